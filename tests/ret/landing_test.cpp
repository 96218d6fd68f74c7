// SPDX-License-Identifier: MIT
// The predicted return of an optimized entry (arch::opt_frame_leave(),
// ret_trampoline.S): a return probe at an optimized function entry makes the
// function return to uprobe_ret_landing, pushed by the thunk's call, not to
// the return trampoline. Exact values through it: every register the caller
// sees (rax, rdx, xmm0/xmm1, st0, the callee-saved and the other
// caller-saved ones, rflags, rsp), what the ret_handler sees; chained tail
// calls, recursion, longjmp, a C++ exception, pthread_exit and
// pthread_cancel through it, backtraces and fixup_backtrace(), a handler
// that moves rip, detach while a thread is inside, fork inside, and signal
// handlers whose own probed calls land in between.

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <execinfo.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "ret_common.hpp"

extern "C" {
extern std::uint64_t ld_seen_ret, ld_seen_slot;
std::uint64_t ld_regs(std::uint64_t, std::uint64_t);
std::uint64_t ld_alt(std::uint64_t, std::uint64_t);
void ld_drive(const void* fn, std::uint64_t a, std::uint64_t b, std::uint64_t* out);
long double ld_x87(long long);
std::uint64_t ld_tail_a(std::uint64_t);
std::uint64_t ld_tail_b(std::uint64_t);
std::uint64_t ld_fact(std::uint64_t);
long ld_cb(long (*fn)(long), long arg);
}

using namespace rettest;
using uprobe::Action;
using uprobe::Callbacks;
using uprobe::Regs;

