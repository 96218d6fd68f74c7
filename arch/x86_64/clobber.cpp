// SPDX-License-Identifier: MIT
/// @file clobber.cpp
/// What a consumer's code can change of the vector state (analyze_clobbers()),
/// read from its instructions at registration: the kernel saves nothing of
/// the vector state for its handlers, and libuprobe saves only what an
/// ordinary consumer can clobber. Every path from the entry points is
/// followed (both ways of a conditional branch, direct jumps, direct calls
/// into their callees, until each path returns); the answer is "known" only
/// when every instruction on them is understood and none can touch more than
/// the low 128 bits of xmm0-15 and the MXCSR's status flags: legacy SSE
/// instructions (which leave the upper halves of ymm/zmm alone), general
/// registers, memory, system calls. Anything else makes it unknown, and the
/// caller saves everything the site makes live (call_preserving()): a VEX,
/// EVEX or XOP instruction (they zero the upper halves, reach ymm/zmm/k),
/// x87 and MMX, an MXCSR or x87 control load, xsave/xrstor/fxrstor, an
/// indirect jump or call (a PLT stub, a switch's table, a virtual call: code
/// not read here), a far transfer, RTM, too much code. Classification from
/// the raw prefix and opcode bytes first, then Capstone's operands and
/// register accesses (any vector register named, read or written, counts as
/// clobbered). Not on the hot path: Capstone allocates.

#include <capstone/capstone.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "arch.hpp"
#include "capstone_lib.hpp"

