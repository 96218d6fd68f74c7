// SPDX-License-Identifier: MIT
/// @file evict_solve.cpp
/// Successor eviction's bytes and its search (E9Patch's tactic T2): the mark
/// a trampoline carries for the step path, the successor's jump, and
/// solve_evicted(), which finds a pair of free addresses the two jumps'
/// bytes allow (plan.hpp). plan_evict(), which decides whether a successor
/// can be evicted, stays with the windows (window.cpp). Not hot.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "arch.hpp"
#include "why.hpp"

namespace uprobe::arch {
namespace {

using why::hex;
using why::refuse;

}  // namespace

std::size_t append_evict_mark(std::uint8_t* code, std::size_t n, std::uint64_t entry, std::uint64_t successor) noexcept {
  std::memcpy(code + n, kEvictMark, sizeof kEvictMark);
  const auto rel = static_cast<std::int32_t>(static_cast<std::int64_t>(successor - entry));
  std::memcpy(code + n + sizeof kEvictMark, &rel, sizeof rel);
  return n + kEvictMarkLen;
}

bool find_evict_mark(const std::uint8_t* code, std::size_t n, std::uint64_t entry, std::size_t from,
                     std::uint64_t& successor, std::size_t& len) noexcept {
  for (std::size_t k = from ? from : 1; k + kEvictMarkLen <= n; ++k) {
    if (std::memcmp(code + k, kEvictMark, sizeof kEvictMark) != 0) continue;
    std::int32_t rel;
    std::memcpy(&rel, code + k + sizeof kEvictMark, sizeof rel);
    const std::uint64_t s = entry + static_cast<std::uint64_t>(static_cast<std::int64_t>(rel));
    if (s < 0x10000 || s >= 0x7ffffffff000ull) continue;
    successor = s;
    len = k;
    return true;
  }
  return false;
}

std::size_t evict_jump(std::uint64_t site, const EntryWindow& w, std::size_t evict_pad, std::uint64_t evict_target,
                       std::uint8_t* out) noexcept {
  std::uint8_t j[kMaxJumpLen];
  encode_jump(site + w.len, evict_target, j, evict_pad);
  const std::size_t n = std::min<std::size_t>(evict_pad + kJumpLen, w.evict.len);
  std::memcpy(out, j, n);
  return n;
}

namespace {

/// dfs() results (besides 1, solved; 0, nothing under this prefix).
constexpr int kSiteCulprit = -1;  // the site's target of this prefix cannot be placed: try the next site value
constexpr int kSpanTaken = -2;    // every target the successor's bytes allow (this evict_pad) is mapped
constexpr int kSiteSpanTaken = -3;  // every target the site's bytes allow (this pad and evict_pad) is mapped

struct EvictSearch {
  std::uint64_t site;
  const EntryWindow* w;
  bool (*maybe_free)(void*, std::uint64_t, std::size_t);
  bool (*mapped)(void*, std::uint64_t, std::uint64_t);
  bool (*place_evict)(void*, std::uint64_t);
  bool (*place_site)(void*, std::uint64_t);
  void* ctx;
  std::size_t budget;
  std::size_t pad, epad;
  std::uint8_t c[32];         // the combined bytes from the site on
  std::size_t vars[8];        // positions of the free bytes, in search order
  std::size_t nvars = 0, site_vars = 0;  // the first site_vars decide the site's rel32
  EvictChoice found;