namespace {

/// What ld_drive stores (see landing_fixtures.S).
struct Drive {
  std::uint64_t rax, rdx, rcx, rsi, rdi, r8, r9, r10, r11, rbx, rbp, r12, r13, r14, r15;
  std::uint64_t xmm0[2], xmm1[2], rflags, rsp_delta;
};
static_assert(sizeof(Drive) == 21 * 8);

constexpr std::uint64_t kArith = 0x8d5;  // CF PF AF ZF SF OF

/// The return address in `slot` is the landing: one of ours, not the
/// trampoline.
bool is_landing(std::uint64_t ret) {
  return uprobe::is_return_trampoline(reinterpret_cast<const void*>(ret)) &&
         reinterpret_cast<const void*>(ret) != uprobe::return_trampoline();
}

/// A return consumer compiled normally (may use vector registers): records
/// what its ret_handler sees and does floating-point work there.
struct RetRecorder : uprobe::Consumer {
  RetRecorder() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> rets{0};
  std::uint64_t func = 0, rax = 0, rdx = 0, rip = 0, rsp = 0, rbx = 0, r12 = 0;
  double xmm0 = 0, xmm1 = 0;
  volatile double sink = 0;
  void ret_handler(Regs& r, std::uint64_t fn) override {
    rets.fetch_add(1, std::memory_order_relaxed);
    func = fn;
    rax = r.rax;
    rdx = r.rdx;
    rip = r.rip;
    rsp = r.rsp;
    rbx = r.rbx;
    r12 = r.r12;
    xmm0 = as_double(uprobe::return_xmm(0));
    xmm1 = as_double(uprobe::return_xmm(1));
    sink = std::sqrt(static_cast<double>(r.rax) + 0.5) * 3.0;  // clobbers vector registers
  }
};

void expect_optimized(const uprobe::Attachment& a) {
  const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
  ASSERT_TRUE(info.mode == uprobe::ProbeMode::optimized_nop5 || info.mode == uprobe::ProbeMode::optimized_entry)
      << "mode " << static_cast<int>(info.mode) << ": " << info.why_not_optimized;
}

TEST(RetLanding, RegistersExactThroughTheLanding) {
  Drive plain{}, probed{};
  ld_drive(vaddr(ld_regs), 40, 2, &plain.rax);
  const std::uint64_t real_ret = ld_seen_ret, real_slot = ld_seen_slot;
  ASSERT_FALSE(uprobe::is_return_trampoline(reinterpret_cast<const void*>(real_ret)));
  EXPECT_EQ(plain.rax, 42u);
  EXPECT_EQ(plain.rdx, 40u ^ 2u);
  RetRecorder rec;
  uprobe::Attachment a(vaddr(ld_regs), rec);
  expect_optimized(a);
  for (int i = 0; i < 1000; ++i) {
    std::memset(&probed, 0, sizeof probed);
    ld_drive(vaddr(ld_regs), 40, 2, &probed.rax);
    ASSERT_TRUE(is_landing(ld_seen_ret)) << "the function's return slot held " << hexs(ld_seen_ret);
    ASSERT_EQ(ld_seen_slot, real_slot);
    const std::uint64_t* p = &plain.rax;
    const std::uint64_t* q = &probed.rax;
    for (int w = 0; w < 15; ++w) ASSERT_EQ(q[w], p[w]) << "word " << w << " of ld_drive's record";
    ASSERT_EQ(probed.xmm0[0], plain.xmm0[0]);  // (the upper halves are what cvtsi2sd left: not the callee's)
    ASSERT_EQ(probed.xmm1[0], plain.xmm1[0]);
    ASSERT_EQ(probed.rflags & kArith, plain.rflags & kArith);
    ASSERT_EQ(probed.rflags & 1, 1u) << "CF set before the return";
    ASSERT_EQ(probed.rsp_delta, plain.rsp_delta);
  }
  EXPECT_EQ(rec.rets.load(), 1000u);
  EXPECT_EQ(rec.func, addr(ld_regs));
  EXPECT_EQ(rec.rip, real_ret) << "the ret_handler sees the real return address";
  EXPECT_EQ(rec.rsp, real_slot + 8) << "and rsp after the return";
  EXPECT_EQ(rec.rax, 42u);
  EXPECT_EQ(rec.rdx, 40u ^ 2u);
  EXPECT_EQ(rec.rbx, 0x0b0b0b0b0b0b0b0bull);
  EXPECT_EQ(rec.r12, 0x1212121212121212ull);
  EXPECT_EQ(rec.xmm0, 40.0);
  EXPECT_EQ(rec.xmm1, 3.0);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

TEST(RetLanding, X87ReturnValueIntact) {
  RetRecorder rec;
  uprobe::Attachment a(vaddr(ld_x87), rec);
  expect_optimized(a);
  for (long long i = -5; i < 1000; ++i) {
    const long double r = ld_x87(i);
    ASSERT_EQ(r, static_cast<long double>(i) + 1.0L) << i;
  }
  EXPECT_EQ(rec.rets.load(), 1005u);
}

/// Records the order of the ret_handlers and what they saw.
struct Order : uprobe::Consumer {
  Order() : uprobe::Consumer(Callbacks::ret) {}
  RetLog<64> log;
  void ret_handler(Regs& r, std::uint64_t fn) override {
    log.add(RetRec{fn, r.rax, r.rdx, r.rip, r.rsp, 0, this});
  }
};

TEST(RetLanding, ChainedTailCallsReturnOnceThroughTheLanding) {
  Order oa, ob;
  uprobe::Attachment a(vaddr(ld_tail_a), oa), b(vaddr(ld_tail_b), ob);
  expect_optimized(a);
  expect_optimized(b);
  const uprobe::Stats s0 = uprobe::stats();
  for (std::uint64_t x = 0; x < 50; ++x) {
    oa.log.clear();
    ob.log.clear();
    ASSERT_EQ(rt_call(vaddr(ld_tail_a), x, 0, 0, 0), 2 * (x + 1));
    ASSERT_EQ(oa.log.size(), 1u);
    ASSERT_EQ(ob.log.size(), 1u);
    for (const RetRec* r : {&oa.log.rec[0], &ob.log.rec[0]}) {
      EXPECT_EQ(r->rax, 2 * (x + 1));
      EXPECT_EQ(r->rip, call_site()) << "both return to rt_call's return site";
      EXPECT_EQ(r->rsp, rt_call_rsp);
    }
    EXPECT_EQ(oa.log.rec[0].func, addr(ld_tail_a));
    EXPECT_EQ(ob.log.rec[0].func, addr(ld_tail_b));
    ASSERT_EQ(uprobe::return_stack_depth(), 0u);
    // ld_tail_b alone.
    ob.log.clear();
    ASSERT_EQ(rt_call(vaddr(ld_tail_b), x, 0, 0, 0), 2 * x);
    ASSERT_EQ(ob.log.size(), 1u);
    EXPECT_EQ(ob.log.rec[0].rip, call_site());
  }
  const uprobe::Stats d = delta(s0, uprobe::stats());
  EXPECT_EQ(d.return_hits, 150u) << str(d);
  EXPECT_EQ(d.return_misses + d.return_dropped, 0u) << str(d);
}

/// entry_and_ret: the cookie is the argument, checked against rax at return.
struct FactSession : uprobe::Consumer {
  FactSession() : uprobe::Consumer(Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0}, bad{0};
  Action handler(Regs& r) override {
    entries.fetch_add(1, std::memory_order_relaxed);
    uprobe::session_cookie() = r.rdi;
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t) override {
    rets.fetch_add(1, std::memory_order_relaxed);
    if (r.rax != fact_model(uprobe::session_cookie() ? uprobe::session_cookie() : 1)) bad.fetch_add(1);
  }
};

TEST(RetLanding, RecursionEveryLevelReturnsItsOwnValue) {
  FactSession s;
  uprobe::Attachment a(vaddr(ld_fact), s);
  expect_optimized(a);
  std::uint64_t calls = 0;
  for (int round = 0; round < 20; ++round)
    for (std::uint64_t n = 0; n <= 20; ++n) {
      ASSERT_EQ(ld_fact(n), fact_model(n)) << n;
      calls += n <= 1 ? 1 : n;
      ASSERT_EQ(uprobe::return_stack_depth(), 0u);
    }
  EXPECT_EQ(s.entries.load(), calls);
  EXPECT_EQ(s.rets.load(), calls);
  EXPECT_EQ(s.bad.load(), 0u);
}

/// A session consumer of ld_cb: counts, and checks the returned value
/// (twice(arg) + 1) unless `any`.
struct CbSession : uprobe::Consumer {
  CbSession() : uprobe::Consumer(Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0}, bad{0};
  bool any = false;
  Action handler(Regs& r) override {
    entries.fetch_add(1, std::memory_order_relaxed);
    uprobe::session_cookie() = static_cast<std::uint64_t>(r.rsi);
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t) override {
    rets.fetch_add(1, std::memory_order_relaxed);
    if (!any && r.rax != uprobe::session_cookie() * 2 + 1) bad.fetch_add(1);
  }
};

long twice(long x) { return 2 * x; }

/// Calls ld_cb from one fixed call site (its return address is the same in
/// every call).
__attribute__((noinline, noipa)) long call_cb(long (*fn)(long), long arg) {
  long r = ld_cb(fn, arg);
  asm volatile("" : "+r"(r));
  return r;
}

std::uint64_t real_cb_return() {
  call_cb(twice, 1);  // no probe, or the landing: the slot's value says which
  return ld_seen_ret;
}

jmp_buf g_env;
long jump_out(long) { longjmp(g_env, 1); }

/// Calls ld_cb with a callback that longjmps back here; true when it did.
__attribute__((noinline)) bool jumped_out(long arg) {
  if (setjmp(g_env) != 0) return true;
  call_cb(jump_out, arg);
  return false;
}

TEST(RetLanding, LongjmpOutOfTheProbedFunction) {
  CbSession s;
  uprobe::Attachment a(vaddr(ld_cb), s);
  expect_optimized(a);
  const uprobe::Stats s0 = uprobe::stats();
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(jumped_out(i)) << "returned past longjmp";
    ASSERT_TRUE(is_landing(ld_seen_ret));
    ASSERT_EQ(call_cb(twice, i), 2 * i + 1);
    ASSERT_EQ(uprobe::return_stack_depth(), 0u) << "the skipped instance is dropped";
  }
  const uprobe::Stats d = delta(s0, uprobe::stats());
  EXPECT_EQ(s.entries.load(), 200u);
  EXPECT_EQ(s.rets.load(), 100u);
  EXPECT_EQ(s.bad.load(), 0u);
  EXPECT_EQ(d.return_dropped, 100u) << str(d);
}

long throw_out(long x) {
  if (x >= 0) throw std::runtime_error("out");
  return x;
}

/// backtrace(3) from inside ld_cb's callee.
void* g_bt[64];
int g_bt_n = 0;
long take_backtrace(long x) {
  g_bt_n = backtrace(g_bt, 64);
  return x;
}

/// fixup_backtrace() from inside ld_cb's callee, on ld_cb's own return slot.
std::uint64_t g_fixed = 0;
int g_fixed_n = -1;
long fix_own_slot(long x) {
  void* f[1] = {reinterpret_cast<void*>(ld_seen_ret)};
  g_fixed_n = uprobe::fixup_backtrace(f, 1);
  g_fixed = reinterpret_cast<std::uint64_t>(f[0]);
  return x;
}

TEST(RetLanding, ExceptionBacktraceAndFixupThroughTheLanding) {
  const std::uint64_t real = real_cb_return();
  ASSERT_FALSE(uprobe::is_return_trampoline(reinterpret_cast<const void*>(real)));
  CbSession s;
  uprobe::Attachment a(vaddr(ld_cb), s);
  expect_optimized(a);
  const uprobe::Stats s0 = uprobe::stats();
  for (int i = 0; i < 100; ++i) {
    bool caught = false;
    try {
      call_cb(throw_out, i);
    } catch (const std::runtime_error&) {
      caught = true;
    }
    ASSERT_TRUE(caught);
    ASSERT_TRUE(is_landing(ld_seen_ret));
    ASSERT_EQ(uprobe::return_stack_depth(), 0u);
    ASSERT_EQ(call_cb(twice, i), 2 * i + 1);
  }
  const uprobe::Stats d = delta(s0, uprobe::stats());
  EXPECT_EQ(s.rets.load(), 100u) << "the unwound invocations ran no ret_handler";
  EXPECT_EQ(d.return_dropped, 100u) << str(d);

  s.any = true;
  ASSERT_EQ(call_cb(take_backtrace, 5), 6);
  ASSERT_GT(g_bt_n, 2);
  bool saw_real = false;
  for (int i = 0; i < g_bt_n; ++i) {
    EXPECT_FALSE(uprobe::is_return_trampoline(g_bt[i])) << "frame " << i;
    saw_real |= reinterpret_cast<std::uint64_t>(g_bt[i]) == real;
  }
  EXPECT_TRUE(saw_real) << "ld_cb's real return address is in the backtrace";

  ASSERT_EQ(call_cb(fix_own_slot, 3), 4);
  EXPECT_EQ(g_fixed_n, 1);
  EXPECT_EQ(g_fixed, real);
  EXPECT_EQ(s.bad.load(), 0u);
}

// pthread_exit / pthread_cancel through ld_cb: forced unwinds libuprobe does
// not interpose (the landing's personality routine).
struct ExitCtx {
  int fd = -1;
  bool cancel = false;
  std::atomic<int> inside{0}, dtors{0}, cleanups{0}, after{0};
  std::uint64_t seen = 0;
};
thread_local ExitCtx* t_exit = nullptr;

long exit_body(long) {
  ExitCtx* c = t_exit;
  c->seen = ld_seen_ret;
  c->inside.fetch_add(1);
  if (!c->cancel) pthread_exit(nullptr);
  static thread_local char ch;
  return ::read(c->fd, &ch, 1);  // a cancellation point; blocks
}

struct Dtor {
  ExitCtx* c;
  ~Dtor() { c->dtors.fetch_add(1); }
};
void exit_cleanup(void* p) { static_cast<ExitCtx*>(p)->cleanups.fetch_add(1); }

__attribute__((noinline)) void exit_caller(ExitCtx* c) {
  Dtor d{c};
  pthread_cleanup_push(exit_cleanup, c);
  long r = ld_cb(exit_body, 1);
  c->after.fetch_add(static_cast<int>(r) + 1);
  pthread_cleanup_pop(0);
}

void* exit_thread(void* p) {
  t_exit = static_cast<ExitCtx*>(p);
  exit_caller(t_exit);
  return nullptr;
}

void check_forced_unwind(bool cancel) {
  CbSession s;
  uprobe::Attachment a(vaddr(ld_cb), s);
  expect_optimized(a);
  int pfd[2];
  ASSERT_EQ(::pipe(pfd), 0);
  const uprobe::Stats s0 = uprobe::stats();
  constexpr int kThreads = 20;
  for (int i = 0; i < kThreads; ++i) {
    ExitCtx c;
    c.fd = pfd[0];
    c.cancel = cancel;
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, nullptr, exit_thread, &c), 0);
    if (cancel) {
      while (c.inside.load() == 0) std::this_thread::yield();
      ::usleep(200);
      ASSERT_EQ(pthread_cancel(t), 0);
    }
    void* res = reinterpret_cast<void*>(1);
    ASSERT_EQ(pthread_join(t, &res), 0);
    EXPECT_EQ(res, cancel ? PTHREAD_CANCELED : nullptr);
    EXPECT_TRUE(is_landing(c.seen)) << "ld_cb returned through " << hexs(c.seen);
    EXPECT_EQ(c.dtors.load(), 1) << "the caller's destructor (unwound past the landing)";
    EXPECT_EQ(c.cleanups.load(), 1);
    EXPECT_EQ(c.after.load(), 0);
  }
  ::close(pfd[0]);
  ::close(pfd[1]);
  const uprobe::Stats d = delta(s0, uprobe::stats());
  EXPECT_EQ(s.entries.load(), std::uint64_t(kThreads));
  EXPECT_EQ(s.rets.load(), 0u);
  EXPECT_EQ(d.return_dropped, std::uint64_t(kThreads)) << str(d);
  for (long i = 0; i < 1000; ++i) ASSERT_EQ(call_cb(twice, i), 2 * i + 1);
  EXPECT_EQ(s.rets.load(), 1000u);
  EXPECT_EQ(s.bad.load(), 0u);
}

