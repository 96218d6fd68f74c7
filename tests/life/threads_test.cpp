// SPDX-License-Identifier: MIT
// Threads and attach: threads created before the attach and threads created
// after it, each counting its own calls, with exact hit counts for the
// attached window; a thread leaving through pthread_cancel (deferred, at a
// cancellation point; and asynchronous, in a busy loop) from inside a
// function whose return probe is armed: the process keeps working, the
// canceled thread's cleanup handlers and its caller's destructors run (the
// forced unwind goes past the hijacked return address), its return instance
// is dropped (Stats), no instance leaks, other threads' probes stay right.
// The same for pthread_exit() inside the function. A return probe on
// glibc's own thread-exit path (__nptl_deallocate_tsd, which runs the
// thread-exit hook) returns. Int3 and optimized.

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "life_common.hpp"
#include "uprobe/symbols.hpp"

using namespace lifetest;

namespace {

class Threads : public ::testing::TestWithParam<Kind> {
 protected:
  ConfigGuard guard;
  void SetUp() override { use_kind(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Kinds, Threads, ::testing::Values(Kind::int3, Kind::optimized),
                         [](const auto& info) { return std::string(kind_name(info.param)); });

/// A reusable barrier for `n` threads (std::barrier needs C++20 <barrier>;
/// pthread_barrier is simplest here).
struct Barrier {
  pthread_barrier_t b;
  explicit Barrier(unsigned n) { pthread_barrier_init(&b, nullptr, n); }
  ~Barrier() { pthread_barrier_destroy(&b); }
  void wait() { pthread_barrier_wait(&b); }
};

TEST_P(Threads, CreatedBeforeAndAfterAttach) {
  constexpr int kEarly = 3, kLate = 3, kCalls = 1000;
  Session s;
  s.adds = true;
  // Phases (the main thread takes part in every barrier):
  // 1. early threads call kCalls times unprobed; 2. main attaches;
  // 3. early threads call kCalls times probed, late threads are created and do
  // the same; 4. main detaches; 5. everyone calls kCalls times unprobed.
  Barrier b1(kEarly + 1), b2(kEarly + kLate + 1), b3(kEarly + kLate + 1);
  std::atomic<std::uint64_t> wrong{0};
  auto body = [&](std::uint64_t id, bool early) {
    if (early) {
      for (std::uint64_t i = 0; i < kCalls; ++i) wrong += lf_add(i, id) != i + id;
      b1.wait();
    }
    b2.wait();
    for (std::uint64_t i = 0; i < kCalls; ++i) wrong += lf_add(i, id) != i + id;
    if (uprobe::return_stack_depth() != 0) wrong += 1000000;
    b3.wait();
    b3.wait();  // main detached
    for (std::uint64_t i = 0; i < kCalls; ++i) wrong += lf_add(i, id) != i + id;
  };
  std::vector<std::thread> ts;
  for (int i = 0; i < kEarly; ++i) ts.emplace_back(body, i + 1, true);
  b1.wait();
  const uprobe::Stats s0 = uprobe::stats();
  uprobe::Attachment a(vaddr(lf_add), s);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, kind_mode(GetParam()));
  for (int i = 0; i < kLate; ++i) ts.emplace_back(body, 100 + i, false);
  b2.wait();
  b3.wait();
  a.detach();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  b3.wait();
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(s.entries.load(), std::uint64_t(kEarly + kLate) * kCalls);
  EXPECT_EQ(s.rets.load(), std::uint64_t(kEarly + kLate) * kCalls);
  EXPECT_EQ(s.bad.load(), 0u);
  EXPECT_EQ(d.hits, std::uint64_t(kEarly + kLate) * kCalls) << stats_str(d);
  EXPECT_EQ(d.optimized, GetParam() == Kind::optimized ? d.hits : 0u) << stats_str(d);
  EXPECT_EQ(d.return_hits, std::uint64_t(kEarly + kLate) * kCalls) << stats_str(d);
  EXPECT_EQ(d.return_misses + d.return_dropped, 0u) << stats_str(d);
}

// A thread's statistics block goes back to the pool at its exit, its counts
// kept: past the pool's 4096 threads in a process's life, threads running at
// once still count in blocks of their own (they shared one overflow block,
// whose plain increments lost counts to each other: with 4 threads hitting
// an optimized probe 200,000 times each, stats() said 812,326 hits of 812,600
// in one run, exact in another).
TEST_P(Threads, CountsStayExactPastThePoolsThreads) {
  constexpr int kShortLived = 4200, kShortCalls = 3, kBusy = 4;
  const std::uint64_t busy_calls = GetParam() == Kind::optimized ? 200000 : 5000;
  Session s;
  s.adds = true;
  uprobe::Attachment a(vaddr(lf_add), s);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, kind_mode(GetParam()));
  const uprobe::Stats s0 = uprobe::stats();
  std::atomic<std::uint64_t> wrong{0};
  for (int t = 0; t < kShortLived; ++t)  // one at a time: each claims a block and exits
    std::thread([&, t] {
      for (std::uint64_t i = 0; i < kShortCalls; ++i) wrong += lf_add(i, t) != i + t;
    }).join();
  const uprobe::Stats d1 = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(d1.hits, std::uint64_t(kShortLived) * kShortCalls) << stats_str(d1);
  EXPECT_EQ(d1.return_hits, std::uint64_t(kShortLived) * kShortCalls) << stats_str(d1);
  Barrier start(kBusy);
  std::vector<std::thread> busy;
  for (int t = 0; t < kBusy; ++t)
    busy.emplace_back([&, t] {
      start.wait();
      for (std::uint64_t i = 0; i < busy_calls; ++i) wrong += lf_add(i, t) != i + t;
    });
  for (auto& t : busy) t.join();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  const std::uint64_t calls = std::uint64_t(kShortLived) * kShortCalls + kBusy * busy_calls;
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(s.entries.load(), calls);
  EXPECT_EQ(s.rets.load(), calls);
  EXPECT_EQ(s.bad.load(), 0u);
  EXPECT_EQ(d.hits, calls) << stats_str(d);
  EXPECT_EQ(d.optimized, GetParam() == Kind::optimized ? calls : 0u) << stats_str(d);
  EXPECT_EQ(d.return_hits, calls) << stats_str(d);
  EXPECT_EQ(d.return_misses + d.return_dropped + d.recursion_misses, 0u) << stats_str(d);
}

// Hits in a thread's exit path after libuprobe's exit hook gave its
// statistics block back (a key created later: glibc runs its destructor
// after libuprobe's) count too, and take no block that would stay taken.
pthread_key_t g_late_key;
void late_key_destructor(void* v) {
  auto* wrong = static_cast<std::atomic<std::uint64_t>*>(v);
  for (std::uint64_t i = 0; i < 3; ++i) *wrong += lf_add(i, 7) != i + 7;
}
TEST_P(Threads, HitsInALaterKeysDestructorAreCounted) {
  constexpr int kThreads = 300;
  ASSERT_EQ(pthread_key_create(&g_late_key, late_key_destructor), 0);
  Session s;
  s.adds = true;
  uprobe::Attachment a(vaddr(lf_add), s);
  const uprobe::Stats s0 = uprobe::stats();
  std::atomic<std::uint64_t> wrong{0};
  for (int t = 0; t < kThreads; ++t)
    std::thread([&] {
      for (std::uint64_t i = 0; i < 2; ++i) wrong += lf_add(i, 1) != i + 1;
      pthread_setspecific(g_late_key, &wrong);
    }).join();
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  pthread_key_delete(g_late_key);
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(s.entries.load(), kThreads * 5u);
  EXPECT_EQ(s.rets.load(), kThreads * 5u);
  EXPECT_EQ(s.bad.load(), 0u);
  EXPECT_EQ(d.hits, kThreads * 5u) << stats_str(d);
  EXPECT_EQ(d.return_hits, kThreads * 5u) << stats_str(d);
  EXPECT_EQ(d.return_misses + d.recursion_misses, 0u) << stats_str(d);
}

// -------------------------------------------------------- pthread_cancel ----

struct CancelCtx {
  int fd = -1;                    // deferred: a pipe nobody writes
  std::atomic<int> inside{0};     // the thread reached the body
  std::atomic<int> cleanups{0};   // cleanup handlers that ran
  std::atomic<int> dtors{0};      // destructors of the caller's frame that ran
  std::atomic<int> after{0};      // code after the body (must not run)
  int mode = 0;  // 0: deferred cancel, 1: asynchronous cancel, 2: pthread_exit
};
thread_local CancelCtx* t_cancel = nullptr;

long cancel_body(long a) {
  CancelCtx* c = t_cancel;
  if (c->mode == 2) {
    c->inside.fetch_add(1);
    pthread_exit(nullptr);
  }
  // No object of this frame lives on the stack (spin, ch): ASan would
  // surround it with poisoned redzones, which the forced unwind leaves
  // behind, and gcc 12's libasan then reports its own sigaltstack() call in
  // __asan_handle_no_return (the caller's cleanup, before _Unwind_Resume) as a
  // write to them (CHECK kCurrentStackFrameMagic), with or without libuprobe.
  static thread_local volatile long spin;
  static thread_local char ch;
  if (c->mode == 1) {
    pthread_setcanceltype(PTHREAD_CANCEL_ASYNCHRONOUS, nullptr);
    c->inside.fetch_add(1);
    spin = 0;
    for (;;) spin = spin + 1;
  }
  c->inside.fetch_add(1);
  ssize_t n = ::read(c->fd, &ch, 1);  // a cancellation point; blocks
  return a + n;
}

void cleanup(void* p) { static_cast<CancelCtx*>(p)->cleanups.fetch_add(1); }

struct Dtor {
  CancelCtx* c;
  ~Dtor() { c->dtors.fetch_add(1); }
};

__attribute__((noinline)) void cancel_caller(CancelCtx* c) {
  Dtor d{c};
  pthread_cleanup_push(cleanup, c);
  g_outer_body = cancel_body;
  long r = lf_outer(1);  // return probe armed; canceled inside
  c->after.fetch_add(static_cast<int>(r) + 1);
  pthread_cleanup_pop(0);
}

void* cancel_thread(void* p) {
  auto* c = static_cast<CancelCtx*>(p);
  t_cancel = c;
  cancel_caller(c);
  return nullptr;
}

void check_cancel(Kind kind, int mode) {
  Session outer, add;
  add.adds = true;
  uprobe::Attachment ao(vaddr(lf_outer), outer), aa(vaddr(lf_add), add);
  ASSERT_EQ(uprobe::probe_info(ao.probe()).mode, kind_mode(kind));
  int pfd[2];
  ASSERT_EQ(::pipe(pfd), 0);
  const uprobe::Stats s0 = uprobe::stats();
  constexpr int kThreads = 50;
  int canceled = 0, inside = 0, cleanups = 0, dtors = 0, after = 0;
  for (int i = 0; i < kThreads; ++i) {
    CancelCtx c;
    c.fd = pfd[0];
    c.mode = mode;
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, nullptr, cancel_thread, &c), 0);
    if (mode != 2) {
      while (c.inside.load() == 0) std::this_thread::yield();
      if (mode == 0) ::usleep(200);  // let it block in read()
      ASSERT_EQ(pthread_cancel(t), 0);
    }
    void* res = reinterpret_cast<void*>(1);
    ASSERT_EQ(pthread_join(t, &res), 0);
    canceled += res == (mode == 2 ? nullptr : PTHREAD_CANCELED);
    inside += c.inside.load();
    cleanups += c.cleanups.load();
    dtors += c.dtors.load();
    after += c.after.load();
    // Another thread's probes are fine meanwhile.
    std::thread other([] {
      for (std::uint64_t k = 0; k < 10; ++k) lf_add(k, 1);
    });
    other.join();
  }
  g_outer_body = nullptr;
  ::close(pfd[0]);
  ::close(pfd[1]);
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(canceled, kThreads);
  EXPECT_EQ(inside, kThreads);
  EXPECT_EQ(after, 0) << "code after the canceled call ran";
  EXPECT_EQ(cleanups, kThreads) << "pthread_cleanup_push handlers in the probed function's caller";
  EXPECT_EQ(dtors, kThreads) << "destructors in the probed function's caller (forced unwind past the hijacked "
                                "return address)";
  EXPECT_EQ(outer.entries.load(), std::uint64_t(kThreads));
  EXPECT_EQ(outer.rets.load(), 0u) << "a canceled (exited) invocation does not return";
  EXPECT_EQ(d.return_dropped, std::uint64_t(kThreads)) << "each canceled thread's pending instance: " << stats_str(d);
  EXPECT_EQ(d.return_misses, 0u) << stats_str(d);
  EXPECT_EQ(add.entries.load(), 10u * kThreads);
  EXPECT_EQ(add.rets.load(), 10u * kThreads);
  EXPECT_EQ(add.bad.load(), 0u);
  // This thread is unaffected and the pool did not leak: many more returns.
  for (std::uint64_t k = 0; k < 5000; ++k) ASSERT_EQ(lf_outer(static_cast<long>(k)), static_cast<long>(k) + 1000);
  EXPECT_EQ(outer.rets.load(), 5000u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

TEST_P(Threads, CancelDeferredInsideReturnProbedFunction) { check_cancel(GetParam(), 0); }
TEST_P(Threads, CancelAsynchronousInsideReturnProbedFunction) { check_cancel(GetParam(), 1); }
TEST_P(Threads, PthreadExitInsideReturnProbedFunction) { check_cancel(GetParam(), 2); }

/// glibc's __nptl_deallocate_tsd in `libc` (named with libc6-dbg), or a
/// Symbol with an empty name when the debug file is not there.
uprobe::Symbol deallocate_tsd(const std::string& libc) {
  try {
    return uprobe::find_symbol(libc, "__nptl_deallocate_tsd");
  } catch (const uprobe::Error&) {
    return {};
  }
}

/// A probe on libc's pthread_create() sees the program's start routine and
/// argument, as the kernel's uprobes do, though libuprobe's interposer hands
/// libc its own (prepared_start and a hand-off: bpftrace's threadsnoop.bt
/// printed "uprobe::detail::(anonymous namespace)::prepared_start(void*)"
/// for `usym(arg2)`); a consumer that writes them changes what the new
/// thread runs, with what argument; the registers libc gets are the
/// interposer's again (the thread still starts prepared: it counts its hit).
void* created_a(void* arg) { return static_cast<char*>(arg) + 1; }
void* created_b(void* arg) { return static_cast<char*>(arg) + 2; }

struct CreateSpy : uprobe::Consumer {
  pid_t tid = ::gettid();
  std::atomic<std::uint64_t> start{0}, arg{0}, hits{0};
  std::uint64_t new_start = 0, new_arg = 0;  // written into the registers when set
  uprobe::Action handler(uprobe::Regs& r) override {
    if (::gettid() != tid) return uprobe::Action::keep;
    hits.fetch_add(1);
    start.store(r.arg(2));
    arg.store(r.arg(3));
    if (new_start) r.rdx = new_start;
    if (new_arg) r.rcx = new_arg;
    return uprobe::Action::keep;
  }
};

TEST_P(Threads, ProbeOnPthreadCreateSeesTheProgramsStartAndArgument) {
  const std::string libc = uprobe::resolve_library("libc.so.6");
  CreateSpy spy;
  Counter leaf;
  uprobe::Attachment a(libc, uprobe::find_symbol(libc, "pthread_create").offset, spy);
  uprobe::Attachment b(vaddr(lf_add), leaf);
  char token[8] = {};
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, nullptr, created_a, token), 0);
  void* ret = nullptr;
  pthread_join(t, &ret);
  EXPECT_EQ(spy.hits.load(), 1u);
  EXPECT_EQ(spy.start.load(), reinterpret_cast<std::uint64_t>(&created_a));
  EXPECT_EQ(spy.arg.load(), reinterpret_cast<std::uint64_t>(token));
  EXPECT_EQ(ret, token + 1);
  // Rewritten by the consumer: created_b(token + 1) runs, prepared (its hit counts).
  spy.new_start = reinterpret_cast<std::uint64_t>(&created_b);
  spy.new_arg = reinterpret_cast<std::uint64_t>(token + 1);
  ASSERT_EQ(pthread_create(
                &t, nullptr, [](void* p) -> void* { return created_a(reinterpret_cast<void*>(lf_add(reinterpret_cast<std::uint64_t>(p), 0))); },
                token),
            0);
  pthread_join(t, &ret);
  EXPECT_EQ(spy.hits.load(), 2u);
  EXPECT_EQ(spy.arg.load(), reinterpret_cast<std::uint64_t>(token));
  EXPECT_EQ(ret, token + 3);
  // And a thread whose start routine calls the probed function counts its hit.
  spy.new_start = spy.new_arg = 0;
  ASSERT_EQ(pthread_create(
                &t, nullptr, [](void* p) -> void* { return reinterpret_cast<void*>(lf_add(reinterpret_cast<std::uint64_t>(p), 5)); },
                token),
            0);
  pthread_join(t, &ret);
  EXPECT_EQ(ret, token + 5);
  EXPECT_EQ(leaf.hits.load(), 1u);
}