  static constexpr std::uint64_t kUserLo = 0x10000, kUserHi = 0x7ffffffff000ull - 64;
  static bool user(std::uint64_t a) { return a >= kUserLo && a < kUserHi; }
  std::uint64_t target(std::size_t at, std::uint64_t end) const {
    std::int32_t rel;
    std::memcpy(&rel, c + at, 4);
    return end + static_cast<std::uint64_t>(static_cast<std::int64_t>(rel));
  }
  std::uint64_t site_target() const { return target(pad + 1, site + pad + kJumpLen); }
  std::uint64_t evict_target() const { return target(w->len + epad + 1, site + w->len + epad + kJumpLen); }
  /// The user addresses [lo, hi) the successor's jump may aim at while the
  /// free bytes vars[from..nvars) are open (any value) and the others hold
  /// what c holds: an open byte is 0x00 at the low end, 0xff at the high
  /// one (0x80 / 0x7f for the rel32's most significant byte: signed). The
  /// successor's free bytes are the low bytes of its rel32 (those past it
  /// are fixed), so with every one open this is exactly the set its bytes
  /// allow. False when no user address is in it.
  bool evict_span(std::size_t from, std::uint64_t& lo, std::uint64_t& hi) const {
    const std::size_t at = w->len + epad + 1;
    std::uint8_t a[4], b[4];
    std::memcpy(a, c + at, 4);
    std::memcpy(b, c + at, 4);
    for (std::size_t k = from; k < nvars; ++k) {
      const std::size_t p = vars[k];
      if (p < at || p >= at + 4) continue;
      a[p - at] = p == at + 3 ? 0x80 : 0x00;
      b[p - at] = p == at + 3 ? 0x7f : 0xff;
    }
    std::int32_t ra, rb;
    std::memcpy(&ra, a, 4);
    std::memcpy(&rb, b, 4);
    const std::uint64_t end = site + w->len + epad + kJumpLen;
    lo = std::max(end + static_cast<std::uint64_t>(static_cast<std::int64_t>(ra)), kUserLo);
    hi = std::min(end + static_cast<std::uint64_t>(static_cast<std::int64_t>(rb)) + 1, kUserHi);
    return lo < hi;
  }
  /// The user addresses [lo, hi) the site's jump may aim at with every one
  /// of its free bytes (vars[0..site_vars): its own, and the successor's
  /// that its rel32 covers) open, the others as c holds them (as
  /// evict_span()). False when no user address is in it.
  bool site_span(std::uint64_t& lo, std::uint64_t& hi) const {
    const std::size_t at = pad + 1;
    std::uint8_t a[4], b[4];
    std::memcpy(a, c + at, 4);
    std::memcpy(b, c + at, 4);
    for (std::size_t k = 0; k < site_vars; ++k) {
      const std::size_t p = vars[k];
      a[p - at] = p == at + 3 ? 0x80 : 0x00;
      b[p - at] = p == at + 3 ? 0x7f : 0xff;
    }
    std::int32_t ra, rb;
    std::memcpy(&ra, a, 4);
    std::memcpy(&rb, b, 4);
    const std::uint64_t end = site + pad + kJumpLen;
    lo = std::max(end + static_cast<std::uint64_t>(static_cast<std::int64_t>(ra)), kUserLo);
    hi = std::min(end + static_cast<std::uint64_t>(static_cast<std::int64_t>(rb)) + 1, kUserHi);
    return lo < hi;
  }
  /// Whether every target of evict_span(from) is known to be mapped (no
  /// maybe_free() question spent).
  bool span_taken(std::size_t from) const {
    std::uint64_t lo, hi;
    return !evict_span(from, lo, hi) || mapped(ctx, lo, hi);
  }
  bool ask(std::uint64_t a, std::size_t len) {
    if (budget == 0 || !user(a)) return false;
    --budget;
    return maybe_free(ctx, a, len);
  }
  /// The i-th value tried for the free byte vars[k]: every value for the
  /// most significant free byte of either rel32, nearest first (0, 1, -1,
  /// 2, -2, ... as signed values of that byte); for the others, values that
  /// move a target by less than a page's worth of pages, spread (0x00,
  /// 0x80, 0x40, 0xc0, ...: i's bits reversed), of which limit() are tried.
  bool every_value(std::size_t k) const { return k == 0 || k == site_vars; }
  static std::uint8_t value(bool every, std::size_t i) {
    if (every) {
      const int d = static_cast<int>((i + 1) / 2);
      return static_cast<std::uint8_t>(i % 2 ? d : -d);
    }
    std::uint8_t r = 0;
    for (int b = 0; b < 8; ++b)
      if (i & (1u << b)) r = static_cast<std::uint8_t>(r | (0x80u >> b));
    return r;
  }
  /// dfs(): 1, solved; 0, nothing under this prefix; kSiteCulprit;
  /// kSpanTaken (a placement that failed taught the caller's memory that
  /// every target of this evict_pad is mapped: no other pad or prefix helps).
  int dfs(std::size_t k) {
    if (budget == 0) return 0;
    if (k == site_vars) {
      if (!ask(site_target(), kJumpLen)) return 0;
    }
    if (k == nvars) {
      const std::uint64_t t = evict_target();
      if (!ask(t, 32)) return 0;
      if (!place_evict(ctx, t)) return span_taken(0) ? kSpanTaken : 0;
      if (!place_site(ctx, site_target())) return kSiteCulprit;
      found = EvictChoice{static_cast<std::uint8_t>(pad), static_cast<std::uint8_t>(epad), site_target(), t};
      return 1;
    }
    const bool every = every_value(k);
    // The successor's own bytes skip the values whose every target is
    // known to be mapped (asked again after each value: a failed placement
    // teaches the memory more), so the few tried are ones that may be free.
    const bool successor = k >= site_vars;
    if (successor && span_taken(k)) return 0;
    const std::size_t limit = every ? 256 : 4;
    std::size_t tried = 0;
    for (std::size_t i = 0; i < 256 && tried < limit; ++i) {
      c[vars[k]] = value(every, i);
      if (successor && span_taken(k + 1)) continue;
      ++tried;
      const int r = dfs(k + 1);
      if (r == 1 || r == kSpanTaken) return r;
      if (r == kSiteCulprit && k >= site_vars) return kSiteCulprit;  // the site's value is the culprit: up to its loops
      if (budget == 0) return 0;
    }
    return 0;
  }
};

std::string span_text(std::uint64_t lo, std::uint64_t hi) {
  if (hi - lo == 1) return hex(lo);
  std::string t = "[";  // (appended: g++ 12's -Wrestrict misfires on the chained + inlined here)
  t += hex(lo);
  t += ", ";
  t += hex(hi);
  t += ')';
  return t;
}

}  // namespace

bool solve_evicted(std::uint64_t site, const EntryWindow& w, bool (*maybe_free)(void*, std::uint64_t, std::size_t),
                   bool (*mapped)(void*, std::uint64_t, std::uint64_t), bool (*place_evict)(void*, std::uint64_t),
                   bool (*place_site)(void*, std::uint64_t), void* ctx, EvictChoice& out, std::string& why,
                   std::size_t budget) {
  if (!w.evict.len || !w.punned || w.len >= kJumpLen) return refuse(why, "no successor eviction is planned");
  const std::size_t lp = w.len, ls = w.evict.len;
  EvictSearch s{site, &w, maybe_free, mapped, place_evict, place_site, ctx, budget, 0, 0, {}, {}, 0, 0, {}};
  std::string taken;   // the spans of the evict_pads whose every target is mapped
  std::string site_taken;  // the site's spans (per pad and evict_pad) whose every target is mapped
  bool site_closed_any = false;  // a pad closed by its site span (site_taken, or no user address)
  bool open = false;   // an evict_pad whose span is not, with a pad whose site span is not
  for (std::size_t epad = 0; epad <= w.evict_max_pad; ++epad) {
    bool span_taken = false;
    bool site_open = false;  // a pad of this evict_pad whose site span is not wholly mapped
    for (std::size_t pad = 0; pad < lp && pad <= kMaxJumpPad; ++pad) {
      s.pad = pad;
      s.epad = epad;
      const std::size_t n = lp + std::max<std::size_t>(ls, kJumpLen + epad);
      std::memcpy(s.c, w.evict_bytes, n);
      bool is_free[32] = {};
      for (std::size_t i = 0; i < pad; ++i) s.c[i] = kJumpPadPrefix[i];
      s.c[pad] = kJumpOpcode;
      for (std::size_t i = pad + 1; i < lp; ++i) is_free[i] = true;
      for (std::size_t i = 0; i < epad; ++i) s.c[lp + i] = kJumpPadPrefix[i];
      s.c[lp + epad] = kJumpOpcode;
      for (std::size_t i = lp + epad + 1; i < lp + epad + kJumpLen && i < lp + ls; ++i) is_free[i] = true;
      // The site's rel32 bytes, most significant first; then the
      // successor's own, most significant first.
      s.nvars = 0;
      for (std::size_t i = pad + kJumpLen; i-- > pad + 1;)
        if (is_free[i]) s.vars[s.nvars++] = i;
      s.site_vars = s.nvars;
      for (std::size_t i = lp + epad + kJumpLen; i-- > lp + epad + 1;)
        if (is_free[i] && i >= pad + kJumpLen) s.vars[s.nvars++] = i;
      // The successor's targets do not depend on the site's pad (its free
      // bytes, the ones inside it, are free for every pad): a span whose
      // every address is mapped is skipped whole, no question spent.
      // The site's targets (this pad, with this evict_pad's bytes) all
      // mapped: no value of the successor's bytes helps; another pad may.
      // (Asked again after a search that failed: a refused placement
      // teaches the caller's memory what a stale snapshot called free.)
      std::uint64_t slo = 0, shi = 0;
      const auto site_closed = [&] { return !s.site_span(slo, shi) || mapped(ctx, slo, shi); };
      int r = pad == 0 && s.span_taken(0) ? kSpanTaken : site_closed() ? kSiteSpanTaken : s.dfs(0);
      if ((r == 0 || r == kSiteCulprit) && s.budget != 0 && site_closed()) r = kSiteSpanTaken;
      if (r == kSiteSpanTaken) {
        site_closed_any = true;
        if (slo < shi) {
          const std::string t = span_text(slo, shi);
          if (site_taken.find(t) == std::string::npos) site_taken += (site_taken.empty() ? "" : ", ") + t;
        }
        continue;
      }
      site_open = true;
      if (r == 1) {
        out = s.found;
        why.clear();
        return true;
      }
      if (r == kSpanTaken) {
        span_taken = true;
        break;
      }
      if (s.budget == 0)
        return refuse(why, "no free pair of addresses for both jumps found in " +
                               std::to_string(budget) + " tries (the search gave up)");
    }
    if (!span_taken) {
      open = open || site_open;
      continue;
    }
    std::uint64_t lo = 0, hi = 0;
    if (s.evict_span(0, lo, hi)) taken += (taken.empty() ? "" : ", ") + span_text(lo, hi);
  }
  if (!open && site_closed_any) {
    const std::string spans = taken.empty() ? site_taken : site_taken.empty() ? taken : taken + ", " + site_taken;
    return refuse(why, "every address its bytes allow for the successor's trampoline or the site's hop is mapped" +
                           (spans.empty() ? std::string(" (none is a user address)") : " (" + spans + ")"));
  }
  if (!open)
    return refuse(why, "every trampoline address its bytes allow is mapped" +
                           (taken.empty() ? std::string(" (none is a user address)") : " (" + taken + ")"));
  return refuse(why, "no free pair of addresses for both jumps among those tried" +
                         (taken.empty() ? std::string() : " (every trampoline address is mapped in " + taken + ")"));
}

}  // namespace uprobe::arch
