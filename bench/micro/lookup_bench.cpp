// SPDX-License-Identifier: MIT
// Lookup latency of the hit path against the number of probes and of VMAs,
// on the runtime's own structures: detail::ProbeTable::find (src/hit/probe.hpp,
// header-inline) and detail::VmaSnapshot::find (src/hit/vma_snapshot.hpp, header-inline).
// BM_HitLookup* model trap.cpp's lookup(): VMA -> (dev, ino, offset) ->
// uprobe, under the address-space sequence count (speculative) or the global
// reader-writer lock (locked, seed 000's "before").

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "micro.hpp"
#include "probe.hpp"
#include "spin_rwlock.hpp"
#include "vma.hpp"

namespace {

using uprobe::Uprobe;
using uprobe::detail::ProbeKey;
using uprobe::detail::ProbeTable;
using uprobe::detail::SpinRwLock;
using uprobe::detail::Vma;
using uprobe::detail::VmaSnapshot;

constexpr dev_t kDev = 0x803;
constexpr std::size_t kLookups = 4096;  // ring of precomputed lookups (power of two)

// Never dereferenced: the table maps keys to opaque pointers.
Uprobe* fake_uprobe(std::size_t i) { return reinterpret_cast<Uprobe*>((i + 1) * 64); }

// A process image: `vmas` executable file mappings, `probes` probes spread
// over them, and kLookups probe addresses to look up in random order.
struct Image {
  std::unique_ptr<VmaSnapshot> snapshot;
  ProbeTable table;
  std::vector<std::uint64_t> addresses;  // probe sites
  std::vector<ProbeKey> keys;            // their keys

  Image(std::size_t probes, std::size_t vmas) {
    const std::size_t per_vma = (probes + vmas - 1) / vmas;
    const std::uint64_t len = ((per_vma * 16 + 16 + 0xfff) & ~0xfffull);
    std::vector<Vma> v(vmas);
    for (std::size_t j = 0; j < vmas; ++j) {
      v[j].start = 0x10000000ull + j * (len + 0x1000);  // a one-page gap between mappings
      v[j].end = v[j].start + len;
      v[j].pgoff = 0;
      v[j].dev = kDev;
      v[j].ino = static_cast<ino_t>(j + 1);
      v[j].prot = 5;  // r-x
    }
    std::vector<std::uint64_t> all_addr(probes);
    for (std::size_t i = 0; i < probes; ++i) {
      const std::size_t j = i % vmas, k = i / vmas;
      const ProbeKey key{kDev, static_cast<ino_t>(j + 1), 16 * k};
      table.entries.emplace_back(key, fake_uprobe(i));
      all_addr[i] = v[j].start + 16 * k;
    }
    std::sort(table.entries.begin(), table.entries.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    table.build();  // as publish_probes() does
    snapshot = std::make_unique<VmaSnapshot>(std::move(v));
    micro::Rng rng;
    for (std::size_t n = 0; n < kLookups; ++n) {
      const std::size_t i = rng.next() % probes;
      addresses.push_back(all_addr[i]);
      const Vma* m = snapshot->find(all_addr[i]);
      keys.push_back(ProbeKey{m->dev, m->ino, m->pgoff + (all_addr[i] - m->start)});
    }
  }

  // trap.cpp's find_uprobe().
  Uprobe* find(std::uint64_t ip) const noexcept {
    const Vma* v = snapshot->find(ip);
    if (!v || !v->executable() || v->ino == 0) return nullptr;
    return table.find(ProbeKey{v->dev, v->ino, v->pgoff + (ip - v->start)});
  }
};

void BM_ProbeTableFind(benchmark::State& state) {
  const Image img(static_cast<std::size_t>(state.range(0)), 1);
  std::size_t n = 0;
  for (auto _ : state) {
    Uprobe* u = img.table.find(img.keys[n++ & (kLookups - 1)]);
    benchmark::DoNotOptimize(u);
  }
  state.counters["probes"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_ProbeTableFind)->ArgName("probes")->RangeMultiplier(10)->Range(1, 100000);

void BM_VmaSnapshotFind(benchmark::State& state) {
  const Image img(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(0)));
  std::size_t n = 0;
  for (auto _ : state) {
    const Vma* v = img.snapshot->find(img.addresses[n++ & (kLookups - 1)]);
    benchmark::DoNotOptimize(v);
  }
  state.counters["vmas"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_VmaSnapshotFind)->ArgName("vmas")->RangeMultiplier(10)->Range(1, 10000);

// The whole speculative lookup of one hit: sequence count, VMA, probe, re-check.
std::atomic<std::uint64_t> g_seq{0};

void BM_HitLookup(benchmark::State& state) {
  const Image img(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  std::size_t n = 0;
  for (auto _ : state) {
    const std::uint64_t seq = g_seq.load(std::memory_order_acquire);
    Uprobe* u = img.find(img.addresses[n++ & (kLookups - 1)]);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (g_seq.load(std::memory_order_relaxed) != seq) u = nullptr;
    benchmark::DoNotOptimize(u);
  }
}
BENCHMARK(BM_HitLookup)
    ->ArgNames({"probes", "vmas"})
    ->ArgsProduct({{1, 100, 10000, 100000}, {1, 100, 10000}});

// The same lookup from several threads at once: speculative (no shared write)
// against locked (a CAS on the lock word per hit, bouncing between CPUs).
const Image& shared_image() {
  static const Image img(1000, 100);
  return img;
}
SpinRwLock g_lock;

void BM_HitLookupSpeculative(benchmark::State& state) {
  const Image& img = shared_image();
  std::size_t n = static_cast<std::size_t>(state.thread_index()) * 977;
  for (auto _ : state) {
    const std::uint64_t seq = g_seq.load(std::memory_order_acquire);
    Uprobe* u = img.find(img.addresses[n++ & (kLookups - 1)]);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (g_seq.load(std::memory_order_relaxed) != seq) u = nullptr;
    benchmark::DoNotOptimize(u);
  }
}
BENCHMARK(BM_HitLookupSpeculative)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

void BM_HitLookupLocked(benchmark::State& state) {
  const Image& img = shared_image();
  std::size_t n = static_cast<std::size_t>(state.thread_index()) * 977;
  for (auto _ : state) {
    const std::uint64_t epoch = g_lock.lock_shared();
    Uprobe* u = img.find(img.addresses[n++ & (kLookups - 1)]);
    g_lock.unlock_shared(epoch);
    benchmark::DoNotOptimize(u);
  }
}
BENCHMARK(BM_HitLookupLocked)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

}  // namespace
