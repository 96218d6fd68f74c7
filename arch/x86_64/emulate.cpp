// SPDX-License-Identifier: MIT
/// @file emulate.cpp
/// Emulation of the simple instruction classes on a Regs (the kernel's
/// branch_emulate_op / push_emulate_op) and the per-instruction operations
/// tables (XolOps, the kernel's uprobe_xol_ops) analyze() picks from.
/// Hot path: async-signal-safe, no allocation, no syscall, no Capstone; pure
/// arithmetic on the precomputed Insn.

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

namespace {

// One emulation per class (the kernel's branch_emulate_op, push_emulate_op),
// each the `emulate` of its XolOps table below.

bool emulate_nop(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept {
  regs.rip = ip + insn.len;
  return true;
}

bool emulate_push(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept {
  push64(regs, reg_value(regs, insn.reg));  // push rsp stores the old rsp
  regs.rip = ip + insn.len;
  return true;
}

std::uint64_t rel_target(const Insn& insn, std::uint64_t ip) noexcept {
  return ip + insn.len + static_cast<std::uint64_t>(insn.rel);
}

bool emulate_jmp_rel(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept {
  regs.rip = rel_target(insn, ip);
  return true;
}

bool emulate_call_rel(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept {
  push64(regs, ip + insn.len);
  regs.rip = rel_target(insn, ip);
  return true;
}

bool emulate_jcc(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept {
  regs.rip = condition(insn.cond, regs.rflags) ? rel_target(insn, ip) : ip + insn.len;
  return true;
}

bool emulate_loop(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept {
  regs.rip = loop_taken(insn.cond, regs) ? rel_target(insn, ip) : ip + insn.len;
  return true;
}

bool emulate_ret(const Insn& insn, std::uint64_t, Regs& regs) noexcept {
  regs.rip = load64(regs.rsp);
  regs.rsp += 8 + (insn.cls == InsnClass::ret_imm ? insn.imm : 0);
  return true;
}

bool emulate_jmp_ind(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept {
  regs.rip = indirect_target(insn, ip + insn.len, regs);
  return true;
}

bool emulate_call_ind(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept {
  const std::uint64_t next = ip + insn.len;
  const std::uint64_t dest = indirect_target(insn, next, regs);  // before the push
  push64(regs, next);
  regs.rip = dest;
  return true;
}

/// pre_xol of every instruction (the kernel's default_pre_xol_op): the step
/// plan, TF set; `fix_pushf`/`keep_tf` for the pushf and popf tables.
inline void pre_xol_with(const Insn& insn, std::uint64_t ip, std::uint64_t slot, Regs& regs, bool program_tf,
                         XolStep& step, bool fix_pushf, bool keep_tf) noexcept {
  step.plan = plan_single_step(insn, ip, slot, regs);
  step.ops = insn.ops;
  step.program_tf = program_tf;
  step.fix_pushf = fix_pushf;
  step.keep_tf = keep_tf;
  regs.rflags |= kTrapFlag;
}

void pre_xol_default(const Insn& insn, std::uint64_t ip, std::uint64_t slot, Regs& regs, bool program_tf,
                     XolStep& step) noexcept {
  pre_xol_with(insn, ip, slot, regs, program_tf, step, false, false);
}

/// pushf under our TF stores TF = 1: its step clears it in the stored word.
void pre_xol_pushf(const Insn& insn, std::uint64_t ip, std::uint64_t slot, Regs& regs, bool program_tf,
                   XolStep& step) noexcept {
  pre_xol_with(insn, ip, slot, regs, program_tf, step, !program_tf, false);
}

/// popf loads TF: the flags after it are what it loaded (UPROBE_FIX_SETF).
void pre_xol_popf(const Insn& insn, std::uint64_t ip, std::uint64_t slot, Regs& regs, bool program_tf,
                  XolStep& step) noexcept {
  pre_xol_with(insn, ip, slot, regs, program_tf, step, false, true);
}

/// post_xol (the kernel's default_post_xol_op and the UPROBE_FIX_* fix-ups
/// of arch_uprobe_post_xol()).
StepEnd post_xol_default(const XolStep& step, ucontext_t* uc) noexcept {
  std::uint64_t resume = 0;
  const StepEnd end = single_step_end(step.plan, ucontext_ip(uc), ucontext_sp(uc), resume);
  if (end != StepEnd::done) return end;
  set_ucontext_ip(uc, resume);
  if (!step.program_tf) {
    if (!step.keep_tf) set_ucontext_flags(uc, ucontext_flags(uc) & ~kTrapFlag);
    // The copy ran under our TF: flags it stored must read as the program's.
    if (step.fix_pushf) clear_stored_trap_flag(uc);
  }
  return StepEnd::done;
}

//                                  emulate           emulate_only step_always pre_xol          post_xol
constexpr XolOps kNopOps        = {emulate_nop,       false, false, pre_xol_default, post_xol_default};
constexpr XolOps kPushOps       = {emulate_push,      false, false, pre_xol_default, post_xol_default};
constexpr XolOps kJmpRelOps     = {emulate_jmp_rel,   true,  false, pre_xol_default, post_xol_default};
constexpr XolOps kCallRelOps    = {emulate_call_rel,  true,  false, pre_xol_default, post_xol_default};
constexpr XolOps kJccOps        = {emulate_jcc,       true,  false, pre_xol_default, post_xol_default};
constexpr XolOps kLoopOps       = {emulate_loop,      true,  false, pre_xol_default, post_xol_default};
constexpr XolOps kRetOps        = {emulate_ret,       false, false, pre_xol_default, post_xol_default};
constexpr XolOps kJmpIndOps     = {emulate_jmp_ind,   false, false, pre_xol_default, post_xol_default};
constexpr XolOps kJmpIndRipOps  = {emulate_jmp_ind,   true,  false, pre_xol_default, post_xol_default};
constexpr XolOps kCallIndOps    = {emulate_call_ind,  true,  false, pre_xol_default, post_xol_default};
constexpr XolOps kPushfOps      = {nullptr,           false, false, pre_xol_pushf,   post_xol_default};
constexpr XolOps kPopfOps       = {nullptr,           false, true,  pre_xol_popf,    post_xol_default};

}  // namespace

constinit const XolOps kDefaultXolOps = {nullptr, false, false, pre_xol_default, post_xol_default};

const XolOps& xol_ops_for(const Insn& insn) noexcept {
  switch (insn.cls) {
    case InsnClass::nop: return kNopOps;
    case InsnClass::push_reg: return kPushOps;
    case InsnClass::jmp_rel: return kJmpRelOps;
    case InsnClass::call_rel: return kCallRelOps;
    case InsnClass::jcc_rel: return kJccOps;
    case InsnClass::loop_rel: return kLoopOps;
    case InsnClass::ret:
    case InsnClass::ret_imm: return kRetOps;
    case InsnClass::jmp_ind: return insn.rip_relative ? kJmpIndRipOps : kJmpIndOps;
    case InsnClass::call_ind: return kCallIndOps;
    case InsnClass::xol: break;
  }
  return stores_flags(insn) ? kPushfOps : loads_flags(insn) ? kPopfOps : kDefaultXolOps;
}

bool emulate(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept {
  const XolOps& ops = xol_ops_for(insn);
  return ops.emulate && ops.emulate(insn, ip, regs);
}

}  // namespace uprobe::arch
