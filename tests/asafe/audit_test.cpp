// SPDX-License-Identifier: MIT
// The async-signal-safety audit (issue 7): libuprobe's hot paths -- the
// SIGTRAP handler (int3 hits, emulated and out of line), an optimized site's
// stub entry, the return trampoline -- must not allocate or take a lock, since
// they run in whatever state the interrupted code was in (inside malloc, or
// holding the lock). interpose.c replaces malloc & co. and the pthread lock
// functions in this executable and records every call made while the calling
// thread is on a hot path (libuprobe's HotPathScope) but not inside one of the
// consumer callbacks below (user code may allocate). Every test drives one
// path with exact hit counts and expects no recorded call; the Control tests
// are the audit's own check: a consumer that allocates without marking itself
// must be caught on every path, call for call.
//
// The runtime is linked in statically (uprobe_static) so that the test can read
// the runtime's per-thread state; every test is one process under ctest.

#include <dlfcn.h>
#include <link.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "audit.h"
#include "thread_state.hpp"
#include "uprobe/config.hpp"
#include "uprobe/uprobe.hpp"

extern "C" {
std::uint64_t asafe_emulated(std::uint64_t, std::uint64_t);
std::uint64_t asafe_xol(std::uint64_t, std::uint64_t);
std::uint64_t asafe_nop5(std::uint64_t, std::uint64_t);
std::uint64_t asafe_remove_int3(std::uint64_t, std::uint64_t);
std::uint64_t asafe_remove_nop5(std::uint64_t, std::uint64_t);
void* __libc_malloc(std::size_t);
void __libc_free(void*);

int asafe_on_hot_path(void) { return uprobe::detail::t_state.hot > 0; }
}

#ifdef ASAFE_KEYS_BEFORE_START
// A program that made many pthread keys before libuprobe started (glibc keeps
// the values of keys 0..31 in the thread descriptor; a key beyond that needs
// a second-level block, which pthread_setspecific() callocs on a thread's
// first use of the block).
__attribute__((constructor)) static void asafe_make_keys() {
  for (int i = 0; i < ASAFE_KEYS_BEFORE_START; ++i) {
    pthread_key_t k;
    if (pthread_key_create(&k, nullptr) != 0) std::abort();
  }
}
#endif

