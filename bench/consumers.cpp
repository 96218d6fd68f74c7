// SPDX-License-Identifier: MIT
// The gpr consumers of the uprobe-* and uretprobe-* variants (--consumer=gpr).
// They only count, in general-purpose registers: this file is compiled with
// -mgeneral-regs-only, so they declare set_vector_state_unused() truthfully
// and an optimized hit or a return saves no vector or x87 state at all (the
// kernel bench's BPF programs do not touch the FPU either). The default
// consumers (--consumer=plain) are in plain_consumers.cpp.

#include "bench.hpp"
#include "uprobe/uprobe.hpp"

namespace bench {
namespace {

// ---- uprobe-*: a consumer at the target's first byte counts on the hitting
// thread's counter.
class CountingConsumer final : public uprobe::Consumer {
 public:
  CountingConsumer() noexcept { set_vector_state_unused(); }
  uprobe::Action handler(uprobe::Regs& regs) override {
    (void)regs;
    count_hit();
    return uprobe::Action::keep;
  }
};

#if defined(UPROBE_HAS_URETPROBE)
// ---- uretprobe-*: a return-only consumer (the kernel bench's uretprobe
// program) counts in its ret_handler.
class RetCountingConsumer final : public uprobe::Consumer {
 public:
  RetCountingConsumer() noexcept : uprobe::Consumer(uprobe::Callbacks::ret) { set_vector_state_unused(); }
  void ret_handler(uprobe::Regs& regs, std::uint64_t func) override {
    (void)regs;
    (void)func;
    count_hit();
  }
};
#endif

}  // namespace

uprobe::Consumer& gpr_consumer() {
  static CountingConsumer c;
  return c;
}

#if defined(UPROBE_HAS_URETPROBE)
uprobe::Consumer& gpr_ret_consumer() {
  static RetCountingConsumer c;
  return c;
}
#endif

}  // namespace bench
