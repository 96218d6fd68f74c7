// SPDX-License-Identifier: MIT
#pragma once
// Successor eviction's placement (E9Patch's T2, issue 16): where the evicted
// successor's trampoline and the site's hop go, given the address space.

#include <string>
#include <vector>

#include "arch.hpp"
#include "probe.hpp"
#include "vma.hpp"

namespace uprobe::detail {

/// Places successor eviction (T2) for the punned site `s` of window `w`:
/// the successor's trampoline and the site's hop at the addresses
/// arch::solve_evicted() finds free (memory of the snapshot `vmas` is
/// taken, save our pages of hops; a placement refused there teaches it
/// more: the address space is read afresh, evict_place.cpp's
/// PlacementView), the trampoline written. Sets s.hop, s.pad, s.evict_*,
/// returns ""; leaves them 0 when nothing fits and returns why ("evicting
/// the successor `INSN`: " and solve_evicted()'s reason). Registry mutex
/// held (a transaction's step).
std::string place_evicting(Site& s, const arch::EntryWindow& w, const std::vector<Vma>& vmas);

}  // namespace uprobe::detail
