// SPDX-License-Identifier: MIT
// Signal masks (issue 14, section 2): a thread that blocks every signal
// survives int3 probe hits. Every probe here is an int3 site (Config::optimize
// off, checked with probe_info()), so each hit is a SIGTRAP, which the kernel
// makes fatal in a thread that has SIGTRAP blocked. Each test asserts the
// exact hit count and that the mask the program reads back (sigprocmask's
// old set, a handler's mask and its ucontext, sigaction's sa_mask, a saved
// context's uc_sigmask, posix_spawnattr_getsigmask) is exactly what it set,
// SIGTRAP included, while the thread's real mask (/proc) never blocks it:
// - a worker blocking every signal with sigprocmask / pthread_sigmask, 1000 hits;
// - a handler installed with a full sa_mask calling probed code;
// - siglongjmp out of such a handler back into probed code;
// - sigsuspend, ppoll, pselect, epoll_pwait, epoll_pwait2 under a full mask
//   woken by a handler that hits, and the sigwait family, while another
//   thread hits;
// - swapcontext/setcontext with a uc_sigmask blocking everything, and a
//   makecontext() function returning to its uc_link through glibc's own
//   setcontext;
// - a program spawned with posix_spawnattr_setsigmask of a full set, which
//   itself takes int3 hits;
// - the program's own SIGTRAP while it blocks it: raise() stays pending
//   (sigpending, sigwaitinfo), is delivered when unblocked; a foreign int3
//   while blocked kills, as the kernel does.

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "life_common.hpp"

extern char** environ;

using namespace lifetest;

