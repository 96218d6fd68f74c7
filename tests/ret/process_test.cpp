// SPDX-License-Identifier: MIT
// Return probes and the process: fork() from inside a return-probed function
// (both processes return through the trampoline and run their own
// ret_handler), pthread_exit() with return instances pending (dropped and
// counted, no crash), many short-lived threads (no leak of return stacks or
// instances), and a million returns in one thread (memory flat).

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "ret_common.hpp"

using namespace rettest;
using uprobe::Action;
using uprobe::Callbacks;
using uprobe::Regs;

namespace {
volatile pid_t g_fork_pid = -1;
volatile long g_sink;
}  // namespace

extern "C" __attribute__((noinline, noipa)) long rt_forker(long x) {
  pid_t p = fork();
  g_fork_pid = p;
  if (p < 0) return -1;
  return p == 0 ? x + 1 : x + 2;
}

extern "C" __attribute__((noinline, noipa)) long rt_exit_inner(long x) {
  if (x == 42) pthread_exit(nullptr);
  return x + 1;
}

extern "C" __attribute__((noinline, noipa)) long rt_exit_outer(long x) {
  long r = rt_exit_inner(x);
  g_sink = r;  // not a tail call
  return r + 1;
}

namespace {
volatile std::uint64_t g_sig_a, g_sig_result, g_sig_depth;
void usr1_handler(int) {
  g_sig_result = rt_simple_add(g_sig_a, 7);
  g_sig_depth = uprobe::return_stack_depth();
}
}  // namespace

/// Raises SIGUSR1 (its handler calls a return-probed function on the
/// sigaltstack) while its own return is pending.
extern "C" __attribute__((noinline, noipa)) long rt_sig_outer(long x) {
  g_sig_a = static_cast<std::uint64_t>(x);
  raise(SIGUSR1);
  g_sink = x;
  return x + 100;
}