/// libuprobe's own libc calls on the program's behalf are not the program's
/// (RuntimeCallScope): pthread_create()'s interposer asks the attributes
/// for the new thread's stack (pthread_attr_getstacksize,
/// pthread_getattr_default_np: 7 calls more here), its dlopen() asks whether a name is loaded
/// (a second dlopen, RTLD_NOLOAD) and gives that reference back (dlclose):
/// probes there see only the program's own calls, as the kernel's would.
TEST_P(Threads, ProbesSeeOnlyTheProgramsOwnCallsNotTheInterposersOnes) {
  const std::string libc = uprobe::resolve_library("libc.so.6");
  Counter create, stacksize, defaults, opens, closes;
  uprobe::Attachment a(libc, uprobe::find_symbol(libc, "pthread_create").offset, create);
  uprobe::Attachment b(libc, uprobe::find_symbol(libc, "pthread_attr_getstacksize").offset, stacksize);
  uprobe::Attachment c(libc, uprobe::find_symbol(libc, "pthread_getattr_default_np").offset, defaults);
  uprobe::Attachment d(libc, uprobe::find_symbol(libc, "dlopen").offset, opens);
  uprobe::Attachment e(libc, uprobe::find_symbol(libc, "dlclose").offset, closes);
  char token[8] = {};
  for (int i = 0; i < 3; ++i) {
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, nullptr, created_a, token), 0);
    pthread_join(t, nullptr);
  }
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 1 << 20), 0);
  std::size_t size = 0;
  ASSERT_EQ(pthread_attr_getstacksize(&attr, &size), 0);  // the program's own: 1 hit
  EXPECT_EQ(size, 1u << 20);
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, &attr, created_a, token), 0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
  EXPECT_EQ(create.hits.load(), 4u);
  EXPECT_EQ(stacksize.hits.load(), 1u);
  // glibc's pthread_create() asks for the defaults itself when it has no
  // attributes: 3, as bpftrace counts for this sequence (its interposer's
  // own queries made it 6).
  EXPECT_EQ(defaults.hits.load(), 3u);
  // libc.so.6 by its soname, loaded already: the program's two dlopen()s and
  // two dlclose()s, no more.
  for (int i = 0; i < 2; ++i) {
    void* h = dlopen("libc.so.6", RTLD_NOW);
    ASSERT_NE(h, nullptr) << dlerror();
    EXPECT_EQ(dlclose(h), 0);
  }
  EXPECT_EQ(opens.hits.load(), 2u);
  EXPECT_EQ(closes.hits.load(), 2u);
}