namespace {

/// Signals 1..64 of a set, as a string of the differing numbers.
std::string diff(const sigset_t& got, const sigset_t& want) {
  std::string out;
  for (int s = 1; s <= 64; ++s)
    if (sigismember(&got, s) != sigismember(&want, s)) {
      if (!out.empty()) out += ',';
      out += std::to_string(s);
      out += sigismember(&got, s) ? '+' : '-';
    }
  return out;
}

/// sigfillset() as the kernel keeps it (never SIGKILL, SIGSTOP), and as
/// glibc's sigprocmask/pthread_sigmask keep it (never its SIGCANCEL 32 and
/// SIGSETXID 33): what a program reads back after blocking everything.
sigset_t full_as_kept(bool glibc_filters) {
  sigset_t s;
  sigfillset(&s);
  sigdelset(&s, SIGKILL);
  sigdelset(&s, SIGSTOP);
  if (glibc_filters) {
    sigdelset(&s, 32);
    sigdelset(&s, 33);
  }
  return s;
}

/// The calling thread's real blocked mask (SigBlk of /proc/thread-self/status).
/// Async-signal-safe (also read in signal handlers): no allocation.
std::uint64_t real_blocked() {
  char buf[4096];
  const int fd = ::open("/proc/thread-self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ~0ull;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return ~0ull;
  buf[n] = 0;
  const char* p = std::strstr(buf, "SigBlk:");
  if (!p) return ~0ull;
  p += 7;
  while (*p == ' ' || *p == '\t') ++p;
  std::uint64_t v = 0;
  for (; (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'); ++p)
    v = v * 16 + static_cast<std::uint64_t>(*p <= '9' ? *p - '0' : *p - 'a' + 10);
  return v;
}
constexpr std::uint64_t kTrapBit = 1ull << (SIGTRAP - 1);

sigset_t current_mask() {
  sigset_t m;
  pthread_sigmask(SIG_BLOCK, nullptr, &m);
  return m;
}

/// Int3 probes for the test (Config::optimize off), restored afterwards.
class Masks : public ::testing::Test {
 protected:
  ConfigGuard guard;
  void SetUp() override { use_kind(Kind::int3); }
  /// An int3 probe on lf_add counting into `c`.
  uprobe::Attachment attach_add(Counter& c) {
    uprobe::Attachment a(vaddr(lf_add), c);
    EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::int3);
    return a;
  }
};

// ------------------------------------------------- a worker blocking all ----

enum class MaskCall { sigprocmask, pthread_sigmask };

class MasksWorker : public Masks, public ::testing::WithParamInterface<MaskCall> {};
INSTANTIATE_TEST_SUITE_P(Calls, MasksWorker, ::testing::Values(MaskCall::sigprocmask, MaskCall::pthread_sigmask),
                         [](const auto& info) {
                           return std::string(info.param == MaskCall::sigprocmask ? "sigprocmask" : "pthread_sigmask");
                         });

TEST_P(MasksWorker, ThreadBlockingEverySignalTakes1000Int3Hits) {
  Counter c;
  uprobe::Attachment a = attach_add(c);
  const uprobe::Stats s0 = uprobe::stats();
  std::string got_diff = "not run", after_diff = "not run";
  std::uint64_t real = 0, wrong = 0;
  int rc = -1;
  std::thread t([&] {
    sigset_t all, old, got;
    sigfillset(&all);
    rc = GetParam() == MaskCall::sigprocmask ? sigprocmask(SIG_SETMASK, &all, &old)
                                             : pthread_sigmask(SIG_SETMASK, &all, &old);
    if (GetParam() == MaskCall::sigprocmask) sigprocmask(SIG_SETMASK, nullptr, &got);
    else pthread_sigmask(SIG_SETMASK, nullptr, &got);
    got_diff = diff(got, full_as_kept(true));
    real = real_blocked();
    for (std::uint64_t i = 0; i < 1000; ++i) wrong += lf_add(i, 1) != i + 1;
    after_diff = diff(current_mask(), full_as_kept(true));
  });
  t.join();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(got_diff, "") << "the mask read back (+: extra, -: missing)";
  EXPECT_EQ(after_diff, "");
  EXPECT_EQ(real & kTrapBit, 0u) << "SIGTRAP is never blocked for real";
  EXPECT_EQ(real | kTrapBit, full_as_kept(true).__val[0]) << std::hex << real;
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(c.hits.load(), 1000u);
  EXPECT_EQ(d.hits, 1000u) << stats_str(d);
}

// ------------------------------------------- a handler with a full sa_mask ----

std::atomic<std::uint64_t> g_handler_runs{0}, g_handler_wrong{0};
/// The first mask and uc_sigmask a handler saw that were not the expected ones.
std::atomic<std::uint64_t> g_bad_mask{0}, g_bad_uc{0};
sigset_t g_interrupted_mask;

void on_usr1_full(int, siginfo_t*, void* ctx) {
  g_handler_runs.fetch_add(1);
  if (lf_add(40, 2) != 42) g_handler_wrong.fetch_add(1);
  // The handler runs under everything (the kernel's rules: sa_mask, the
  // thread's mask, the signal), SIGTRAP included in the program's view; its
  // ucontext holds the interrupted mask. (Signal context: words, no strings.)
  const sigset_t m = current_mask();
  if (m.__val[0] != full_as_kept(false).__val[0]) g_bad_mask = m.__val[0];
  const sigset_t& uc = static_cast<ucontext_t*>(ctx)->uc_sigmask;
  if (uc.__val[0] != g_interrupted_mask.__val[0]) g_bad_uc = uc.__val[0];
  if (real_blocked() & kTrapBit) g_handler_wrong.fetch_add(1);
}

TEST_F(Masks, HandlerWithFullSaMaskTakesInt3Hits) {
  Counter c;
  uprobe::Attachment a = attach_add(c);
  g_handler_runs = g_handler_wrong = g_bad_mask = g_bad_uc = 0;
  struct sigaction sa, old, now;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_usr1_full;
  sa.sa_flags = SA_SIGINFO;
  sigfillset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  ASSERT_EQ(sigaction(SIGUSR1, nullptr, &now), 0);
  std::string sa_diff = diff(now.sa_mask, full_as_kept(false));
  const bool same_handler = now.sa_sigaction == on_usr1_full && (now.sa_flags & SA_SIGINFO);
  const uprobe::Stats s0 = uprobe::stats();
  std::thread t([&] {
    // Half the raises from a thread that blocks SIGTRAP itself (and SIGUSR2).
    for (int i = 0; i < 200; ++i) {
      sigset_t m;
      sigemptyset(&m);
      if (i >= 100) {
        sigaddset(&m, SIGTRAP);
        sigaddset(&m, SIGUSR2);
      }
      pthread_sigmask(SIG_SETMASK, &m, nullptr);
      g_interrupted_mask = current_mask();
      raise(SIGUSR1);
    }
  });
  t.join();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  sigaction(SIGUSR1, &old, nullptr);
  EXPECT_EQ(sa_diff, "") << "sigaction() reads back the sa_mask it was given";
  EXPECT_TRUE(same_handler);
  EXPECT_EQ(g_handler_runs.load(), 200u);
  EXPECT_EQ(g_handler_wrong.load(), 0u);
  EXPECT_EQ(g_bad_mask.load(), 0u) << "the handler's mask";
  EXPECT_EQ(g_bad_uc.load(), 0u) << "the handler's uc_sigmask";
  EXPECT_EQ(c.hits.load(), 200u);
  EXPECT_EQ(d.hits, 200u) << stats_str(d);
}

// ----------------------------------------- siglongjmp out of a handler ----

sigjmp_buf g_env;
std::atomic<std::uint64_t> g_jump_handler_hits{0};

void on_usr1_jump(int) {
  if (lf_add(1, 2) == 3) g_jump_handler_hits.fetch_add(1);
  siglongjmp(g_env, 1);
}

TEST_F(Masks, SiglongjmpOutOfAFullMaskHandlerIntoProbedCode) {
  Counter c;
  uprobe::Attachment a = attach_add(c);
  g_jump_handler_hits = 0;
  struct sigaction sa, old;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1_jump;
  sigfillset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  const uprobe::Stats s0 = uprobe::stats();
  std::string bad;
  std::uint64_t after = 0, wrong = 0;
  std::thread t([&] {
    // Everything blocked but SIGUSR1: SIGTRAP too, as the program sees it.
    sigset_t m = full_as_kept(true), set;
    sigdelset(&m, SIGUSR1);
    pthread_sigmask(SIG_SETMASK, &m, nullptr);
    volatile int round = 0;
    sigsetjmp(g_env, 1);
    // Here first from sigsetjmp, then after each jump out of the handler: the
    // mask sigsetjmp saved is back, and probed code runs under it.
    set = current_mask();
    if (bad.empty() && !diff(set, m).empty()) bad = "round " + std::to_string(round) + ": " + diff(set, m);
    if (real_blocked() & kTrapBit) ++wrong;
    for (int i = 0; i < 10; ++i, ++after) wrong += lf_add(static_cast<std::uint64_t>(i), 5) != static_cast<std::uint64_t>(i) + 5;
    if (round < 100) {
      round = round + 1;
      raise(SIGUSR1);
    }
  });
  t.join();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  sigaction(SIGUSR1, &old, nullptr);
  EXPECT_EQ(bad, "") << "the mask after siglongjmp (+: extra, -: missing)";
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(g_jump_handler_hits.load(), 100u);
  EXPECT_EQ(after, 1010u);
  EXPECT_EQ(c.hits.load(), 1110u);
  EXPECT_EQ(d.hits, 1110u) << stats_str(d);
}

// --------------------------------------- waiting under a full mask ----

enum class Wait { sigsuspend, ppoll, pselect, epoll_pwait, epoll_pwait2 };
const char* wait_name(Wait w) {
  switch (w) {
    case Wait::sigsuspend: return "sigsuspend";
    case Wait::ppoll: return "ppoll";
    case Wait::pselect: return "pselect";
    case Wait::epoll_pwait: return "epoll_pwait";
    case Wait::epoll_pwait2: return "epoll_pwait2";
  }
  return "?";
}

std::atomic<std::uint64_t> g_wake_hits{0};
void on_usr1_wake(int) {
  if (lf_add(20, 22) == 42) g_wake_hits.fetch_add(1);
}

/// A thread hammering the probe meanwhile: its hits, exactly.
struct Hammer {
  std::atomic<bool> stop{false};
  std::uint64_t calls = 0, wrong = 0;
  std::thread t;
  Hammer() {
    t = std::thread([this] {
      while (!stop.load(std::memory_order_relaxed)) {
        wrong += lf_add(calls, 1) != calls + 1;
        ++calls;
      }
    });
  }
  void join() {
    stop = true;
    t.join();
  }
};

class MasksWait : public Masks, public ::testing::WithParamInterface<Wait> {};
INSTANTIATE_TEST_SUITE_P(Calls, MasksWait,
                         ::testing::Values(Wait::sigsuspend, Wait::ppoll, Wait::pselect, Wait::epoll_pwait,
                                           Wait::epoll_pwait2),
                         [](const auto& info) { return std::string(wait_name(info.param)); });

TEST_P(MasksWait, FullMaskWaitWokenByAHandlerThatHits) {
  Counter c;
  uprobe::Attachment a = attach_add(c);
  g_wake_hits = 0;
  struct sigaction sa, old;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1_wake;
  sigfillset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  const uprobe::Stats s0 = uprobe::stats();
  std::atomic<int> ready{0};
  std::atomic<pid_t> tid{0};
  std::string bad;
  std::uint64_t after = 0, eintr = 0, wrong = 0;
  const Wait w = GetParam();
  Hammer hammer;
  std::thread waiter([&] {
    const sigset_t all = full_as_kept(true);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    tid = static_cast<pid_t>(syscall(SYS_gettid));
    sigset_t temp;
    sigfillset(&temp);
    sigdelset(&temp, SIGUSR1);  // the temporary mask lets SIGUSR1 in, nothing else
    for (int i = 0; i < 100; ++i) {
      ready = i + 1;
      int r = -2;
      switch (w) {
        case Wait::sigsuspend: r = sigsuspend(&temp); break;
        case Wait::ppoll: r = ppoll(nullptr, 0, nullptr, &temp); break;
        case Wait::pselect: r = pselect(0, nullptr, nullptr, nullptr, nullptr, &temp); break;
        case Wait::epoll_pwait: {
          epoll_event ev;
          r = epoll_pwait(ep, &ev, 1, -1, &temp);
          break;
        }
        case Wait::epoll_pwait2: {
          epoll_event ev;
          r = epoll_pwait2(ep, &ev, 1, nullptr, &temp);
          break;
        }
      }
      if (r == -1 && errno == EINTR) ++eintr;
      const sigset_t m = current_mask();
      if (bad.empty() && !diff(m, all).empty()) bad = "after wait " + std::to_string(i) + ": " + diff(m, all);
      if (real_blocked() & kTrapBit) ++wrong;
      wrong += lf_add(1, 1) != 2;  // under the full mask again
      ++after;
    }
  });
  for (int i = 1; i <= 100; ++i) {
    while (ready.load() != i) std::this_thread::yield();
    // Blocked outside the wait: pending until the temporary mask lets it in.
    syscall(SYS_tgkill, getpid(), tid.load(), SIGUSR1);
  }
  waiter.join();
  hammer.join();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  sigaction(SIGUSR1, &old, nullptr);
  ::close(ep);
  EXPECT_EQ(eintr, 100u);
  EXPECT_EQ(bad, "") << "(+: extra, -: missing)";
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(hammer.wrong, 0u);
  EXPECT_EQ(g_wake_hits.load(), 100u) << "one handler hit per wait";
  EXPECT_EQ(c.hits.load(), 100u + after + hammer.calls);
  EXPECT_EQ(d.hits, 100u + after + hammer.calls) << stats_str(d);
}

enum class SigWait { sigwait, sigwaitinfo, sigtimedwait };
class MasksSigwait : public Masks, public ::testing::WithParamInterface<SigWait> {};
INSTANTIATE_TEST_SUITE_P(Calls, MasksSigwait,
                         ::testing::Values(SigWait::sigwait, SigWait::sigwaitinfo, SigWait::sigtimedwait),
                         [](const auto& info) {
                           return std::string(info.param == SigWait::sigwait       ? "sigwait"
                                              : info.param == SigWait::sigwaitinfo ? "sigwaitinfo"
                                                                                   : "sigtimedwait");
                         });

TEST_P(MasksSigwait, FullMaskThreadTakesSignalsAndHits) {
  Counter c;
  uprobe::Attachment a = attach_add(c);
  const uprobe::Stats s0 = uprobe::stats();
  std::atomic<int> ready{0};
  std::atomic<pid_t> tid{0};
  std::uint64_t taken = 0, after = 0, wrong = 0;
  std::string bad;
  Hammer hammer;
  std::thread waiter([&] {
    const sigset_t all = full_as_kept(true);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    tid = static_cast<pid_t>(syscall(SYS_gettid));
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    const struct timespec ten_s = {10, 0};
    for (int i = 0; i < 100; ++i) {
      ready = i + 1;
      int sig = 0;
      siginfo_t si;
      switch (GetParam()) {
        case SigWait::sigwait: sigwait(&usr1, &sig); break;
        case SigWait::sigwaitinfo: sig = sigwaitinfo(&usr1, &si); break;
        case SigWait::sigtimedwait: sig = sigtimedwait(&usr1, &si, &ten_s); break;
      }
      taken += sig == SIGUSR1;
      const sigset_t m = current_mask();
      if (bad.empty() && !diff(m, all).empty()) bad = std::to_string(i) + ": " + diff(m, all);
      for (int k = 0; k < 10; ++k, ++after) wrong += lf_add(2, 3) != 5;
    }
  });
  for (int i = 1; i <= 100; ++i) {
    while (ready.load() != i) std::this_thread::yield();
    syscall(SYS_tgkill, getpid(), tid.load(), SIGUSR1);
  }
  waiter.join();
  hammer.join();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(taken, 100u);
  EXPECT_EQ(bad, "");
  EXPECT_EQ(wrong + hammer.wrong, 0u);
  EXPECT_EQ(after, 1000u);
  EXPECT_EQ(c.hits.load(), after + hammer.calls);
  EXPECT_EQ(d.hits, after + hammer.calls) << stats_str(d);
}

// ------------------------------------------------------------ contexts ----

ucontext_t g_main_ctx, g_co_ctx, g_co_back, g_link;
std::uint64_t g_co_hits = 0, g_co_wrong = 0;
std::string g_co_bad;

void coroutine() {
  // Runs under the uc_sigmask swapcontext() installed: every signal.
  const std::string d = diff(current_mask(), full_as_kept(false));
  if (!d.empty()) g_co_bad += "in coroutine: " + d + ";";
  if (real_blocked() & kTrapBit) ++g_co_wrong;
  for (std::uint64_t i = 0; i < 100; ++i, ++g_co_hits) g_co_wrong += lf_add(i, 2) != i + 2;
  swapcontext(&g_co_back, &g_main_ctx);  // out, and back in again
  for (std::uint64_t i = 0; i < 100; ++i, ++g_co_hits) g_co_wrong += lf_add(i, 3) != i + 3;
  // Returning: glibc's own setcontext() resumes uc_link (g_link), whose
  // uc_sigmask (from getcontext() under a full mask) has SIGTRAP.
}

TEST_F(Masks, SwapcontextAndSetcontextWithUcSigmaskBlockingEverything) {
  Counter c;
  uprobe::Attachment a = attach_add(c);
  g_co_hits = g_co_wrong = 0;
  g_co_bad.clear();
  const uprobe::Stats s0 = uprobe::stats();
  std::uint64_t main_hits = 0;
  std::vector<char> stack(256 << 10);
  std::thread t([&] {
    sigset_t usr2;  // this thread's own mask: just SIGUSR2
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    pthread_sigmask(SIG_SETMASK, &usr2, nullptr);
    // g_link: saved while everything is blocked; the coroutine returns to it.
    const sigset_t all = full_as_kept(true);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    volatile int phase = 0;
    getcontext(&g_link);
    if (phase == 0) {
      phase = 1;
      const std::string d = diff(g_link.uc_sigmask, all);
      if (!d.empty()) g_co_bad += "getcontext uc_sigmask: " + d + ";";
      pthread_sigmask(SIG_SETMASK, &usr2, nullptr);
      getcontext(&g_co_ctx);
      g_co_ctx.uc_stack.ss_sp = stack.data();
      g_co_ctx.uc_stack.ss_size = stack.size();
      g_co_ctx.uc_link = &g_link;
      sigfillset(&g_co_ctx.uc_sigmask);
      makecontext(&g_co_ctx, coroutine, 0);
      swapcontext(&g_main_ctx, &g_co_ctx);
      // Back from the coroutine's first swapcontext: our own mask again.
      std::string d2 = diff(current_mask(), usr2);
      if (!d2.empty()) g_co_bad += "after swapcontext: " + d2 + ";";
      const std::string d3 = diff(g_co_back.uc_sigmask, full_as_kept(false));
      if (!d3.empty()) g_co_bad += "swapcontext's saved uc_sigmask: " + d3 + ";";
      for (std::uint64_t i = 0; i < 50; ++i, ++main_hits) g_co_wrong += lf_add(i, 4) != i + 4;
      setcontext(&g_co_back);  // into the coroutine, which returns to g_link
      g_co_bad += "setcontext returned;";
      return;
    }
    // Resumed at g_link by glibc's setcontext: the mask getcontext() saved.
    const std::string d = diff(current_mask(), all);
    if (!d.empty()) g_co_bad += "at uc_link: " + d + ";";
    if (real_blocked() & kTrapBit) ++g_co_wrong;
    for (std::uint64_t i = 0; i < 50; ++i, ++main_hits) g_co_wrong += lf_add(i, 6) != i + 6;
  });
  t.join();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(g_co_bad, "");
  EXPECT_EQ(g_co_wrong, 0u);
  EXPECT_EQ(g_co_hits, 200u);
  EXPECT_EQ(main_hits, 100u);
  EXPECT_EQ(c.hits.load(), 300u);
  EXPECT_EQ(d.hits, 300u) << stats_str(d);
}

// ----------------------------------------------------------- posix_spawn ----

TEST_F(Masks, PosixSpawnWithAFullSigmask) {
  Counter c;
  uprobe::Attachment a = attach_add(c);
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_EQ(lf_add(i, 1), i + 1);
  posix_spawnattr_t attr;
  ASSERT_EQ(posix_spawnattr_init(&attr), 0);
  sigset_t all, back;
  sigfillset(&all);
  ASSERT_EQ(posix_spawnattr_setsigmask(&attr, &all), 0);
  ASSERT_EQ(posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK), 0);
  ASSERT_EQ(posix_spawnattr_getsigmask(&attr, &back), 0);
  EXPECT_EQ(std::memcmp(&back, &all, sizeof all), 0) << diff(back, all);
  // The child (a libuprobe program) starts with every signal blocked: it
  // attaches an int3 probe itself and takes 1000 hits (exit status 0), and
  // reads back every signal blocked but SIGKILL, SIGSTOP and glibc's two.
  char arg0[] = LIFE_MASK_CHILD;
  char* argv[] = {arg0, nullptr};
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, LIFE_MASK_CHILD, nullptr, &attr, argv, environ), 0);
  posix_spawnattr_destroy(&attr);
  const int st = wait_child(pid, 60);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st);
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_EQ(lf_add(i, 1), i + 1);
  EXPECT_EQ(c.hits.load(), 20u) << "the parent's own hits";
}

