// SPDX-License-Identifier: MIT
/// @file xol.cpp
/// The out-of-line copy of an instruction: the original bytes with a
/// rip-relative displacement re-aimed from the slot at the same absolute
/// target, followed by an absolute jump back (jmp *N(%rip); .quad ip + len),
/// the quadword 8-byte aligned: the copy may run with rflags.AC set (a probed
/// `popf` that turns alignment checking on), and an unaligned load of the
/// jump target would then raise #AC (SIGBUS) in the slot.

#include <cstdio>
#include <cstring>

#include "arch.hpp"

namespace uprobe::arch {
namespace {

/// ff 25 disp32: jmp qword ptr [rip + disp32]; the 8-byte destination
/// follows after disp32 bytes of int3 padding.
constexpr std::uint8_t kJmpAbsOpcode[2] = {0xff, 0x25};
constexpr std::size_t kJmpAbsInsnLen = 6;

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::uint64_t rip_target(const Insn& insn, std::uint64_t ip) noexcept {
  return ip + insn.len + static_cast<std::uint64_t>(static_cast<std::int64_t>(insn.disp));
}

std::size_t build_xol(const Insn& insn, std::uint64_t ip, std::uint64_t slot, std::uint8_t* out,
                      std::string& why) {
  why.clear();
  if (insn.len == 0 || insn.len > kMaxInsnLen || insn.len + kJmpAbsInsnLen + 8 > kXolSlotSize) {
    why = "no instruction to copy out of line";
    return 0;
  }
  std::uint8_t buf[kXolSlotSize] = {};
  std::memcpy(buf, insn.bytes, insn.len);
  if (insn.rip_relative) {
    if (insn.disp_offset == 0 || insn.disp_offset + 4u > insn.len) {
      why = "bad rip-relative displacement offset";
      return 0;
    }
    const std::uint64_t target = rip_target(insn, ip);
    const auto disp = static_cast<std::int64_t>(target - (slot + insn.len));
    if (disp < INT32_MIN || disp > INT32_MAX) {
      why = "rip-relative target " + hex(target) + " is out of reach of XOL slot " + hex(slot);
      return 0;
    }
    const auto d32 = static_cast<std::int32_t>(disp);
    std::memcpy(buf + insn.disp_offset, &d32, sizeof d32);
  }
  const std::uint64_t back = ip + insn.len;
  const std::size_t jmp_end = insn.len + kJmpAbsInsnLen;
  // Pad so that the quadword is 8-byte aligned in memory; a slot that is not
  // itself 8-byte aligned may lack the room (the runtime's slots are
  // kXolSlotSize-aligned, where the longest instruction still fits).
  std::size_t pad = (8 - ((slot + jmp_end) & 7)) & 7;
  if (jmp_end + pad + 8 > kXolSlotSize) pad = 0;
  const std::int32_t disp = static_cast<std::int32_t>(pad);
  std::memcpy(buf + insn.len, kJmpAbsOpcode, sizeof kJmpAbsOpcode);
  std::memcpy(buf + insn.len + sizeof kJmpAbsOpcode, &disp, sizeof disp);
  std::memset(buf + jmp_end, kBreakpoint, pad);
  std::memcpy(buf + jmp_end + pad, &back, sizeof back);
  const std::size_t total = jmp_end + pad + 8;
  std::memcpy(out, buf, total);
  return total;
}

namespace {

/// True for a rep/repe/repne-prefixed string instruction (movs, cmps, stos,
/// lods, scas, ins, outs): under TF it traps after every iteration, with rip
/// still at the instruction until the count runs out.
bool rep_string(const Insn& insn) noexcept {
  bool rep = false;
  std::size_t i = 0;
  for (; i < insn.len; ++i) {
    const std::uint8_t b = insn.bytes[i];
    if (b == 0xf2 || b == 0xf3) {
      rep = true;
    } else if (b == 0x66 || b == 0x67 || b == 0x2e || b == 0x3e || b == 0x26 || b == 0x36 || b == 0x64 ||
               b == 0x65 || b == 0xf0 || (b & 0xf0) == 0x40) {
      continue;
    } else {
      break;
    }
  }
  if (!rep || i >= insn.len) return false;
  const std::uint8_t op = insn.bytes[i];
  return (op >= 0xa4 && op <= 0xa7) || (op >= 0xaa && op <= 0xaf) || (op >= 0x6c && op <= 0x6f);
}

}  // namespace

StepPlan plan_single_step(const Insn& insn, std::uint64_t ip, std::uint64_t slot, const Regs& regs) noexcept {
  StepPlan p;
  p.ip = ip;
  p.slot = slot;
  p.len = insn.len;
  switch (insn.cls) {
    case InsnClass::ret:
    case InsnClass::ret_imm:
      // (The analyser refuses an operand-size override on ret: it pops 8.)
      p.kind = StepEndKind::branch;
      p.sp = regs.rsp + 8 + (insn.cls == InsnClass::ret_imm ? insn.imm : 0);
      break;
    case InsnClass::jmp_ind:
      p.kind = StepEndKind::branch;
      p.sp = regs.rsp;
      break;
    default:
      p.kind = insn.traps ? StepEndKind::kernel : rep_string(insn) ? StepEndKind::rep : StepEndKind::next;
      break;
  }
  return p;
}

StepEnd single_step_end(const StepPlan& plan, std::uint64_t trap_ip, std::uint64_t trap_sp,
                        std::uint64_t& resume) noexcept {
  switch (plan.kind) {
    case StepEndKind::branch:
      // The target may be anywhere; the stack pointer is the branch's own.
      // (A fault or signal inside the copy leaves rip in the slot.)
      if (trap_sp != plan.sp || (trap_ip >= plan.slot && trap_ip < plan.slot + kXolSlotSize)) return StepEnd::foreign;
      resume = trap_ip;
      return StepEnd::done;
    case StepEndKind::rep:
      if (trap_ip == plan.slot) return StepEnd::again;
      break;
    case StepEndKind::kernel:
      if (trap_ip == plan.ip + plan.len) {
        resume = trap_ip;
        return StepEnd::done;
      }
      break;
    case StepEndKind::next:
      break;
  }
  if (trap_ip != plan.slot + plan.len) return StepEnd::foreign;
  resume = plan.ip + plan.len;
  return StepEnd::done;
}

namespace {
/// The opcode after operand-size and REX prefixes.
int opcode_after_prefixes(const Insn& insn) noexcept {
  std::size_t i = 0;
  while (i < insn.len && (insn.bytes[i] == 0x66 || (insn.bytes[i] & 0xF0) == 0x40)) ++i;
  return i < insn.len ? insn.bytes[i] : -1;
}
}  // namespace

// pushf/popf: 9c/9d, 66 9c/66 9d (16-bit); a REX prefix changes nothing.
bool stores_flags(const Insn& insn) noexcept { return opcode_after_prefixes(insn) == 0x9C; }
bool loads_flags(const Insn& insn) noexcept { return opcode_after_prefixes(insn) == 0x9D; }

bool xol_safe(const Insn& insn) noexcept {
  switch (insn.cls) {
    case InsnClass::jmp_rel:
    case InsnClass::call_rel:
    case InsnClass::jcc_rel:
    case InsnClass::loop_rel:
    case InsnClass::call_ind:
      return false;
    case InsnClass::jmp_ind:
      return !insn.rip_relative;
    default:
      return true;
  }
}

}  // namespace uprobe::arch
