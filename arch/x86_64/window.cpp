// SPDX-License-Identifier: MIT
/// @file window.cpp
/// Optimized function-entry probes: which first instructions of a function
/// the 5-byte jump may displace (beyond the kernel, which optimizes only nop5
/// sites; the same checks as its x86 kprobes optimizer, can_optimize() in
/// arch/x86/kernel/kprobes/opt.c), and their relocated copy. Not hot.

#include <emmintrin.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <memory>

#include "arch.hpp"
#include "why.hpp"
#include "sweep.hpp"

namespace uprobe::arch {
namespace {

using why::hex;
using why::refuse;

/// Calls `visit(end, rel)` for each target `end + rel` that an instruction
/// with its opcode byte at `p` could have as one of the forms branch_info()
/// and lea_rip_target() read (see may_reach_window()), until `visit` returns
/// true; returns whether it did. `end` may lie past `size` (the visitor
/// decides). Operands past the end read as 0.
template <typename Visit>
bool branch_form_targets(const std::uint8_t* f, std::size_t size, std::size_t p, Visit&& visit) {
  auto i8 = [&](std::size_t at) { return at < size ? static_cast<std::int64_t>(static_cast<std::int8_t>(f[at])) : 0; };
  auto i16 = [&](std::size_t at) {
    if (at + 2 > size) return std::int64_t{0};
    std::int16_t v;
    std::memcpy(&v, f + at, 2);
    return static_cast<std::int64_t>(v);
  };
  auto i32 = [&](std::size_t at) {
    if (at + 4 > size) return std::int64_t{0};
    std::int32_t v;
    std::memcpy(&v, f + at, 4);
    return static_cast<std::int64_t>(v);
  };
  // A relative branch whose displacement starts at `at` (rel32 form ending at at + 4).
  auto relz = [&](std::size_t at) {
    return visit(at + 4, i32(at)) || visit(at + 2, i16(at)) || visit(at + 4, i16(at + 2));
  };
  const std::uint8_t op = f[p];
  const std::uint8_t op2 = p + 1 < size ? f[p + 1] : 0;
  if ((op >= 0x70 && op <= 0x7f) || op == 0xeb || (op >= 0xe0 && op <= 0xe3)) return visit(p + 2, i8(p + 1));
  if (op == 0xe8 || op == 0xe9) return relz(p + 1);
  if ((op == 0x0f && op2 >= 0x80 && op2 <= 0x8f) || (op == 0xc7 && op2 == 0xf8)) return relz(p + 2);
  if (op == 0x8d && (op2 & 0xc7) == 0x05) return visit(p + 6, i32(p + 2));
  return false;
}

/// True when some instruction with its opcode byte at `p` could be a direct
/// branch, or a `lea disp32(%rip)`, whose target lies in (win, win + len):
/// every form branch_info() and lea_rip_target() read, with each operand size
/// a decoder may give it (rel8; rel32; rel16 right after the opcode, or in the
/// last two bytes of a rel32-sized instruction, as branch_info() reads a
/// 66-prefixed one). Prefixes never move the end of an instruction relative
/// to its opcode, so they need not be known. `win` is the window's first
/// byte relative to `f` (0 for the window's own function; outside [0, size)
/// for a neighbour).
bool may_reach_window(const std::uint8_t* f, std::size_t size, std::size_t p, std::int64_t win, std::size_t len) {
  return branch_form_targets(f, size, p, [&](std::size_t end, std::int64_t rel) {
    if (end > size) return false;
    const std::int64_t t = static_cast<std::int64_t>(end) + rel;
    return t > win && t < win + static_cast<std::int64_t>(len);
  });
}

/// Refuses a direct branch into bytes 1 .. len-1 of the window, or an
/// address taken there, anywhere in the function `func` [0, size), swept
/// from its own first byte; the window starts at `win` relative to `func`
/// (0: the window's own function; else a neighbour). First a scan of every
/// byte as a possible opcode (whatever the instruction boundaries: an answer
/// of "none" holds for any decoding), which clears most functions at about a
/// nanosecond per byte; then, only when some byte could be such an
/// instruction, the linear sweep with Capstone from the entry up to the last
/// of those bytes tells whether it is one (an instruction start whose
/// decoded branch aims there). Attaching every entry of a library made the
/// whole-function sweep the largest cost of an attach (~25 us per function).
bool check_function(const std::uint8_t* func, std::size_t size, std::int64_t win, std::size_t len, std::string& why,
                    bool own = true) {
  // The first bytes of the forms may_reach_window() reads; far from the
  // window (a rel8 reaches 128 bytes back) only those with a wider operand.
  static constexpr auto kWide = [] {
    std::array<bool, 256> t{};
    for (int b : {0xe8, 0xe9, 0x0f, 0xc7, 0x8d}) t[b] = true;
    return t;
  }();
  static constexpr auto kAny = [] {
    std::array<bool, 256> t = kWide;
    for (int b = 0x70; b <= 0x7f; ++b) t[b] = true;
    for (int b = 0xe0; b <= 0xe3; ++b) t[b] = true;
    t[0xeb] = true;
    return t;
  }();
  const auto clamp = [size](std::int64_t v) {
    return static_cast<std::size_t>(std::clamp<std::int64_t>(v, 0, static_cast<std::int64_t>(size)));
  };
  const std::size_t near_lo = clamp(win - 130), near_hi = clamp(win + static_cast<std::int64_t>(len) + 130);
  std::size_t last = size;  // the last byte that may start such an instruction, size = none
  // 16 bytes at a time (SSE2), last block first: the positions of those
  // first bytes (all forms near the window, the wide ones beyond), then the
  // exact check at each, last first.
  auto splat = [](int b) { return _mm_set1_epi8(static_cast<char>(b)); };
  const __m128i wide[5] = {splat(0xe8), splat(0xe9), splat(0x0f), splat(0xc7), splat(0x8d)};
  const __m128i hi4 = splat(0xf0), hi6 = splat(0xfc), jcc8 = splat(0x70), jcxz = splat(0xe0), jmp8 = splat(0xeb);
  auto scan = [&](std::size_t lo, std::size_t hi, bool any) {
    for (std::size_t end = hi; end > lo && last == size;) {
      const std::size_t start = end - lo >= 16 ? end - 16 : lo;
      unsigned mask = 0;
      if (end - start == 16) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(func + start));
        __m128i m = _mm_cmpeq_epi8(v, wide[0]);
        for (int k = 1; k < 5; ++k) m = _mm_or_si128(m, _mm_cmpeq_epi8(v, wide[k]));
        if (any)  // 70-7f, e0-e3, eb
          m = _mm_or_si128(_mm_or_si128(m, _mm_cmpeq_epi8(_mm_and_si128(v, hi4), jcc8)),
                           _mm_or_si128(_mm_cmpeq_epi8(_mm_and_si128(v, hi6), jcxz), _mm_cmpeq_epi8(v, jmp8)));
        mask = static_cast<unsigned>(_mm_movemask_epi8(m));
      } else {
        for (std::size_t i = 0; i < end - start; ++i)
          if ((any ? kAny : kWide)[func[start + i]]) mask |= 1u << i;
      }
      for (; mask; mask &= ~(1u << (31 - __builtin_clz(mask)))) {
        const std::size_t p = start + static_cast<std::size_t>(31 - __builtin_clz(mask));
        if (may_reach_window(func, size, p, win, len)) {
          last = p;
          break;
        }
      }
      end = start;
    }
  };
  scan(near_hi, size, false);
  scan(near_lo, near_hi, true);
  scan(0, near_lo, false);
  if (last == size) return true;
  const auto inside = [&](std::uint64_t target) {
    const auto t = static_cast<std::int64_t>(target);
    return t > win && t < win + static_cast<std::int64_t>(len);
  };
  const auto shown = [&](std::uint64_t target) {
    // Relative to the function for its own window, else to the window.
    const auto t = static_cast<std::int64_t>(target) - (own ? 0 : win);
    std::string out = own ? "+" : "the window's +";
    out += hex(static_cast<std::uint64_t>(t));
    return out;
  };
  if (!sweep_available()) return refuse(why, "cannot open the disassembler");
  const auto text = [&](std::uint64_t start) { return sweep_text(func + start, size - start, start); };
  for (std::uint64_t at = 0; at < size && at <= last;) {
    const std::uint64_t start = at;
    const SweepStep st = sweep_step(func + start, size - start, true);
    if (!st.len)
      return refuse(why, "the function cannot be disassembled to its end (undecodable bytes at +" + hex(start) +
                             "), so branches into the displaced bytes cannot be ruled out");
    at += st.len;
    // An address taken inside the window (lea L(%rip) of a label there, for
    // a computed goto or a hand-made jump table): an indirect jump may land
    // in the middle of the jump.
    if (st.lea) {
      std::uint64_t target = 0;
      if (lea_rip_target(func + start, st.len, at, target) && inside(target))
        return refuse(why, "the instruction at +" + hex(start) + " (" + text(start) + ") takes the address " +
                               shown(target) + ", inside the " + std::to_string(len) +
                               " bytes the jump displaces (an indirect jump may land there)");
    }
    const BranchInfo bi = st.branch ? branch_info(func + start, st.len) : BranchInfo{};
    if (bi.relative) {
      const std::uint64_t target = at + static_cast<std::uint64_t>(bi.rel);
      if (inside(target))
        return refuse(why, "the instruction at +" + hex(start) + " (" + text(start) + ") branches to " +
                               shown(target) + ", inside the " + std::to_string(len) + " bytes the jump displaces");
    }
  }
  return true;
}