// ---------------------------------------------- the program's own SIGTRAP ----

std::atomic<int> g_trap_runs{0};
std::atomic<int> g_trap_code{0};
void on_own_trap(int, siginfo_t* si, void*) {
  g_trap_runs.fetch_add(1);
  g_trap_code = si->si_code;
}

TEST_F(Masks, RaisedSigtrapWhileBlockedStaysPendingUntilTakenOrUnblocked) {
  Counter c;
  uprobe::Attachment a = attach_add(c);
  struct sigaction sa, old;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_own_trap;
  sa.sa_flags = SA_SIGINFO;
  ASSERT_EQ(sigaction(SIGTRAP, &sa, &old), 0);
  g_trap_runs = 0;
  int runs_blocked = -1, runs_after_wait = -1, runs_before_unblock = -1, runs_after_unblock = -1;
  int waited = 0, waited_code = 0, pending1 = -1, pending2 = -1, code_after_unblock = 0;
  std::uint64_t wrong = 0;
  std::thread t([&] {
    sigset_t trap;
    sigemptyset(&trap);
    sigaddset(&trap, SIGTRAP);
    pthread_sigmask(SIG_BLOCK, &trap, nullptr);
    raise(SIGTRAP);
    for (std::uint64_t i = 0; i < 10; ++i) wrong += lf_add(i, 9) != i + 9;  // probe hits: not the program's traps
    runs_blocked = g_trap_runs.load();
    sigset_t p;
    sigpending(&p);
    pending1 = sigismember(&p, SIGTRAP);
    siginfo_t si;
    waited = sigwaitinfo(&trap, &si);
    waited_code = si.si_code;
    runs_after_wait = g_trap_runs.load();
    sigpending(&p);
    pending2 = sigismember(&p, SIGTRAP);
    raise(SIGTRAP);
    runs_before_unblock = g_trap_runs.load();
    pthread_sigmask(SIG_UNBLOCK, &trap, nullptr);  // delivered before it returns
    runs_after_unblock = g_trap_runs.load();
    code_after_unblock = g_trap_code.load();
  });
  t.join();
  sigaction(SIGTRAP, &old, nullptr);
  EXPECT_EQ(runs_blocked, 0) << "blocked: not delivered";
  EXPECT_EQ(pending1, 1) << "sigpending() shows it";
  EXPECT_EQ(waited, SIGTRAP);
  EXPECT_EQ(waited_code, SI_USER) << "glibc's sigwaitinfo() reports raise()'s SI_TKILL as SI_USER";
  EXPECT_EQ(runs_after_wait, 0);
  EXPECT_EQ(pending2, 0) << "taken";
  EXPECT_EQ(runs_before_unblock, 0);
  EXPECT_EQ(runs_after_unblock, 1);
  EXPECT_EQ(code_after_unblock, SI_TKILL);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(c.hits.load(), 10u);
}

