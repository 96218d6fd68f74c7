// SPDX-License-Identifier: MIT
/// @file plan.cpp
/// plan_site() and function_sites() (uprobe.hpp): what a probe at an offset
/// would be patched as, from the file alone, with the checks an attach runs
/// (validate.cpp) and nothing written; and the instruction starts of every
/// function of known bounds, which uprobe-coverage --every-instruction
/// plans one by one.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "elf_image.hpp"
#include "uprobe/uprobe.hpp"
#include "forbidden.hpp"
#include "validate.hpp"

namespace uprobe {

using namespace detail;

SitePlan plan_site(const std::string& path, std::uint64_t offset) {
  Target t;
  open_target(path, offset, t);
  check_not_forbidden(t, offset);
  arch::Insn insn;
  arch::PatchPlan patch;
  bool entry = false;
  analyze_target(t, offset, insn, &patch, &entry);
  SitePlan plan;
  plan.instruction = insn.text;
  plan.why_no_window = patch.why_no_window;
  switch (patch.tactic) {
    case arch::Tactic::nop5:
      plan.tactic = ProbeMode::optimized_nop5;
      break;
    case arch::Tactic::punned:
      plan.tactic = patch.window.min_pad ? ProbeMode::optimized_padded : ProbeMode::optimized_punned;
      plan.displaced = patch.window.len;
      break;
    case arch::Tactic::window:
      plan.tactic = entry ? ProbeMode::optimized_entry : ProbeMode::optimized_window;
      plan.displaced = patch.window.len;
      break;
    case arch::Tactic::int3:
      plan.tactic = ProbeMode::int3;
      plan.why_int3 = "the instruction `" + insn.text + "` is not a 5-byte nop, and " + patch.why_no_window;
      break;
  }
  return plan;
}

std::vector<FunctionSites> function_sites(const std::string& path) {
  const auto img = load_elf_image(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(Errc::file_not_found, path, 0, "cannot open the file");
  std::vector<FunctionSites> out;
  std::vector<std::uint8_t> code;
  for (const FuncSym& f : img->funcs) {
    if (!out.empty() && out.back().offset == f.file_offset && out.back().size == f.size) continue;  // an alias
    const LoadSegment* seg = img->exec_segment(f.file_offset);
    if (!seg) continue;
    FunctionSites fs;
    fs.name = f.name;
    fs.offset = f.file_offset;
    fs.size = f.size;
    const std::uint64_t n = std::min<std::uint64_t>({f.size, seg->offset + seg->filesz - f.file_offset, 1u << 20});
    code.resize(static_cast<std::size_t>(n));
    const ssize_t got = ::pread(fd, code.data(), code.size(), static_cast<off_t>(f.file_offset));
    if (got > 0)
      for (const std::size_t s : arch::instruction_starts(code.data(), static_cast<std::size_t>(got)))
        fs.starts.push_back(static_cast<std::uint32_t>(s));
    out.push_back(std::move(fs));
  }
  ::close(fd);
  return out;
}

}  // namespace uprobe