namespace uprobe::arch {
namespace {

constexpr std::size_t kMaxInstructions = 16384;  ///< over every path of every entry point
constexpr std::size_t kMaxFunctions = 256;       ///< entry points and direct callees

/// The raw bytes' verdict on one instruction.
enum class Next { fall, unknown };

/// Next::unknown for an encoding or an opcode the analysis does not follow
/// (the file comment; ud2 and hlt too: a signal handler may resume past
/// them); else fall (the operands decide).
Next raw_class(const std::uint8_t* b, std::size_t len) {
  // Legacy prefixes and REX bytes in any order (a REX before a legacy
  // prefix is ignored by the CPU, which then decodes what follows: `40 2e c5
  // ...` is a VEX instruction), up to the opcode.
  std::size_t i = 0;
  bool f3 = false;
  for (; i < len; ++i) {
    const std::uint8_t c = b[i];
    if (c == 0x66 || c == 0x67 || c == 0xf0 || c == 0xf2 || c == 0x2e || c == 0x36 || c == 0x3e || c == 0x26 ||
        c == 0x64 || c == 0x65 || (c & 0xf0) == 0x40)
      continue;
    if (c == 0xf3) {
      f3 = true;
      continue;
    }
    break;
  }
  if (i >= len) return Next::unknown;
  const std::uint8_t op = b[i];
  if (op == 0xc4 || op == 0xc5 || op == 0x62) return Next::unknown;  // VEX, EVEX (64-bit mode)
  if (op == 0x8f && i + 1 < len && ((b[i + 1] >> 3) & 7) != 0) return Next::unknown;  // XOP
  if ((op >= 0xd8 && op <= 0xdf) || op == 0x9b) return Next::unknown;  // x87, fwait
  if (op == 0xf4) return Next::unknown;                                // hlt
  if (op == 0xf1) return Next::unknown;                                // icebp
  if (op == 0xc7 && i + 1 < len && b[i + 1] == 0xf8) return Next::unknown;  // xbegin
  if (op != 0x0f) return Next::fall;
  if (i + 1 >= len) return Next::unknown;
  const std::uint8_t op1 = b[i + 1];
  if (op1 == 0x0b) return Next::unknown;  // ud2 (a SIGILL handler may resume past it)
  if (op1 == 0x77 || op1 == 0x0e || op1 == 0x0f) return Next::unknown;  // emms, femms, 3DNow!
  if (op1 == 0xae || op1 == 0xc7 || op1 == 0x01) {
    if (i + 2 >= len) return Next::unknown;
    const std::uint8_t modrm = b[i + 2];
    const unsigned reg = (modrm >> 3) & 7, mod = modrm >> 6;
    if (op1 == 0xae) {
      // fxsave, fxrstor, ldmxcsr, xsave, xrstor, xsaveopt; stmxcsr (/3) and
      // clflush (/7) only read; the register forms are fences, or (with f3)
      // rd/wr fs/gs base.
      if (mod != 3 && reg != 3 && reg != 7) return Next::unknown;
      if (mod == 3 && f3) return Next::unknown;
    }
    if (op1 == 0xc7 && mod != 3 && (reg == 3 || reg == 4 || reg == 5)) return Next::unknown;  // xrstors, xsavec, xsaves
    if (op1 == 0x01 && (modrm == 0xd1 || modrm == 0xef)) return Next::unknown;  // xsetbv, wrpkru
  }
  return Next::fall;
}

/// Adds the vector register `r` to `mask` (xmm0-15); false for a register the
/// analysis does not allow (ymm, zmm, xmm16-31, k, mm, st, the x87 status).
bool note_register(unsigned r, std::uint32_t& mask) {
  if (r >= X86_REG_XMM0 && r <= X86_REG_XMM15) {
    mask |= 1u << (r - X86_REG_XMM0);
    return true;
  }
  if (r >= X86_REG_XMM16 && r <= X86_REG_XMM31) return false;
  if (r >= X86_REG_YMM0 && r <= X86_REG_YMM31) return false;
  if (r >= X86_REG_ZMM0 && r <= X86_REG_ZMM31) return false;
  if (r >= X86_REG_K0 && r <= X86_REG_K7) return false;
  if (r >= X86_REG_MM0 && r <= X86_REG_MM7) return false;
  if (r >= X86_REG_ST0 && r <= X86_REG_ST7) return false;
  if (r >= X86_REG_FP0 && r <= X86_REG_FP7) return false;
  if (r == X86_REG_FPSW) return false;
  return true;
}

bool in_group(const cs_insn* ci, std::uint8_t g) {
  const cs_detail* d = ci->detail;
  return std::find(d->groups, d->groups + d->groups_count, g) != d->groups + d->groups_count;
}

}  // namespace

namespace {

constexpr std::int64_t kUnknownDepth = INT64_MIN;

/// Where a path is: the instruction, the bytes below the function's entry
/// stack pointer (its return address is at rsp + depth), and rbp as such a
/// depth when it holds a copy of rsp (kUnknownDepth otherwise).
struct At {
  std::uint64_t addr;
  std::int64_t depth;
  std::int64_t rbp;
};

bool is_rsp(unsigned r) { return r == X86_REG_RSP || r == X86_REG_ESP || r == X86_REG_SP || r == X86_REG_SPL; }
bool is_rbp(unsigned r) { return r == X86_REG_RBP || r == X86_REG_EBP || r == X86_REG_BP || r == X86_REG_BPL; }

bool writes(const std::uint16_t* regs, std::uint8_t n, bool (*which)(unsigned)) {
  for (std::uint8_t k = 0; k < n; ++k)
    if (which(regs[k])) return true;
  return false;
}

/// Whether [at, at + size) overlaps the 8 bytes of the return address at `slot`.
bool overlaps_slot(std::int64_t at, std::int64_t size, std::int64_t slot) { return at < slot + 8 && slot < at + size; }

}  // namespace

Clobbers analyze_clobbers(const std::vector<const void*>& entries, const CodeReader& read,
                          std::vector<std::pair<std::uint64_t, std::uint64_t>>* read_ranges) noexcept {
  Clobbers unknown;  // (known = false)
  if (read_ranges) read_ranges->clear();
  try {
    capstone::DetailDecoder& h = capstone::detail_decoder();  // (the thread's: registration time)
    std::vector<At> work;
    std::unordered_map<std::uint64_t, std::pair<std::int64_t, std::int64_t>> seen;  // addr -> (depth, rbp)
    std::unordered_set<std::uint64_t> functions;
    for (const void* e : entries) {
      const auto a = reinterpret_cast<std::uint64_t>(e);
      if (a == 0) return unknown;
      if (functions.insert(a).second) work.push_back({a, 0, kUnknownDepth});
    }
    std::uint32_t mask = 0;
    std::size_t count = 0;
    while (!work.empty()) {
      At at = work.back();
      work.pop_back();
      for (;;) {
        // A path meets one already read: with the same stack, nothing new;
        // with another, the stack cannot be followed (unknown).
        const auto [it, fresh] = seen.try_emplace(at.addr, at.depth, at.rbp);
        if (!fresh) {
          if (it->second.first != at.depth) return unknown;
          if (it->second.second != at.rbp) it->second.second = kUnknownDepth;  // (checked less from here)
          break;
        }
        if (++count > kMaxInstructions) return unknown;
        std::uint8_t b[16];
        const std::size_t got = read(at.addr, b, 15);
        if (got == 0) return unknown;
        const cs_insn* ci = h.decode(b, got, at.addr);
        if (!ci || ci->size == 0 || ci->size > got) return unknown;
        if (read_ranges) read_ranges->emplace_back(at.addr, at.addr + ci->size);
        const Next raw = raw_class(ci->bytes, ci->size);
        if (raw == Next::unknown) return unknown;
        // (Every VEX/EVEX/XOP instruction and k-register one has a mnemonic
        // starting with v or k, whatever its prefixes: a second guard.)
        if (ci->mnemonic[0] == 'v' || ci->mnemonic[0] == 'k') return unknown;
        const cs_detail* d = ci->detail;
        const cs_x86& x = d->x86;
        if (ci->id == X86_INS_PCMPISTRM || ci->id == X86_INS_PCMPESTRM) mask |= 1;  // writes xmm0 implicitly
        for (std::uint8_t k = 0; k < x.op_count; ++k) {
          const cs_x86_op& o = x.operands[k];
          if (o.type == X86_OP_REG && !note_register(o.reg, mask)) return unknown;
          if (o.type != X86_OP_MEM) continue;
          if (!note_register(o.mem.base, mask) || !note_register(o.mem.index, mask)) return unknown;
          // The return address: a store there (or any other access but a
          // plain load) makes the `ret` an indirect jump (a retpoline thunk,
          // `mov %rax, (%rsp); ret`).
          const bool load = ci->id == X86_INS_MOV && k == 1 && x.operands[0].type == X86_OP_REG;
          if (load || o.mem.index != X86_REG_INVALID) continue;
          if (is_rsp(o.mem.base)) {
            if (at.depth == kUnknownDepth) {
              if (o.access & CS_AC_WRITE) return unknown;
            } else if (overlaps_slot(o.mem.disp, o.size ? o.size : 8, at.depth)) {
              return unknown;
            }
          } else if (is_rbp(o.mem.base) && at.rbp != kUnknownDepth &&
                     overlaps_slot(o.mem.disp, o.size ? o.size : 8, at.rbp)) {
            return unknown;
          }
        }
        cs_regs rd, wr;
        std::uint8_t nrd = 0, nwr = 0;
        if (capstone::regs_access(h.handle(), ci, rd, &nrd, wr, &nwr) != CS_ERR_OK) return unknown;
        for (std::uint8_t k = 0; k < nrd; ++k)
          if (!note_register(rd[k], mask)) return unknown;
        for (std::uint8_t k = 0; k < nwr; ++k)
          if (!note_register(wr[k], mask)) return unknown;
        const std::uint64_t next = at.addr + ci->size;
        if (in_group(ci, X86_GRP_IRET) || in_group(ci, X86_GRP_PRIVILEGE)) return unknown;
        if (in_group(ci, X86_GRP_RET)) {
          if (at.depth != 0) return unknown;  // (`push %rax; ret`: a jump, not a return)
          break;
        }
        // int3 may be a breakpoint written into this code (a probe on the
        // consumer's own code): what it replaced is not read here.
        if (in_group(ci, X86_GRP_INT) && ci->id != X86_INS_SYSCALL) return unknown;
        // The stack: what moves rsp and rbp.
        const bool imm1 = x.op_count == 2 && x.operands[1].type == X86_OP_IMM;
        const bool dst_rsp = x.op_count >= 1 && x.operands[0].type == X86_OP_REG && is_rsp(x.operands[0].reg);
        const bool dst_rbp = x.op_count >= 1 && x.operands[0].type == X86_OP_REG && is_rbp(x.operands[0].reg);
        auto add_depth = [&](std::int64_t n) {
          if (at.depth != kUnknownDepth) at.depth += n;
        };
        switch (ci->id) {
          case X86_INS_PUSH:
          case X86_INS_PUSHFQ:
            if (x.prefix[2] == 0x66) return unknown;  // (a 2-byte push)
            add_depth(8);
            break;
          case X86_INS_POP:
          case X86_INS_POPFQ:
            if (x.prefix[2] == 0x66 || dst_rsp) return unknown;
            if (dst_rbp) at.rbp = kUnknownDepth;
            add_depth(-8);
            break;
          case X86_INS_SUB:
          case X86_INS_ADD:
            if (dst_rsp) {
              if (!imm1) return unknown;
              add_depth(ci->id == X86_INS_SUB ? x.operands[1].imm : -x.operands[1].imm);
            } else if (dst_rbp) {
              at.rbp = kUnknownDepth;
            }
            break;
          case X86_INS_LEA:
            if (dst_rsp || dst_rbp) {
              const cs_x86_op& m = x.operands[1];
              std::int64_t v = kUnknownDepth;
              if (m.mem.index == X86_REG_INVALID && is_rsp(m.mem.base) && at.depth != kUnknownDepth)
                v = at.depth - m.mem.disp;
              else if (m.mem.index == X86_REG_INVALID && is_rbp(m.mem.base) && at.rbp != kUnknownDepth)
                v = at.rbp - m.mem.disp;
              if (dst_rsp) at.depth = v;
              else at.rbp = v;
            }
            break;
          case X86_INS_MOV:
            if ((dst_rsp || dst_rbp) && x.operands[1].type == X86_OP_REG) {
              const unsigned src = x.operands[1].reg;
              const std::int64_t v = is_rsp(src) ? at.depth : is_rbp(src) ? at.rbp : kUnknownDepth;
              if (dst_rsp) at.depth = v;
              else at.rbp = v;
            } else if (dst_rsp || dst_rbp) {
              (dst_rsp ? at.depth : at.rbp) = kUnknownDepth;
            }
            break;
          case X86_INS_LEAVE:
            at.depth = at.rbp == kUnknownDepth ? kUnknownDepth : at.rbp - 8;
            at.rbp = kUnknownDepth;
            break;
          case X86_INS_ENTER:
            return unknown;
          default:
            if (!in_group(ci, X86_GRP_CALL)) {
              if (writes(wr, nwr, is_rsp)) at.depth = kUnknownDepth;  // (and $-16, %rsp: until leave)
              if (writes(wr, nwr, is_rbp)) at.rbp = kUnknownDepth;
            }
            break;
        }
        const bool jump = in_group(ci, X86_GRP_JUMP), call = in_group(ci, X86_GRP_CALL);
        if (jump || call) {
          if (ci->id == X86_INS_LJMP || ci->id == X86_INS_LCALL) return unknown;
          if (x.op_count != 1 || x.operands[0].type != X86_OP_IMM) return unknown;  // indirect
          const auto target = static_cast<std::uint64_t>(x.operands[0].imm);
          if (call) {
            if (functions.insert(target).second) {
              if (functions.size() > kMaxFunctions) return unknown;
              work.push_back({target, 0, kUnknownDepth});
            }
          } else {
            work.push_back({target, at.depth, at.rbp});
            if (ci->id == X86_INS_JMP) break;  // unconditional: no fall-through
          }
        }
        at.addr = next;
      }
    }
    if (read_ranges) {  // merged: adjacent instructions make one range
      std::sort(read_ranges->begin(), read_ranges->end());
      std::vector<std::pair<std::uint64_t, std::uint64_t>> merged;
      for (const auto& r : *read_ranges) {
        if (!merged.empty() && r.first <= merged.back().second) merged.back().second = std::max(merged.back().second, r.second);
        else merged.push_back(r);
      }
      *read_ranges = std::move(merged);
    }
    Clobbers c;
    c.known = true;
    c.xmm = static_cast<std::uint8_t>(mask ? 32 - __builtin_clz(mask) : 0);
    return c;
  } catch (...) {
    return unknown;
  }
}

}  // namespace uprobe::arch
