// SPDX-License-Identifier: MIT
// Return probes on nested, recursive and tail-calling code: exact numbers of
// return calls with exact values per level (fib, fact, a three-function
// nest), sessions with one cookie per recursive invocation, the depth limit
// (Config::max_uretprobe_depth, Stats::return_misses), chains of tail calls
// (the kernel's chained return instances: innermost ret_handler first), and a
// two-thread stress. The value tests run under every configuration that
// changes how return instances are kept (ri_pool, ri_lock) or how the entry
// instruction continues.

#include <pthread.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "ret_common.hpp"

using namespace rettest;
using uprobe::Action;
using uprobe::Callbacks;
using uprobe::Regs;

namespace {

constexpr unsigned kMaxN = 64;

/// Session consumer for rt_fib: cookie = entry rsp << 8 | n.
struct FibSession : uprobe::Consumer {
  FibSession() : uprobe::Consumer(Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0};
  std::atomic<std::uint64_t> bad_start{0}, bad_rax{0}, bad_rsp{0}, bad_rip{0}, bad_func{0}, bad_n{0};
  std::atomic<std::uint64_t> ret_per_n[kMaxN]{}, entry_per_n[kMaxN]{};
  std::uint64_t fib_of[kMaxN];
  std::uint64_t rs1 = addr(rt_fib) + rt_fib_rs1_off, rs2 = addr(rt_fib) + rt_fib_rs2_off, top = call_site();

  FibSession(const FibSession&) = delete;
  void init() {
    for (unsigned i = 0; i < kMaxN; ++i) fib_of[i] = fib_model(i);
  }
  Action handler(Regs& r) override {
    entries.fetch_add(1, std::memory_order_relaxed);
    if (uprobe::session_cookie() != 0) bad_start.fetch_add(1, std::memory_order_relaxed);
    if (r.rdi >= kMaxN) {
      bad_n.fetch_add(1);
      return Action::keep;
    }
    entry_per_n[r.rdi].fetch_add(1, std::memory_order_relaxed);
    uprobe::session_cookie() = r.rsp << 8 | r.rdi;
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t func) override {
    rets.fetch_add(1, std::memory_order_relaxed);
    std::uint64_t c = uprobe::session_cookie();
    std::uint64_t n = c & 0xff, rsp = c >> 8;
    if (n >= kMaxN) {
      bad_n.fetch_add(1);
      return;
    }
    ret_per_n[n].fetch_add(1, std::memory_order_relaxed);
    if (r.rax != fib_of[n]) bad_rax.fetch_add(1, std::memory_order_relaxed);
    if (r.rsp != rsp + 8) bad_rsp.fetch_add(1, std::memory_order_relaxed);
    if (r.rip != rs1 && r.rip != rs2 && r.rip != top) bad_rip.fetch_add(1, std::memory_order_relaxed);
    if (func != addr(rt_fib)) bad_func.fetch_add(1, std::memory_order_relaxed);
  }
  void expect_clean() const {
    EXPECT_EQ(bad_start.load(), 0u) << "cookie must start at 0";
    EXPECT_EQ(bad_rax.load(), 0u) << "rax at return must be fib(n) of the invocation whose cookie this is";
    EXPECT_EQ(bad_rsp.load(), 0u) << "rsp at return must be the entry rsp + 8";
    EXPECT_EQ(bad_rip.load(), 0u) << "rip at return must be a call site in rt_fib or rt_call";
    EXPECT_EQ(bad_func.load(), 0u);
    EXPECT_EQ(bad_n.load(), 0u);
  }
};

class RetModes : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override { uprobe::configure(config_for(GetParam())); }
  ConfigGuard guard_;
};

