// SPDX-License-Identifier: MIT
// Per-site memory given back at detach (issue 16: attaching at every
// instruction of a library in rounds): the stubs, XOL slots and hops of
// detached sites are reused once no thread can be inside them, pages of hops
// with none left are unmapped, and the process's mappings stay bounded however
// many distinct sites it probed. Threads running through the sites, and one
// parked inside a consumer, while their sites are detached and the memory is
// reused.

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "opt_common.hpp"
#include "uprobe/batch.hpp"
#include "uprobe/lab.hpp"

extern "C" {
std::uint64_t opt_many(std::uint64_t);
std::uint64_t opt_park(std::uint64_t);
}

using namespace opttest;

namespace {

constexpr std::size_t kUnits = 512;
constexpr std::size_t kPerRound = 64;
constexpr std::size_t kManyLen = 3 + 10 * kUnits + 1;

const std::uint8_t* many() { return reinterpret_cast<const std::uint8_t*>(&opt_many); }
const void* nop_site(std::size_t i) { return many() + 3 + 10 * i; }
const void* add_site(std::size_t i) { return many() + 8 + 10 * i; }

/// The lines of /proc/self/maps that are libuprobe's XOL memory.
std::size_t xol_mappings() {
  std::size_t n = 0;
  for (const Mapping& m : read_maps()) n += m.path.find("libuprobe-xol") != std::string::npos;
  return n;
}

/// Counts the hits of the thread that set `mine` apart from the others'.
struct ThreadCounter : uprobe::Consumer {
  static thread_local bool mine;
  std::atomic<std::uint64_t> own{0}, others{0};
  uprobe::Action handler(uprobe::Regs&) override {
    (mine ? own : others).fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};
thread_local bool ThreadCounter::mine = false;

/// Attaches `c` at every site of `sites` as one batch; each must take `mode`.
std::vector<uprobe::ProbeConsumer> attach(const std::vector<const void*>& sites, uprobe::Consumer& c,
                                          uprobe::ProbeMode mode) {
  std::vector<uprobe::ProbeRequest> reqs;
  for (const void* s : sites) reqs.push_back(uprobe::ProbeRequest::at(s, c));
  std::vector<uprobe::ProbeConsumer> pcs;
  const std::vector<uprobe::RegisterResult> res = uprobe::register_uprobes(reqs);
  for (std::size_t i = 0; i < res.size(); ++i) {
    EXPECT_TRUE(res[i]) << "site " << i << ": " << (res[i] ? "" : res[i].error->what());
    if (!res[i]) continue;
    // A punned site: padded only where every page of B2's range is mapped
    // (the heap may lie there).
    const uprobe::ProbeMode want =
        mode == uprobe::ProbeMode::optimized_punned ? punned_form_here(sites[i], uprobe::probe_info(res[i].probe).displaced, res[i].mode) : mode;
    EXPECT_EQ(res[i].mode, want) << "site " << i << ": " << uprobe::probe_info(res[i].probe).why_not_optimized;
    pcs.push_back({res[i].probe, &c});
  }
  return pcs;
}

void detach(const std::vector<uprobe::ProbeConsumer>& pcs) {
  for (const auto& e : uprobe::unregister_uprobes(pcs)) EXPECT_FALSE(e) << e->what();
}

/// The jump targets (stubs, or a punned site's hops) of `sites`, all jumps into XOL memory.
std::set<std::uint64_t> targets(const std::vector<const void*>& sites) {
  std::set<std::uint64_t> t;
  for (const void* s : sites) {
    EXPECT_EQ(check_jump_into_xol(s), "") << s;
    t.insert(jump_target(s));
  }
  return t;
}

std::vector<const void*> round_sites(std::size_t round, const void* (*site)(std::size_t)) {
  std::vector<const void*> v;
  for (std::size_t k = 0; k < kPerRound; ++k) v.push_back(site((round * kPerRound + k) % kUnits));
  return v;
}

}  // namespace

/// Eight rounds of 64 distinct nop5 sites (512 in all), each attached,
/// run, detached: every round's stubs are exactly the first round's blocks
/// (given back at detach and taken again), the XOL mappings and all the
/// process's mappings stay as after the first round, and the text is the
/// file's after each detach.
TEST(Reclaim, RoundsOfDistinctSitesReuseTheirStubsAndMappingsStayBounded) {
  const std::vector<std::uint8_t> original = mem(many(), kManyLen);
  ASSERT_EQ(original, file_bytes_at(many(), kManyLen));
  ThreadCounter c;
  ThreadCounter::mine = true;
  std::set<std::uint64_t> first;
  std::size_t xol0 = 0, maps0 = 0;
  for (std::size_t r = 0; r < kUnits / kPerRound; ++r) {
    const std::vector<const void*> sites = round_sites(r, nop_site);
    const auto pcs = attach(sites, c, uprobe::ProbeMode::optimized_nop5);
    ASSERT_EQ(pcs.size(), kPerRound);
    const std::set<std::uint64_t> stubs = targets(sites);
    EXPECT_EQ(stubs.size(), kPerRound);
    c.own = 0;
    EXPECT_EQ(opt_many(1000), 1000u + kUnits);
    EXPECT_EQ(c.own.load(), kPerRound) << "round " << r;
    detach(pcs);
    EXPECT_EQ(mem(many(), kManyLen), original) << "round " << r;
    if (r == 0) {
      first = stubs;
      xol0 = xol_mappings();
      maps0 = read_maps().size();
      EXPECT_GE(xol0, 1u);
      continue;
    }
    EXPECT_EQ(stubs, first) << "round " << r << ": the stubs are not the first round's, given back";
    EXPECT_EQ(xol_mappings(), xol0) << "round " << r;
    EXPECT_EQ(read_maps().size(), maps0) << "round " << r;
  }
  EXPECT_EQ(c.others.load(), 0u);
  EXPECT_EQ(opt_many(5), 5u + kUnits);
  EXPECT_EQ(c.own.load(), kPerRound);  // detached: no more hits
}

/// Punned jumps (SiteTactics::instruction_only on the 4-byte adds): each
/// round's hops sit in pages of their own, mapped at the addresses the
/// punned bytes select; when the round's sites are detached every such page
/// is unmapped, so the XOL mappings after each detach are exactly the
/// first round's.
TEST(Reclaim, PagesOfHopsAreUnmappedWhenTheirSitesAreDetached) {
  ConfigGuard g;
  uprobe::Config cfg = uprobe::configuration();
  cfg.site_tactics = uprobe::SiteTactics::instruction_only;
  uprobe::configure(cfg);
  const std::vector<std::uint8_t> original = mem(many(), kManyLen);
  ThreadCounter c;
  ThreadCounter::mine = true;
  std::size_t detached0 = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    const std::vector<const void*> sites = round_sites(r, add_site);
    const auto pcs = attach(sites, c, uprobe::ProbeMode::optimized_punned);
    ASSERT_EQ(pcs.size(), kPerRound);
    std::set<std::uint64_t> pages;
    for (std::uint64_t hop : targets(sites)) pages.insert(hop & ~std::uint64_t{4095});
    EXPECT_GE(pages.size(), 1u);
    c.own = 0;
    EXPECT_EQ(opt_many(7), 7u + kUnits);
    EXPECT_EQ(c.own.load(), kPerRound) << "round " << r;
    const std::size_t attached = xol_mappings();
    detach(pcs);
    EXPECT_EQ(mem(many(), kManyLen), original) << "round " << r;
    const std::size_t detached = xol_mappings();
    EXPECT_EQ(attached - detached, pages.size()) << "round " << r << ": pages of hops left mapped";
    for (std::uint64_t p : pages) EXPECT_FALSE(mapping_of(p)) << "round " << r << ": hop page " << hex(p);
    if (r == 0) detached0 = detached;
    EXPECT_EQ(detached, detached0) << "round " << r;
  }
}

