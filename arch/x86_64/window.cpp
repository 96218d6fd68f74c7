// SPDX-License-Identifier: MIT
/// @file window.cpp
/// Optimized function-entry probes: which first instructions of a function
/// the 5-byte jump may displace (beyond the kernel, which optimizes only nop5
/// sites; the same checks as its x86 kprobes optimizer, can_optimize() in
/// arch/x86/kernel/kprobes/opt.c), and their relocated copy. Not hot.

#include <capstone/capstone.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "arch.hpp"

namespace uprobe::arch {
namespace {

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

bool refuse(std::string& why, std::string reason) {
  why = std::move(reason);
  return false;
}

/// The linear sweep of the whole function: refuses a direct branch into
/// bytes 1 .. len-1 of the window and (optionally) jump tables.
bool check_function(const std::uint8_t* func, std::size_t size, std::size_t len, std::string& why,
                    bool refuse_indirect_jumps) {
  csh h = 0;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) return refuse(why, "cannot open the disassembler");
  cs_option(h, CS_OPT_DETAIL, CS_OPT_ON);
  std::unique_ptr<cs_insn, void (*)(cs_insn*)> insn(cs_malloc(h), [](cs_insn* i) { cs_free(i, 1); });
  const std::uint8_t* code = func;
  std::size_t left = size;
  std::uint64_t at = 0;
  bool ok = true;
  while (left > 0) {
    const std::uint64_t start = at;
    if (!cs_disasm_iter(h, &code, &left, &at, insn.get())) {
      ok = refuse(why, "the function cannot be disassembled to its end (undecodable bytes at +" + hex(start) +
                           "), so branches into the displaced bytes cannot be ruled out");
      break;
    }
    const cs_detail* d = insn->detail;
    // An address taken inside the window (lea L(%rip) of a label there, for
    // a computed goto or a hand-made jump table): an indirect jump may land
    // in the middle of the jump.
    for (std::uint8_t k = 0; k < d->x86.op_count; ++k) {
      const cs_x86_op& op = d->x86.operands[k];
      if (op.type != X86_OP_MEM || op.mem.base != X86_REG_RIP || op.mem.index != X86_REG_INVALID) continue;
      const std::uint64_t target = at + static_cast<std::uint64_t>(op.mem.disp);
      if (target > 0 && target < len) {
        cs_close(&h);
        return refuse(why, "the instruction at +" + hex(start) + " (" + insn->mnemonic + " " + insn->op_str +
                               ") takes the address +" + hex(target) + ", inside the " + std::to_string(len) +
                               " bytes the jump displaces (an indirect jump may land there)");
      }
    }
    bool branch = false, relative = false;
    for (std::uint8_t g = 0; g < d->groups_count; ++g) {
      branch = branch || d->groups[g] == CS_GRP_JUMP || d->groups[g] == CS_GRP_CALL;
      relative = relative || d->groups[g] == CS_GRP_BRANCH_RELATIVE;
    }
    if (!branch) continue;
    const cs_x86& x = d->x86;
    if (relative && x.op_count == 1 && x.operands[0].type == X86_OP_IMM) {
      const std::uint64_t target = static_cast<std::uint64_t>(x.operands[0].imm);
      if (target > 0 && target < len) {
        ok = refuse(why, "the instruction at +" + hex(start) + " (" + insn->mnemonic + " " + insn->op_str +
                             ") branches to +" + hex(target) + ", inside the " + std::to_string(len) +
                             " bytes the jump displaces");
        break;
      }
    } else if (refuse_indirect_jumps && insn->id == X86_INS_JMP && x.op_count == 1 &&
               x.operands[0].type == X86_OP_REG) {
      ok = refuse(why, "the function has an indirect jump at +" + hex(start) +
                           " (a jump table whose targets cannot be checked)");
      break;
    }
  }
  cs_close(&h);
  return ok;
}

std::size_t put(std::uint8_t* out, std::size_t at, const void* bytes, std::size_t n) {
  std::memcpy(out + at, bytes, n);
  return at + n;
}

bool rel32(std::uint64_t from_end, std::uint64_t target, std::int32_t& out) {
  const auto d = static_cast<std::int64_t>(target - from_end);
  if (d < INT32_MIN || d > INT32_MAX) return false;
  out = static_cast<std::int32_t>(d);
  return true;
}

}  // namespace