namespace {

struct ForkRec : uprobe::Consumer {
  ForkRec() : uprobe::Consumer(Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0};
  std::uint64_t last_rax = 0, last_cookie = 0;
  pid_t last_pid = 0;
  Action handler(Regs& r) override {
    entries.fetch_add(1);
    uprobe::session_cookie() = r.rdi;
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t) override {
    rets.fetch_add(1);
    last_rax = r.rax;
    last_cookie = uprobe::session_cookie();
    last_pid = getpid();
  }
};

struct RetCount : uprobe::Consumer {
  RetCount() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> rets{0}, bad{0};
  std::uint64_t last_rax = 0;
  void ret_handler(Regs& r, std::uint64_t) override {
    rets.fetch_add(1, std::memory_order_relaxed);
    last_rax = r.rax;
    if (r.rax != r.rdi + r.rsi) bad.fetch_add(1, std::memory_order_relaxed);  // rt_simple_add leaves rdi, rsi
  }
};

TEST(RetProcess, ForkInsideReturnProbedFunction) {
  ForkRec rec;
  RetCount add;
  uprobe::Attachment a(vaddr(rt_forker), rec), b(vaddr(rt_simple_add), add);
  int pfd[2];
  ASSERT_EQ(pipe(pfd), 0);
  const pid_t parent = getpid();
  long r = rt_forker(10);
  if (g_fork_pid == 0) {
    // Child: no gtest assertions here; report through the pipe and exit code.
    unsigned code = 0;
    if (r != 11) code |= 1;
    if (rec.rets.load() != 1) code |= 2;
    if (rec.last_pid != getpid() || getpid() == parent) code |= 4;
    if (rec.last_rax != 11) code |= 8;
    if (rec.last_cookie != 10) code |= 16;
    if (uprobe::return_stack_depth() != 0) code |= 32;
    if (rt_simple_add(20, 22) != 42 || add.rets.load() != 1 || add.last_rax != 42) code |= 64;
    ssize_t w = write(pfd[1], &code, sizeof code);
    (void)w;
    _exit(static_cast<int>(code));
  }
  ASSERT_GT(g_fork_pid, 0) << "fork failed";
  const pid_t child = g_fork_pid;
  close(pfd[1]);
  EXPECT_EQ(r, 12);
  EXPECT_EQ(rec.entries.load(), 1u);
  EXPECT_EQ(rec.rets.load(), 1u) << "the parent's ret_handler runs once in the parent";
  EXPECT_EQ(rec.last_pid, getpid());
  EXPECT_EQ(rec.last_rax, 12u);
  EXPECT_EQ(rec.last_cookie, 10u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  int status = 0;
  pid_t w = 0;
  for (int i = 0; i < 1000 && w == 0; ++i) {
    w = waitpid(child, &status, WNOHANG);
    if (w == 0) usleep(10000);
  }
  if (w == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL() << "the child did not exit within 10 s";
  }
  ASSERT_EQ(w, child);
  unsigned code = 0xffff;
  ssize_t n = read(pfd[0], &code, sizeof code);
  close(pfd[0]);
  ASSERT_TRUE(WIFEXITED(status)) << "child died: signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(n, static_cast<ssize_t>(sizeof code));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child report bits: 1 result, 2 ret count, 4 ret ran in child, 8 rax, "
                                       "16 cookie, 32 return stack not empty, 64 probe in child";
  EXPECT_EQ(code, 0u);
  // The parent keeps working.
  EXPECT_EQ(rt_simple_add(1, 2), 3u);
  EXPECT_EQ(add.rets.load(), 1u);
}

void* exit_thread(void* arg) {
  auto* ok = static_cast<std::atomic<int>*>(arg);
  if (rt_exit_outer(1) == 3) ok->fetch_add(1);
  rt_exit_outer(42);  // pthread_exit with two return instances pending
  ok->fetch_add(1000);  // not reached
  return nullptr;
}

TEST(RetProcess, PthreadExitWithPendingReturns) {
  RetCount inner_c, outer_c;
  ForkRec outer_s;  // a session consumer too (its cookie is the argument)
  uprobe::Attachment a(vaddr(rt_exit_inner), inner_c), b(vaddr(rt_exit_outer), outer_c),
      c(vaddr(rt_exit_outer), outer_s);
  auto s0 = uprobe::stats();
  constexpr int kThreads = 100;
  std::atomic<int> ok{0};
  for (int i = 0; i < kThreads; ++i) {
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, nullptr, exit_thread, &ok), 0);
    ASSERT_EQ(pthread_join(t, nullptr), 0);
  }
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(ok.load(), kThreads) << "first call right, nothing after pthread_exit ran";
  EXPECT_EQ(inner_c.rets.load(), std::uint64_t(kThreads));
  EXPECT_EQ(outer_c.rets.load(), std::uint64_t(kThreads));
  EXPECT_EQ(outer_s.rets.load(), std::uint64_t(kThreads));
  EXPECT_EQ(outer_s.last_rax, 3u);
  EXPECT_EQ(outer_s.last_cookie, 1u);
  EXPECT_EQ(d.return_hits, 2u * kThreads) << str(d);
  EXPECT_EQ(d.return_dropped, 2u * kThreads) << "each exiting thread drops its two pending instances: " << str(d);
  EXPECT_EQ(d.return_misses, 0u) << str(d);
  // Still fine on this thread.
  EXPECT_EQ(rt_exit_outer(5), 7);
  EXPECT_EQ(outer_s.last_rax, 7u);
}

void* adder_thread(void* arg) {
  auto* wrong = static_cast<std::atomic<int>*>(arg);
  for (std::uint64_t i = 0; i < 100; ++i)
    if (rt_simple_add(i, 3) != i + 3) wrong->fetch_add(1);
  if (uprobe::return_stack_depth() != 0) wrong->fetch_add(1000);
  return nullptr;
}

void run_threads(int n, std::atomic<int>& wrong) {
  for (int i = 0; i < n; ++i) {
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, nullptr, adder_thread, &wrong), 0);
    ASSERT_EQ(pthread_join(t, nullptr), 0);
  }
}