TEST_F(Masks, ForeignInt3WhileSigtrapBlockedKillsAsTheKernelDoes) {
  ChildReport rep;
  bool got = false;
  const int st = in_child(
      [](ChildReport& r) {
        struct sigaction sa;
        std::memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_own_trap;  // a handler: the kernel ignores it for a blocked trap
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGTRAP, &sa, nullptr);
        sigset_t trap;
        sigemptyset(&trap);
        sigaddset(&trap, SIGTRAP);
        pthread_sigmask(SIG_BLOCK, &trap, nullptr);
        r.v[0] = lf_int3();  // dies here
        r.v[1] = 1;
      },
      rep, got);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTRAP) << status_str(st);
  EXPECT_FALSE(got);
}

TEST_F(Masks, ForkChildTakesItsOwnMaskChangesIntoItsView) {
  // This thread's id is cached (it attached probes): a fork child's cache
  // must not make its mask calls look like a vfork child's, which leave the
  // view to the parent.
  Counter c;
  uprobe::Attachment a = attach_add(c);
  ChildReport rep;
  bool got = false;
  const int st = in_child(
      [](ChildReport& r) {
        g_trap_runs = 0;
        struct sigaction sa;
        std::memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_own_trap;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGTRAP, &sa, nullptr);
        // Forked with the view clear (libuprobe's fork handlers block every
        // signal around the fork and restore): a foreign int3 reaches the
        // handler.
        r.v[2] = lf_int3();
        r.v[3] = static_cast<std::uint64_t>(g_trap_runs.load());
        g_trap_runs = 0;
        sigset_t trap;
        sigemptyset(&trap);
        sigaddset(&trap, SIGTRAP);
        pthread_sigmask(SIG_BLOCK, &trap, nullptr);
        const pid_t pid = ::fork();
        if (pid == 0) {  // the grandchild: unblocks, then a foreign int3 reaches its handler
          pthread_sigmask(SIG_UNBLOCK, &trap, nullptr);
          const bool ok = lf_int3() == 0x77 && g_trap_runs.load() == 1 && lf_add(1, 1) == 2;
          ::_exit(ok ? 0 : 1);
        }
        r.v[0] = static_cast<std::uint64_t>(wait_child(pid, 60));
        sigset_t m;
        pthread_sigmask(SIG_BLOCK, nullptr, &m);
        r.v[1] = sigismember(&m, SIGTRAP);  // this process's view: still blocked
      },
      rep, got);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st);
  ASSERT_TRUE(got);
  EXPECT_TRUE(WIFEXITED(rep.v[0]) && WEXITSTATUS(rep.v[0]) == 0) << status_str(static_cast<int>(rep.v[0]));
  EXPECT_EQ(rep.v[1], 1u);
  EXPECT_EQ(rep.v[2], 0x77u);
  EXPECT_EQ(rep.v[3], 1u) << "the program's handler ran for the foreign int3";
}

