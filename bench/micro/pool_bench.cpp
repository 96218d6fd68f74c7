// SPDX-License-Identifier: MIT
// Return-instance pool get/put (part of uprobe-micro; also built alone as
// tests/pool's pool_microbench): get+put pairs, per thread, at 1/2/4/8
// threads, objpool vs freelist (seed 002 after / before), optionally with seed
// 004's global bookkeeping lock around each get and each put (as the caller's
// return-stack push / pop would take it). Not a ctest test.
//
//   uprobe-micro --benchmark_filter=GetPut --benchmark_counters_tabular=true
//
// pairs/s/thread is per-thread throughput over wall time: with more threads
// than CPUs (this is fine: oversubscription) it also drops by the share of the
// CPU each thread gets; pairs/s is the aggregate. pairs/cpu-s/thread divides
// by each thread's own CPU time (CLOCK_THREAD_CPUTIME_ID), averaged over the
// threads: the cost of contention (cache-line transfers, CAS retries, lock
// spinning) without the scheduling share, so it stays readable on a loaded box.

#include <benchmark/benchmark.h>
#include <time.h>

#include "ri_pool.hpp"

namespace {

using uprobe::detail::RiLockMode;
using uprobe::detail::RiPool;
using uprobe::detail::RiPoolMode;

constexpr std::size_t kObjectSize = 128;  // a return_instance with a few session cookies

// One pool per (mode, lock): runs never switch a pool's mode under its threads.
RiPool& pool_for(RiPoolMode mode, RiLockMode lock) {
  static RiPool* pools[2][2] = {};
  static const bool init = [] {
    for (int m = 0; m < 2; ++m)
      for (int l = 0; l < 2; ++l) {
        pools[m][l] = new RiPool(kObjectSize, 8192);
        pools[m][l]->set_modes(static_cast<RiPoolMode>(m), static_cast<RiLockMode>(l));
      }
    return true;
  }();
  (void)init;
  return *pools[static_cast<int>(mode)][static_cast<int>(lock)];
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void report(benchmark::State& state, std::int64_t pairs, double cpu_seconds) {
  const auto n = static_cast<double>(pairs);
  state.counters["pairs/s/thread"] = benchmark::Counter(n, benchmark::Counter::kAvgThreadsRate);
  state.counters["pairs/s"] = benchmark::Counter(n, benchmark::Counter::kIsRate);
  state.counters["pairs/cpu-s/thread"] =
      benchmark::Counter(cpu_seconds > 0 ? n / cpu_seconds : 0.0, benchmark::Counter::kAvgThreads);
}

// depth 1: the balanced entry/return of a leaf function.
void BM_GetPut(benchmark::State& state) {
  const auto mode = static_cast<RiPoolMode>(state.range(0));
  const auto lock = static_cast<RiLockMode>(state.range(1));
  RiPool& pool = pool_for(mode, lock);
  double cpu = 0;
  for (auto _ : state) {
    if (cpu == 0) cpu = -thread_cpu_seconds();  // from the first iteration (after the start barrier)
    pool.bookkeeping_lock();
    void* obj = pool.get();
    pool.bookkeeping_unlock();
    benchmark::DoNotOptimize(obj);
    pool.bookkeeping_lock();
    pool.put(obj);
    pool.bookkeeping_unlock();
  }
  cpu += thread_cpu_seconds();
  report(state, state.iterations(), cpu);
  pool.thread_exit();
}

// depth 64: a deep call chain (or a burst of entries before the returns):
// more than a thread cache holds, so the per-CPU rings see traffic.
void BM_GetPutDepth64(benchmark::State& state) {
  const auto mode = static_cast<RiPoolMode>(state.range(0));
  RiPool& pool = pool_for(mode, RiLockMode::none);
  void* held[64];
  double cpu = 0;
  for (auto _ : state) {
    if (cpu == 0) cpu = -thread_cpu_seconds();
    for (void*& obj : held) obj = pool.get();
    benchmark::DoNotOptimize(held);
    for (int i = 63; i >= 0; --i) pool.put(held[i]);
  }
  cpu += thread_cpu_seconds();
  report(state, state.iterations() * 64, cpu);
  pool.thread_exit();
}

void args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"freelist", "global_lock"});
  for (int lock = 0; lock < 2; ++lock)
    for (int mode = 0; mode < 2; ++mode) b->Args({mode, lock});
}

BENCHMARK(BM_GetPut)->Apply(args)->Threads(1)->Threads(2)->Threads(4)->Threads(8)->UseRealTime()->MinTime(0.3);
BENCHMARK(BM_GetPutDepth64)
    ->ArgName("freelist")
    ->Arg(0)
    ->Arg(1)
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->Threads(8)
    ->UseRealTime()
    ->MinTime(0.3);

}  // namespace
