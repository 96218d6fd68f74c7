// SPDX-License-Identifier: MIT
/// @file disasm.cpp
/// Linear-sweep helpers (Capstone, no detail): instruction starts of a
/// function body and one-line disassembly. Not on the hot path.

#include <capstone/capstone.h>

#include "arch.hpp"
#include "capstone_lib.hpp"
#include "thread_object.hpp"

namespace uprobe::arch {
namespace {

/// One Capstone handle (detail off) per thread, opened on first use.
class Sweeper {
 public:
  Sweeper() {
    if (capstone::open(CS_ARCH_X86, CS_MODE_64, &handle_) != CS_ERR_OK) {
      handle_ = 0;
      return;
    }
    insn_ = capstone::malloc_insn(handle_);
  }
  ~Sweeper() {
    if (insn_ != nullptr) capstone::free_insn(insn_, 1);
    if (handle_ != 0) capstone::close(&handle_);
  }
  Sweeper(const Sweeper&) = delete;
  Sweeper& operator=(const Sweeper&) = delete;

  /// Decodes the next instruction, advancing code/size/address; nullptr at
  /// an undecodable byte or the end.
  const cs_insn* next(const std::uint8_t*& code, std::size_t& size, std::uint64_t& address) {
    if (insn_ == nullptr || size == 0) return nullptr;
    if (!capstone::disasm_iter(handle_, &code, &size, &address, insn_)) return nullptr;
    return insn_;
  }

 private:
  csh handle_ = 0;
  cs_insn* insn_ = nullptr;
};

Sweeper& sweeper() { return uprobe::detail::thread_object<Sweeper>(); }

}  // namespace

std::vector<std::size_t> instruction_starts(const std::uint8_t* code, std::size_t size) {
  std::vector<std::size_t> starts;
  if (code == nullptr) return starts;
  Sweeper& s = sweeper();
  std::uint64_t address = 0;
  while (size > 0) {
    const std::uint64_t at = address;
    if (s.next(code, size, address) == nullptr) break;
    starts.push_back(static_cast<std::size_t>(at));
  }
  return starts;
}

std::string disassemble(const std::uint8_t* code, std::size_t avail, std::uint64_t address,
                        std::size_t& len) {
  len = 0;
  if (code == nullptr) return "(bad)";
  std::size_t size = avail < kMaxInsnLen ? avail : kMaxInsnLen;
  const cs_insn* ci = sweeper().next(code, size, address);
  if (ci == nullptr) return "(bad)";
  len = ci->size;
  std::string text = ci->mnemonic;
  if (ci->op_str[0] != '\0') {
    text += ' ';
    text += ci->op_str;
  }
  return text;
}

}  // namespace uprobe::arch