/// A return probe on what runs a thread's exit: glibc's start_thread calls
/// __nptl_deallocate_tsd (named with libc6-dbg), which runs the pthread key
/// destructors, libuprobe's thread-exit hook among them. The hook dropped
/// every pending return instance of the thread, __nptl_deallocate_tsd's own
/// too, whose frame is still live: its return then found none and aborted
/// (uretprobe:libc:* killed every program whose threads ended). Its frames
/// return as they should now: each thread's one entry and one return, in a
/// child process (a regression aborts it).
TEST_P(Threads, ReturnProbeOnThreadExitPathReturns) {
  const std::string libc = uprobe::resolve_library("libc.so.6");
  const uprobe::Symbol sym = deallocate_tsd(libc);
  if (sym.name.empty()) GTEST_SKIP() << "no __nptl_deallocate_tsd symbol (libc6-dbg not installed?)";
  constexpr int kThreads = 4;
  ChildReport rep;
  bool got = false;
  const int st = in_child(
      [&](ChildReport& r) {
        Session s;
        uprobe::Attachment a(libc, sym.offset, s);
        std::atomic<std::uint64_t> wrong{0};
        for (int round = 0; round < 2; ++round) {
          std::vector<std::thread> ts;
          for (std::uint64_t i = 0; i < kThreads; ++i)
            ts.emplace_back([&wrong, i] { wrong += lf_add(i, 1) != i + 1; });
          for (auto& t : ts) t.join();
        }
        r.v[2] = wrong.load();
        r.v[0] = s.entries.load();
        r.v[1] = s.rets.load();
        r.v[3] = s.bad.load();
        r.v[4] = uprobe::return_stack_depth();
      },
      rep, got);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st) << " " << rep.msg;
  ASSERT_TRUE(got);
  EXPECT_EQ(rep.v[0], 2u * kThreads);
  EXPECT_EQ(rep.v[1], 2u * kThreads);
  EXPECT_EQ(rep.v[2], 0u);
  EXPECT_EQ(rep.v[3], 0u);
  EXPECT_EQ(rep.v[4], 0u);
}