bool plan_entry_window(const std::uint8_t* func, std::size_t size, EntryWindow& out, std::string& why,
                       bool refuse_indirect_jumps) {
  out = EntryWindow{};
  why.clear();
  if (size < kJumpLen)
    return refuse(why, "the function is " + std::to_string(size) + (size == 1 ? " byte" : " bytes") +
                           " long, shorter than the 5-byte jump");
  std::size_t len = 0;
  while (len < kJumpLen) {
    Insn insn;
    if (!analyze(func + len, size - len, insn, why)) {
      why = "the instruction at +" + hex(len) + " cannot be displaced: " + why;
      return false;
    }
    if (insn.traps)
      return refuse(why, "the instruction `" + insn.text + "` at +" + hex(len) +
                             " enters the kernel or traps; it cannot run displaced");
    const bool last = len + insn.len >= kJumpLen;
    switch (insn.cls) {
      case InsnClass::nop:
      case InsnClass::push_reg:
      case InsnClass::xol:
        break;
      case InsnClass::jmp_rel:
      case InsnClass::jcc_rel:
        // Re-encoded with a rel32 from the slot; a taken branch leaves the
        // window, a not-taken Jcc goes on with the next relocated instruction.
        break;
      case InsnClass::call_rel:
      case InsnClass::jmp_ind:
        // The callee would return into the window, or the rest is dead.
        if (!last)
          return refuse(why, "the branch `" + insn.text + "` at +" + hex(len) +
                                 " is inside the 5 bytes the jump displaces");
        break;
      default:
        return refuse(why, "the instruction `" + insn.text + "` at +" + hex(len) +
                               " cannot be displaced (a return, loop or indirect call)");
    }
    if (len + insn.len > size) return refuse(why, "the first instructions run past the function's end");
    len += insn.len;
    out.insns.push_back(std::move(insn));
  }
  if (!check_function(func, size, len, why, refuse_indirect_jumps)) return false;
  out.len = static_cast<std::uint8_t>(len);
  std::memcpy(out.bytes, func, len);
  return true;
}

std::size_t build_window_xol(const EntryWindow& w, std::uint64_t ip, std::uint64_t slot, std::uint8_t* out,
                             std::string& why) {
  why.clear();
  std::uint8_t buf[kWindowSlotSize + 32] = {};
  std::size_t n = 0;
  std::uint64_t orig = ip;  // address of the original instruction being copied
  bool ends_in_branch = false;
  for (const Insn& insn : w.insns) {
    const std::uint64_t here = slot + n;
    const std::uint64_t target = orig + insn.len + static_cast<std::uint64_t>(insn.rel);
    std::int32_t d = 0;
    switch (insn.cls) {
      case InsnClass::jmp_rel: {
        const std::uint8_t op = 0xe9;
        n = put(buf, n, &op, 1);
        if (!rel32(here + 5, target, d)) return why = "jump target " + hex(target) + " out of reach", 0;
        n = put(buf, n, &d, 4);
        ends_in_branch = true;
        break;
      }
      case InsnClass::jcc_rel: {
        const std::uint8_t op[2] = {0x0f, static_cast<std::uint8_t>(0x80 | insn.cond)};
        n = put(buf, n, op, 2);
        if (!rel32(here + 6, target, d)) return why = "branch target " + hex(target) + " out of reach", 0;
        n = put(buf, n, &d, 4);
        break;  // not taken: falls through to the jump back
      }
      case InsnClass::call_rel: {
        // push $(orig + len) without touching the flags, then jmp target: the
        // callee sees the original return address, as after the original call.
        const std::uint64_t ret = orig + insn.len;
        const std::uint8_t lea[5] = {0x48, 0x8d, 0x64, 0x24, 0xf8};  // lea -8(%rsp), %rsp
        n = put(buf, n, lea, sizeof lea);
        const std::uint8_t lo[3] = {0xc7, 0x04, 0x24};  // movl $imm32, (%rsp)
        const auto lo32 = static_cast<std::uint32_t>(ret), hi32 = static_cast<std::uint32_t>(ret >> 32);
        n = put(buf, n, lo, sizeof lo);
        n = put(buf, n, &lo32, 4);
        const std::uint8_t hi[4] = {0xc7, 0x44, 0x24, 0x04};  // movl $imm32, 4(%rsp)
        n = put(buf, n, hi, sizeof hi);
        n = put(buf, n, &hi32, 4);
        const std::uint8_t op = 0xe9;
        n = put(buf, n, &op, 1);
        if (!rel32(slot + n + 4, target, d)) return why = "call target " + hex(target) + " out of reach", 0;
        n = put(buf, n, &d, 4);
        ends_in_branch = true;
        break;
      }
      default: {
        std::uint8_t bytes[16];
        std::memcpy(bytes, insn.bytes, insn.len);
        if (insn.rip_relative) {
          const std::uint64_t t = rip_target(insn, orig);
          if (!rel32(here + insn.len, t, d))
            return why = "rip-relative target " + hex(t) + " out of reach of the window slot " + hex(slot), 0;
          std::memcpy(bytes + insn.disp_offset, &d, 4);
        }
        n = put(buf, n, bytes, insn.len);
        ends_in_branch = insn.cls == InsnClass::jmp_ind;
      }
    }
    orig += insn.len;
  }
  if (!ends_in_branch) {
    const std::uint64_t back = ip + w.len;
    std::int32_t d;
    if (rel32(slot + n + 5, back, d)) {
      const std::uint8_t op = 0xe9;
      n = put(buf, n, &op, 1);
      n = put(buf, n, &d, 4);
    } else {
      const std::uint8_t jmp_abs[6] = {0xff, 0x25, 0, 0, 0, 0};  // jmp *0(%rip)
      n = put(buf, n, jmp_abs, sizeof jmp_abs);
      n = put(buf, n, &back, 8);
    }
  }
  if (n > kWindowSlotSize) return why = "the relocated window does not fit a slot", 0;
  std::memcpy(out, buf, n);
  return n;
}

}  // namespace uprobe::arch
