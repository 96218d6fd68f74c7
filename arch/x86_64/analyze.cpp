// SPDX-License-Identifier: MIT
/// @file analyze.cpp
/// Instruction analysis at register time: Capstone decodes the instruction
/// (validity, length, operands, text); the classification itself is made from
/// the raw prefix and opcode bytes, with Capstone's operands cross-checked,
/// so that a decoder quirk cannot turn into a wrongly emulated instruction.
/// Not on the hot path.

#include <capstone/capstone.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>

#include "arch.hpp"
#include "capstone_lib.hpp"
#include "thread_object.hpp"

namespace uprobe::arch {
namespace {


/// The legacy prefixes and REX byte in front of the opcode.
struct Prefixes {
  bool lock = false;       // f0
  bool rep = false;        // f3
  bool repne = false;      // f2 (also bnd)
  bool opsize = false;     // 66
  bool addrsize = false;   // 67
  bool fs_gs = false;      // 64 / 65
  std::uint8_t rex = 0;    // 40..4f directly before the opcode, else 0
  std::size_t opcode = 0;  // offset of the first opcode byte
};

Prefixes parse_prefixes(const std::uint8_t* b, std::size_t len) {
  Prefixes p;
  std::size_t i = 0;
  for (; i < len; ++i) {
    const std::uint8_t c = b[i];
    switch (c) {
      case 0xf0:
        p.lock = true;
        break;
      case 0xf3:
        p.rep = true;
        break;
      case 0xf2:
        p.repne = true;
        break;
      case 0x66:
        p.opsize = true;
        break;
      case 0x67:
        p.addrsize = true;
        break;
      case 0x64:
      case 0x65:
        p.fs_gs = true;
        break;
      case 0x26:
      case 0x2e:
      case 0x36:
      case 0x3e:
        break;
      default:
        if ((c & 0xf0) == 0x40) {
          p.rex = c;
          continue;
        }
        p.opcode = i;
        return p;
    }
    p.rex = 0;  // a REX followed by a legacy prefix is ignored by the CPU
  }
  p.opcode = len;
  return p;
}

/// Capstone register -> Insn register number (0..15), kRipReg, or kNoReg.
std::uint8_t map_reg(x86_reg r) {
  switch (r) {
    case X86_REG_RAX:
      return 0;
    case X86_REG_RCX:
      return 1;
    case X86_REG_RDX:
      return 2;
    case X86_REG_RBX:
      return 3;
    case X86_REG_RSP:
      return 4;
    case X86_REG_RBP:
      return 5;
    case X86_REG_RSI:
      return 6;
    case X86_REG_RDI:
      return 7;
    case X86_REG_R8:
      return 8;
    case X86_REG_R9:
      return 9;
    case X86_REG_R10:
      return 10;
    case X86_REG_R11:
      return 11;
    case X86_REG_R12:
      return 12;
    case X86_REG_R13:
      return 13;
    case X86_REG_R14:
      return 14;
    case X86_REG_R15:
      return 15;
    case X86_REG_RIP:
      return kRipReg;
    default:
      return kNoReg;
  }
}

bool is_rip(x86_reg r) { return r == X86_REG_RIP || r == X86_REG_EIP || r == X86_REG_IP; }

std::int32_t load_i32(const std::uint8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string hex_bytes(const std::uint8_t* b, std::size_t n) {
  std::string s;
  char buf[4];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, i == 0 ? "%02x" : " %02x", b[i]);
    s += buf;
  }
  return s;
}

bool refuse(std::string& why, const std::string& reason, const Insn& insn) {
  why = reason;
  if (!insn.text.empty()) why += " (" + insn.text + ")";
  return false;
}

bool trap(std::string& why, const char* reason) {
  why = reason;
  return false;
}

bool has_group(const cs_detail* d, std::uint8_t g) {
  for (std::uint8_t i = 0; i < d->groups_count; ++i)
    if (d->groups[i] == g) return true;
  return false;
}

/// The (single) memory operand with a rip/eip base, or nullptr.
const cs_x86_op* rip_mem_operand(const cs_x86& x) {
  for (std::uint8_t i = 0; i < x.op_count; ++i)
    if (x.operands[i].type == X86_OP_MEM && is_rip(x.operands[i].mem.base)) return &x.operands[i];
  return nullptr;
}

bool regs_access_rip(csh h, const cs_insn* ci) {
  cs_regs rd, wr;
  std::uint8_t nr = 0, nw = 0;
  if (capstone::regs_access(h, ci, rd, &nr, wr, &nw) != CS_ERR_OK) return false;
  for (std::uint8_t i = 0; i < nr; ++i)
    if (is_rip(static_cast<x86_reg>(rd[i]))) return true;
  for (std::uint8_t i = 0; i < nw; ++i)
    if (is_rip(static_cast<x86_reg>(wr[i]))) return true;
  return false;
}

/// Records the rip-relative displacement of `op` (relative to the end of the
/// instruction) in `out`, checking Capstone's offset against the bytes.
bool record_rip_relative(const cs_x86& x, const cs_x86_op& op, Insn& out, std::string& why) {
  if (op.mem.base != X86_REG_RIP)
    return refuse(why, "eip-relative operand (address-size override) cannot be relocated", out);
  const std::size_t off = x.encoding.disp_offset;
  if (off == 0 || off + 4 > out.len || load_i32(out.bytes + off) != op.mem.disp)
    return refuse(why, "cannot locate the rip-relative displacement", out);
  out.rip_relative = true;
  out.disp_offset = static_cast<std::uint8_t>(off);
  out.disp = static_cast<std::int32_t>(op.mem.disp);
  return true;
}

/// jmp/call through ff /2, ff /4.
bool classify_indirect(const cs_x86& x, const Prefixes& p, InsnClass cls, Insn& out,
                       std::string& why) {
  if (p.fs_gs) return refuse(why, "segment-relative indirect branch (fs/gs override)", out);
  if (p.opsize) return refuse(why, "operand-size override on an indirect branch", out);
  if (x.op_count != 1) return refuse(why, "cannot decode the indirect branch operand", out);
  const cs_x86_op& op = x.operands[0];
  if (op.type == X86_OP_REG) {
    out.reg = map_reg(op.reg);
    if (out.reg > 15) return refuse(why, "cannot decode the indirect branch register", out);
  } else if (op.type == X86_OP_MEM) {
    if (p.addrsize) return refuse(why, "address-size override on an indirect branch", out);
    if (op.mem.segment == X86_REG_FS || op.mem.segment == X86_REG_GS)
      return refuse(why, "segment-relative indirect branch (fs/gs override)", out);
    const std::uint8_t base = op.mem.base == X86_REG_INVALID ? kNoReg : map_reg(op.mem.base);
    const std::uint8_t index = op.mem.index == X86_REG_INVALID ? kNoReg : map_reg(op.mem.index);
    if ((op.mem.base != X86_REG_INVALID && base == kNoReg) ||
        (op.mem.index != X86_REG_INVALID && (index == kNoReg || index == kRipReg)))
      return refuse(why, "cannot decode the indirect branch memory operand", out);
    if (op.mem.scale != 1 && op.mem.scale != 2 && op.mem.scale != 4 && op.mem.scale != 8)
      return refuse(why, "cannot decode the indirect branch memory operand", out);
    out.mem_base = base;
    out.mem_index = index;
    out.mem_scale = static_cast<std::uint8_t>(op.mem.scale);
    out.mem_disp = op.mem.disp;
    if (base == kRipReg && !record_rip_relative(x, op, out, why)) return false;
  } else {
    return refuse(why, "cannot decode the indirect branch operand", out);
  }
  out.cls = cls;
  return true;
}

/// Classifies by opcode. Returns false with `why` set to refuse; leaves
/// out.cls == xol for anything not emulated.
bool classify(const cs_insn* ci, const Prefixes& p, Insn& out, std::string& why) {
  const cs_x86& x = ci->detail->x86;
  const std::uint8_t* b = out.bytes;
  const std::size_t len = out.len;
  const std::size_t o = p.opcode;
  if (o >= len) return refuse(why, "cannot decode the opcode", out);
  const std::uint8_t op = b[o];
  const std::uint8_t op2 = o + 1 < len ? b[o + 1] : 0;
  const bool rex_b = (p.rex & 0x01) != 0;
  const bool plain = !p.lock && !p.rep && !p.repne;  // no f0/f2/f3

  auto relative = [&](InsnClass cls, std::size_t width) {
    if (p.opsize)
      return refuse(why, "operand-size override on a relative branch (Intel and AMD differ)", out);
    if (p.lock) return refuse(why, "lock prefix on a branch", out);
    const std::size_t opcode_len = op == 0x0f ? 2 : 1;
    if (len != o + opcode_len + width) return refuse(why, "cannot decode the branch", out);
    out.rel = width == 1 ? static_cast<std::int8_t>(b[len - 1]) : load_i32(b + len - 4);
    // Capstone decoded at address 0: its target is len + rel (mod 2^32 for 67 prefixed).
    const std::uint64_t target = len + static_cast<std::uint64_t>(out.rel);
    const std::uint64_t cs_target = static_cast<std::uint64_t>(x.operands[0].imm);
    if (x.op_count != 1 || x.operands[0].type != X86_OP_IMM ||
        (cs_target != target &&
         static_cast<std::uint32_t>(cs_target) != static_cast<std::uint32_t>(target)))
      return refuse(why, "cannot decode the branch target", out);
    out.cls = cls;
    return true;
  };

  // int3 with prefixes, int 3, int1: traps that would be taken for ours.
  if (op == 0xcc) return trap(why, "an existing breakpoint (int3)");
  if (op == 0xcd && op2 == 0x03) return trap(why, "an existing breakpoint (int 3)");
  if (op == 0xf1) return trap(why, "a debug trap (int1)");

  // nops
  if (op == 0x90 && !rex_b && plain && len == o + 1) {
    out.cls = InsnClass::nop;  // 90, 66 90, 48 90 (not 41 90 = xchg r8d, eax; not f3 90 = pause)
    return true;
  }
  if (op == 0x0f && op2 == 0x1f && plain && o + 2 < len && ((b[o + 2] >> 3) & 7) == 0 &&
      ci->id == X86_INS_NOP) {
    out.cls = InsnClass::nop;  // 0f 1f /0: the multi-byte nops
    return true;
  }
  if (len == 4 && b[0] == 0xf3 && b[1] == 0x0f && b[2] == 0x1e && (b[3] == 0xfa || b[3] == 0xfb)) {
    out.cls = InsnClass::nop;  // endbr64, endbr32
    return true;
  }

  // push r64 (50+r, ff /6 with a register operand); push r16 runs out of line
  if (op >= 0x50 && op <= 0x57 && len == o + 1) {
    if (p.opsize || !plain) return true;
    out.reg = static_cast<std::uint8_t>((op & 7) | (rex_b ? 8 : 0));
    out.cls = InsnClass::push_reg;
    return true;
  }
  if (op == 0xff && (op2 & 0xc0) == 0xc0 && ((op2 >> 3) & 7) == 6 && len == o + 2) {
    if (p.opsize || !plain) return true;
    out.reg = static_cast<std::uint8_t>((op2 & 7) | (rex_b ? 8 : 0));
    out.cls = InsnClass::push_reg;
    return true;
  }

  // relative branches
  if (op == 0xeb) return relative(InsnClass::jmp_rel, 1);
  if (op == 0xe9) return relative(InsnClass::jmp_rel, 4);
  if (op == 0xe8) return relative(InsnClass::call_rel, 4);
  if (op >= 0x70 && op <= 0x7f) {
    out.cond = op & 0x0f;
    return relative(InsnClass::jcc_rel, 1);
  }
  if (op == 0x0f && op2 >= 0x80 && op2 <= 0x8f) {
    out.cond = op2 & 0x0f;
    return relative(InsnClass::jcc_rel, 4);
  }
  if (op >= 0xe0 && op <= 0xe3) {
    static constexpr std::uint8_t kRcx[4] = {2, 1, 0, 3};  // loopne, loope, loop, jrcxz
    static constexpr std::uint8_t kEcx[4] = {7, 6, 5, 4};  // the same counting in ecx
    out.cond = p.addrsize ? kEcx[op - 0xe0] : kRcx[op - 0xe0];
    return relative(InsnClass::loop_rel, 1);
  }

  // returns
  if (op == 0xc3 || op == 0xc2) {
    if (len != o + (op == 0xc2 ? 3 : 1)) return refuse(why, "cannot decode ret", out);
    if (p.opsize) return refuse(why, "operand-size override on ret", out);
    if (p.lock) return refuse(why, "lock prefix on ret", out);
    if (op == 0xc2) {
      out.imm = static_cast<std::uint16_t>(b[o + 1] | (b[o + 2] << 8));
      out.cls = InsnClass::ret_imm;
    } else {
      out.cls = InsnClass::ret;
    }
    return true;
  }
  if (op == 0xcb || op == 0xca) return refuse(why, "far ret", out);
  if (op == 0xcf) return refuse(why, "iret", out);

  // indirect branches
  if (op == 0xff && o + 1 < len) {
    const unsigned ext = (op2 >> 3) & 7;
    if (ext == 3 || ext == 5) return refuse(why, "far indirect branch", out);
    if (ext == 2 || ext == 4) {
      if (p.lock) return refuse(why, "lock prefix on a branch", out);
      return classify_indirect(x, p, ext == 2 ? InsnClass::call_ind : InsnClass::jmp_ind, out, why);
    }
  }
  if (op == 0xc7 && op2 == 0xf8) return refuse(why, "xbegin (branches relative to rip)", out);
  return true;  // xol
}

/// analyze() without the memo.
bool analyze_bytes(const std::uint8_t* code, std::size_t avail, Insn& out, std::string& why) {
  out = Insn{};
  why.clear();
  if (code == nullptr || avail == 0) {
    why = "no instruction bytes";
    return false;
  }
  const std::size_t n = avail < kMaxInsnLen ? avail : kMaxInsnLen;
  std::memcpy(out.bytes, code, n);
  if (code[0] == kBreakpoint) {
    why = "an existing breakpoint (int3)";
    return false;
  }
  capstone::DetailDecoder& dec = capstone::detail_decoder();
  const cs_insn* ci = dec.decode(code, n);
  if (ci == nullptr || ci->detail == nullptr) {
    why = dec.handle() == 0 ? "Capstone's decoder cannot be opened (out of memory)"
                            : "undecodable bytes " + hex_bytes(code, n < 8 ? n : 8);
    return false;
  }
  out.len = static_cast<std::uint8_t>(ci->size);
  std::memset(out.bytes + out.len, 0, sizeof out.bytes - out.len);
  out.text = ci->mnemonic;
  if (ci->op_str[0] != '\0') {
    out.text += ' ';
    out.text += ci->op_str;
  }

  const Prefixes p = parse_prefixes(out.bytes, out.len);
  if (!classify(ci, p, out, why)) return false;
  switch (ci->id) {
    case X86_INS_SYSCALL:
    case X86_INS_SYSENTER:
    case X86_INS_INT:
    case X86_INS_INTO:
    case X86_INS_UD2:
    case X86_INS_UD0:
    case X86_INS_UD2B:
    case X86_INS_HLT:
      out.traps = true;
      break;
    default:
      out.traps = has_group(ci->detail, CS_GRP_INT);
  }

  const cs_x86& x = ci->detail->x86;
  // The rip-relative memory operand, for every class (a nop or an indirect
  // branch may have one too; the XOL builder only needs it for xol).
  const cs_x86_op* rip_op = rip_mem_operand(x);
  if (rip_op != nullptr && !out.rip_relative && !record_rip_relative(x, *rip_op, out, why))
    return false;
  if (out.cls != InsnClass::xol) return true;

  // Out of line: nothing may depend on rip but a rip-relative memory operand.
  const cs_detail* d = ci->detail;
  if (has_group(d, CS_GRP_JUMP) || has_group(d, CS_GRP_CALL) || has_group(d, CS_GRP_RET) ||
      has_group(d, CS_GRP_IRET) || has_group(d, CS_GRP_BRANCH_RELATIVE))
    return refuse(why, "a branch that can be neither emulated nor run out of line", out);
  // Cross-check Capstone's operands with the ModR/M byte: mod=00 rm=101 is
  // rip-relative in 64-bit mode.
  const std::size_t modrm_at = x.encoding.modrm_offset;
  if (modrm_at != 0 && modrm_at < out.len && (out.bytes[modrm_at] & 0xc7) == 0x05 &&
      rip_op == nullptr)
    return refuse(why, "cannot decode the rip-relative operand", out);
  if (rip_op == nullptr && regs_access_rip(dec.handle(), ci))
    return refuse(why, "reads or writes rip", out);
  return true;
}

}  // namespace