/// Whether `insn`, at +`at` in its function, may be displaced into a
/// window slot: `last` when it is the window's last instruction,
/// `before_padding` when it is the function's last, with filler after it.
bool displaceable(const Insn& insn, std::size_t at, bool last, bool before_padding, std::string& why) {
  if (insn.traps)
    return refuse(why, "the instruction `" + insn.text + "` at +" + hex(at) +
                           " enters the kernel or traps; it cannot run displaced");
  switch (insn.cls) {
    case InsnClass::nop:
    case InsnClass::push_reg:
    case InsnClass::xol:
      return true;
    case InsnClass::jmp_rel:
    case InsnClass::jcc_rel:
      // Re-encoded with a rel32 from the slot; a taken branch leaves the
      // window, a not-taken Jcc goes on with the next relocated instruction.
      return true;
    case InsnClass::call_rel:
    case InsnClass::call_ind:
    case InsnClass::jmp_ind:
      // The callee would return into the window, or the rest is dead.
      if (!last && !(insn.cls == InsnClass::jmp_ind && before_padding))
        return refuse(why, "the branch `" + insn.text + "` at +" + hex(at) + " is inside the 5 bytes the jump displaces");
      return true;
    case InsnClass::ret:
    case InsnClass::ret_imm:
      // Runs from the slot as it would here; nothing after it runs.
      if (!last && !before_padding)
        return refuse(why, "the instruction `" + insn.text + "` at +" + hex(at) +
                               " cannot be displaced (a return before the last displaced byte)");
      return true;
    default:
      return refuse(why, "the instruction `" + insn.text + "` at +" + hex(at) +
                             " cannot be displaced (a loop or indirect call)");
  }
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

/// An indirect call (`call *reg`, `call *mem`, ff /2), the window's last
/// instruction, relocated into `buf` at `n` (the slot at `slot`, the call
/// originally at `orig`): the callee must see the original return address
/// (orig + len), so the call becomes
///   push <its operand>        ff /6, the same operand: the target on the stack
///                             (a memory operand faults here, before any state
///                             changes, as the call would; an rsp base is read
///                             before the decrement, as the call reads it)
///   push (%rsp)               the target again, 8 bytes lower
///   movl $lo32, 8(%rsp)       the first slot becomes the return address
///   movl $hi32, 12(%rsp)
///   lea 8(%rsp), %rsp         rsp as after the call
///   jmp *-8(%rsp)             to the target
/// No register and no flag changes; the target is left in the quadword
/// below the new rsp (the callee's dead stack, inside the red zone no signal
/// frame overwrites). Prefixes other than REX (branch hints, notrack, bnd:
/// meaningful only to the branch) are dropped.
bool relocate_call_ind(const Insn& insn, std::uint64_t orig, std::uint64_t slot, std::uint8_t* buf, std::size_t& n,
                       std::string& why) {
  std::size_t o = 0;  // the ff opcode byte
  std::uint8_t rex = 0;
  for (; o < insn.len && insn.bytes[o] != 0xff; ++o) {
    const std::uint8_t b = insn.bytes[o];
    if ((b & 0xf0) == 0x40) rex = b;
    else if (b != 0x2e && b != 0x3e && b != 0xf2 && b != 0xf3 && b != 0x26 && b != 0x36)
      return why = "cannot relocate the indirect call `" + insn.text + "` (prefix " + hex(b) + ")", false;
    else rex = 0;  // a REX followed by a legacy prefix is ignored by the CPU: not carried over
  }
  if (o + 1 >= insn.len || ((insn.bytes[o + 1] >> 3) & 7) != 2)
    return why = "cannot relocate the indirect call `" + insn.text + "`", false;
  std::uint8_t push[16];
  std::size_t k = 0;
  if (rex) push[k++] = rex;
  push[k++] = 0xff;
  push[k++] = static_cast<std::uint8_t>((insn.bytes[o + 1] & ~0x38) | (6 << 3));  // ff /6: push r/m64
  const std::size_t rest = insn.len - (o + 2);  // SIB and displacement, unchanged
  std::memcpy(push + k, insn.bytes + o + 2, rest);
  k += rest;
  if (insn.rip_relative) {
    std::int32_t d = 0;
    const std::uint64_t t = rip_target(insn, orig);
    if (!rel32(slot + n + k, t, d))
      return why = "rip-relative target " + hex(t) + " out of reach of the window slot " + hex(slot), false;
    std::memcpy(push + insn.disp_offset - (o + 2) + k - rest, &d, 4);
  }
  n = put(buf, n, push, k);
  const std::uint64_t ret = orig + insn.len;
  const auto lo32 = static_cast<std::uint32_t>(ret), hi32 = static_cast<std::uint32_t>(ret >> 32);
  const std::uint8_t again[3] = {0xff, 0x34, 0x24};                 // push (%rsp)
  const std::uint8_t lo[4] = {0xc7, 0x44, 0x24, 0x08};              // movl $imm32, 8(%rsp)
  const std::uint8_t hi[4] = {0xc7, 0x44, 0x24, 0x0c};              // movl $imm32, 12(%rsp)
  const std::uint8_t lea[5] = {0x48, 0x8d, 0x64, 0x24, 0x08};       // lea 8(%rsp), %rsp
  const std::uint8_t jmp[4] = {0xff, 0x64, 0x24, 0xf8};             // jmp *-8(%rsp)
  n = put(buf, n, again, sizeof again);
  n = put(buf, n, lo, sizeof lo);
  n = put(buf, n, &lo32, 4);
  n = put(buf, n, hi, sizeof hi);
  n = put(buf, n, &hi32, 4);
  n = put(buf, n, lea, sizeof lea);
  n = put(buf, n, jmp, sizeof jmp);
  return true;
}

}  // namespace