TEST(RetLanding, PthreadExitThroughTheLanding) { check_forced_unwind(false); }
TEST(RetLanding, PthreadCancelThroughTheLanding) { check_forced_unwind(true); }

/// entry_and_ret whose entry handler moves rip to ld_alt: the return probe
/// is armed by the hijack (the stub does not resume at the site), the
/// function ld_alt returns 777 to the real caller.
struct Redirect : uprobe::Consumer {
  Redirect() : uprobe::Consumer(Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> rets{0};
  std::uint64_t rax = 0, rip = 0;
  Action handler(Regs& r) override {
    r.rip = addr(ld_alt);
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t) override {
    rets.fetch_add(1);
    rax = r.rax;
    rip = r.rip;
  }
};

TEST(RetLanding, HandlerMovingRipKeepsTheHijack) {
  Redirect c;
  uprobe::Attachment a(vaddr(ld_regs), c);
  expect_optimized(a);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(rt_call(vaddr(ld_regs), 1, 2, 0, 0), 777u);
  EXPECT_EQ(c.rets.load(), 100u);
  EXPECT_EQ(c.rax, 777u);
  EXPECT_EQ(c.rip, call_site());
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

std::atomic<int> g_wait{0}, g_inside{0};
long wait_body(long x) {
  g_inside.store(1);
  while (g_wait.load() == 0) std::this_thread::yield();
  return x;
}

TEST(RetLanding, DetachWhileAThreadIsInside) {
  for (int round = 0; round < 20; ++round) {
    CbSession s;
    auto a = std::make_unique<uprobe::Attachment>(vaddr(ld_cb), s);
    expect_optimized(*a);
    g_wait.store(0);
    g_inside.store(0);
    long r = 0;
    std::uint64_t seen = 0;
    unsigned depth = 99;
    std::thread t([&] {
      r = call_cb(wait_body, 21);
      seen = ld_seen_ret;
      depth = uprobe::return_stack_depth();
    });
    while (g_inside.load() == 0) std::this_thread::yield();
    seen = ld_seen_ret;
    a.reset();  // unregistered while the thread is inside: the landing stays
    ASSERT_TRUE(is_landing(seen));
    g_wait.store(1);
    t.join();
    EXPECT_EQ(r, 22);
    EXPECT_EQ(depth, 0u);
    EXPECT_EQ(s.entries.load(), 1u);
    EXPECT_EQ(s.rets.load(), 0u) << "no ret_handler after the detach";
  }
}

TEST(RetLanding, DetachingOneOfTwoConsumersWhileAThreadIsInside) {
  CbSession keep, gone;
  uprobe::Attachment a(vaddr(ld_cb), keep);
  auto b = std::make_unique<uprobe::Attachment>(vaddr(ld_cb), gone);
  expect_optimized(a);
  g_wait.store(0);
  g_inside.store(0);
  long r = 0;
  std::thread t([&] { r = call_cb(wait_body, 10); });
  while (g_inside.load() == 0) std::this_thread::yield();
  b.reset();  // the uprobe stays, with a new consumer set
  g_wait.store(1);
  t.join();
  EXPECT_EQ(r, 11);
  EXPECT_EQ(keep.entries.load(), 1u);
  EXPECT_EQ(gone.entries.load(), 1u);
  EXPECT_EQ(keep.rets.load(), 1u) << "the remaining consumer's ret_handler (found by id in the new set)";
  EXPECT_EQ(gone.rets.load(), 0u) << "none for the detached one";
  EXPECT_EQ(keep.bad.load(), 1u) << "(wait_body returns its argument, not twice it)";
}

long fork_body(long x) { return fork() == 0 ? x + 1000 : x; }

TEST(RetLanding, ForkInsideTheProbedFunction) {
  CbSession s;
  s.any = true;
  uprobe::Attachment a(vaddr(ld_cb), s);
  expect_optimized(a);
  const long r = call_cb(fork_body, 5);
  if (r == 1006) {
    // The child: returned through its copy of the landing and instance.
    int code = 0;
    if (!is_landing(ld_seen_ret)) code |= 1;
    if (s.rets.load() != 1) code |= 2;
    if (uprobe::return_stack_depth() != 0) code |= 4;
    if (call_cb(twice, 4) != 9 || s.rets.load() != 2) code |= 8;
    _exit(code);
  }
  ASSERT_EQ(r, 6);
  EXPECT_EQ(s.rets.load(), 1u);
  int status = -1;
  ASSERT_GT(::wait(&status), 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

// Signal handlers that hit the landing's probe while the interrupted code is
// anywhere in the stub, the thunk or the landing.
std::atomic<std::uint64_t> g_sig_calls{0}, g_sig_bad{0};
void on_usr1(int) {
  const int saved = errno;
  for (long i = 0; i < 3; ++i) {
    if (ld_cb(twice, i) != 2 * i + 1) g_sig_bad.fetch_add(1);
    g_sig_calls.fetch_add(1);
  }
  errno = saved;
}

TEST(RetLanding, SignalsWithProbedCallsInBetween) {
  RetRecorder rec;
  CbSession s;
  uprobe::Attachment a(vaddr(ld_regs), rec), b(vaddr(ld_cb), s);
  expect_optimized(a);
  struct sigaction sa {}, old{};
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  const uprobe::Stats s0 = uprobe::stats();
  std::atomic<bool> stop{false};
  const pthread_t self = pthread_self();
  std::thread killer([&] {
    while (!stop.load()) {
      pthread_kill(self, SIGUSR1);
      std::this_thread::yield();
    }
  });
  std::uint64_t calls = 0;
  // (At least 200,000 calls; more, up to 20 s, until a signal handler's call
  // has returned through its probe: under load the signals can all land
  // inside handlers of ours for longer, recursion misses.)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int i = 0; i < 200000 || (s.rets.load() == 0 && std::chrono::steady_clock::now() < deadline); ++i) {
    Drive d{};
    ld_drive(vaddr(ld_regs), 40, 2, &d.rax);
    ++calls;
    if (d.rax != 42 || d.rdx != (40u ^ 2u) || d.rbx != 0x0b0b0b0b0b0b0b0bull || d.r15 != 0x1515151515151515ull ||
        (d.rflags & 1) != 1) {
      ADD_FAILURE() << "call " << i << ": rax " << hexs(d.rax) << " rdx " << hexs(d.rdx);
      break;
    }
    // (Until a handler's call has returned through its probe, too: on a
    // loaded machine the first few thousand signals may all land inside a
    // handler of ours, recursion misses.)
    if (i > 1000 && g_sig_calls.load() > 3000 && s.rets.load() > 0) break;
  }
  stop.store(true);
  killer.join();
  sigaction(SIGUSR1, &old, nullptr);
  EXPECT_GT(g_sig_calls.load(), 0u);
  EXPECT_EQ(g_sig_bad.load(), 0u);
  EXPECT_EQ(rec.rets.load(), calls);
  const uprobe::Stats d = delta(s0, uprobe::stats());
  // A signal that interrupts a handler of ours (the recorder's ret_handler)
  // makes its hits recursion misses, as the kernel's.
  EXPECT_EQ(s.rets.load() + d.recursion_misses, g_sig_calls.load()) << str(d);
  EXPECT_GT(s.rets.load(), 0u);
  EXPECT_EQ(s.bad.load(), 0u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

}  // namespace