TEST_P(RetModes, FibSessionExactPerLevel) {
  constexpr std::uint64_t N = 20;
  auto* s = new FibSession;  // large: keep it off the stack
  s->init();
  auto s0 = uprobe::stats();
  {
    uprobe::Attachment a(vaddr(rt_fib), *s);
    for (int rep = 0; rep < 2; ++rep) ASSERT_EQ(rt_call(vaddr(rt_fib), N, 0, 0, 0), fib_model(N));
    for (std::uint64_t n = 0; n < 10; ++n) ASSERT_EQ(rt_call(vaddr(rt_fib), n, 0, 0, 0), fib_model(n));
  }
  std::uint64_t total = 2 * fib_calls(N);
  for (std::uint64_t n = 0; n < 10; ++n) total += fib_calls(n);
  EXPECT_EQ(s->entries.load(), total);
  EXPECT_EQ(s->rets.load(), total);
  for (std::uint64_t k = 0; k <= N; ++k) {
    std::uint64_t want = 2 * fib_calls_of(N, k);
    for (std::uint64_t n = 0; n < 10; ++n) want += fib_calls_of(n, k);
    EXPECT_EQ(s->ret_per_n[k].load(), want) << "return calls of fib(" << k << ")";
    EXPECT_EQ(s->entry_per_n[k].load(), want) << "entry calls of fib(" << k << ")";
  }
  s->expect_clean();
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(d.hits, total) << str(d);
  EXPECT_EQ(d.return_hits, total) << str(d);
  EXPECT_EQ(d.return_misses, 0u) << str(d);
  EXPECT_EQ(d.return_dropped, 0u) << str(d);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  delete s;
}

/// Ret-only logger (single thread).
struct Logger : uprobe::Consumer {
  explicit Logger(Callbacks c = Callbacks::ret) : uprobe::Consumer(c) {}
  RetLog<4096> log;
  Action handler(Regs& r) override {
    uprobe::session_cookie() = r.rip ^ r.rdi;
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t func) override {
    log.add(RetRec{func, r.rax, r.rdx, r.rip, r.rsp, uprobe::session_cookie(), this});
  }
};

TEST_P(RetModes, FactEachLevelInnermostFirst) {
  constexpr std::uint64_t N = 20;
  Logger lg;
  uprobe::Attachment a(vaddr(rt_fact), lg);
  ASSERT_EQ(rt_call(vaddr(rt_fact), N, 0, 0, 0), fact_model(N));
  ASSERT_EQ(lg.log.size(), N) << "one return call per invocation (fact(20) .. fact(1))";
  for (std::uint64_t i = 0; i < N; ++i) {
    const RetRec& r = lg.log.rec[i];
    EXPECT_EQ(r.rax, fact_model(i + 1)) << "return #" << i << " must be fact(" << i + 1 << ")";
    EXPECT_EQ(r.func, addr(rt_fact));
    if (i + 1 < N) {
      EXPECT_EQ(r.rip, addr(rt_fact) + rt_fact_rs_off) << "return #" << i << " goes back into rt_fact";
      EXPECT_EQ(lg.log.rec[i + 1].rsp, r.rsp + 16) << "each outer frame is 16 bytes up (ret addr + saved rdi)";
    } else {
      EXPECT_EQ(r.rip, call_site());
      EXPECT_EQ(r.rsp, rt_call_rsp);
    }
  }
  // And again, through C++ this time, with a session logger next to it.
  Logger sess(Callbacks::entry_and_ret);
  uprobe::Attachment b(vaddr(rt_fact), sess);
  lg.log.clear();
  auto volatile f = &rt_fact;
  ASSERT_EQ(f(10), fact_model(10));
  ASSERT_EQ(lg.log.size(), 10u);
  ASSERT_EQ(sess.log.size(), 10u);
  for (std::uint64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(sess.log.rec[i].rax, fact_model(i + 1));
    EXPECT_EQ(sess.log.rec[i].cookie, addr(rt_fact) ^ (i + 1)) << "each level has its own cookie";
  }
}

volatile int g_call_sink;
/// Calls fp_outer from one fixed call site (not a tail call).
__attribute__((noinline, noipa)) int call_fp_outer(void** out) {
  int r = fp_outer(out, 3);
  g_call_sink = r;
  return r;
}