bool plan_entry_window(const std::uint8_t* func, std::size_t size, EntryWindow& out, std::string& why,
                       const Insn* first, std::size_t padding) {
  return plan_window(func, size, 0, out, why, first, padding);
}

bool plan_window(const std::uint8_t* func, std::size_t size, std::size_t at, EntryWindow& out, std::string& why,
                 const Insn* first, std::size_t padding) {
  out = EntryWindow{};
  why.clear();
  if (at >= size) return refuse(why, "the site is not inside the function");
  const std::size_t left = size - at;  // the function's bytes from the site on
  // The function ends within the jump's 5 bytes (with the filler after
  // it, when its last instruction never falls through).
  const auto short_fn = [&](bool falls_through) {
    const std::string filler =
        padding == 0 || falls_through ? "" : " with the " + std::to_string(padding) + " filler bytes after it";
    if (at > 0)
      return refuse(why, "the function ends " + std::to_string(left) + (left == 1 ? " byte" : " bytes") +
                             " after the site, within the 5 bytes the jump would displace" + filler);
    return refuse(why, "the function is " + std::to_string(size) + (size == 1 ? " byte" : " bytes") +
                           " long, shorter than the 5-byte jump" + filler);
  };
  if (left + padding < kJumpLen) return short_fn(false);
  std::size_t len = 0;
  bool falls_through = true;  // the last instruction so far may continue to the next byte
  while (len < kJumpLen) {
    if (len == left) {
      // The function ends inside the window: only when its last instruction
      // never falls through may the window cover filler bytes after it.
      if (falls_through || left + padding < kJumpLen) return short_fn(falls_through);
      len = kJumpLen;
      break;
    }
    Insn insn;
    if (len == 0 && first) {
      insn = *first;
    } else if (!analyze(func + at + len, left - len, insn, why)) {
      why = "the instruction at +" + hex(at + len) + " cannot be displaced: " + why;
      return false;
    }
    const bool last = len + insn.len >= kJumpLen;
    // The function's last instruction, with filler bytes after it.
    const bool last_before_padding = len + insn.len == left && padding > 0 && left + padding >= kJumpLen;
    if (!displaceable(insn, at + len, last, last_before_padding, why)) return false;
    if (len + insn.len > left)
      return refuse(why, at ? "the displaced instructions run past the function's end"
                            : "the first instructions run past the function's end");
    falls_through = insn.cls != InsnClass::jmp_rel && insn.cls != InsnClass::jmp_ind && insn.cls != InsnClass::ret &&
                    insn.cls != InsnClass::ret_imm;
    len += insn.len;
    out.insns.push_back(std::move(insn));
  }
  if (!check_function(func, size, static_cast<std::int64_t>(at), len, why)) return false;
  out.len = static_cast<std::uint8_t>(len);
  std::memcpy(out.bytes, func + at, len);
  return true;
}