TEST(RetProcess, ThousandThreadsNoLeak) {
  RetCount rc;
  uprobe::Attachment a(vaddr(rt_simple_add), rc);
  std::atomic<int> wrong{0};
  // Warm-up: the thread stack cache, and the return-instance pool's objects
  // cycling once through the per-CPU rings as exiting threads give back their
  // caches (pages touched once, then reused: ~1 MB here, bounded by the pool).
  run_threads(1000, wrong);
  const long rss0 = vmrss_kb();
  auto s0 = uprobe::stats();
  const std::uint64_t r0 = rc.rets.load();
  auto t0 = std::chrono::steady_clock::now();
  run_threads(1000, wrong);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long rss1 = vmrss_kb();
  auto d = delta(s0, uprobe::stats());
  std::printf("[ info ] 1000 threads x 100 calls: %.3f s, VmRSS %ld -> %ld kB\n", secs, rss0, rss1);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(rc.rets.load() - r0, 100000u);
  EXPECT_EQ(rc.bad.load(), 0u);
  EXPECT_EQ(d.return_hits, 100000u) << str(d);
  EXPECT_EQ(d.return_misses, 0u) << "return instances must not run out (a leak would): " << str(d);
  EXPECT_EQ(d.return_dropped, 0u) << str(d);
  // Expected growth: the per-thread statistics blocks (128 B per new thread,
  // kept by design for stats(), at most 4096 of them) = 125 kB. A leaked
  // return stack (>= 4 kB touched) or thread cache per thread would be 4 MB
  // or more; allocator noise (thread stacks' guard pages, malloc arenas under
  // load) stays well below 2 MB.
  EXPECT_LT(rss1 - rss0, 2048) << "VmRSS grew by " << rss1 - rss0 << " kB over 1000 threads";
}

namespace tsd {
pthread_key_t g_key;
std::atomic<std::uint64_t> g_wrong{0};
/// A destructor that calls a return-probed function in each of glibc's four
/// rounds (it sets its value again in the first three): the last round's
/// call comes after the thread's last exit hook.
void again(void* v) {
  const auto round = reinterpret_cast<std::uintptr_t>(v);
  if (rt_simple_add(round, 1) != round + 1) g_wrong.fetch_add(1);
  if (round < PTHREAD_DESTRUCTOR_ITERATIONS) pthread_setspecific(g_key, reinterpret_cast<void*>(round + 1));
}
void* thread(void*) {
  pthread_setspecific(g_key, reinterpret_cast<void*>(std::uintptr_t{1}));
  return nullptr;
}
}  // namespace tsd

/// Threads whose TSD destructors call a return-probed function in every
/// round, the last one after libuprobe's exit hook: each instance goes back
/// to the pool (the thread caches nothing after its hook). Before, each such
/// thread left its cached instances (a batch of the pool) behind: after ~850
/// threads the pool was empty and every return probe missed. Exact: 3000
/// threads x 4 returns, no miss, and the main thread's calls still hit.
TEST(RetProcess, TsdDestructorsCallingReturnProbedCodeLeakNothing) {
  ASSERT_EQ(pthread_key_create(&tsd::g_key, tsd::again), 0);
  RetCount rc;
  const uprobe::Stats s0 = uprobe::stats();
  {
    uprobe::Attachment a(vaddr(rt_simple_add), rc);
    for (int i = 0; i < 3000; ++i) {
      pthread_t t;
      ASSERT_EQ(pthread_create(&t, nullptr, tsd::thread, nullptr), 0);
      ASSERT_EQ(pthread_join(t, nullptr), 0);
    }
    for (std::uint64_t i = 0; i < 10; ++i) EXPECT_EQ(rt_simple_add(i, 2), i + 2);
  }
  const uprobe::Stats d = delta(s0, uprobe::stats());
  pthread_key_delete(tsd::g_key);
  EXPECT_EQ(tsd::g_wrong.load(), 0u);
  EXPECT_EQ(d.return_misses, 0u) << "return instances ran out (a leak): " << str(d);
  EXPECT_EQ(d.return_hits, 3000u * PTHREAD_DESTRUCTOR_ITERATIONS + 10u) << str(d);
  EXPECT_EQ(rc.rets.load(), 3000u * PTHREAD_DESTRUCTOR_ITERATIONS + 10u);
  EXPECT_EQ(rc.bad.load(), 0u);
}

