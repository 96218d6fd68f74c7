// SPDX-License-Identifier: MIT
// Two threads call an optimized nop5 function 1e6 times each while a third
// attaches and detaches it 500 times. Each call is bracketed by reads of the
// attacher's state (detached / attaching / attached / detaching) and by the
// calling thread's own hit count (written by the handler on that thread), so
// every call is accounted for exactly: a call that began and ended inside one
// attached state hit exactly once, one inside one detached state did not hit,
// one overlapping a transition hit at most once, and the consumer's total
// equals the sum over calls. In every attached state the site is the jump;
// after every detach the bytes are the file's; no rwx mapping at the end.

#include <chrono>
#include <thread>

#include "opt_common.hpp"

using namespace opttest;
using uprobe::Action;
using uprobe::Regs;

namespace {

constexpr std::uint64_t kCallsPerThread = 1000000;
constexpr int kCycles = 500;
constexpr std::uint64_t kCallsPerStableState = 1000;  // per producer, per attached/detached state
constexpr int kProducers = 2;

thread_local volatile std::uint64_t tl_hits = 0;

struct TlCounter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, bad_ip{0};
  std::uint64_t ip = 0;
  Action handler(Regs& r) override {
    tl_hits = tl_hits + 1;
    hits.fetch_add(1, std::memory_order_relaxed);
    if (r.rip != ip) bad_ip.fetch_add(1, std::memory_order_relaxed);
    return Action::keep;
  }
};

struct alignas(64) PerProducer {
  std::uint64_t calls = 0, wrong = 0, hits = 0;
  std::uint64_t in_attached = 0, in_detached = 0, in_transition = 0, hits_in_transition = 0;
  std::uint64_t must_hit_missed = 0, must_miss_hit = 0, double_hit = 0;
  std::atomic<std::uint64_t> progress{0};
  std::atomic<bool> done{false};
};