bool rip_data_refs(const std::uint8_t* func, std::size_t size, std::vector<std::int64_t>& refs, std::string& why) {
  refs.clear();
  why.clear();
  if (!sweep_available()) return refuse(why, "cannot open the disassembler");
  for (std::uint64_t at = 0; at < size;) {
    const std::uint64_t start = at;
    const SweepStep st = sweep_step(func + start, size - start, true);
    if (!st.len)
      return refuse(why, "the function cannot be disassembled to its end (undecodable bytes at +" + hex(start) +
                             "), so the tables its indirect jumps read cannot be found");
    at += st.len;
    std::uint64_t target = 0;
    if (st.lea && lea_rip_target(func + start, st.len, at, target) && target >= size)
      refs.push_back(static_cast<std::int64_t>(target));
  }
  std::sort(refs.begin(), refs.end());
  refs.erase(std::unique(refs.begin(), refs.end()), refs.end());
  return true;
}

bool plan_punned(const std::uint8_t* code, std::size_t avail, const Insn& insn, EntryWindow& out, std::string& why) {
  out = EntryWindow{};
  why.clear();
  if (insn.len >= kJumpLen || avail < kJumpLen) return refuse(why, "no punned jump: the instruction is not shorter than the jump, or the code ends");
  if (!displaceable(insn, 0, true, false, why)) return false;
  out.insns.push_back(insn);
  out.len = static_cast<std::uint8_t>(insn.len);
  out.punned = true;
  // Padded forms (T1): the opcode inside the instruction, the rel32's fixed
  // bytes known.
  out.max_pad = static_cast<std::uint8_t>(std::min({insn.len - std::size_t{1}, avail - kJumpLen, kMaxJumpPad}));
  std::memcpy(out.bytes, code, kJumpLen + out.max_pad);
  return true;
}

