// SPDX-License-Identifier: MIT
// Group 9: two producer threads call a probed function while a third thread
// attaches and detaches it 1000 times.
//
// WindowsExact: the attacher announces each phase through a handshake.
//   attached window w: register, announce, each producer makes K calls and
//   acks, the attacher checks hits == 2K for that window, then unregisters;
//   detached phase w: announce, each producer makes F calls and acks, the
//   attacher checks that no hit happened.
// FreeRunning: the producers never wait; each call is bracketed by reads of
//   the attacher's state (detached / attaching / attached / detaching). A call
//   that began and ended inside one attached state must have hit exactly once;
//   one inside one detached state must not have hit; calls overlapping a
//   transition hit at most once. The handler counts per thread, so every call
//   is accounted for.

#include <pthread.h>

#include <chrono>
#include <thread>

#include "common.hpp"
#include "fixtures.hpp"

using namespace coretest;
using uprobe::Action;
using uprobe::Regs;

namespace {

constexpr int kWindows = 1000;
constexpr int kProducers = 2;

struct WindowCounter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> bad_ip{0};
  std::uint64_t ip = 0;
  Action handler(Regs& r) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    if (r.rip != ip) bad_ip.fetch_add(1, std::memory_order_relaxed);
    return Action::keep;
  }
};

TEST(Concurrency, AttachDetachWindowsAreExact) {
  constexpr int K = 4, F = 3;
  WindowCounter c;
  c.ip = reinterpret_cast<std::uint64_t>(fx_addr(fx_conc));
  std::atomic<std::uint64_t> phase{0};  // 0 idle; 2w+1 attached window w; 2w+2 detached phase w; ~0 stop
  std::atomic<std::uint64_t> acks{0};
  std::atomic<std::uint64_t> wrong{0}, calls{0};
  constexpr std::uint64_t kStop = ~std::uint64_t(0);

  auto producer = [&](int id) {
    std::uint64_t seen = 0;
    for (;;) {
      phase.wait(seen, std::memory_order_acquire);
      std::uint64_t ph = phase.load(std::memory_order_acquire);
      if (ph == seen) continue;
      seen = ph;
      if (ph == kStop) return;
      const int n = (ph % 2) ? K : F;
      for (int i = 0; i < n; ++i) {
        const std::uint64_t x = ph * 16 + static_cast<std::uint64_t>(id * 8 + i);
        if (fx_conc(x, 0) != 7 * x + 3) wrong.fetch_add(1, std::memory_order_relaxed);
        calls.fetch_add(1, std::memory_order_relaxed);
      }
      acks.fetch_add(1, std::memory_order_acq_rel);
      acks.notify_all();
    }
  };
  std::thread p0(producer, 0), p1(producer, 1);

  auto announce_and_wait = [&](std::uint64_t ph) {
    phase.store(ph, std::memory_order_release);
    phase.notify_all();
    const std::uint64_t want = ph * kProducers;  // every phase 1..ph acked by both
    for (std::uint64_t a = acks.load(std::memory_order_acquire); a < want; a = acks.load(std::memory_order_acquire))
      acks.wait(a, std::memory_order_acquire);
  };

  const uprobe::Stats s0 = uprobe::stats();
  int bad_windows = 0, hits_outside = 0;
  std::string first_bad;
  const auto t0 = std::chrono::steady_clock::now();
  for (int w = 0; w < kWindows; ++w) {
    const std::uint64_t before = c.hits.load();
    uprobe::Uprobe* p = uprobe::register_uprobe(fx_addr(fx_conc), c);
    announce_and_wait(2 * static_cast<std::uint64_t>(w) + 1);
    const std::uint64_t in_window = c.hits.load() - before;
    uprobe::unregister_uprobe(p, c);
    if (in_window != 2 * K && bad_windows++ == 0)
      first_bad = "window " + std::to_string(w) + ": " + std::to_string(in_window) + " hits";
    const std::uint64_t after_detach = c.hits.load();
    announce_and_wait(2 * static_cast<std::uint64_t>(w) + 2);
    if (c.hits.load() != after_detach) ++hits_outside;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  phase.store(kStop, std::memory_order_release);
  phase.notify_all();
  p0.join();
  p1.join();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  std::printf("[ info ] %d windows in %.2f s\n", kWindows, secs);
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(calls.load(), static_cast<std::uint64_t>(kWindows) * kProducers * (K + F));
  EXPECT_EQ(bad_windows, 0) << "first: " << first_bad << " (expected " << 2 * K << ")";
  EXPECT_EQ(hits_outside, 0) << "hits during detached phases";
  EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kWindows) * kProducers * K);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(d.hits, static_cast<std::uint64_t>(kWindows) * kProducers * K) << stats_str(d);
}