TEST(Threads, AttachDetachWhileTwoThreadsCallOptimizedSite) {
  TlCounter c;
  c.ip = addr(opt_conc);
  const auto file = file_bytes_at(vaddr(opt_conc), 5);
  ASSERT_EQ(hex_bytes(mem(vaddr(opt_conc), 5)), hex_bytes(file));

  std::atomic<std::uint64_t> state{0};  // % 4: 0 detached, 1 attaching, 2 attached, 3 detaching
  std::atomic<bool> attacher_done{false};
  PerProducer pp[kProducers];

  // A producer calls freely while the attacher is in a transition (the racy
  // part) and makes kCallsPerStableState calls in each stable state, then
  // waits for the next state; it stops once it made kCallsPerThread calls
  // and the attacher is done.
  auto producer = [&](PerProducer& me, std::uint64_t seed) {
    std::uint64_t x = seed, last_state = ~std::uint64_t(0), in_state = 0;
    while (me.calls < kCallsPerThread || !attacher_done.load(std::memory_order_relaxed)) {
      const std::uint64_t s1 = state.load(std::memory_order_seq_cst);
      if (s1 != last_state) {
        last_state = s1;
        in_state = 0;
      }
      if ((s1 % 4 == 0 || s1 % 4 == 2) && in_state >= kCallsPerStableState &&
          !(attacher_done.load(std::memory_order_relaxed) && me.calls < kCallsPerThread)) {
        std::this_thread::yield();
        continue;
      }
      ++in_state;
      const std::uint64_t h1 = tl_hits;
      const std::uint64_t r = opt_conc(x);
      const std::uint64_t h2 = tl_hits;
      const std::uint64_t s2 = state.load(std::memory_order_seq_cst);
      const std::uint64_t dh = h2 - h1;
      ++me.calls;
      me.hits += dh;
      if (r != 7 * x + 3) ++me.wrong;
      if (dh > 1) ++me.double_hit;
      if (s1 == s2 && s1 % 4 == 2) {
        ++me.in_attached;
        if (dh != 1) ++me.must_hit_missed;
      } else if (s1 == s2 && s1 % 4 == 0) {
        ++me.in_detached;
        if (dh != 0) ++me.must_miss_hit;
      } else {
        ++me.in_transition;
        me.hits_in_transition += dh;
      }
      me.progress.store(me.calls, std::memory_order_release);
      x += 0x9E3779B9;
    }
    me.done.store(true);
  };
  std::thread t0(producer, std::ref(pp[0]), 1), t1(producer, std::ref(pp[1]), 2);

  // Each producer's call count when the state last changed.
  std::uint64_t b0 = 0, b1 = 0;
  auto enter_state = [&] {
    state.fetch_add(1);
    b0 = pp[0].progress.load();
    b1 = pp[1].progress.load();
  };
  // Let each producer make `n` calls since the state changed (bounded in
  // time; a producer past its quota keeps calling until the attacher is
  // done). Counted from the change, not from here: a producer stops after
  // kCallsPerStableState calls in a stable state, and the attacher's checks
  // before this wait (slow under ThreadSanitizer) may outlast them.
  auto let_run = [&](std::uint64_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while ((pp[0].progress.load() < b0 + n || pp[1].progress.load() < b1 + n) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  };

  int not_optimized = 0, not_restored = 0;
  std::string first_not_optimized, first_not_restored;
  const auto start = std::chrono::steady_clock::now();
  for (int w = 0; w < kCycles; ++w) {
    state.fetch_add(1);  // attaching
    uprobe::Uprobe* p = uprobe::register_uprobe(vaddr(opt_conc), c);
    enter_state();  // attached
    const std::string j = check_jump_into_xol(vaddr(opt_conc));
    if (!j.empty() && not_optimized++ == 0) first_not_optimized = "cycle " + std::to_string(w) + ": " + j;
    let_run(kCallsPerStableState);
    state.fetch_add(1);  // detaching
    uprobe::unregister_uprobe(p, c);
    enter_state();  // detached
    const auto now = mem(vaddr(opt_conc), 5);
    if (now != file && not_restored++ == 0)
      first_not_restored = "cycle " + std::to_string(w) + ": " + hex_bytes(now);
    let_run(kCallsPerStableState);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  attacher_done.store(true);
  t0.join();
  t1.join();

  std::uint64_t calls = 0, wrong = 0, hits = 0, in_att = 0, in_det = 0, in_tr = 0, hits_tr = 0, missed = 0,
                spurious = 0, dbl = 0;
  for (const PerProducer& p : pp) {
    EXPECT_GE(p.calls, kCallsPerThread);
    calls += p.calls;
    wrong += p.wrong;
    hits += p.hits;
    in_att += p.in_attached;
    in_det += p.in_detached;
    in_tr += p.in_transition;
    hits_tr += p.hits_in_transition;
    missed += p.must_hit_missed;
    spurious += p.must_miss_hit;
    dbl += p.double_hit;
  }
  std::printf("[ info ] %d cycles in %.2f s; %llu calls: %llu attached, %llu detached, %llu in transitions "
              "(%llu of them hit)\n",
              kCycles, secs, static_cast<unsigned long long>(calls), static_cast<unsigned long long>(in_att),
              static_cast<unsigned long long>(in_det), static_cast<unsigned long long>(in_tr),
              static_cast<unsigned long long>(hits_tr));
  EXPECT_EQ(wrong, 0u) << "wrong results";
  EXPECT_EQ(missed, 0u) << "calls inside an attached state without exactly one hit";
  EXPECT_EQ(spurious, 0u) << "calls inside a detached state that hit";
  EXPECT_EQ(dbl, 0u) << "calls with more than one hit";
  EXPECT_EQ(c.hits.load(), hits) << "consumer hits != hits accounted to calls";
  EXPECT_EQ(hits, in_att + hits_tr) << "hits != calls made while attached (+ hits of transitional calls)";
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(not_optimized, 0) << first_not_optimized;
  EXPECT_EQ(not_restored, 0) << first_not_restored;
  EXPECT_GT(in_att, 0u);
  EXPECT_GT(in_det, 0u);
  EXPECT_EQ(hex_bytes(mem(vaddr(opt_conc), 5)), hex_bytes(file));
  const auto rwx = rwx_mappings();
  EXPECT_TRUE(rwx.empty()) << rwx[0];
}

}  // namespace