// ------------------------------------------------- glibc's own windows ----

TEST_F(Masks, ProbeInfoNamesWhereGlibcBlocksEverySignal) {
  void* const libc = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  struct {
    const char* name;
    const char* where;
  } const cases[] = {
      // memcpy: the implementation glibc selected for this CPU (an IFUNC), an
      // int3 site (no symbol sizes it), run by posix_spawnp's child.
      {"memcpy", "posix_spawn()'s child before execve, with every handler reset to SIG_DFL"},
      {"free", "thread exit"},
      {"__lll_lock_wait_private",
       "pthread_create() in the creating thread; a new thread's start; thread exit; pthread_kill()/pthread_cancel() "
       "of another thread"},
      {"alarm", "lckpwdf()"},
      {"strverscmp", ""},
  };
  for (const auto& k : cases) {
    void* f = ::dlsym(libc, k.name);
    ASSERT_NE(f, nullptr) << k.name;
    Counter c;
    uprobe::Attachment a(f, c);
    EXPECT_EQ(uprobe::probe_info(a.probe()).signals_blocked, k.where) << k.name;
  }
  ::dlclose(libc);
  Counter c;
  uprobe::Attachment a = attach_add(c);
  EXPECT_EQ(uprobe::probe_info(a.probe()).signals_blocked, "");
}

}  // namespace
