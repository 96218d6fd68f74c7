// SPDX-License-Identifier: MIT
// Successor eviction's placement (evict_place.hpp).

#include "evict_place.hpp"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <iterator>

#include "xol.hpp"

namespace uprobe::detail {

namespace {

/// What successor eviction's placement knows of the address space: the
/// transaction's snapshot, which may be older than the last anonymous
/// mapping (refresh_vmas() keeps a snapshot while the file mappings are
/// unchanged, so the heap may have grown over what it calls free), read
/// afresh when a placement it called free is refused (MAP_FIXED_NOREPLACE:
/// EEXIST; at most kMaxReads times a search, then the refused page alone is
/// noted), and before it calls a span of addresses wholly mapped (so that
/// "impossible" is said of the address space as it is).
class PlacementView {
 public:
  explicit PlacementView(const std::vector<Vma>& snapshot) : vmas_(&snapshot) {}

  /// Whether `a` lies in a mapping known (not counting our hop pages'
  /// free bytes: XolArea::hop_room() answers for those).
  bool taken(std::uint64_t a) const { return next_free(a) != a; }

  /// Whether every address of [lo, hi) is known to be mapped, no page of
  /// hops among them; read afresh once a search before the first yes.
  bool all_taken(std::uint64_t lo, std::uint64_t hi) {
    if (xol_area().hop_pages_in(lo, hi) || next_free(lo) < hi) return false;
    if (fresh_) return true;
    reread();
    return next_free(lo) >= hi;
  }

  /// A placement at `a` was refused: something is mapped there.
  void refused(std::uint64_t a) {
    const std::uint64_t page = a & ~std::uint64_t{4095};
    if (reads_ < kMaxReads) {
      reread();
      if (taken(a)) return;
    }
    pages_.insert(std::upper_bound(pages_.begin(), pages_.end(), page), page);  // (mapped and gone again meanwhile)
  }

 private:
  static constexpr int kMaxReads = 4;

  /// The first address from `a` on that no mapping known holds.
  std::uint64_t next_free(std::uint64_t a) const {
    for (;;) {
      auto it = std::upper_bound(vmas_->begin(), vmas_->end(), a,
                                 [](std::uint64_t x, const Vma& v) { return x < v.start; });
      if (it != vmas_->begin() && std::prev(it)->end > a) {
        a = std::prev(it)->end;
        continue;
      }
      auto p = std::upper_bound(pages_.begin(), pages_.end(), a);
      if (p != pages_.begin() && *std::prev(p) + 4096 > a) {
        a = *std::prev(p) + 4096;
        continue;
      }
      return a;
    }
  }
  void reread() {
    ++reads_;
    fresh_ = true;
    try {
      read_ = read_proc_maps();
      vmas_ = &read_;
    } catch (const std::exception&) {
      // (keep what is known)
    }
  }

  const std::vector<Vma>* vmas_;
  std::vector<Vma> read_;
  std::vector<std::uint64_t> pages_;  // refused pages a fresh read did not show mapped, sorted
  bool fresh_ = false;                // vmas_ was read during this search
  int reads_ = 0;
};

}  // namespace

std::string place_evicting(Site& s, const arch::EntryWindow& w, const std::vector<Vma>& vmas) {
  struct Ctx {
    PlacementView view;
    const arch::EntryWindow* w;
    std::uint64_t site, succ;
    std::size_t tramp_len;
  } c{PlacementView(vmas), &w, s.addr, s.addr + w.len, 0};
  auto maybe_free = [](void* p, std::uint64_t a, std::size_t len) -> bool {
    const Ctx& c = *static_cast<Ctx*>(p);
    // This site's own hop or its successor's trampoline, kept (retired, not
    // yet freed) from an earlier probe here: hop_in() gives it back.
    if (a == xol_area().hop_of(c.succ | kEvictKey) || a == xol_area().hop_of(c.site)) return true;
    const int room = xol_area().hop_room(a, len);
    if (room >= 0) return room == 1;
    if ((a & 4095) + len > 4096) return false;  // a new page of hops holds it whole
    return !c.view.taken(a);
  };
  auto mapped = [](void* p, std::uint64_t lo, std::uint64_t hi) -> bool {
    return static_cast<Ctx*>(p)->view.all_taken(lo, hi);
  };
  auto place_evict = [](void* p, std::uint64_t a) -> bool {
    Ctx& c = *static_cast<Ctx*>(p);
    arch::EntryWindow one;
    one.insns.push_back(c.w->evict);
    one.len = c.w->evict.len;
    std::uint8_t code[arch::kWindowSlotSize + arch::kEvictMarkLen];
    std::string why;
    const std::size_t len = arch::build_window_xol(one, c.succ, a, code, why);
    if (len == 0) return false;
    // Then the mark the step path finds the successor by (never executed),
    // in the same page.
    const std::size_t n = arch::append_evict_mark(code, len, a, c.succ);
    if ((a & 4095) + n > 4096) return false;
    bool taken = false;
    if (xol_area().hop_in(c.succ | kEvictKey, a, a + 1, n, why, &taken) != a) {
      if (taken) c.view.refused(a);
      return false;
    }
    c.tramp_len = len;
    return xol_area().write_code(a, code, n, why);
  };
  auto place_site = [](void* p, std::uint64_t a) -> bool {
    Ctx& c = *static_cast<Ctx*>(p);
    std::string why;
    bool taken = false;
    if (xol_area().hop_in(c.site, a, a + 1, arch::kJumpLen, why, &taken) == a) return true;
    if (taken) c.view.refused(a);
    return false;
  };
  arch::EvictChoice ch;
  std::string why;
  if (!arch::solve_evicted(s.addr, w, maybe_free, mapped, place_evict, place_site, &c, ch, why))
    return "evicting the successor `" + w.evict.text + "`: " + why;
  s.hop = ch.target;
  s.pad = ch.pad;
  s.evict_addr = c.succ;
  s.evict_hop = ch.evict_target;
  s.evict_pad = ch.evict_pad;
  s.evict_len = static_cast<std::uint8_t>(c.tramp_len);
  return "";
}

}  // namespace uprobe::detail