bool analyze(const std::uint8_t* code, std::size_t avail, Insn& out, std::string& why) {
  // The analysis depends only on the instruction's own bytes (decoded at
  // address 0, operands kept relative), and attaching a library's entries
  // analyzes the same few instructions (endbr64, push %rbp, ...) again and
  // again: each accepted instruction is kept by its bytes, which no longer
  // instruction can start with (a decoder reads an instruction's bytes to
  // its end and stops), so at most one length matches.
  // (Per thread: thread_object(), no dynamic-linker lock at a thread's first call.)
  struct Memo {
    std::unordered_map<std::string, Insn> by_bytes;
    std::uint16_t lengths[256] = {};  // first byte -> bit l: a kept instruction of l bytes starts with it
  };
  Memo& m = uprobe::detail::thread_object<Memo>();
  std::unordered_map<std::string, Insn>& memo = m.by_bytes;
  std::uint16_t (&lengths)[256] = m.lengths;
  if (code != nullptr && avail != 0 && code[0] != kBreakpoint) {
    const std::size_t n = avail < kMaxInsnLen ? avail : kMaxInsnLen;
    std::string key;
    for (std::size_t len = 1; len <= n; ++len) {
      if (!(lengths[code[0]] & (1u << len))) continue;
      key.assign(reinterpret_cast<const char*>(code), len);
      if (auto it = memo.find(key); it != memo.end()) {
        out = it->second;
        why.clear();
        return true;
      }
    }
  }
  if (!analyze_bytes(code, avail, out, why)) return false;
  out.ops = &xol_ops_for(out);  // (the kernel's arch_uprobe_analyze_insn() choosing auprobe->ops)
  if (memo.size() >= 4096) {
    memo.clear();
    std::memset(lengths, 0, sizeof lengths);
  }
  memo.emplace(std::string(reinterpret_cast<const char*>(out.bytes), out.len), out);
  lengths[out.bytes[0]] |= static_cast<std::uint16_t>(1u << out.len);
  return true;
}

}  // namespace uprobe::arch
