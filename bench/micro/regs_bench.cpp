// SPDX-License-Identifier: MIT
// uprobe::Regs from and to a signal ucontext (arch::regs_from_ucontext /
// regs_to_ucontext, from the uprobe_arch static library): the per-hit cost of
// building the handler's register view.

#include <benchmark/benchmark.h>
#include <ucontext.h>

#include "arch.hpp"

namespace {

ucontext_t make_context() {
  ucontext_t uc{};
  getcontext(&uc);
  return uc;
}

void BM_RegsFromUcontext(benchmark::State& state) {
  ucontext_t uc = make_context();
  uprobe::Regs regs{};
  for (auto _ : state) {
    benchmark::DoNotOptimize(&uc);
    uprobe::arch::regs_from_ucontext(&uc, regs);
    benchmark::DoNotOptimize(regs);
  }
}
BENCHMARK(BM_RegsFromUcontext);

void BM_RegsToUcontext(benchmark::State& state) {
  ucontext_t uc = make_context();
  uprobe::Regs regs{};
  uprobe::arch::regs_from_ucontext(&uc, regs);
  for (auto _ : state) {
    benchmark::DoNotOptimize(&regs);
    uprobe::arch::regs_to_ucontext(regs, &uc);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_RegsToUcontext);

void BM_RegsRoundTrip(benchmark::State& state) {
  ucontext_t uc = make_context();
  uprobe::Regs regs{};
  for (auto _ : state) {
    uprobe::arch::regs_from_ucontext(&uc, regs);
    regs.rax += 1;
    uprobe::arch::regs_to_ucontext(regs, &uc);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_RegsRoundTrip);

}  // namespace
