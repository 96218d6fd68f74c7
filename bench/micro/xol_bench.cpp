// SPDX-License-Identifier: MIT
// XOL slots (src/attach/xol.cpp, compiled in). In libuprobe a slot belongs to one
// probe site for the life of the process and is immutable after it is
// written, so the trap path takes and releases nothing: there is no per-hit
// take/release to measure (the kernel's xol_take_insn_slot() /
// xol_free_insn_slot() pair has no counterpart). What costs is the slot's
// allocation and write at attach time:
//   BM_XolSlotNew        a new site: place the slot, relocate the instruction,
//                        write it through a transient RW alias (mremap of the
//                        R-X view with old size 0, mprotect RW, munmap)
//   BM_XolSlotNewBatched the same inside begin_batch()/end_batch(), as
//                        register_uprobes() does: one RW alias per region
//   BM_XolSlotAgain      a site that has its slot already (re-attach): the
//                        relocated copy is rebuilt and compared, nothing written

#include <benchmark/benchmark.h>

#include <string>

#include "arch.hpp"
#include "micro.hpp"
#include "vma.hpp"
#include "xol.hpp"

namespace {

using uprobe::detail::XolArea;

uprobe::arch::Insn lea_insn() {
  static const std::uint8_t code[] = {0x48, 0x8d, 0x47, 0x01};  // lea 0x1(%rdi), %rax
  uprobe::arch::Insn insn;
  std::string why;
  if (!uprobe::arch::analyze(code, sizeof code, insn, why)) std::abort();
  return insn;
}

// Distinct fake site addresses near this binary's code (slots are placed
// within reach of them; the slots are never run).
std::uint64_t site(std::uint64_t i) { return reinterpret_cast<std::uint64_t>(micro::fixture(0)) + 16 * i; }

void new_slots(benchmark::State& state, bool batched) {
  auto* xol = new XolArea;  // regions stay mapped (as in the runtime): leaked on purpose
  const auto vmas = uprobe::detail::read_proc_maps();
  const uprobe::arch::Insn insn = lea_insn();
  std::string why;
  std::uint64_t i = 0;
  if (batched) xol->begin_batch();
  for (auto _ : state) {
    const std::uint64_t slot = xol->slot_for(site(i++), insn, vmas, why);
    if (!slot) state.SkipWithError(why.c_str());
    benchmark::DoNotOptimize(slot);
  }
  if (batched) xol->end_batch();
}

void BM_XolSlotNew(benchmark::State& state) { new_slots(state, false); }
BENCHMARK(BM_XolSlotNew)->Iterations(20000);

void BM_XolSlotNewBatched(benchmark::State& state) { new_slots(state, true); }
BENCHMARK(BM_XolSlotNewBatched)->Iterations(20000);

void BM_XolSlotAgain(benchmark::State& state) {
  auto* xol = new XolArea;
  const auto vmas = uprobe::detail::read_proc_maps();
  const uprobe::arch::Insn insn = lea_insn();
  std::string why;
  for (std::uint64_t i = 0; i < 1000; ++i) xol->slot_for(site(i), insn, vmas, why);
  std::uint64_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(xol->slot_for(site(i), insn, vmas, why));
    i = (i + 1) % 1000;
  }
}
BENCHMARK(BM_XolSlotAgain);

}  // namespace