TEST_P(RetModes, NestedDifferentFunctions) {
  void* real[3] = {};
  ASSERT_EQ(call_fp_outer(real), 1103);  // unprobed: the real return addresses
  Logger lg;
  uprobe::Attachment a(vaddr(fp_outer), lg), b(vaddr(fp_mid), lg), c(vaddr(fp_inner), lg);
  for (int rep = 0; rep < 100; ++rep) {
    lg.log.clear();
    void* frames[3] = {};
    ASSERT_EQ(call_fp_outer(frames), 1103);
    ASSERT_EQ(lg.log.size(), 3u);
    const RetRec* r = lg.log.rec;
    EXPECT_EQ(r[0].func, addr(fp_inner));
    EXPECT_EQ(r[0].rax, 3u);
    EXPECT_EQ(r[0].rip, reinterpret_cast<std::uint64_t>(real[0])) << "fp_inner returns into fp_mid";
    EXPECT_EQ(r[1].func, addr(fp_mid));
    EXPECT_EQ(r[1].rax, 103u);
    EXPECT_EQ(r[1].rip, reinterpret_cast<std::uint64_t>(real[1])) << "fp_mid returns into fp_outer";
    EXPECT_EQ(r[2].func, addr(fp_outer));
    EXPECT_EQ(r[2].rax, 1103u);
    EXPECT_EQ(r[2].rip, reinterpret_cast<std::uint64_t>(real[2])) << "fp_outer returns into call_fp_outer";
    EXPECT_EQ(r[1].rsp, r[0].rsp + 16) << "fp frames: saved rbp + return address";
    EXPECT_EQ(r[2].rsp, r[1].rsp + 16);
    if (HasFailure()) break;
  }
}

// ------------------------------------------------------- tail calls ----

TEST_P(RetModes, TailCallChainInnermostFirst) {
  Logger lg(Callbacks::entry_and_ret);
  uprobe::Attachment a(vaddr(rt_tail_a), lg), b(vaddr(rt_tail_b), lg), c(vaddr(rt_tail_c), lg);
  auto s0 = uprobe::stats();
  for (std::uint64_t x = 0; x < 300; ++x) {
    lg.log.clear();
    ASSERT_EQ(rt_call(vaddr(rt_tail_a), x, 0, 0, 0), 2 * x + 5);
    ASSERT_EQ(lg.log.size(), 3u) << "a, b and c each get their return call";
    const std::uint64_t order[3] = {addr(rt_tail_c), addr(rt_tail_b), addr(rt_tail_a)};
    const std::uint64_t arg[3] = {2 * (x + 1), x + 1, x};  // each one's rdi at its entry
    for (int i = 0; i < 3; ++i) {
      const RetRec& r = lg.log.rec[i];
      ASSERT_EQ(r.func, order[i]) << "chained returns run innermost first (c, b, a), #" << i;
      ASSERT_EQ(r.rax, 2 * x + 5) << "#" << i;
      ASSERT_EQ(r.rip, call_site()) << "every return of the chain goes to a's caller, #" << i;
      ASSERT_EQ(r.rsp, rt_call_rsp) << "#" << i;
      ASSERT_EQ(r.cookie, order[i] ^ arg[i]) << "each link has its own session cookie, #" << i;
    }
    ASSERT_EQ(uprobe::return_stack_depth(), 0u);
  }
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(d.hits, 900u) << str(d);
  EXPECT_EQ(d.return_hits, 900u) << str(d);
  EXPECT_EQ(d.return_misses, 0u) << str(d);
  EXPECT_EQ(d.return_dropped, 0u) << str(d);
}