TEST(RetProcess, MillionReturnsMemoryFlat) {
  RetCount rc;
  uprobe::Attachment a(vaddr(rt_simple_add), rc);
  auto volatile f = &rt_simple_add;
  for (std::uint64_t i = 0; i < 10000; ++i) ASSERT_EQ(f(i, 1), i + 1);
  const long rss0 = vmrss_kb();
  auto s0 = uprobe::stats();
  auto t0 = std::chrono::steady_clock::now();
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < 1000000; ++i)
    if (f(i, i) != 2 * i) ++wrong;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long rss1 = vmrss_kb();
  auto d = delta(s0, uprobe::stats());
  std::printf("[ info ] 1e6 return-probed calls: %.3f s, VmRSS %ld -> %ld kB\n", secs, rss0, rss1);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(rc.rets.load(), 1010000u);
  EXPECT_EQ(rc.bad.load(), 0u);
  EXPECT_EQ(d.return_hits, 1000000u) << str(d);
  EXPECT_EQ(d.return_misses, 0u) << str(d);
  EXPECT_LT(rss1 - rss0, 1024) << "VmRSS grew by " << rss1 - rss0 << " kB over 1e6 returns";
}

// A hit never grows the pool of return instances: attaching a return probe
// sizes it for the threads running then (64 each, plus room for 64 more).
// 100 threads hold 61 pending returns each at once (6100, more than the
// pool's first 4096), then all return: every return is probed, none missed.
constexpr int kDeepThreads = 100;
constexpr std::uint64_t kDeepN = 60;
std::atomic<int> g_deep_started{0}, g_deep_bottom{0}, g_deep_phase{0};

/// The innermost rt_deep() invocation of each thread waits here until every
/// thread is that deep.
extern "C" void rt_deep_bottom() {
  g_deep_bottom.fetch_add(1);
  while (g_deep_phase.load() < 2) std::this_thread::yield();
}

struct DeepRet : uprobe::Consumer {
  DeepRet() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> rets{0}, rax_sum{0}, bad{0};
  void ret_handler(Regs& r, std::uint64_t) override {
    rets.fetch_add(1, std::memory_order_relaxed);
    rax_sum.fetch_add(r.rax, std::memory_order_relaxed);
    if (r.rax == 0 || r.rax > kDeepN + 1) bad.fetch_add(1, std::memory_order_relaxed);
  }
};

TEST(RetProcess, ManyThreadsDeepAtOnceMissNoReturn) {
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < kDeepThreads; ++i)
    ts.emplace_back([&] {
      g_deep_started.fetch_add(1);
      while (g_deep_phase.load() < 1) std::this_thread::yield();
      if (rt_deep(kDeepN) != kDeepN + 1) wrong.fetch_add(1);
    });
  while (g_deep_started.load() < kDeepThreads) std::this_thread::yield();
  DeepRet d;
  uprobe::Attachment a(reinterpret_cast<const void*>(&rt_deep), d);
  const uprobe::Stats s0 = uprobe::stats();
  g_deep_phase.store(1);
  while (g_deep_bottom.load() < kDeepThreads) std::this_thread::yield();
  EXPECT_EQ(g_deep_bottom.load(), kDeepThreads);
  g_deep_phase.store(2);
  for (auto& t : ts) t.join();
  const uprobe::Stats s = delta(s0, uprobe::stats());
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(d.rets.load(), kDeepThreads * (kDeepN + 1));
  EXPECT_EQ(d.bad.load(), 0u);
  EXPECT_EQ(d.rax_sum.load(), kDeepThreads * (kDeepN + 1) * (kDeepN + 2) / 2) << "each level's n + 1, 1..61";
  EXPECT_EQ(s.return_hits, kDeepThreads * (kDeepN + 1)) << str(s);
  EXPECT_EQ(s.return_misses, 0u) << str(s);
  EXPECT_EQ(s.return_dropped, 0u) << str(s);
}