/// The return handler of __nptl_deallocate_tsd runs after liburcu-bp's own
/// thread-exit destructor has unregistered the thread as a reader (it ran
/// inside that function). Unregistering the probe while such a handler runs
/// must wait for it, as for any hit: the consumer set it reads is freed after
/// the unregister's grace period. The grace period did not wait for the
/// unregistered thread (a use-after-free TSan reported). The exiting thread's
/// handler holds on for 200 ms after the main thread began the unregister;
/// the unregister returns only after the handler finished.
struct ExitPathHolder : uprobe::Consumer {
  ExitPathHolder() : uprobe::Consumer(uprobe::Callbacks::ret) {}
  pid_t main_tid = ::gettid();
  std::atomic<int> taken{0}, in_handler{0}, unregistering{0}, done{0};
  void ret_handler(uprobe::Regs&, std::uint64_t) override {
    if (::gettid() == main_tid || taken.exchange(1) != 0) return;
    in_handler.store(1);
    for (int i = 0; i < 5000 && unregistering.load() == 0; ++i) ::usleep(1000);
    ::usleep(200 * 1000);
    done.store(1);
  }
};

TEST_P(Threads, UnregisterWaitsForAReturnHandlerOnTheThreadExitPath) {
  const std::string libc = uprobe::resolve_library("libc.so.6");
  const uprobe::Symbol sym = deallocate_tsd(libc);
  if (sym.name.empty()) GTEST_SKIP() << "no __nptl_deallocate_tsd symbol (libc6-dbg not installed?)";
  ChildReport rep;
  bool got = false;
  const int st = in_child(
      [&](ChildReport& r) {
        ExitPathHolder h;
        uprobe::Attachment a(libc, sym.offset, h);
        std::thread t([] { (void)lf_add(1, 2); });
        for (int i = 0; i < 5000 && h.in_handler.load() == 0; ++i) ::usleep(1000);
        r.v[0] = static_cast<std::uint64_t>(h.in_handler.load());
        h.unregistering.store(1);
        a.detach();
        r.v[1] = static_cast<std::uint64_t>(h.done.load());
        t.join();
        r.v[2] = static_cast<std::uint64_t>(h.done.load());
      },
      rep, got);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st) << " " << rep.msg;
  ASSERT_TRUE(got);
  EXPECT_EQ(rep.v[0], 1u) << "the exiting thread's return handler ran";
  EXPECT_EQ(rep.v[1], 1u) << "unregister returned while a return handler on the thread-exit path still ran";
  EXPECT_EQ(rep.v[2], 1u);
}