TEST_P(RetModes, TailCallFirstInstructionIsTheJump) {
  Logger lg;
  uprobe::Attachment j(vaddr(rt_tail_j), lg), b(vaddr(rt_tail_b), lg);
  for (std::uint64_t x = 0; x < 200; ++x) {
    lg.log.clear();
    ASSERT_EQ(rt_call(vaddr(rt_tail_j), x, 0, 0, 0), 2 * x + 3);
    ASSERT_EQ(lg.log.size(), 2u);
    ASSERT_EQ(lg.log.rec[0].func, addr(rt_tail_b));
    ASSERT_EQ(lg.log.rec[1].func, addr(rt_tail_j));
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(lg.log.rec[i].rax, 2 * x + 3);
      ASSERT_EQ(lg.log.rec[i].rip, call_site());
    }
  }
}

TEST_P(RetModes, TailCallPartlyProbed) {
  // Only a and c probed (b in between is not): c then a.
  {
    Logger lg;
    uprobe::Attachment a(vaddr(rt_tail_a), lg), c(vaddr(rt_tail_c), lg);
    for (std::uint64_t x = 0; x < 100; ++x) {
      lg.log.clear();
      ASSERT_EQ(rt_call(vaddr(rt_tail_a), x, 0, 0, 0), 2 * x + 5);
      ASSERT_EQ(lg.log.size(), 2u);
      ASSERT_EQ(lg.log.rec[0].func, addr(rt_tail_c));
      ASSERT_EQ(lg.log.rec[1].func, addr(rt_tail_a));
      ASSERT_EQ(lg.log.rec[0].rip, call_site());
      ASSERT_EQ(lg.log.rec[1].rip, call_site());
    }
  }
  // Only b probed, entered by a's tail jump: it returns straight to a's caller.
  {
    Logger lg;
    uprobe::Attachment b(vaddr(rt_tail_b), lg);
    for (std::uint64_t x = 0; x < 100; ++x) {
      lg.log.clear();
      ASSERT_EQ(rt_call(vaddr(rt_tail_a), x, 0, 0, 0), 2 * x + 5);
      ASSERT_EQ(lg.log.size(), 1u);
      ASSERT_EQ(lg.log.rec[0].func, addr(rt_tail_b));
      ASSERT_EQ(lg.log.rec[0].rax, 2 * x + 5);
      ASSERT_EQ(lg.log.rec[0].rip, call_site());
      ASSERT_EQ(lg.log.rec[0].rsp, rt_call_rsp);
    }
  }
}

// ------------------------------------------------------ depth limit ----

struct SumSession : uprobe::Consumer {
  SumSession() : uprobe::Consumer(Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0}, bad{0};
  std::atomic<std::uint64_t> min_n{~0ull}, max_n{0};
  Action handler(Regs& r) override {
    entries.fetch_add(1);
    uprobe::session_cookie() = r.rdi;
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t) override {
    rets.fetch_add(1);
    std::uint64_t n = uprobe::session_cookie();
    if (r.rax != n * (n + 1) / 2) bad.fetch_add(1);
    if (n < min_n.load()) min_n.store(n);
    if (n > max_n.load()) max_n.store(n);
  }
};

class RetDepth : public ::testing::TestWithParam<unsigned> {};

