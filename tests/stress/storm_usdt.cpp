// SPDX-License-Identifier: MIT
// USDT fixtures of uprobe-storm: a probe guarded by its semaphore and a plain
// one (5-byte nop sites, so both can be optimized probes).
#include "storm.hpp"
#include "uprobe/usdt_probe.h"

UPROBE_USDT_DEFINE_SEMAPHORE(storm, tick);

// 2x + 1 when the semaphore was set (a tracer attached), else 2x.
extern "C" __attribute__((noipa)) std::uint64_t storm_usdt_sema(std::uint64_t x) {
  if (UPROBE_USDT_PROBE_ENABLED(storm, tick)) {
    UPROBE_USDT_PROBE_SEMA(storm, tick, x);
    return 2 * x + 1;
  }
  return 2 * x;
}

// x ^ 0x5a.
extern "C" __attribute__((noipa)) std::uint64_t storm_usdt_plain(std::uint64_t x) {
  UPROBE_USDT_PROBE(storm, plain, x);
  return x ^ 0x5a;
}