// operator new/delete: recorded as themselves (they do not go through the
// malloc above, so a `new` on a hot path is one ASAFE_NEW).
#define ASAFE_CALLER __builtin_extract_return_addr(__builtin_return_address(0))
void* operator new(std::size_t n) {
  asafe_note(ASAFE_NEW, ASAFE_CALLER);
  if (void* p = __libc_malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  asafe_note(ASAFE_NEW, ASAFE_CALLER);
  if (void* p = __libc_malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  asafe_note(ASAFE_DELETE, ASAFE_CALLER);
  __libc_free(p);
}
void operator delete[](void* p) noexcept {
  asafe_note(ASAFE_DELETE, ASAFE_CALLER);
  __libc_free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  asafe_note(ASAFE_DELETE, ASAFE_CALLER);
  __libc_free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  asafe_note(ASAFE_DELETE, ASAFE_CALLER);
  __libc_free(p);
}

namespace {

using uprobe::Action;
using uprobe::Callbacks;

constexpr const char* kFnNames[ASAFE_FN_COUNT] = {"malloc",   "calloc", "realloc",           "free",
                                                  "memalign", "new",    "delete",            "pthread_mutex_lock",
                                                  "pthread_mutex_trylock", "pthread_rwlock_*lock"};

/// liburcu-bp's executable segment, for the interposer's attribution.
int find_urcu(dl_phdr_info* info, std::size_t, void*) {
  if (!info->dlpi_name || !std::strstr(info->dlpi_name, "liburcu-bp")) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    asafe_urcu_lo = info->dlpi_addr + ph.p_vaddr;
    asafe_urcu_hi = asafe_urcu_lo + ph.p_memsz;
    return 1;
  }
  return 0;
}

void reset_record() {
  if (!asafe_urcu_hi) {
    ASSERT_EQ(dl_iterate_phdr(find_urcu, nullptr), 1) << "liburcu-bp is not loaded";
  }
  for (int i = 0; i < ASAFE_FN_COUNT; ++i) {
    __atomic_store_n(&asafe_record.calls[i], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&asafe_record.first_caller[i], nullptr, __ATOMIC_RELAXED);
  }
  __atomic_store_n(&asafe_record.urcu_registration_locks, 0, __ATOMIC_RELAXED);
}

std::uint64_t calls(asafe_fn fn) { return __atomic_load_n(&asafe_record.calls[fn], __ATOMIC_RELAXED); }

/// "" when nothing was recorded, else each function with its count and the
/// symbol of its first caller. liburcu-bp's reader registration is a
/// violation too unless the test made fresh threads hit (and checks them).
std::string violations(bool fresh_threads = false) {
  std::string out;
  const std::uint64_t urcu = __atomic_load_n(&asafe_record.urcu_registration_locks, __ATOMIC_RELAXED);
  if (urcu && !fresh_threads) out += "liburcu-bp registration locks x" + std::to_string(urcu) + " ";
  for (int i = 0; i < ASAFE_FN_COUNT; ++i) {
    std::uint64_t n = calls(static_cast<asafe_fn>(i));
    if (!n) continue;
    void* caller = __atomic_load_n(&asafe_record.first_caller[i], __ATOMIC_RELAXED);
    Dl_info di{};
    std::string where = "?";
    if (caller && dladdr(caller, &di) && di.dli_sname)
      where = std::string(di.dli_sname) + "+" +
              std::to_string(static_cast<char*>(caller) - static_cast<char*>(di.dli_saddr));
    else if (caller && di.dli_fname)  // a hidden symbol: addr2line -f -C -e FILE OFFSET
      where = std::string(di.dli_fname) + "+0x" +
              [](std::uintptr_t v) {
                char b[32];
                std::snprintf(b, sizeof b, "%lx", static_cast<unsigned long>(v));
                return std::string(b);
              }(reinterpret_cast<std::uintptr_t>(caller) - reinterpret_cast<std::uintptr_t>(di.dli_fbase));
    out += std::string(kFnNames[i]) + " x" + std::to_string(n) + " (first from " + where + ") ";
  }
  return out;
}

/// Marks a consumer callback: calls inside are the user's.
struct InConsumer {
  explicit InConsumer(bool mark = true) : mark_(mark) {
    if (mark_) ++asafe_in_consumer;
  }
  ~InConsumer() {
    if (mark_) --asafe_in_consumer;
  }
  bool mark_;
};

}  // namespace

void* volatile g_asafe_sink;
pthread_mutex_t g_asafe_user_mutex = PTHREAD_MUTEX_INITIALIZER;

/// What a consumer may do: allocate and lock (not elided: the pointer
/// escapes). Exported (-rdynamic) so that the audit's message names it.
extern "C" __attribute__((noinline)) void asafe_user_work() {
  g_asafe_sink = std::malloc(64);
  std::free(g_asafe_sink);
  pthread_mutex_lock(&g_asafe_user_mutex);
  pthread_mutex_unlock(&g_asafe_user_mutex);
}

namespace {

/// A consumer that allocates and locks in each callback. With `mark` false it
/// does so without saying it is a consumer callback (the audit's control).
struct Audited : uprobe::Consumer {
  explicit Audited(Callbacks cb, bool mark = true) : uprobe::Consumer(cb), mark(mark) {}
  Action handler(uprobe::Regs& regs) override {
    InConsumer in(mark);
    const long n = entries.fetch_add(1) + 1;
    asafe_user_work();
    if (callbacks() == Callbacks::entry_and_ret) {
      uprobe::session_cookie() = regs.rdi * 1000 + 7;
      if (ignore_odd && (regs.rdi & 1)) return Action::ignore;
    }
    return remove_at != 0 && n >= remove_at ? Action::remove : Action::keep;
  }
  void ret_handler(uprobe::Regs& regs, std::uint64_t) override {
    InConsumer in(mark);
    returns.fetch_add(1);
    asafe_user_work();
    if (callbacks() == Callbacks::entry_and_ret && uprobe::session_cookie() != cookie_expect(regs))
      bad_cookies.fetch_add(1);
    ret_sum.fetch_add(regs.rax);
  }
  bool filter(pid_t tid) override {
    InConsumer in(mark);
    asafe_user_work();
    return only_tid == 0 || tid == only_tid;
  }
  /// The session cookie written at entry for this invocation (rdi is gone at
  /// return; the fixtures return a + b with b == 1).
  static std::uint64_t cookie_expect(const uprobe::Regs& regs) { return (regs.rax - 1) * 1000 + 7; }

  bool mark;
  long remove_at = 0;       ///< Action::remove from this entry hit on (1-based); 0 = never
  bool ignore_odd = false;  ///< sessions: Action::ignore for odd first arguments
  pid_t only_tid = 0;       ///< filter: only this thread (0 = all)
  std::atomic<long> entries{0}, returns{0}, bad_cookies{0};
  std::atomic<std::uint64_t> ret_sum{0};
};

using Fn = std::uint64_t (*)(std::uint64_t, std::uint64_t);

/// Calls fn(i, 1) for i in [1, n]; returns the sum of the results.
std::uint64_t call_n(Fn fn, int n) {
  std::uint64_t sum = 0;
  for (int i = 1; i <= n; ++i) sum += fn(static_cast<std::uint64_t>(i), 1);
  return sum;
}

std::uint64_t expected_sum(int n) { return static_cast<std::uint64_t>(n) * (n + 1) / 2 + n; }

struct Path {
  const char* name;
  Fn fn;
  const char* mode;                        // probe_info().mode
  std::uint64_t uprobe::Stats::*counter;  // the stats counter one entry hit on this path bumps
};
const Path kEmulated{"int3, emulated", asafe_emulated, "int3", &uprobe::Stats::emulated};
const Path kXol{"int3, out of line", asafe_xol, "int3", &uprobe::Stats::out_of_line};
const Path kOptimized{"optimized", asafe_nop5, "optimized-nop5", &uprobe::Stats::optimized};
const Path kOptimizedEntry{"optimized entry", asafe_emulated, "optimized-entry", &uprobe::Stats::optimized};

class Asafe : public ::testing::Test {
 protected:
  void SetUp() override {
    uprobe::configure(uprobe::Config{});
    reset_record();
  }
  void TearDown() override { uprobe::configure(uprobe::Config{}); }
};

/// Attaches `c` to path.fn, calls it n times on this thread, detaches; checks
/// the mode, the hits on the path's counter and the results.
/// The int3 paths need optimization off (a function entry is optimized otherwise).
void set_optimize(bool on) {
  uprobe::Config cfg = uprobe::configuration();
  cfg.optimize = on;
  uprobe::configure(cfg);
}

void run_path(const Path& path, Audited& c, int n) {
  SCOPED_TRACE(path.name);
  set_optimize(std::string(path.mode) != "int3");
  uprobe::Uprobe* p = uprobe::register_uprobe(reinterpret_cast<const void*>(path.fn), c);
  EXPECT_EQ(uprobe::probe_info(p).mode, path.mode);
  const uprobe::Stats before = uprobe::stats();
  EXPECT_EQ(call_n(path.fn, n), expected_sum(n));
  const uprobe::Stats after = uprobe::stats();
  uprobe::unregister_uprobe(p, c);
  EXPECT_EQ(after.*path.counter - before.*path.counter, static_cast<std::uint64_t>(n));
  EXPECT_EQ(after.hits - before.hits, static_cast<std::uint64_t>(n));
}

TEST_F(Asafe, Int3EmulatedEntry) {
  Audited c(Callbacks::entry);
  run_path(kEmulated, c, 50);
  EXPECT_EQ(c.entries, 50);
  EXPECT_EQ(violations(), "");
}

TEST_F(Asafe, Int3OutOfLineEntry) {
  Audited c(Callbacks::entry);
  run_path(kXol, c, 50);
  EXPECT_EQ(c.entries, 50);
  EXPECT_EQ(violations(), "");
}

TEST_F(Asafe, OptimizedEntry) {
  Audited c(Callbacks::entry);
  run_path(kOptimized, c, 50);
  EXPECT_EQ(c.entries, 50);
  EXPECT_EQ(violations(), "");
}

TEST_F(Asafe, OptimizedFunctionEntry) {
  Audited c(Callbacks::entry);
  run_path(kOptimizedEntry, c, 50);
  EXPECT_EQ(c.entries, 50);
  EXPECT_EQ(violations(), "");
}

TEST_F(Asafe, ReturnProbeArmAndReturn) {
  for (const Path* path : {&kEmulated, &kXol, &kOptimized, &kOptimizedEntry}) {
    reset_record();
    Audited c(Callbacks::ret);
    const uprobe::Stats before = uprobe::stats();
    run_path(*path, c, 40);
    EXPECT_EQ(uprobe::stats().return_hits - before.return_hits, 40u) << path->name;
    EXPECT_EQ(c.entries, 0) << path->name;
    EXPECT_EQ(c.returns, 40) << path->name;
    EXPECT_EQ(c.ret_sum, expected_sum(40)) << path->name;
    EXPECT_EQ(violations(), "") << path->name;
  }
}

TEST_F(Asafe, SessionWithIgnore) {
  for (const Path* path : {&kEmulated, &kOptimized}) {
    reset_record();
    Audited c(Callbacks::entry_and_ret);
    c.ignore_odd = true;
    run_path(*path, c, 40);
    EXPECT_EQ(c.entries, 40) << path->name;
    EXPECT_EQ(c.returns, 20) << path->name;  // the odd ones said Action::ignore
    EXPECT_EQ(c.bad_cookies, 0) << path->name;
    EXPECT_EQ(violations(), "") << path->name;
  }
}

/// Runs `body` on a thread created by glibc's own pthread_create, not the
/// one libuprobe interposes: a thread libuprobe did not prepare (as one that
/// existed before libuprobe was loaded), whose first hit does the per-thread
/// set-up on the hot path.
template <typename F>
void on_unprepared_thread(F body) {
  using CreateFn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  auto create = reinterpret_cast<CreateFn>(dlvsym(libc, "pthread_create", "GLIBC_2.34"));
  if (!create) create = reinterpret_cast<CreateFn>(dlvsym(libc, "pthread_create", "GLIBC_2.2.5"));
  ASSERT_NE(create, nullptr);
  ASSERT_NE(reinterpret_cast<void*>(create), reinterpret_cast<void*>(&pthread_create)) << "libc's, not libuprobe's";
  pthread_t t;
  ASSERT_EQ(create(
                &t, nullptr,
                [](void* p) -> void* {
                  (*static_cast<F*>(p))();
                  return nullptr;
                },
                &body),
            0);
  ASSERT_EQ(pthread_join(t, nullptr), 0);
  dlclose(libc);
}

TEST_F(Asafe, FilterOnTwoThreads) {
  for (const Path* path : {&kXol, &kOptimized}) {
    reset_record();
    Audited c(Callbacks::entry_and_ret);
    c.only_tid = gettid();
    uprobe::Uprobe* p = uprobe::register_uprobe(reinterpret_cast<const void*>(path->fn), c);
    std::uint64_t other = 0, first_locks = 0, later_locks = 0, prepared_other = 0, prepared_locks = 1;
    on_unprepared_thread([&] {
      other = call_n(path->fn, 1);  // a fresh thread: liburcu-bp registers it on this hit
      first_locks = asafe_thread_urcu_locks;
      other += call_n(path->fn, 29) - (29 + 1);  // i = 1..29 again: drop the sum's overlap below
      later_locks = asafe_thread_urcu_locks - first_locks;
    });
    // A thread from the interposed pthread_create() registered before its
    // code ran: none of its hits takes liburcu-bp's registry lock.
    std::thread t([&] {
      prepared_other = call_n(path->fn, 30);
      prepared_locks = asafe_thread_urcu_locks;
    });
    t.join();
    EXPECT_EQ(prepared_other, expected_sum(30)) << path->name;
    EXPECT_EQ(prepared_locks, 0u) << path->name;
    EXPECT_EQ(call_n(path->fn, 20), expected_sum(20)) << path->name;
    uprobe::unregister_uprobe(p, c);
    EXPECT_EQ(other, 2 + expected_sum(29) - 30) << path->name;
    EXPECT_EQ(c.entries, 20) << path->name;
    EXPECT_EQ(c.returns, 20) << path->name;
    EXPECT_GT(first_locks, 0u) << path->name;
    EXPECT_EQ(later_locks, 0u) << path->name;  // only the first hit
    EXPECT_EQ(violations(/*fresh_threads=*/true), "") << path->name;
  }
}

TEST_F(Asafe, RemoveActionUnappliesOnTheHitPath) {
  struct Case {
    Fn fn;
    const char* mode;
    std::uint8_t first_byte;
  };
  for (const Case& k : {Case{asafe_remove_int3, "int3", 0x55}, Case{asafe_remove_nop5, "optimized-nop5", 0x0f}}) {
    reset_record();
    Audited c(Callbacks::entry);
    c.remove_at = 3;
    set_optimize(std::string(k.mode) != "int3");
    uprobe::Uprobe* p = uprobe::register_uprobe(reinterpret_cast<const void*>(k.fn), c);
    EXPECT_EQ(uprobe::probe_info(p).mode, k.mode);
    std::uint64_t sum = 0;
    for (std::uint64_t i = 1; i <= 10; ++i) sum += k.fn(i, 0);
    EXPECT_EQ(sum, 65u) << k.mode;
    EXPECT_EQ(c.entries, 3) << k.mode;  // the breakpoint left with the third hit
    EXPECT_EQ(*reinterpret_cast<const volatile std::uint8_t*>(k.fn), k.first_byte) << k.mode;
    uprobe::unregister_uprobe(p, c);
    EXPECT_EQ(violations(), "") << k.mode;
  }
}

/// A thread's first hit does the per-thread set-up on the hot path (RCU reader
/// registration, statistics block, gettid) when libuprobe did not prepare the
/// thread: still no allocation and no lock outside the consumer. A thread from
/// the interposed pthread_create() needs none of it (round 1).
TEST_F(Asafe, FirstHitsOnFreshThreads) {
  Audited entry(Callbacks::entry), ret(Callbacks::ret), session(Callbacks::entry_and_ret);
  uprobe::Uprobe* p1 = uprobe::register_uprobe(reinterpret_cast<const void*>(&asafe_emulated), entry);
  uprobe::Uprobe* p2 = uprobe::register_uprobe(reinterpret_cast<const void*>(&asafe_xol), ret);
  uprobe::Uprobe* p3 = uprobe::register_uprobe(reinterpret_cast<const void*>(&asafe_nop5), session);
  constexpr int kThreads = 4;
  std::vector<std::uint64_t> sums(kThreads * 3);
  std::atomic<int> later_locks{0}, prepared_locks{0};
  for (int round = 0; round < 2; ++round) {
    const bool prepared = round == 1;
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
      auto body = [&sums, &later_locks, &prepared_locks, prepared, t] {
        // Each thread's first probe hit is on a different path.
        const Fn order[3][3] = {{asafe_emulated, asafe_xol, asafe_nop5},
                                {asafe_xol, asafe_nop5, asafe_emulated},
                                {asafe_nop5, asafe_emulated, asafe_xol}};
        std::uint64_t first_locks = 0;
        for (int k = 0; k < 3; ++k) {
          sums[t * 3 + k] = call_n(order[t % 3][k], 10);
          if (k == 0) first_locks = asafe_thread_urcu_locks;
        }
        if (prepared) {
          if (asafe_thread_urcu_locks != 0) prepared_locks.fetch_add(1);
        } else if (first_locks == 0 || asafe_thread_urcu_locks != first_locks) {
          later_locks.fetch_add(1);  // liburcu-bp's registration: in the first 10 hits, none after
        }
      };
      if (prepared)
        ts.emplace_back(body);
      else
        ts.emplace_back([body] { on_unprepared_thread(body); });  // (its creator is a prepared thread)
    }
    for (auto& t : ts) t.join();
    for (std::uint64_t s : sums) EXPECT_EQ(s, expected_sum(10));
  }
  EXPECT_EQ(later_locks, 0);
  EXPECT_EQ(prepared_locks, 0);
  uprobe::unregister_uprobe(p1, entry);
  uprobe::unregister_uprobe(p2, ret);
  uprobe::unregister_uprobe(p3, session);
  EXPECT_EQ(entry.entries, 2 * kThreads * 10);
  EXPECT_EQ(ret.returns, 2 * kThreads * 10);
  EXPECT_EQ(session.entries, 2 * kThreads * 10);
  EXPECT_EQ(session.returns, 2 * kThreads * 10);
  EXPECT_EQ(session.bad_cookies, 0);
  EXPECT_EQ(violations(/*fresh_threads=*/true), "");
}

/// The audit itself: a consumer that allocates and locks without marking
/// itself is seen on every path, exactly once per callback per call.
TEST_F(Asafe, ControlUnmarkedConsumerIsCaughtOnEveryPath) {
  for (const Path* path : {&kEmulated, &kXol, &kOptimized}) {
    for (Callbacks cb : {Callbacks::entry, Callbacks::ret}) {
      reset_record();
      Audited c(cb, /*mark=*/false);
      run_path(*path, c, 12);
      // One filter() and one handler() or ret_handler() per call, each with
      // one malloc, one free and one lock.
      EXPECT_EQ(calls(ASAFE_MALLOC), 24u) << path->name;
      EXPECT_EQ(calls(ASAFE_FREE), 24u) << path->name;
      EXPECT_EQ(calls(ASAFE_MUTEX_LOCK), 24u) << path->name;
      EXPECT_NE(violations().find("first from asafe_user_work+"), std::string::npos) << violations();
    }
  }
}

/// And a marked consumer's own allocations are not held against the runtime,
/// while the same calls off the hot path are not recorded at all.
TEST_F(Asafe, ControlMarkedConsumerAndColdPathAreNotRecorded) {
  asafe_user_work();
  EXPECT_EQ(violations(), "");
  Audited c(Callbacks::entry_and_ret);
  run_path(kEmulated, c, 5);
  EXPECT_EQ(c.entries, 5);
  EXPECT_EQ(c.returns, 5);
  EXPECT_EQ(violations(), "");
}

}  // namespace
