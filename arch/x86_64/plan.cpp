// SPDX-License-Identifier: MIT
/// @file plan.cpp
/// plan(): the one entry point that chooses how a probe site is patched
/// (int3, nop5, window, punned) from the instruction, its function's bytes
/// and what the core knows of the file (PlanContext); is_nop5(), the nop5
/// tactic's test, and is_filler(), the test of the bytes after a short
/// function.

#include <algorithm>

#include "arch.hpp"

namespace uprobe::arch {

bool is_nop5(const Insn& insn) noexcept { return insn.cls == InsnClass::nop && insn.len == kJumpLen; }

bool is_filler(const std::uint8_t* b, std::size_t n) {
  std::string why;
  for (std::size_t p = 0; p < n;) {
    if (b[p] == kBreakpoint) {
      ++p;
      continue;
    }
    Insn x;
    if (!analyze(b + p, n - p, x, why) || x.cls != InsnClass::nop) return false;
    p += x.len;
  }
  return true;
}

PatchPlan plan(const Insn& insn, PlanContext& ctx) {
  PatchPlan out;
  std::string why;
  bool ok = false;
  // An instruction as long as the jump (E9Patch's tactic B1) is a window of
  // its own: only its bytes change, and nothing branches into the middle of
  // an instruction, so no function, neighbour or data check applies and no
  // bounds are needed. (At an entry the whole plan below runs.)
  if (!ctx.at_function_entry() && insn.len >= kJumpLen) {
    ok = plan_window(insn.bytes, insn.len, 0, out.window, why, &insn);
  } else {
    PlanContext::Function f;
    ok = ctx.function(kJumpLen, f, why) &&
         plan_window(f.code, f.size, f.at, out.window, why, &insn, f.padding) &&
         ctx.no_outside_entry(out.window.len, why);
  }
  if (!ok) {
    out.window = EntryWindow{};
    out.why_no_window = why;
  }
  // No window: a punned jump (E9Patch's B2) over the instruction alone, its
  // bytes after it kept (a branch target there, the function's end, ...).
  // Its refusal's reason follows the window's.
  // With the bytes a padded form (T1) needs, when the file has them.
  if (!out.window.len && insn.len < kJumpLen) {
    std::uint8_t code[kMaxJumpLen];
    std::size_t avail = kJumpLen + std::min<std::size_t>(insn.len - 1, kMaxJumpPad);
    bool have = false;
    for (; avail >= kJumpLen && !(have = ctx.site_bytes(code, avail)); --avail) {
    }
    std::string pwhy;
    if (!have) {
      out.window = EntryWindow{};
    } else if (!plan_punned(code, avail, insn, out.window, pwhy)) {
      out.window = EntryWindow{};
      if (!pwhy.empty()) out.why_no_window += "; no punned jump either: " + pwhy;
    } else if (ctx.evict_wanted()) {
      // Successor eviction (T2), for when no form's pages are free: the
      // successor and the bytes its jump keeps (the core drops the plan when
      // Config::optimize_evicted is off: evict_wanted()).
      std::uint8_t more[sizeof out.window.evict_bytes];
      std::size_t n = std::min<std::size_t>(sizeof more, insn.len + kMaxInsnLen + kMaxJumpLen);
      for (; n > insn.len && !ctx.site_bytes(more, n); --n) {
      }
      std::string ewhy;
      const bool falls_through = insn.cls != InsnClass::jmp_rel && insn.cls != InsnClass::jmp_ind &&
                                 insn.cls != InsnClass::ret && insn.cls != InsnClass::ret_imm;
      if (!falls_through && !ctx.code_at(insn.len))
        out.why_no_evict = "the instruction is a jump or a return, and what follows it is not known to be code of "
                           "its function";
      else if (n > insn.len && !plan_evict(more, n, out.window, ewhy)) out.why_no_evict = ewhy;
      else if (n <= insn.len) out.why_no_evict = "the code ends after the instruction";
    }
  }
  out.tactic = is_nop5(insn)                 ? Tactic::nop5
               : out.window.punned           ? Tactic::punned
               : out.window.len >= kJumpLen ? Tactic::window
                                             : Tactic::int3;
  return out;
}

}  // namespace uprobe::arch
