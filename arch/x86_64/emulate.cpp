// SPDX-License-Identifier: MIT
/// @file emulate.cpp
/// Emulation of the simple instruction classes on a Regs (the kernel's
/// branch_emulate_op / push_emulate_op). Hot path: async-signal-safe, no
/// allocation, no syscall, no Capstone; pure arithmetic on the precomputed Insn.

#include <cstring>

#include "arch.hpp"

namespace uprobe::arch {
namespace {

/// Insn register number (rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8..r15) -> Regs field.
constexpr std::uint64_t Regs::*kRegField[16] = {
    &Regs::rax, &Regs::rcx, &Regs::rdx, &Regs::rbx, &Regs::rsp, &Regs::rbp, &Regs::rsi, &Regs::rdi,
    &Regs::r8,  &Regs::r9,  &Regs::r10, &Regs::r11, &Regs::r12, &Regs::r13, &Regs::r14, &Regs::r15,
};

constexpr std::uint64_t kCF = 1u << 0, kPF = 1u << 2, kZF = 1u << 6, kSF = 1u << 7, kOF = 1u << 11;

std::uint64_t reg_value(const Regs& regs, std::uint8_t reg) noexcept {
  return reg < 16 ? regs.*kRegField[reg] : 0;
}

std::uint64_t load64(std::uint64_t addr) noexcept {
  std::uint64_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
  return v;
}

void push64(Regs& regs, std::uint64_t value) noexcept {
  regs.rsp -= 8;
  std::memcpy(reinterpret_cast<void*>(regs.rsp), &value, sizeof value);
}

/// Jcc condition (low nibble of 0x7X): even codes test, odd codes negate.
bool condition(std::uint8_t cond, std::uint64_t f) noexcept {
  const bool cf = f & kCF, pf = f & kPF, zf = f & kZF, sf = f & kSF, of = f & kOF;
  bool r = false;
  switch (cond >> 1) {
    case 0:
      r = of;
      break;  // jo / jno
    case 1:
      r = cf;
      break;  // jb / jae
    case 2:
      r = zf;
      break;  // je / jne
    case 3:
      r = cf || zf;
      break;  // jbe / ja
    case 4:
      r = sf;
      break;  // js / jns
    case 5:
      r = pf;
      break;  // jp / jnp
    case 6:
      r = sf != of;
      break;  // jl / jge
    default:
      r = zf || sf != of;
      break;  // jle / jg
  }
  return (cond & 1) ? !r : r;
}

/// loop/loope/loopne (rcx or ecx) and jrcxz/jecxz: updates rcx, returns taken.
bool loop_taken(std::uint8_t kind, Regs& regs) noexcept {
  const bool zf = regs.rflags & kZF;
  switch (kind) {
    case 3:
      return regs.rcx == 0;  // jrcxz
    case 4:
      return static_cast<std::uint32_t>(regs.rcx) == 0;  // jecxz
    default:
      break;
  }
  std::uint64_t count;
  if (kind >= 5) {  // 67-prefixed: the count is ecx; the write zero-extends into rcx
    count = static_cast<std::uint32_t>(regs.rcx - 1);
    kind = static_cast<std::uint8_t>(kind - 5);
  } else {
    count = regs.rcx - 1;
  }
  regs.rcx = count;
  switch (kind) {
    case 0:
      return count != 0;  // loop
    case 1:
      return count != 0 && zf;  // loope
    default:
      return count != 0 && !zf;  // loopne
  }
}

std::uint64_t indirect_target(const Insn& insn, std::uint64_t next, const Regs& regs) noexcept {
  if (insn.reg != kNoReg) return reg_value(regs, insn.reg);
  std::uint64_t ea = static_cast<std::uint64_t>(insn.mem_disp);
  if (insn.mem_base == kRipReg)
    ea += next;
  else
    ea += reg_value(regs, insn.mem_base);
  if (insn.mem_index != kNoReg) ea += reg_value(regs, insn.mem_index) * insn.mem_scale;
  return load64(ea);
}

}  // namespace

bool is_emulated(const Insn& insn) noexcept { return insn.cls != InsnClass::xol; }

bool emulate(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept {
  const std::uint64_t next = ip + insn.len;
  const std::uint64_t target = next + static_cast<std::uint64_t>(insn.rel);
  switch (insn.cls) {
    case InsnClass::nop:
      regs.rip = next;
      return true;
    case InsnClass::push_reg:
      push64(regs, reg_value(regs, insn.reg));  // push rsp stores the old rsp
      regs.rip = next;
      return true;
    case InsnClass::jmp_rel:
      regs.rip = target;
      return true;
    case InsnClass::call_rel:
      push64(regs, next);
      regs.rip = target;
      return true;
    case InsnClass::jcc_rel:
      regs.rip = condition(insn.cond, regs.rflags) ? target : next;
      return true;
    case InsnClass::loop_rel:
      regs.rip = loop_taken(insn.cond, regs) ? target : next;
      return true;
    case InsnClass::ret:
    case InsnClass::ret_imm:
      regs.rip = load64(regs.rsp);
      regs.rsp += 8 + (insn.cls == InsnClass::ret_imm ? insn.imm : 0);
      return true;
    case InsnClass::jmp_ind:
      regs.rip = indirect_target(insn, next, regs);
      return true;
    case InsnClass::call_ind: {
      const std::uint64_t dest = indirect_target(insn, next, regs);  // before the push
      push64(regs, next);
      regs.rip = dest;
      return true;
    }
    case InsnClass::xol:
      break;
  }
  return false;
}

}  // namespace uprobe::arch
