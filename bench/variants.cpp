// SPDX-License-Identifier: MIT
// The benchmark variants (run_bench_uprobes.sh's list) and their producer
// loops: direct calls, as bench_trigger.c's producers make.

#include <sys/syscall.h>
#include <unistd.h>

#include "bench.hpp"

namespace bench {
namespace {

bool stopped() noexcept { return stop_flag.load(std::memory_order_relaxed); }

// The ceiling: bench_trigger.c's uprobe_producer_count.
void count_call_loop() {
  while (!stopped()) {
    uprobe_target_nop();
    count_hit();
  }
}

// trigger_base_producer: a cheap syscall per iteration.
void count_syscall_loop() {
  while (!stopped()) {
    (void)syscall(SYS_getpgid);
    count_hit();
  }
}

// The SIGTRAP handler or the consumer's handler counts.
template <void (*Target)()>
void call_loop() {
  while (!stopped()) Target();
}

}  // namespace

const std::vector<Variant>& variants() {
  static const std::vector<Variant> table = {
      {"usermode-count", Kind::count_call, nullptr, count_call_loop},
      {"syscall-count", Kind::count_syscall, nullptr, count_syscall_loop},
      {"sigtrap-floor", Kind::sigtrap, sigtrap_floor_target, call_loop<sigtrap_floor_target>},
      {"uprobe-nop", Kind::uprobe, uprobe_target_nop, call_loop<uprobe_target_nop>},
      {"uprobe-push", Kind::uprobe, uprobe_target_push, call_loop<uprobe_target_push>},
      {"uprobe-ret", Kind::uprobe, uprobe_target_ret, call_loop<uprobe_target_ret>},
      {"uprobe-nop5", Kind::uprobe, uprobe_target_nop5, call_loop<uprobe_target_nop5>},
  };
  return table;
}

const Variant* find_variant(const std::string& name) {
  for (const Variant& v : variants())
    if (name == v.name) return &v;
  return nullptr;
}

}  // namespace bench
