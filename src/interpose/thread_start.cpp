// SPDX-License-Identifier: MIT
// New threads are ready for probe hits before their own code runs:
// pthread_create() is interposed, and the new thread caches its kernel thread
// id and registers as an RCU reader with liburcu-bp before it calls the start
// routine. Its hits then make no system call of libuprobe's, even under a
// seccomp filter the program installs later (the kernel's uprobes keep their
// per-task state in the kernel; in user space it has to exist before the
// first hit). A thread not created this way (one that existed before
// libuprobe was loaded, C11 thrd_create(), a raw clone()) does the same on
// its first hit instead: the README lists those system calls.

#include <dlfcn.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include <cstdint>

#include "masks.hpp"
#include "next_symbol.hpp"
#include "raw_syscall.hpp"
#include "rcu.hpp"
#include "sanitize.hpp"
#include "thread_state.hpp"


extern "C" void* __libc_stack_end;  // (glibc, ld.so: the stack pointer the process started with)

namespace uprobe::detail {

namespace {

using StartFn = void* (*)(void*);
using CreateFn = int (*)(pthread_t*, const pthread_attr_t*, StartFn, void*);

/// The start routine and argument handed from pthread_create() to the new
/// thread. Plain fields accessed with __atomic builtins only: the new thread
/// reads them before a sanitizer's own thread set-up has run (its start
/// routine is ours), where no instrumented code may run.
struct Handoff {
  std::uint64_t fn;   // StartFn (a word: ArgView::program, a consumer's write)
  std::uint64_t arg;  // void*
  int busy;
  int view_blocked;  // the new thread starts with SIGTRAP in its view (masks.hpp)
  // The new thread's stack (ThreadState::stack_lo, stack_hi): the caller's
  // own [stack_lo, stack_hi) (pthread_attr_setstack), else stack_size below
  // the new thread's first frame; all 0 when unknown.
  std::uint64_t stack_lo, stack_hi, stack_size;
};
constexpr unsigned kHandoffs = 256;  // threads starting at once; more start without the preparation
Handoff g_handoff[kHandoffs];

Handoff* claim_handoff() noexcept {
  static unsigned next = 0;
  const unsigned start = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
  for (unsigned k = 0; k < kHandoffs; ++k) {
    Handoff* h = &g_handoff[(start + k) % kHandoffs];
    int idle = 0;
    if (__atomic_compare_exchange_n(&h->busy, &idle, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return h;
  }
  return nullptr;
}

/// Where a thread created with `attr` will have its stack (Handoff).
struct StackOfNewThread {
  std::uint64_t lo = 0, hi = 0, size = 0;
};
StackOfNewThread stack_of_new_thread(const pthread_attr_t* attr) noexcept {
  StackOfNewThread s;
  void* addr = nullptr;
  std::size_t size = 0;
  // (glibc answers stackaddr - stacksize for the address, 0 - stacksize when
  // no stack was given: a user stack is one whose end is not 0.)
  if (attr && pthread_attr_getstack(attr, &addr, &size) == 0 && addr &&
      reinterpret_cast<std::uint64_t>(addr) + size != 0) {
    s.lo = reinterpret_cast<std::uint64_t>(addr);
    s.hi = s.lo + size;
    return s;
  }
  if (attr) {
    if (pthread_attr_getstacksize(attr, &size) == 0) s.size = size;
    return s;
  }
  pthread_attr_t def;
  if (pthread_getattr_default_np(&def) == 0) {
    if (pthread_attr_getstacksize(&def, &size) == 0) s.size = size;
    pthread_attr_destroy(&def);
  }
  return s;
}

/// The main thread's stack (ThreadState::stack_lo, stack_hi): its frames
/// all lie below glibc's __libc_stack_end (the stack pointer the process
/// started with; argv, envp and the auxiliary vector above it), and as far
/// below as RLIMIT_STACK lets the stack grow (1 GiB when unlimited). Run at
/// load, on the thread that loads libuprobe (the main thread's own only):
/// one prlimit64, no read of /proc (every traced process runs this).
/// libc's pthread_create, looked up at libuprobe's load (next_symbol_in()).
CreateFn g_real_pthread_create;
__attribute__((constructor)) void resolve_pthread_create() noexcept {
  (void)libc_symbol_in(g_real_pthread_create, "pthread_create");
}

__attribute__((constructor)) void note_main_thread_stack() {
  if (uprobe::arch::raw_syscall(SYS_gettid) != uprobe::arch::raw_syscall(SYS_getpid)) return;
  const auto end = reinterpret_cast<std::uint64_t>(__libc_stack_end);
  if (end == 0) return;
  t_state.stack_hi = end + 1;
  t_state.stack_lo = main_stack_lo(end + 1);
  t_state.stack_grows = true;
}

/// The new thread's first code. Not instrumented, and calls nothing that is:
/// under ASan or TSan the sanitizer's own start routine (the one the
/// program's pthread_create() call went through) runs after this, so the
/// thread is not known to the sanitizer yet. The gettid is written out for
/// the same reason (arch::raw_syscall would be an instrumented call here).
UPROBE_NO_SANITIZE void* prepared_start(void* p) {
  auto* h = static_cast<Handoff*>(p);
  const auto fn = reinterpret_cast<StartFn>(__atomic_load_n(&h->fn, __ATOMIC_RELAXED));
  void* const arg = reinterpret_cast<void*>(__atomic_load_n(&h->arg, __ATOMIC_RELAXED));
  const int view_blocked = __atomic_load_n(&h->view_blocked, __ATOMIC_RELAXED);
  const std::uint64_t lo = __atomic_load_n(&h->stack_lo, __ATOMIC_RELAXED);
  const std::uint64_t hi = __atomic_load_n(&h->stack_hi, __ATOMIC_RELAXED);
  const std::uint64_t size = __atomic_load_n(&h->stack_size, __ATOMIC_RELAXED);
  __atomic_store_n(&h->busy, 0, __ATOMIC_RELEASE);
  // Its frames lie below this one (start_thread's and clone's, a few hundred
  // bytes, above it); glibc's thread descriptor and static TLS sit at the top
  // of the block, the guard page at its bottom: [top - size, top + 4 KiB)
  // holds every frame the thread will have.
  const auto top = reinterpret_cast<std::uint64_t>(__builtin_frame_address(0));
  if (hi != 0) {
    t_state.stack_lo = lo;
    t_state.stack_hi = hi;
  } else if (size != 0 && size < top) {
    t_state.stack_lo = top - size;
    t_state.stack_hi = top + 4096;
  }
  // Not the program's calls (RuntimeCallScope, done by hand: this function
  // runs before a sanitizer has the thread, and the scope's constructor
  // would be instrumented).
  ++t_state.runtime_calls;
  if (view_blocked) take_blocked_view_in_new_thread();
  prepare_thread_for_hits(true);
  --t_state.runtime_calls;
  return fn(arg);
}

}  // namespace

namespace {

std::atomic<int> g_rcu_fork_handlers{0};  // 0 none, 1 being registered, 2 in
std::atomic<pid_t> g_rcu_fork_claimer{0};  // the process of the thread registering them (0: not yet known)
/// >0 from liburcu-bp's prepare handler to its parent or child handler: its
/// registry lock is held by the forking thread. A thread started meanwhile
/// (by a program's atfork handler, which may join it before the fork goes
/// on) registers at its first hit instead of at its start.
std::atomic<int> g_rcu_fork_in_progress{0};

/// liburcu-bp blocks every signal from here until the fork completes
/// (urcu_bp_after_fork_*), and glibc's fork() runs libc functions meanwhile
/// (_IO_list_lock, _Fork, _IO_list_unlock, _IO_list_resetlock) as well as the
/// atfork handlers registered before these: an int3 probe there would be hit
/// with SIGTRAP blocked, which is fatal. Its pthread_sigmask() reaches our
/// interposer (masks.cpp), which keeps SIGTRAP out; should it reach libc's
/// (libuprobe loaded RTLD_LOCAL), let SIGTRAP in again here. (The runtime's
/// prepare handler, registered after these and so run before, made the
/// forking thread a reader: its hits' read sections take no lock.)
void rcu_fork_prepare() {
  g_rcu_fork_in_progress.fetch_add(1, std::memory_order_relaxed);
  urcu_bp_before_fork();
  sigset_t trap{};  // (not sigemptyset/sigaddset: libc functions, which may carry probes)
  trap.__val[0] = sig_bit(SIGTRAP);
  raw_sigprocmask(SIG_UNBLOCK, &trap, nullptr);
}
void rcu_fork_parent() {
  urcu_bp_after_fork_parent();
  g_rcu_fork_in_progress.fetch_sub(1, std::memory_order_relaxed);
}
/// The thread's id first: the mask urcu_bp_after_fork_child() restores is
/// the child's thread's own (masks.cpp).
void rcu_fork_child() {
  thread_state_after_fork_child();
  urcu_bp_after_fork_child();
  g_rcu_fork_in_progress.store(0, std::memory_order_relaxed);
}

}  // namespace

void install_rcu_fork_handlers() noexcept {
  for (;;) {
    int state = g_rcu_fork_handlers.load(std::memory_order_acquire);
    if (state == 2) return;
    const pid_t pid = static_cast<pid_t>(uprobe::arch::raw_syscall(SYS_getpid));
    if (state == 0 && g_rcu_fork_handlers.compare_exchange_strong(state, 1, std::memory_order_acq_rel)) {
      g_rcu_fork_claimer.store(pid, std::memory_order_relaxed);
      ::pthread_atfork(rcu_fork_prepare, rcu_fork_parent, rcu_fork_child);
      g_rcu_fork_handlers.store(2, std::memory_order_release);
      return;
    }
    // Another thread registers them (pthread_atfork() waits only while a
    // fork() is in progress, which needs nothing of this thread); unless
    // that thread is in the parent of this process (a fork came while it
    // waited): then this process registers them.
    const pid_t claimer = g_rcu_fork_claimer.load(std::memory_order_relaxed);
    if (state == 1 && claimer != 0 && claimer != pid) {
      g_rcu_fork_claimer.store(0, std::memory_order_relaxed);
      g_rcu_fork_handlers.store(0, std::memory_order_release);
      continue;
    }
    uprobe::arch::raw_syscall(SYS_sched_yield);
  }
}

UPROBE_NO_SANITIZE void prepare_thread_for_hits(bool new_thread) noexcept {
  if (new_thread || t_state.tid == 0) {
    const long tid = uprobe::arch::raw_syscall(SYS_gettid);
    t_state.tid = static_cast<pid_t>(tid);  // current_tid(): the filter's argument, the return stack's owner
  }
  // The registration's pthread_sigmask reaches masks.cpp, instrumented code:
  // under ThreadSanitizer not before TSan's own start routine has run (a new
  // thread then registers at its first hit).
  // (Nor while a fork holds liburcu-bp's registry lock: a program's atfork
  // handler that started this thread may wait for it.)
  if (!(UPROBE_TSAN && new_thread) && !(new_thread && g_rcu_fork_in_progress.load(std::memory_order_relaxed) != 0))
    uprobe_rcu_register_thread();  // the hits' read sections need no registration
}

}  // namespace uprobe::detail

/// Interposed pthread_create(3): the same thread, started through
/// prepared_start(), which also gives it its signal-mask view (masks.cpp: a
/// thread created by one whose view blocks SIGTRAP, or with
/// pthread_attr_setsigmask_np() blocking it, has SIGTRAP blocked in its view
/// only). The program's start routine, argument, attributes and
/// result are untouched. Async-signal-safety and errors as glibc's.
extern "C" __attribute__((visibility("default"))) int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                                                                     void* (*start)(void*), void* arg) {
  using namespace uprobe::detail;
  const CreateFn real = libc_symbol_in(g_real_pthread_create, "pthread_create");
  // glibc blocks every signal around its clone() with its own system
  // calls: a hit in there (a probe on clone3) finds SIGSEGV blocked whatever
  // this thread's state says. Unknown during the call, as before after it.
  struct KeepFaultState {
    unsigned char saved = uprobe_fault_state;
    KeepFaultState() noexcept { forget_fault_state(); }
    ~KeepFaultState() { uprobe_fault_state = saved; }
  } keep_fault_state;
  bool view_blocked = false;
  Handoff* h = nullptr;
  StackOfNewThread stack{};
  {
    RuntimeCallScope ours;  // (its queries of the attributes are not the program's calls)
    install_rcu_fork_handlers();  // (before the new thread registers as a reader)
    view_blocked = new_thread_view_blocked(attr);
    h = claim_handoff();
    // 256 threads created and not started yet: a new one whose view blocks
    // SIGTRAP waits for a hand-off (it must start through prepared_start()),
    // another one starts without the preparation (its first hit does it).
    while (!h && view_blocked) {
      uprobe::arch::raw_syscall(SYS_sched_yield);
      h = claim_handoff();
    }
    if (h) stack = stack_of_new_thread(attr);
  }
  if (!h) return real(thread, attr, start, arg);
  __atomic_store_n(&h->view_blocked, view_blocked ? 1 : 0, __ATOMIC_RELAXED);
  __atomic_store_n(&h->stack_lo, stack.lo, __ATOMIC_RELAXED);
  __atomic_store_n(&h->stack_hi, stack.hi, __ATOMIC_RELAXED);
  __atomic_store_n(&h->stack_size, stack.size, __ATOMIC_RELAXED);
  __atomic_store_n(&h->fn, reinterpret_cast<std::uint64_t>(start), __ATOMIC_RELAXED);
  __atomic_store_n(&h->arg, reinterpret_cast<std::uint64_t>(arg), __ATOMIC_RELAXED);
  // A probe on libc's pthread_create() (or inside it) shows the program's
  // start routine and argument, as the kernel's uprobes do (ArgView).
  const ArgView view{2, {2, 3}, {reinterpret_cast<std::uint64_t>(&prepared_start), reinterpret_cast<std::uint64_t>(h)},
                     {&h->fn, &h->arg}};
  struct InView {
    const ArgView* outer = t_state.arg_view;
    explicit InView(const ArgView* v) noexcept { __atomic_store_n(&t_state.arg_view, v, __ATOMIC_RELAXED); }
    ~InView() { __atomic_store_n(&t_state.arg_view, outer, __ATOMIC_RELAXED); }
  };
  int rc;
  {
    InView in_view(&view);
    rc = real(thread, attr, prepared_start, h);  // its clone() publishes the hand-off to the thread
  }
  if (rc != 0) __atomic_store_n(&h->busy, 0, __ATOMIC_RELEASE);
  return rc;
}