/// A thread calls opt_many() without pause while the main thread attaches
/// and detaches 16 rounds of 64 nop5 sites (a sample signal observes it):
/// every one of its results is exact, the main thread's hits are exactly 64
/// a round, the text is the file's after each detach, and the detached
/// stubs are reused (at most 4 x 64 distinct stub blocks over 1024
/// attaches; one is kept back only while the thread was seen inside).
TEST(Reclaim, AThreadRunsThroughSitesWhileTheirMemoryIsReused) {
  ConfigGuard g;
  uprobe::Config cfg = uprobe::configuration();
  cfg.sample_signal = SIGRTMAX;
  uprobe::configure(cfg);
  const std::vector<std::uint8_t> original = mem(many(), kManyLen);
  ThreadCounter c;
  ThreadCounter::mine = true;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> calls{0}, wrong{0};
  std::thread runner([&] {
    for (std::uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      if (opt_many(i) != i + kUnits) wrong.fetch_add(1);
      calls.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (calls.load() == 0) {
  }
  std::set<std::uint64_t> all;
  std::size_t xol0 = 0;
  for (std::size_t r = 0; r < 16; ++r) {
    const std::vector<const void*> sites = round_sites(r % 8, nop_site);
    const auto pcs = attach(sites, c, uprobe::ProbeMode::optimized_nop5);
    ASSERT_EQ(pcs.size(), kPerRound);
    for (std::uint64_t s : targets(sites)) all.insert(s);
    const std::uint64_t before = c.own.load();
    EXPECT_EQ(opt_many(3), 3u + kUnits);
    EXPECT_EQ(c.own.load() - before, kPerRound) << "round " << r;
    const std::uint64_t seen = calls.load();
    while (calls.load() < seen + 2) {  // the runner went through the attached sites
    }
    detach(pcs);
    EXPECT_EQ(mem(many(), kManyLen), original) << "round " << r;
    if (r == 0) xol0 = xol_mappings();
  }
  stop = true;
  runner.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(c.others.load(), 0u);
  EXPECT_LE(all.size(), 4 * kPerRound) << "detached stubs were not reused";
  EXPECT_EQ(xol_mappings(), xol0);
}

namespace {
/// Parks the thread that set `park_here` inside its handler, blocked in
/// read() on a pipe until the test writes a byte.
struct Parker : uprobe::Consumer {
  static thread_local bool park_here;
  int fds[2] = {-1, -1};
  std::atomic<int> parked{0};
  std::atomic<std::uint64_t> hits{0};
  Parker() { EXPECT_EQ(::pipe(fds), 0); }
  ~Parker() override {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  uprobe::Action handler(uprobe::Regs&) override {
    hits.fetch_add(1);
    if (park_here) {
      parked.store(1);
      char b = 0;
      EXPECT_EQ(::read(fds[0], &b, 1), 1);
    }
    return uprobe::Action::keep;
  }
};
thread_local bool Parker::park_here = false;
}  // namespace

/// A thread parked in a consumer (blocked in read()) called from the stub of
/// opt_park while that site is detached: the site's bytes are the file's at
/// once, but the detach returns only after the parked thread left its
/// consumer (its grace period waits for it), so its stub is not reused under
/// it; the thread returns with the exact result, and the next probe takes
/// the detached site's stub block.
TEST(Reclaim, AThreadParkedInAConsumerKeepsItsStubUntilItLeaves) {
  ConfigGuard g;
  uprobe::Config cfg = uprobe::configuration();
  cfg.sample_signal = SIGRTMAX;  // the parked thread, on its way out when the detach observes it, is running
  uprobe::configure(cfg);
  const std::vector<std::uint8_t> park_original = mem(vaddr(opt_park), 5);
  ASSERT_EQ(park_original, std::vector<std::uint8_t>(kNop5, kNop5 + 5));
  Parker p;
  uprobe::Uprobe* probe = uprobe::register_uprobe(vaddr(opt_park), p);
  ASSERT_NE(probe, nullptr);
  ASSERT_EQ(uprobe::probe_info(probe).mode, uprobe::ProbeMode::optimized_nop5);
  const std::uint64_t stub = jump_target(vaddr(opt_park));
  ASSERT_NE(stub, 0u);
  std::atomic<std::uint64_t> result{0};
  std::thread parked([&] {
    Parker::park_here = true;
    result = opt_park(10);
  });
  while (p.parked.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::atomic<bool> detached{false};
  std::thread detacher([&] {
    uprobe::unregister_uprobe(probe, p);
    detached = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(mem(vaddr(opt_park), 5), park_original);  // restored while the thread is inside
  EXPECT_FALSE(detached.load()) << "the detach returned while a thread was parked in the consumer";
  EXPECT_EQ(result.load(), 0u);
  char b = 1;
  ASSERT_EQ(::write(p.fds[1], &b, 1), 1);
  parked.join();
  detacher.join();
  EXPECT_TRUE(detached.load());
  EXPECT_EQ(result.load(), 15u);
  EXPECT_EQ(p.hits.load(), 1u);
  // The next probe takes the freed blocks: its stub is the parked site's.
  ThreadCounter c;
  ThreadCounter::mine = true;
  const auto pcs = attach({nop_site(0)}, c, uprobe::ProbeMode::optimized_nop5);
  ASSERT_EQ(pcs.size(), 1u);
  EXPECT_EQ(jump_target(nop_site(0)), stub);
  EXPECT_EQ(opt_many(0), kUnits);
  EXPECT_EQ(c.own.load(), 1u);
  EXPECT_EQ(opt_park(1), 6u);
  EXPECT_EQ(p.hits.load(), 1u);
  detach(pcs);
  EXPECT_EQ(mem(vaddr(opt_park), 5), park_original);
  EXPECT_EQ(mem(nop_site(0), 5), std::vector<std::uint8_t>(kNop5, kNop5 + 5));
}