thread_local volatile std::uint64_t tl_hits = 0;  // written by the handler on the hitting thread

struct PerThreadCounter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs&) override {
    tl_hits = tl_hits + 1;
    hits.fetch_add(1, std::memory_order_relaxed);
    return Action::keep;
  }
};

TEST(Concurrency, FreeRunningCallsAcrossAttachDetach) {
  // state % 4: 0 detached, 1 attaching, 2 attached, 3 detaching.
  std::atomic<std::uint64_t> state{0};
  std::atomic<bool> stop{false};
  PerThreadCounter c;
  struct PerProducer {
    std::uint64_t calls = 0, wrong = 0, must_hit_missed = 0, must_miss_hit = 0, double_hit = 0, hits = 0;
    std::uint64_t in_attached = 0, in_detached = 0;
    std::atomic<std::uint64_t> progress{0};
  };
  PerProducer pp[kProducers];

  // Producers call freely while the attacher is in a transition (register or
  // unregister in progress: the racy part), and make a few calls in each
  // stable state before waiting for the next state, so that 1000 windows stay
  // fast on 2 cores.
  constexpr std::uint64_t kPerStableState = 3;
  auto producer = [&](PerProducer& me, std::uint64_t seed) {
    std::uint64_t x = seed, last_state = ~std::uint64_t(0), in_state = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::uint64_t s1 = state.load(std::memory_order_seq_cst);
      if (s1 != last_state) {
        last_state = s1;
        in_state = 0;
      }
      if ((s1 % 4 == 0 || s1 % 4 == 2) && in_state >= kPerStableState) {
        std::this_thread::yield();
        continue;
      }
      ++in_state;
      const std::uint64_t h1 = tl_hits;
      const std::uint64_t r = fx_conc2(x, 0);
      const std::uint64_t h2 = tl_hits;
      const std::uint64_t s2 = state.load(std::memory_order_seq_cst);
      const std::uint64_t dh = h2 - h1;
      ++me.calls;
      me.hits += dh;
      if (r != 5 * x + 1) ++me.wrong;
      if (dh > 1) ++me.double_hit;
      if (s1 == s2 && s1 % 4 == 2) {
        ++me.in_attached;
        if (dh != 1) ++me.must_hit_missed;
      }
      if (s1 == s2 && s1 % 4 == 0) {
        ++me.in_detached;
        if (dh != 0) ++me.must_miss_hit;
      }
      me.progress.store(me.calls, std::memory_order_release);
      x += 0x9E3779B9;
    }
  };
  std::thread t0(producer, std::ref(pp[0]), 1), t1(producer, std::ref(pp[1]), 2);

  // Wait until each producer has made at least `n` more calls (bounded).
  auto let_run = [&](std::uint64_t n) {
    const std::uint64_t b0 = pp[0].progress.load(), b1 = pp[1].progress.load();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while ((pp[0].progress.load() < b0 + n || pp[1].progress.load() < b1 + n) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  };

  const auto start = std::chrono::steady_clock::now();
  for (int w = 0; w < kWindows; ++w) {
    state.fetch_add(1);  // attaching
    uprobe::Uprobe* p = uprobe::register_uprobe(fx_addr(fx_conc2), c);
    state.fetch_add(1);  // attached
    let_run(2);
    state.fetch_add(1);  // detaching
    uprobe::unregister_uprobe(p, c);
    state.fetch_add(1);  // detached
    let_run(1);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stop.store(true);
  t0.join();
  t1.join();

  std::uint64_t calls = 0, hits = 0, attached = 0, detached = 0;
  for (auto& p : pp) {
    EXPECT_EQ(p.wrong, 0u);
    EXPECT_EQ(p.double_hit, 0u) << "a single call was reported more than once";
    EXPECT_EQ(p.must_hit_missed, 0u) << "calls made entirely while attached that were not reported";
    EXPECT_EQ(p.must_miss_hit, 0u) << "calls made entirely while detached that were reported";
    calls += p.calls;
    hits += p.hits;
    attached += p.in_attached;
    detached += p.in_detached;
  }
  EXPECT_EQ(c.hits.load(), hits) << "consumer total vs the per-thread accounting";
  std::printf("[ info ] %d windows in %.2f s\n", kWindows, secs);
  std::printf("[ info ] %llu calls, %llu hits, %llu surely attached, %llu surely detached\n",
              static_cast<unsigned long long>(calls), static_cast<unsigned long long>(hits),
              static_cast<unsigned long long>(attached), static_cast<unsigned long long>(detached));
  EXPECT_GT(attached, 0u);
  EXPECT_GT(detached, 0u);
  EXPECT_EQ(fx_conc2(3, 0), 16u);
}

}  // namespace
