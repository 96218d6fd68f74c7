// SPDX-License-Identifier: MIT
// The benchmark variants (run_bench_uprobes.sh's list, plus the kernel's own
// uprobes on the same targets) and their producer loops: direct calls, as
// bench_trigger.c's producers make.

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "bench.hpp"
#include "uprobe/uprobe.hpp"  // UPROBE_HAS_URETPROBE

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

// Kernel uprobes: the kernel counts the hits (the perf event's count is the
// hit count); the producer counts its calls, which the run checks against it.
template <void (*Target)()>
void counted_call_loop() {
  while (!stopped()) {
    Target();
    count_hit();
  }
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
      {"trampoline-floor", Kind::trampoline, trampoline_floor_target, call_loop<trampoline_floor_target>},
      {"trampoline-floor-popfq", Kind::trampoline, trampoline_floor_popfq_target,
       call_loop<trampoline_floor_popfq_target>},
      {"uprobe-nop5", Kind::uprobe, uprobe_target_nop5, call_loop<uprobe_target_nop5>},
      {"uprobe-entry", Kind::uprobe, uprobe_target_entry, call_loop<uprobe_target_entry>},
      // A nop5 inside a function (as a USDT probe): no ABI boundary, so an
      // ordinary consumer gets the full vector/x87 state saved around it.
      {"uprobe-nop5-mid", Kind::uprobe, uprobe_target_nop5_mid, call_loop<uprobe_target_nop5_mid>, 1},
      {"uretprobe-nop", Kind::uretprobe, uprobe_target_nop, call_loop<uprobe_target_nop>},
      {"uretprobe-push", Kind::uretprobe, uprobe_target_push, call_loop<uprobe_target_push>},
      {"uretprobe-ret", Kind::uretprobe, uprobe_target_ret, call_loop<uprobe_target_ret>},
      {"uretprobe-nop5", Kind::uretprobe, uprobe_target_nop5, call_loop<uprobe_target_nop5>},
      {"uretprobe-entry", Kind::uretprobe, uprobe_target_entry, call_loop<uprobe_target_entry>},
      {"kernel-uprobe-nop", Kind::kernel_uprobe, uprobe_target_nop, counted_call_loop<uprobe_target_nop>},
      {"kernel-uprobe-push", Kind::kernel_uprobe, uprobe_target_push, counted_call_loop<uprobe_target_push>},
      {"kernel-uprobe-ret", Kind::kernel_uprobe, uprobe_target_ret, counted_call_loop<uprobe_target_ret>},
      {"kernel-uprobe-nop5", Kind::kernel_uprobe, uprobe_target_nop5, counted_call_loop<uprobe_target_nop5>},
      {"kernel-uprobe-entry", Kind::kernel_uprobe, uprobe_target_entry, counted_call_loop<uprobe_target_entry>},
      {"kernel-uretprobe-nop", Kind::kernel_uretprobe, uprobe_target_nop, counted_call_loop<uprobe_target_nop>},
      {"kernel-uretprobe-push", Kind::kernel_uretprobe, uprobe_target_push, counted_call_loop<uprobe_target_push>},
      {"kernel-uretprobe-ret", Kind::kernel_uretprobe, uprobe_target_ret, counted_call_loop<uprobe_target_ret>},
      {"kernel-uretprobe-nop5", Kind::kernel_uretprobe, uprobe_target_nop5, counted_call_loop<uprobe_target_nop5>},
      {"kernel-uretprobe-entry", Kind::kernel_uretprobe, uprobe_target_entry, counted_call_loop<uprobe_target_entry>},
  };
  return table;
}

const Variant* find_variant(const std::string& name) {
  for (const Variant& v : variants())
    if (name == v.name) return &v;
  return nullptr;
}

bool uses_switches(const Variant& v) noexcept { return v.kind == Kind::uprobe || v.kind == Kind::uretprobe; }

bool is_kernel(const Variant& v) noexcept { return v.kind == Kind::kernel_uprobe || v.kind == Kind::kernel_uretprobe; }

const Variant* kernel_counterpart(const Variant& v) {
  if (!uses_switches(v)) return nullptr;
  return find_variant(std::string("kernel-") + v.name);
}

bool uretprobes_available() noexcept {
#if defined(UPROBE_HAS_URETPROBE)
  return true;
#else
  return false;
#endif
}

}  // namespace bench