TEST_P(RetDepth, DeeperInvocationsGetNoReturnCall) {
  ConfigGuard guard;
  const unsigned limit = GetParam();
  if (limit != 0) {
    uprobe::Config c = uprobe::configuration();
    c.max_uretprobe_depth = limit;
    uprobe::configure(c);
  }
  const unsigned eff = limit ? limit : 64;  // 0: the default, which must be 64
  EXPECT_EQ(uprobe::configuration().max_uretprobe_depth, eff);
  const std::uint64_t N = eff + 36;  // N + 1 invocations
  SumSession s;
  auto s0 = uprobe::stats();
  {
    uprobe::Attachment a(vaddr(rt_sum), s);
    ASSERT_EQ(rt_sum(N), N * (N + 1) / 2) << "results stay right past the limit";
    EXPECT_EQ(s.entries.load(), N + 1);
    EXPECT_EQ(s.rets.load(), eff) << "only the " << eff << " outermost invocations are tracked";
    EXPECT_EQ(s.bad.load(), 0u);
    EXPECT_EQ(s.max_n.load(), N);
    EXPECT_EQ(s.min_n.load(), N - eff + 1);
    auto d = delta(s0, uprobe::stats());
    EXPECT_EQ(d.return_hits, eff) << str(d);
    EXPECT_EQ(d.return_misses, N + 1 - eff) << str(d);
    EXPECT_EQ(d.return_dropped, 0u) << str(d);
    EXPECT_EQ(uprobe::return_stack_depth(), 0u);
    // Within the limit again: everything tracked.
    s.rets = 0;
    const std::uint64_t M = eff - 1;
    ASSERT_EQ(rt_sum(M), M * (M + 1) / 2);
    EXPECT_EQ(s.rets.load(), M + 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Limits, RetDepth, ::testing::Values(0u, 1u, 8u, 200u),
                         [](const auto& info) { return info.param ? "max" + std::to_string(info.param) : std::string("default"); });

// ------------------------------------------------------ two threads ----

TEST_P(RetModes, TwoThreadStressRecursiveSessions) {
  constexpr std::uint64_t N = 15;
  constexpr int kReps = 40;
  auto* s = new FibSession;
  s->init();
  std::atomic<int> wrong{0};
  auto s0 = uprobe::stats();
  {
    uprobe::Attachment a(vaddr(rt_fib), *s);
    auto work = [&](std::uint64_t salt) {
      for (int i = 0; i < kReps; ++i) {
        std::uint64_t n = (i + salt) % 3 == 0 ? N : N - 1;
        if (rt_call(vaddr(rt_fib), n, 0, 0, 0) != fib_model(n)) wrong.fetch_add(1);
        if (uprobe::return_stack_depth() != 0) wrong.fetch_add(100);
      }
    };
    std::thread t1(work, 0), t2(work, 1);
    t1.join();
    t2.join();
  }
  std::uint64_t total = 0;
  for (std::uint64_t salt = 0; salt < 2; ++salt)
    for (int i = 0; i < kReps; ++i) total += fib_calls((i + salt) % 3 == 0 ? N : N - 1);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(s->entries.load(), total);
  EXPECT_EQ(s->rets.load(), total);
  s->expect_clean();
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(d.return_hits, total) << str(d);
  EXPECT_EQ(d.return_misses, 0u) << str(d);
  EXPECT_EQ(d.return_dropped, 0u) << str(d);
  delete s;
}

// ------------------------------------------- attach/detach races ----

TEST(RetRace, AttachDetachWhileReturnsPending) {
  SumSession s;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> wrong{0}, calls{0}, bad_depth{0};
  std::thread caller([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      if (rt_sum(30) != 465) wrong.fetch_add(1);
      if (uprobe::return_stack_depth() != 0) bad_depth.fetch_add(1);
      calls.fetch_add(1, std::memory_order_relaxed);
    }
  });
  auto t_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(700);
  int cycles = 0;
  while (std::chrono::steady_clock::now() < t_end) {
    uprobe::Attachment a(vaddr(rt_sum), s);
    std::this_thread::sleep_for(std::chrono::microseconds(200 + 50 * (cycles % 7)));
    a.detach();
    ++cycles;
  }
  stop = true;
  caller.join();
  std::printf("[ info ] %d attach/detach cycles, %llu calls, %llu entries, %llu returns\n", cycles,
              static_cast<unsigned long long>(calls.load()), static_cast<unsigned long long>(s.entries.load()),
              static_cast<unsigned long long>(s.rets.load()));
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(bad_depth.load(), 0u) << "return stack not empty between calls";
  EXPECT_EQ(s.bad.load(), 0u) << "a ret_handler saw a cookie that does not match rax";
  EXPECT_LE(s.rets.load(), s.entries.load());
  EXPECT_GT(s.entries.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Config, RetModes,
                         ::testing::Values(Mode::def, Mode::freelist, Mode::global_lock, Mode::freelist_global,
                                           Mode::no_emulate, Mode::single_step, Mode::locked_lookup),
                         [](const auto& info) { return std::string(mode_name(info.param)); });

}  // namespace
