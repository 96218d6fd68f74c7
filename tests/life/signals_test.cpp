// SPDX-License-Identifier: MIT
// Signals: a SIGUSR1 handler running on a sigaltstack calls return-probed
// code (and is raised from inside a return-probed function) 1000 times while
// the main thread attaches and detaches the probes window by window; every
// hit of an attached window is counted exactly, none of a detached one, and
// the raising thread's sigaltstack and signal mask are unchanged afterwards.
// The program's own SIGTRAP handler installed after the library started, from
// another thread while probes are hit: probes of both kinds (with return
// probes) keep working, foreign int3s reach the program's handler exactly
// once each, sigaction() reports the program's handler, and SA_RESETHAND
// makes the second foreign trap fatal exactly as without the library.

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <time.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "life_common.hpp"

using namespace lifetest;

namespace {

class Signals : public ::testing::TestWithParam<Kind> {
 protected:
  ConfigGuard guard;
  void SetUp() override { use_kind(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Kinds, Signals, ::testing::Values(Kind::int3, Kind::optimized),
                         [](const auto& info) { return std::string(kind_name(info.param)); });

/// `handler` for `sig` (an empty mask, `flags`) while the object lives; the
/// action before it back after.
struct ScopedAction {
  int sig;
  struct sigaction old {};
  bool ok;
  ScopedAction(int s, void (*handler)(int), int flags = 0) : sig(s) {
    struct sigaction sa {};
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    ok = sigaction(sig, &sa, &old) == 0;
  }
  ~ScopedAction() {
    if (ok) sigaction(sig, &old, nullptr);
  }
  ScopedAction(const ScopedAction&) = delete;
  ScopedAction& operator=(const ScopedAction&) = delete;
};

// ------------------------------------------------- SIGUSR1 on sigaltstack ----

std::atomic<std::uint64_t> g_usr1_calls{0}, g_usr1_wrong{0}, g_usr1_on_alt{0};
std::uintptr_t g_alt_lo = 0, g_alt_hi = 0;

void on_usr1(int) {
  const auto here = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  if (here >= g_alt_lo && here < g_alt_hi) g_usr1_on_alt.fetch_add(1);
  const std::uint64_t n = g_usr1_calls.fetch_add(1);
  if (lf_add(n, 3) != n + 3) g_usr1_wrong.fetch_add(1);
}

long raise_body(long a) {
  raise(SIGUSR1);
  return a + 1;
}

enum : int { kIdle = 0, kGo = 1, kDone = 2, kStop = 3 };

struct Storm {
  std::atomic<int> state{kIdle};
  std::atomic<bool> attached_window{false};
  std::uint64_t raises = 0, attached_raises = 0, attached_outer = 0, wrong = 0;
  int alt_changed = 0, mask_changed = 0;
};

void raiser(Storm* s, void* alt, std::size_t alt_size) {
  stack_t ss{};
  ss.ss_sp = alt;
  ss.ss_size = alt_size;
  if (sigaltstack(&ss, nullptr) != 0) {
    s->wrong += 1000000;
    return;
  }
  // The thread's mask: SIGUSR2 blocked, so a change is visible.
  sigset_t m;
  sigemptyset(&m);
  sigaddset(&m, SIGUSR2);
  pthread_sigmask(SIG_SETMASK, &m, nullptr);
  stack_t ss0;
  sigaltstack(nullptr, &ss0);
  sigset_t m0;
  pthread_sigmask(SIG_SETMASK, nullptr, &m0);
  g_outer_body = raise_body;
  for (;;) {
    int st;
    while ((st = s->state.load()) == kIdle || st == kDone) std::this_thread::yield();
    if (st == kStop) break;
    const bool attached = s->attached_window.load();
    // 50 raises per window: 25 directly, 25 from inside lf_outer (a return
    // pending on the thread's stack while the handler runs on the altstack).
    for (int i = 0; i < 50; ++i) {
      if (i & 1) {
        if (lf_outer(i) != i + 1) ++s->wrong;
        if (attached) ++s->attached_outer;
      } else {
        raise(SIGUSR1);
      }
      ++s->raises;
      if (attached) ++s->attached_raises;
    }
    stack_t ss1;
    sigaltstack(nullptr, &ss1);
    if (ss1.ss_sp != ss0.ss_sp || ss1.ss_size != ss0.ss_size || ss1.ss_flags != ss0.ss_flags) ++s->alt_changed;
    sigset_t m1;
    pthread_sigmask(SIG_SETMASK, nullptr, &m1);
    for (int sig = 1; sig < NSIG; ++sig)
      if (sigismember(&m0, sig) != sigismember(&m1, sig)) {
        ++s->mask_changed;
        break;
      }
    if (uprobe::return_stack_depth() != 0) ++s->wrong;
    s->state.store(kDone);
  }
  g_outer_body = nullptr;
  ss.ss_flags = SS_DISABLE;
  sigaltstack(&ss, nullptr);
}

TEST_P(Signals, SigaltstackHandlerWhileAttachDetach) {
  ScopedAction usr1(SIGUSR1, on_usr1, SA_ONSTACK);
  ASSERT_TRUE(usr1.ok);
  const std::size_t kAlt = 256 << 10;
  void* alt = ::mmap(nullptr, kAlt, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(alt, MAP_FAILED);
  g_alt_lo = reinterpret_cast<std::uintptr_t>(alt);
  g_alt_hi = g_alt_lo + kAlt;
  g_usr1_calls = 0;
  g_usr1_on_alt = 0;
  g_usr1_wrong = 0;
  Session add, outer;
  add.adds = true;
  Storm s;
  std::thread t(raiser, &s, alt, kAlt);
  const uprobe::Stats s0 = uprobe::stats();
  for (int w = 0; w < 20; ++w) {  // 20 windows x 50 raises = 1000
    uprobe::Attachment aa, ao;
    const bool attach = (w % 2) == 0;
    if (attach) {
      aa = uprobe::Attachment(vaddr(lf_add), add);
      ao = uprobe::Attachment(vaddr(lf_outer), outer);
      ASSERT_EQ(uprobe::probe_info(aa.probe()).mode, kind_mode(GetParam()));
    }
    s.attached_window = attach;
    s.state.store(kGo);
    while (s.state.load() != kDone) std::this_thread::yield();
    aa.detach();
    ao.detach();
  }
  s.state.store(kStop);
  t.join();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  ::munmap(alt, kAlt);
  EXPECT_EQ(s.raises, 1000u);
  EXPECT_EQ(s.attached_raises, 500u);
  EXPECT_EQ(g_usr1_calls.load(), 1000u);
  EXPECT_EQ(g_usr1_on_alt.load(), 1000u) << "the handler ran on the sigaltstack";
  EXPECT_EQ(g_usr1_wrong.load(), 0u);
  EXPECT_EQ(s.wrong, 0u);
  EXPECT_EQ(add.entries.load(), s.attached_raises) << "one hit per handler run in an attached window";
  EXPECT_EQ(add.rets.load(), s.attached_raises);
  EXPECT_EQ(add.bad.load(), 0u);
  EXPECT_EQ(outer.entries.load(), s.attached_outer);
  EXPECT_EQ(outer.rets.load(), s.attached_outer);
  EXPECT_EQ(outer.bad.load(), 0u);
  EXPECT_EQ(d.hits, s.attached_raises + s.attached_outer) << stats_str(d);
  EXPECT_EQ(d.return_hits, s.attached_raises + s.attached_outer) << stats_str(d);
  EXPECT_EQ(d.return_dropped + d.return_misses, 0u) << stats_str(d);
  EXPECT_EQ(s.alt_changed, 0) << "the thread's sigaltstack changed";
  EXPECT_EQ(s.mask_changed, 0) << "the thread's signal mask changed";
}

// ------------------------------------------ a signal inside a handler ----

std::atomic<std::uint64_t> g_nested_wrong{0}, g_nested_runs{0};

void on_usr2(int) {
  g_nested_runs.fetch_add(1);
  // A probed call while the interrupted consumer handler is still running on
  // this thread: not reported (recursion guard), but it runs right.
  if (lf_add(40, 2) != 42) g_nested_wrong.fetch_add(1);
  if (lf_outer(1) != 1001) g_nested_wrong.fetch_add(1);
}

/// A consumer whose entry handler raises SIGUSR2 (a system call is fine in
/// a handler); the signal handler calls the probed functions.
struct Raiser : uprobe::Consumer {
  Raiser() : uprobe::Consumer(uprobe::Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0};
  uprobe::Action handler(uprobe::Regs&) override {
    entries.fetch_add(1);
    raise(SIGUSR2);
    return uprobe::Action::keep;
  }
  void ret_handler(uprobe::Regs&, std::uint64_t) override {
    rets.fetch_add(1);
    raise(SIGUSR2);
  }
};

TEST_P(Signals, SignalInsideHandlerCallsProbedCode) {
  ScopedAction usr2(SIGUSR2, on_usr2);
  ASSERT_TRUE(usr2.ok);
  g_nested_runs = 0;
  g_nested_wrong = 0;
  Raiser r;
  Session outer;
  uprobe::Attachment a(vaddr(lf_add), r), b(vaddr(lf_outer), outer);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, kind_mode(GetParam()));
  const uprobe::Stats s0 = uprobe::stats();
  for (std::uint64_t i = 0; i < 200; ++i) ASSERT_EQ(lf_add(i, 1), i + 1);
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(r.entries.load(), 200u);
  EXPECT_EQ(r.rets.load(), 200u);
  EXPECT_EQ(g_nested_runs.load(), 400u) << "one signal per entry and per return";
  EXPECT_EQ(g_nested_wrong.load(), 0u);
  EXPECT_EQ(outer.entries.load(), 0u) << "hits inside a handler are not reported";
  EXPECT_EQ(d.hits, 200u + 800u) << "each nested call is a hit counted as a recursion miss: " << stats_str(d);
  EXPECT_EQ(d.recursion_misses, 800u) << stats_str(d);
  EXPECT_EQ(d.return_hits, 200u) << stats_str(d);
  EXPECT_EQ(d.return_dropped + d.return_misses, 0u) << stats_str(d);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

// ------------------------------------------ siglongjmp out of a hit ----

sigjmp_buf g_jump_out;
void on_usr2_jump_out(int) { siglongjmp(g_jump_out, 1); }

/// On its `jump_at`-th entry (or return) call, raises SIGUSR2, whose handler
/// siglongjmps out of the hit to the test's sigsetjmp(): the hit never ends.
struct JumpOut : uprobe::Consumer {
  JumpOut() : uprobe::Consumer(uprobe::Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0};
  std::uint64_t jump_entry = 0, jump_ret = 0;  // 1-based call numbers; 0: never
  uprobe::Action handler(uprobe::Regs&) override {
    if (entries.fetch_add(1) + 1 == jump_entry) raise(SIGUSR2);
    return uprobe::Action::keep;
  }
  void ret_handler(uprobe::Regs&, std::uint64_t) override {
    if (rets.fetch_add(1) + 1 == jump_ret) raise(SIGUSR2);
  }
};

/// A signal handler that siglongjmps out of a hit (raised inside an entry
/// handler, then inside a return handler; on the thread's stack and on a
/// sigaltstack) leaves the thread's recursion guard set, as if the hit were
/// still running: every later hit of the thread was a recursion miss. The
/// guard names the hit's frame; a hit above it on the same stack (or off the
/// sigaltstack the guard's frame was on) finds it stale. Exact: every call
/// after the jump is a hit and a return hit, no recursion miss; a signal
/// handler's hits while a hit runs stay misses (SignalInsideHandlerCallsProbedCode).
TEST_P(Signals, HandlerThatLongjmpsOutOfAHitLeavesNoGuardBehind) {
  std::vector<char> alt(1 << 16);
  for (const bool on_alt : {false, true}) {
    for (const bool from_ret : {false, true}) {
      SCOPED_TRACE(std::string(on_alt ? "on a sigaltstack" : "on the thread's stack") +
                   (from_ret ? ", from a return handler" : ", from an entry handler"));
      stack_t ss{};
      ss.ss_sp = alt.data();
      ss.ss_size = alt.size();
      ss.ss_flags = on_alt ? 0 : SS_DISABLE;
      ASSERT_EQ(sigaltstack(&ss, nullptr), 0);
      ScopedAction usr2(SIGUSR2, on_usr2_jump_out, on_alt ? SA_ONSTACK : 0);
      ASSERT_TRUE(usr2.ok);
      JumpOut j;
      (from_ret ? j.jump_ret : j.jump_entry) = 3;
      const uprobe::Stats s0 = uprobe::stats();
      {
        uprobe::Attachment a(vaddr(lf_add), j);
        ASSERT_EQ(uprobe::probe_info(a.probe()).mode, kind_mode(GetParam()));
        static volatile int jumped;
        static volatile std::uint64_t next;  // (static: kept across the jump)
        jumped = 0;
        next = 0;
        if (sigsetjmp(g_jump_out, 1) != 0) {
          jumped = jumped + 1;
          next = next + 1;  // past the call that jumped out
        }
        while (next < 100) {
          const std::uint64_t i = next;
          EXPECT_EQ(lf_add(i, 1), i + 1) << "call " << i;
          next = i + 1;
        }
        EXPECT_EQ(jumped, 1);
      }
      const uprobe::Stats d = stats_delta(s0, uprobe::stats());
      ss.ss_flags = SS_DISABLE;
      sigaltstack(&ss, nullptr);
      // Call 3 (i == 2) jumped out of its entry or return handler; from the
      // entry, the function did not run and its return was never armed;
      // from the return handler, that return was left unfinished (not
      // counted a return hit).
      EXPECT_EQ(j.entries.load(), 100u) << stats_str(d);
      EXPECT_EQ(j.rets.load(), from_ret ? 100u : 99u) << stats_str(d);
      EXPECT_EQ(d.hits, 100u) << stats_str(d);
      EXPECT_EQ(d.recursion_misses, 0u) << stats_str(d);
      EXPECT_EQ(d.return_hits, 99u) << stats_str(d);
      EXPECT_EQ(uprobe::return_stack_depth(), 0u);
      EXPECT_FALSE(uprobe::in_handler());
    }
  }
}

/// The same on a thread started by pthread_create() (its stack's bounds come
/// from its attributes), a hundred times: each jump leaves its hit.
TEST_P(Signals, HandlerThatLongjmpsOutOfAHitInAThreadLeavesIt) {
  ScopedAction usr2(SIGUSR2, on_usr2_jump_out);
  ASSERT_TRUE(usr2.ok);
  JumpOut j;
  j.jump_entry = 1;
  const uprobe::Stats s0 = uprobe::stats();
  std::uint64_t jumped = 0, in_handler_after = 0;
  const auto rounds = [&] {
    for (int round = 0; round < 50; ++round) {
      j.entries = 0;  // (jumps at its first entry each round)
      if (sigsetjmp(g_jump_out, 1) == 0) {
        lf_add(1, 1);
      } else {
        ++jumped;
      }
      in_handler_after += uprobe::in_handler() ? 1 : 0;
      lf_add(2, 1);  // a hit that runs its consumer (entries 2)
    }
  };
  {
    uprobe::Attachment a(vaddr(lf_add), j);
    std::thread t(rounds);  // default attributes
    t.join();
    // Attributes that set only a stack size (glibc then answers a stack
    // address of 0 - size: no stack of the caller's).
    pthread_attr_t attr;
    ASSERT_EQ(pthread_attr_init(&attr), 0);
    ASSERT_EQ(pthread_attr_setstacksize(&attr, 256 * 1024), 0);
    pthread_t p;
    ASSERT_EQ(pthread_create(
                  &p, &attr, [](void* f) -> void* { (*static_cast<decltype(rounds)*>(f))(); return nullptr; },
                  const_cast<void*>(static_cast<const void*>(&rounds))),
              0);
    ASSERT_EQ(pthread_join(p, nullptr), 0);
    pthread_attr_destroy(&attr);
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(jumped, 100u);
  EXPECT_EQ(in_handler_after, 0u);
  EXPECT_EQ(d.hits, 200u) << stats_str(d);
  EXPECT_EQ(d.recursion_misses, 0u) << stats_str(d);
  EXPECT_EQ(j.rets.load(), 100u) << "the second call of each round returns";
}

// --------------------------- a hit left for another stack, then resumed ----

sigjmp_buf g_sched, g_co;
ucontext_t g_co_uc, g_main_uc;
volatile int g_co_result_ok = 0, g_co_done = 0;
void on_usr1_preempt(int) {
  if (sigsetjmp(g_co, 1) == 0) siglongjmp(g_sched, 1);  // to the scheduler; back here to resume
}
void co_main() {
  g_co_result_ok = lf_add(1000, 1) == 1001;
  g_co_done = 1;
  siglongjmp(g_sched, 2);
}

/// On its call with rdi == 1000, raises SIGUSR1 (a green-thread scheduler's
/// preemption), then touches itself again after the hit is resumed.
struct Preempted : uprobe::Consumer {
  std::atomic<std::uint64_t> entries{0}, after{0};
  uprobe::Action handler(uprobe::Regs& r) override {
    entries.fetch_add(1);
    if (r.rdi == 1000) raise(SIGUSR1);
    after.fetch_add(1);
    return uprobe::Action::keep;
  }
};

/// A green thread (a coroutine on a stack of its own) is preempted inside a
/// consumer: the signal handler siglongjmps to the scheduler on the main
/// stack, above the hit's addresses but on another stack, and later back
/// into the handler's frame: the hit goes on. It is not left meanwhile (the
/// thread is still "in a handler", a detach from the scheduler is refused:
/// Errc::in_handler), so nothing it uses is freed under it; resumed, it
/// ends as any hit. Before, the hit was taken as left: a detach there freed
/// the probe, and the resumed int3 hit crashed on it.
TEST_P(Signals, AHitLeftForAnotherStackAndResumedEndsAsAnyHit) {
  ScopedAction usr1(SIGUSR1, on_usr1_preempt);
  ASSERT_TRUE(usr1.ok);
  const std::size_t size = 1 << 20;
  void* stack = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(stack, MAP_FAILED);
  ASSERT_EQ(getcontext(&g_co_uc), 0);
  g_co_uc.uc_stack.ss_sp = stack;
  g_co_uc.uc_stack.ss_size = size;
  g_co_uc.uc_link = nullptr;
  makecontext(&g_co_uc, co_main, 0);
  g_co_result_ok = 0;
  g_co_done = 0;
  Preempted p;
  const uprobe::Stats s0 = uprobe::stats();
  {
    uprobe::Attachment a(vaddr(lf_add), p);
    ASSERT_EQ(uprobe::probe_info(a.probe()).mode, kind_mode(GetParam()));
    static volatile int in_handler_at_scheduler, detach_refused;
    in_handler_at_scheduler = 0;
    detach_refused = 0;
    const int v = sigsetjmp(g_sched, 1);
    if (v == 0) swapcontext(&g_main_uc, &g_co_uc);  // starts the green thread
    if (v == 1) {
      in_handler_at_scheduler = uprobe::in_handler() ? 1 : 0;
      try {
        uprobe::unregister_uprobe(a.probe(), p);
      } catch (const uprobe::Error& e) {
        detach_refused = e.code() == uprobe::Errc::in_handler ? 1 : 2;
      }
      siglongjmp(g_co, 1);  // resumes the green thread inside the hit
    }
    EXPECT_EQ(v, 2);
    EXPECT_EQ(in_handler_at_scheduler, 1);
    EXPECT_EQ(detach_refused, 1);
    EXPECT_FALSE(uprobe::in_handler());
    for (std::uint64_t i = 0; i < 10; ++i) EXPECT_EQ(lf_add(i, 1), i + 1);
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  munmap(stack, size);
  EXPECT_EQ(g_co_done, 1);
  EXPECT_EQ(g_co_result_ok, 1);
  EXPECT_EQ(p.entries.load(), 11u);
  EXPECT_EQ(p.after.load(), 11u);
  EXPECT_EQ(d.hits, 11u) << stats_str(d);
  EXPECT_EQ(d.recursion_misses, 0u) << stats_str(d);
}

// ------------------------------------------------ counters under signals ----

std::atomic<std::uint64_t> g_tick_calls{0};

void on_tick(int) {
  lf_add(1, 2);  // a hit inside a signal handler that may have interrupted a hit
  g_tick_calls.fetch_add(1, std::memory_order_relaxed);
}

// The per-thread statistics are written by their thread only, but a signal
// can interrupt that thread between reading a counter and writing it back,
// and its handler's hit increments the same counter: every hit must still be
// counted once (a lost increment here made Stats disagree with the hits).
TEST_P(Signals, StatsCountEveryHitWhileSignalsInterruptHits) {
  g_tick_calls = 0;
  Counter c;
  uprobe::Attachment a(vaddr(lf_add), c);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, kind_mode(GetParam()));
  ScopedAction usr2(SIGUSR2, on_tick, SA_RESTART);
  ASSERT_TRUE(usr2.ok);
  // A timer signals this thread every 20 us (SIGEV_THREAD_ID: the kernel
  // delivers it here, preempting whatever instruction runs).
  sigevent sev;
  std::memset(&sev, 0, sizeof sev);
  sev.sigev_notify = SIGEV_THREAD_ID;
  sev.sigev_signo = SIGUSR2;
  sev._sigev_un._tid = static_cast<pid_t>(::gettid());
  timer_t timer;
  ASSERT_EQ(timer_create(CLOCK_MONOTONIC, &sev, &timer), 0);
  itimerspec its{};
  its.it_interval.tv_nsec = 20000;
  its.it_value.tv_nsec = 20000;
  const uprobe::Stats s0 = uprobe::stats();
  ASSERT_EQ(timer_settime(timer, 0, &its, nullptr), 0);
  std::uint64_t calls = 0, wrong = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (g_tick_calls.load(std::memory_order_relaxed) < 20000 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    for (int k = 0; k < 1000; ++k, ++calls) wrong += lf_add(calls, 5) != calls + 5;
  }
  its = itimerspec{};
  timer_settime(timer, 0, &its, nullptr);
  timer_delete(timer);
  const std::uint64_t sent = g_tick_calls.load();
  // Pending signals are delivered by now (pthread_kill to the calling thread's
  // own signals: give them a moment, then block to settle the count).
  sigset_t m, om;
  sigemptyset(&m);
  sigaddset(&m, SIGUSR2);
  ::usleep(1000);
  pthread_sigmask(SIG_BLOCK, &m, &om);
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  const std::uint64_t ticks = g_tick_calls.load();
  pthread_sigmask(SIG_SETMASK, &om, nullptr);
  EXPECT_EQ(wrong, 0u);
  EXPECT_GT(ticks, 1000u) << "too few signals to test anything (" << sent << " in the loop)";
  // A tick whose handler ran while a hit was in its handlers is a recursion
  // miss (counted as a hit, not reported); every other tick is a hit.
  EXPECT_EQ(c.hits.load() + d.recursion_misses, calls + ticks) << stats_str(d);
  EXPECT_EQ(d.hits, calls + ticks) << "hits lost or doubled: " << stats_str(d);
}

// ------------------------------------------- the program's SIGTRAP handler ----

std::atomic<std::uint64_t> g_prog_calls{0}, g_prog_bad{0};

void prog_trap(int sig, siginfo_t* si, void* ctx) {
  g_prog_calls.fetch_add(1);
  const auto* uc = static_cast<const ucontext_t*>(ctx);
  if (sig != SIGTRAP || si->si_code != SI_KERNEL ||
      uc->uc_mcontext.gregs[REG_RIP] != static_cast<greg_t>(addr(lf_int3) + 1))
    g_prog_bad.fetch_add(1);
}

/// In a child: probes (entry + return) hit by a worker thread; another
/// thread installs the program's SIGTRAP handler meanwhile; then foreign
/// int3s from two threads while the probes keep being hit.
void handler_after_start(ChildReport& r) {
  static Session add, outer;
  add.adds = true;
  uprobe::Attachment aa(vaddr(lf_add), add), ao(vaddr(lf_outer), outer);
  r.v[0] = uprobe::probe_info(aa.probe()).mode == (uprobe::configuration().optimize ? uprobe::ProbeMode::optimized_nop5 : uprobe::ProbeMode::int3);
  std::atomic<bool> stop{false}, installed{false};
  std::atomic<std::uint64_t> calls{0}, wrong{0}, foreign{0};
  std::thread worker([&] {
    for (std::uint64_t i = 0; !stop.load() || calls.load() < 20000; ++i) {
      wrong += lf_add(i, 2) != i + 2;
      wrong += lf_outer(static_cast<long>(i)) != static_cast<long>(i) + 1000;
      calls += 1;
      if (installed.load() && (i % 10) == 0) {
        wrong += lf_int3() != 0x77;
        foreign += 1;
      }
    }
  });
  std::thread installer([&] {
    ::usleep(2000);
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = prog_trap;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTRAP, &sa, nullptr);
    installed = true;
  });
  installer.join();
  for (int i = 0; i < 100; ++i) wrong += lf_int3() != 0x77;
  while (foreign.load() < 10) std::this_thread::yield();  // the worker's own foreign traps
  stop = true;
  worker.join();
  struct sigaction cur;
  ::sigaction(SIGTRAP, nullptr, &cur);
  r.v[1] = (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == prog_trap;
  r.v[2] = calls.load();
  r.v[3] = wrong.load();
  r.v[4] = add.entries.load();
  r.v[5] = add.rets.load();
  r.v[6] = outer.entries.load();
  r.v[7] = outer.rets.load();
  r.v[8] = add.bad.load() + outer.bad.load();
  r.v[9] = g_prog_calls.load();
  r.v[10] = g_prog_bad.load();
  r.v[11] = foreign.load() + 100;  // foreign int3s after the program's handler was installed
}

TEST_P(Signals, ProgramSigtrapHandlerInstalledWhileProbesAreHit) {
  ChildReport r;
  bool got = false;
  const int st = in_child(handler_after_start, r, got);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st) << " " << r.msg;
  ASSERT_TRUE(got);
  EXPECT_EQ(r.v[0], 1u) << "probe mode";
  EXPECT_EQ(r.v[1], 1u) << "sigaction() reports the program's handler";
  EXPECT_EQ(r.v[3], 0u) << "wrong results (lf_int3 returns 0x77 after the program's handler)";
  EXPECT_EQ(r.v[4], r.v[2]) << "every probed call counted";
  EXPECT_EQ(r.v[5], r.v[2]);
  EXPECT_EQ(r.v[6], r.v[2]);
  EXPECT_EQ(r.v[7], r.v[2]);
  EXPECT_EQ(r.v[8], 0u);
  EXPECT_GE(r.v[11], 110u);
  EXPECT_EQ(r.v[9], r.v[11]) << "the program's handler ran exactly once per foreign int3";
  EXPECT_EQ(r.v[10], 0u) << "the program's handler saw a wrong signo/si_code/rip";
}

/// SA_RESETHAND: the first foreign int3 runs the program's handler, which
/// resets to SIG_DFL; the second kills the process by SIGTRAP, as without
/// the library. Probes keep working in between.
TEST_P(Signals, ProgramSigtrapHandlerResetHand) {
  ChildReport r;
  bool got = false;
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(p[0]);
    static Session add;
    add.adds = true;
    uprobe::Attachment aa(vaddr(lf_add), add);
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = prog_trap;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTRAP, &sa, nullptr);
    ChildReport c;
    c.v[0] = lf_int3();
    for (std::uint64_t i = 0; i < 10; ++i) c.v[1] += lf_add(i, 1) != i + 1;
    c.v[2] = add.rets.load();
    c.v[3] = g_prog_calls.load();
    struct sigaction cur;
    ::sigaction(SIGTRAP, nullptr, &cur);
    c.v[4] = cur.sa_handler == SIG_DFL;
    write_all(p[1], &c, sizeof c);
    lf_int3();  // fatal
    c.v[5] = 1;
    write_all(p[1], &c, sizeof c);
    ::_exit(0);
  }
  ::close(p[1]);
  got = read_all(p[0], &r, sizeof r) == sizeof r;
  ChildReport extra;
  const bool second = read_all(p[0], &extra, sizeof extra) == sizeof extra;
  ::close(p[0]);
  const int st = wait_child(pid, 60);
  ASSERT_TRUE(got);
  EXPECT_FALSE(second) << "the child survived its second foreign int3";
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTRAP) << status_str(st);
  EXPECT_EQ(r.v[0], 0x77u);
  EXPECT_EQ(r.v[1], 0u);
  EXPECT_EQ(r.v[2], 10u);
  EXPECT_EQ(r.v[3], 1u) << "the program's handler ran once";
  EXPECT_EQ(r.v[4], 1u) << "SA_RESETHAND left SIG_DFL";
}

// -------------------------------------------- the signal-return trampoline ----

std::atomic<int> g_restorer_calls{0};
void on_restorer_signal(int) { g_restorer_calls.fetch_add(1); }

/// glibc's __restore_rt (every handler's sa_restorer, a size-0 local symbol of
/// the debug file: `uprobe:libc:*` with libc6-dbg named it) is refused at both
/// of its instructions: libuprobe's own SIGTRAP handler returns through it,
/// so an int3 there recursed until the stack overflowed (every program under
/// `uprobe-trace -e 'uprobe:libc:*'` died of SIGSEGV at its first trap). The
/// bytes stay as they were and signals keep working.
TEST_P(Signals, SignalReturnTrampolineIsRefused) {
  // Some probe first: libuprobe's SIGTRAP handler is installed.
  Counter add;
  uprobe::Attachment a(vaddr(lf_add), add);
  EXPECT_EQ(lf_add(1, 2), 3u);
  EXPECT_EQ(add.hits.load(), 1u);
  g_restorer_calls = 0;  // (both kinds in one process)
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_restorer_signal;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR2, &sa, nullptr), 0);
  // The kernel's record of it (a sanitizer's sigaction() would answer from a
  // table of its own): struct k_sigaction's handler, flags, restorer, mask.
  struct {
    void* handler;
    unsigned long flags;
    void* restorer;
    std::uint64_t mask;
  } kact{};
  ASSERT_EQ(::syscall(SYS_rt_sigaction, SIGUSR2, nullptr, &kact, 8), 0);
  const auto* restorer = static_cast<const std::uint8_t*>(kact.restorer);
  ASSERT_NE(restorer, nullptr);
  // mov $15,%rax; syscall (rt_sigreturn)
  const std::uint8_t want[] = {0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05};
  ASSERT_EQ(std::memcmp(restorer, want, sizeof want), 0);
  for (std::size_t off : {std::size_t{0}, std::size_t{7}}) {
    Counter c;
    try {
      uprobe::register_uprobe(restorer + off, c);
      ADD_FAILURE() << "a probe at __restore_rt+" << off << " was accepted";
    } catch (const uprobe::Error& e) {
      EXPECT_EQ(e.code(), uprobe::Errc::forbidden_target) << e.what();
      EXPECT_NE(std::string(e.what()).find("signal-return trampoline"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(std::memcmp(restorer, want, sizeof want), 0) << "the refusals changed no byte";
  for (int i = 0; i < 5; ++i) ::raise(SIGUSR2);
  EXPECT_EQ(g_restorer_calls.load(), 5);
  EXPECT_EQ(lf_add(2, 2), 4u);
  EXPECT_EQ(add.hits.load(), 2u);
  sa.sa_handler = SIG_DFL;
  ::sigaction(SIGUSR2, &sa, nullptr);
}

}  // namespace