bool punned_jump_range(std::uint64_t site, const EntryWindow& w, std::uint64_t& lo, std::uint64_t& hi,
                       std::size_t pad) noexcept {
  if (!w.punned || w.len == 0 || w.len >= kJumpLen || pad > w.max_pad || pad >= w.len) return false;
  // rel32 = bytes[pad + 1 .. pad + 4] little-endian; bytes [pad + 1, len)
  // are free (0 here), bytes [len, pad + 5) fixed; the sign byte
  // (bytes[pad + 4], at or past len) is always fixed.
  std::uint8_t rel[4] = {};
  for (std::size_t i = w.len; i < pad + kJumpLen; ++i) rel[i - pad - 1] = w.bytes[i];
  std::int32_t fixed;
  std::memcpy(&fixed, rel, 4);
  const std::int64_t base = static_cast<std::int64_t>(site + pad + kJumpLen) + fixed;
  const std::int64_t span = std::int64_t{1} << (8 * (w.len - 1 - pad));
  const std::int64_t kLow = 0x10000, kHigh = 0x7ffffffff000;  // user space, above mmap_min_addr
  const std::int64_t l = std::max(base, kLow), h = std::min(base + span, kHigh);
  if (l >= h) return false;
  lo = static_cast<std::uint64_t>(l);
  hi = static_cast<std::uint64_t>(h);
  return true;
}

bool check_neighbour_branches(const std::uint8_t* code, std::size_t size, std::int64_t win, std::size_t len,
                              std::string& why) {
  why.clear();
  return check_function(code, size, win, len, why, false);
}