// ------------------------------------------------------ sigaltstack ----

struct AltCtx {
  void* alt;
  std::size_t alt_size;
  std::atomic<int> wrong{0};
  std::atomic<int> good{0};
};

void* alt_thread(void* arg) {
  auto* c = static_cast<AltCtx*>(arg);
  stack_t ss{};
  ss.ss_sp = c->alt;
  ss.ss_size = c->alt_size;
  if (sigaltstack(&ss, nullptr) != 0) {
    c->wrong.fetch_add(1000);
    return nullptr;
  }
  for (long i = 0; i < 100; ++i) {
    g_sig_result = 0;
    if (rt_sig_outer(i) != i + 100) c->wrong.fetch_add(1);
    if (g_sig_result != static_cast<std::uint64_t>(i) + 7) c->wrong.fetch_add(1);
    if (g_sig_depth != 1) c->wrong.fetch_add(1);  // rt_sig_outer pending while the handler ran
    if (uprobe::return_stack_depth() != 0) c->wrong.fetch_add(1);
    c->good.fetch_add(1);
  }
  ss.ss_flags = SS_DISABLE;
  sigaltstack(&ss, nullptr);
  return nullptr;
}

/// A signal handler on the sigaltstack calls a return-probed function while a
/// return is pending on the thread's stack. Address order between the two
/// stacks says nothing about frame order then: nothing may be found stale.
/// Run with the altstack above and below the thread's stack.
TEST(RetProcess, SigaltstackHandlerWhileReturnPending) {
  struct sigaction sa{}, old{};
  sa.sa_handler = usr1_handler;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  const std::size_t kStack = 1 << 20, kAlt = 256 << 10;
  void* region = mmap(nullptr, kStack + kAlt, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  auto* base = static_cast<std::uint8_t*>(region);
  for (int above = 1; above >= 0; --above) {
    SCOPED_TRACE(above ? "altstack above the thread stack" : "altstack below the thread stack");
    RetCount add;
    ForkRec outer;
    uprobe::Attachment a(vaddr(rt_simple_add), add), b(vaddr(rt_sig_outer), outer);
    AltCtx ctx;
    void* stack = above ? base : base + kAlt;
    ctx.alt = above ? base + kStack : base;
    ctx.alt_size = kAlt;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    ASSERT_EQ(pthread_attr_setstack(&attr, stack, kStack), 0);
    auto s0 = uprobe::stats();
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, &attr, alt_thread, &ctx), 0);
    ASSERT_EQ(pthread_join(t, nullptr), 0);
    pthread_attr_destroy(&attr);
    auto d = delta(s0, uprobe::stats());
    EXPECT_EQ(ctx.good.load(), 100);
    EXPECT_EQ(ctx.wrong.load(), 0) << "results, the handler's result and the return stack depth";
    EXPECT_EQ(add.rets.load(), 100u) << "the handler's probed call returns are reported";
    EXPECT_EQ(add.bad.load(), 0u);
    EXPECT_EQ(outer.rets.load(), 100u) << "the interrupted function's returns are reported";
    EXPECT_EQ(outer.last_rax, 199u);
    EXPECT_EQ(d.return_hits, 200u) << str(d);
    EXPECT_EQ(d.return_dropped, 0u) << "nothing is stale: " << str(d);
    EXPECT_EQ(d.return_misses, 0u) << str(d);
  }
  munmap(region, kStack + kAlt);
  sigaction(SIGUSR1, &old, nullptr);
}

}  // namespace
