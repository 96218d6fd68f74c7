// SPDX-License-Identifier: MIT
// Building optimized-probe stubs from the template in opt_stub.S.

#include <cstddef>
#include <cstring>

#include "arch.hpp"

extern "C" {
extern const std::uint8_t uprobe_opt_stub_template[];
extern const std::uint8_t uprobe_opt_stub_template_end[];
extern const std::uint8_t uprobe_opt_stub_desc_imm[];
extern const std::uint8_t uprobe_opt_stub_entry_imm[];
extern const std::uint8_t uprobe_opt_stub_exit_imm[];
extern const std::uint8_t uprobe_opt_stub_resume[];
extern const std::uint8_t uprobe_opt_stub_resume_end[];
extern const std::uint8_t uprobe_opt_stub_entry_resume[];
void uprobe_opt_entry(std::uint64_t* frame, const uprobe::arch::OptSite* site);
void uprobe_opt_stub_exit();
}

namespace uprobe::arch {

namespace {
std::size_t code_len() noexcept {
  return static_cast<std::size_t>(uprobe_opt_stub_template_end - uprobe_opt_stub_template);
}
// (The template ends 16-aligned, and its resume jump reads the descriptor's
// `resume` there: opt_stub.S.)
std::size_t desc_offset() noexcept { return code_len(); }
// The resume point's jump (opt_stub.S): the template's, or at a function
// entry uprobe_opt_stub_entry_resume's bytes, as long.
std::size_t resume_offset() noexcept {
  return static_cast<std::size_t>(uprobe_opt_stub_resume - uprobe_opt_stub_template);
}
std::size_t resume_len() noexcept {
  return static_cast<std::size_t>(uprobe_opt_stub_resume_end - uprobe_opt_stub_resume);
}
static_assert(offsetof(uprobe::arch::OptSite, resume) == 8, "opt_stub.S reads OptSite::resume at +8");
}  // namespace

std::size_t opt_stub_probe_len() noexcept {
  // The fixed code before the first patched immediate.
  return static_cast<std::size_t>(uprobe_opt_stub_desc_imm - uprobe_opt_stub_template);
}

std::uint64_t opt_stub_desc(std::uint64_t ip, const std::uint8_t* code) noexcept {
  // The template's bytes, but the resume point: the template's or a function
  // entry's (build_opt_stub()).
  const std::size_t r = resume_offset(), rn = resume_len();
  if (std::memcmp(code, uprobe_opt_stub_template, r) != 0 ||
      std::memcmp(code + r + rn, uprobe_opt_stub_template + r + rn, opt_stub_probe_len() - r - rn) != 0)
    return 0;
  if (std::memcmp(code + r, uprobe_opt_stub_resume, rn) != 0 &&
      std::memcmp(code + r, uprobe_opt_stub_entry_resume, rn) != 0)
    return 0;
  return ip + desc_offset();
}

std::size_t opt_stub_owner_offset() noexcept { return desc_offset() + offsetof(OptSite, owner); }

std::size_t build_opt_stub(std::uint64_t stub, const OptSite& desc, std::uint8_t* out) noexcept {
  const std::size_t n = code_len();
  static_assert(sizeof(OptSite) == 56);
  static_assert(kOptStubSize >= 128 + sizeof(OptSite));
  std::memset(out, 0xCC, kOptStubSize);
  std::memcpy(out, uprobe_opt_stub_template, n);
  const std::uint64_t desc_addr = stub + desc_offset();
  const auto entry = reinterpret_cast<std::uint64_t>(&uprobe_opt_entry);
  const auto exit = reinterpret_cast<std::uint64_t>(&uprobe_opt_stub_exit);
  std::memcpy(out + (uprobe_opt_stub_desc_imm - uprobe_opt_stub_template), &desc_addr, 8);
  std::memcpy(out + (uprobe_opt_stub_entry_imm - uprobe_opt_stub_template), &entry, 8);
  std::memcpy(out + (uprobe_opt_stub_exit_imm - uprobe_opt_stub_template), &exit, 8);
  if (desc.at_entry) std::memcpy(out + resume_offset(), uprobe_opt_stub_entry_resume, resume_len());
  std::memcpy(out + desc_offset(), &desc, sizeof desc);
  return desc_offset() + sizeof desc;
}

}  // namespace uprobe::arch