bool neighbour_branch_targets(const std::uint8_t* f, std::size_t size, std::vector<std::int32_t>& targets) {
  // check_function()'s sweep, to the end, each target it would test
  // recorded instead of tested (int32: a window near `f` is far inside that
  // range; a farther target is kept at its bound, which no window reaches).
  const std::size_t first = targets.size();
  const auto record = [&](std::uint64_t t) {
    const auto v = std::clamp<std::int64_t>(static_cast<std::int64_t>(t), INT32_MIN, INT32_MAX);
    targets.push_back(static_cast<std::int32_t>(v));
  };
  bool whole = true;
  for (std::uint64_t at = 0; at < size;) {
    const std::uint64_t start = at;
    const SweepStep st = sweep_step(f + start, size - start, true);
    if (!st.len) {
      whole = false;
      break;
    }
    at += st.len;
    std::uint64_t target = 0;
    if (st.lea && lea_rip_target(f + start, st.len, at, target)) record(target);
    if (st.branch)
      if (const BranchInfo bi = branch_info(f + start, st.len); bi.relative) record(at + static_cast<std::uint64_t>(bi.rel));
  }
  std::sort(targets.begin() + static_cast<std::ptrdiff_t>(first), targets.end());
  return whole;
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
        // The first store is a push, so an unwritable stack faults before rsp
        // changes, as the call itself would (found by fuzz_xol's window run).
        const std::uint64_t ret = orig + insn.len;
        const auto lo32 = static_cast<std::uint32_t>(ret), hi32 = static_cast<std::uint32_t>(ret >> 32);
        const std::uint8_t push = 0x68;  // push $imm32 (sign-extended: the high half is set next)
        n = put(buf, n, &push, 1);
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
      case InsnClass::call_ind: {
        if (!relocate_call_ind(insn, orig, slot, buf, n, why)) return 0;
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
        ends_in_branch = insn.cls == InsnClass::jmp_ind || insn.cls == InsnClass::ret || insn.cls == InsnClass::ret_imm;
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
      // jmp *pad(%rip) with the quadword 8-byte aligned: the window runs
      // with the site's rflags, and with AC set an unaligned load of the
      // jump target would raise #AC (SIGBUS) in the slot.
      const std::uint8_t jmp_abs[2] = {0xff, 0x25};
      n = put(buf, n, jmp_abs, sizeof jmp_abs);
      const std::int32_t pad = static_cast<std::int32_t>((8 - ((slot + n + 4) & 7)) & 7);
      n = put(buf, n, &pad, 4);
      for (std::int32_t i = 0; i < pad; ++i) n = put(buf, n, &kBreakpoint, 1);
      n = put(buf, n, &back, 8);
    }
  }
  if (n > kWindowSlotSize) return why = "the relocated window does not fit a slot", 0;
  std::memcpy(out, buf, n);
  return n;
}

}  // namespace uprobe::arch

namespace uprobe::arch {

bool plan_evict(const std::uint8_t* code, std::size_t avail, EntryWindow& w, std::string& why) {
  why.clear();
  if (!w.punned || w.len == 0 || w.len >= kJumpLen) return refuse(why, "no punned jump to evict for");
  if (avail <= w.len) return refuse(why, "the code ends after the instruction");
  Insn s;
  if (!analyze(code + w.len, avail - w.len, s, why)) return refuse(why, "its successor: " + why);
  if (!displaceable(s, w.len, true, false, why)) return refuse(why, "its successor: " + why);
  const std::size_t max_pad = std::min<std::size_t>(s.len - 1, kMaxJumpPad);
  std::size_t pad = max_pad + 1;
  // The bytes the successor's longest jump keeps must exist (a shorter one
  // where the file ends sooner).
  while (pad-- > 0)
    if (w.len + std::max<std::size_t>(s.len, kJumpLen + pad) <= avail) break;
  if (pad > max_pad) return refuse(why, "the code ends within the successor's jump");
  const std::size_t n = w.len + std::max<std::size_t>(s.len, kJumpLen + pad);
  if (n > sizeof w.evict_bytes) return refuse(why, "the successor is too long");
  w.evict = s;
  w.evict_max_pad = static_cast<std::uint8_t>(pad);
  std::memcpy(w.evict_bytes, code, n);
  return true;
}

}  // namespace uprobe::arch