/// Counts the hits whose first argument is one mutex.
struct MutexArgCounter : uprobe::Consumer {
  std::atomic<std::uint64_t> mine{0};
  const void* mutex;
  explicit MutexArgCounter(const void* m) : mutex(m) {}
  uprobe::Action handler(uprobe::Regs& regs) override {
    if (regs.rdi == reinterpret_cast<std::uint64_t>(mutex)) mine.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

/// A probe on what liburcu-bp's reader registration runs (libc's internal
/// __pthread_mutex_unlock_usercnt, under pthread_mutex_unlock; named with
/// libc6-dbg): a new thread's first hit registers it as a reader, and the
/// hit inside that registration must not register again. It waited forever
/// for the registry mutex its own thread held (uprobe:libc:* hung xz -T2).
/// The new thread's own unlocks are counted exactly.
TEST(Threads, ProbeOnWhatReaderRegistrationRunsDoesNotHang) {
  const std::string libc = uprobe::resolve_library("libc.so.6");
  uprobe::Symbol sym;
  try {
    sym = uprobe::find_symbol(libc, "__pthread_mutex_unlock_usercnt");
  } catch (const uprobe::Error& e) {
    GTEST_SKIP() << "no __pthread_mutex_unlock_usercnt symbol (libc6-dbg not installed?): " << e.what();
  }
  for (const bool optimize : {true, false}) {
    SCOPED_TRACE(optimize ? "optimized" : "int3");
    ConfigGuard guard;
    uprobe::Config c = uprobe::configuration();
    c.optimize = optimize;
    uprobe::configure(c);
    static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    MutexArgCounter counter(&m);
    uprobe::Attachment a(libc, sym.offset, counter);
    constexpr int kUnlocks = 100;
    // A new thread each round: its first hit is its reader registration.
    std::future<void> done = std::async(std::launch::async, [] {
      for (int i = 0; i < kUnlocks; ++i) {
        pthread_mutex_lock(&m);
        pthread_mutex_unlock(&m);
      }
    });
    ASSERT_EQ(done.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "the new thread hangs";
    done.get();
    EXPECT_EQ(counter.mine.load(), static_cast<std::uint64_t>(kUnlocks));
  }
}

}  // namespace
