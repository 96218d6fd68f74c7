// SPDX-License-Identifier: MIT
// Runtime start-up, configuration and RCU publication of the trap path's
// snapshots.

#include "runtime.hpp"

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include "rcu.hpp"

#include "elf_image.hpp"
#include "fork_fresh.hpp"
#include "forbidden.hpp"
#include "masks.hpp"
#include "thread_state.hpp"
#include "uretprobe.hpp"
#include "sites.hpp"
#include "text_pages.hpp"
#include "thread_sample.hpp"
#include "xol.hpp"

namespace uprobe::detail {

HotState g_hot;

Registry& registry() {
  // Never destroyed: hits may run during exit. (made_once(): no static's
  // guard, which a fork child could find held.)
  static std::atomic<Registry*> r{nullptr};
  return made_once(r);
}

void publish(Registry& r, const VmaSnapshot* vmas, const ProbeTable* probes) {
  sigset_t all, old;
  // Never SIGTRAP: an int3 hit with SIGTRAP blocked is fatal (the kernel
  // forces the signal). No probe can be hit in this short stretch anyway.
  all.__val[0] = ~sig_bit(SIGTRAP);
  // A signal handler on this thread that hits a probe must not find the
  // write lock held by its own thread. (The real mask: not the program's
  // view, and no libc wrapper.)
  raw_sigprocmask(SIG_BLOCK, &all, &old);
  g_hot.mm_lock.lock();
  std::uint64_t seq = g_hot.mm_seq.load(std::memory_order_relaxed);
  // The odd count is ordered before the pointers by the release exchanges
  // themselves (a reader that acquires a new pointer then sees it): no fence.
  g_hot.mm_seq.store(seq + 1, std::memory_order_relaxed);
  const VmaSnapshot* old_vmas = vmas ? g_hot.vmas.exchange(vmas, std::memory_order_release) : nullptr;
  const ProbeTable* old_probes = probes ? g_hot.probes.exchange(probes, std::memory_order_release) : nullptr;
  g_hot.mm_seq.store(seq + 2, std::memory_order_release);
  g_hot.mm_lock.unlock();
  raw_sigprocmask(SIG_SETMASK, &old, nullptr);
  if (old_vmas) r.deferred.emplace_back([old_vmas] { delete old_vmas; });
  if (old_probes) r.deferred.emplace_back([old_probes] { delete old_probes; });
}

void synchronize_and_reclaim(Registry& r) {
  const std::size_t retired = xol_area().retired_count();  // retired before this grace period began
  uprobe_rcu_synchronize();
  std::vector<std::function<void()>> frees;
  frees.swap(r.deferred);
  for (auto& f : frees) f();
  reclaim_retired(retired);
}

const VmaSnapshot* refresh_vmas(Registry& r) {
  const VmaSnapshot* cur = g_hot.vmas.load(std::memory_order_acquire);
  // What the registry and the trap path use a snapshot for is file-backed:
  // where a file's code and USDT semaphores are mapped. While those mappings
  // are exactly the snapshot's, it stays (its anonymous and read-only file
  // mappings may be older: only XOL placement looks at them, and it reads
  // the address space afresh when it needs a new region).
  if (cur && file_mappings_unchanged(*cur).value_or(false)) return cur;
  auto fresh = std::make_unique<VmaSnapshot>(read_proc_maps());
  if (cur && same_layout(*cur, *fresh)) return cur;
  const VmaSnapshot* snap = fresh.release();
  publish(r, snap, nullptr);
  return snap;
}

std::optional<FileOffset> file_offset_from_snapshot(std::uint64_t addr) {
  // A handler may run on a thread that holds the registry mutex (a probe hit
  // inside register_uprobe()), and a program's pthread_atfork handler on one
  // whose fork() holds it (before_fork()): no lock there.
  Registry& r = registry();
  if (t_state.depth > 0 || r.mutex.held_by_this_thread()) return std::nullopt;
  std::lock_guard<ForkHeldMutex> lock(r.mutex);
  const VmaSnapshot* cur = g_hot.vmas.load(std::memory_order_acquire);
  return cur ? file_offset_if_unchanged(*cur, addr) : std::nullopt;
}

namespace {
// fork() while another thread is inside register/unregister would leave the
// child with a registry mutex nobody owns: hold it across fork instead.
/// The forking thread's id: written by before_fork() with the registry
/// mutex held, for the child.
pid_t g_forking_tid = 0;

/// In a fork child: every probe's patch lock that a thread that did not come
/// along held (a hit's Action::remove on another thread) is free, the
/// forking thread's own (its transaction's, when a handler of its forked
/// inside one: the registry side takes them only with the registry mutex)
/// is now held by the child's thread. (The tree is whole: a transaction
/// changes it without calling out, so never at a handler's hit.)
void patch_locks_after_fork_child(Registry& r) noexcept {
  const pid_t me = current_tid();
  for (Uprobe& up : r.tree) {
    const pid_t holder = up.patch_lock.load(std::memory_order_relaxed);
    if (holder != 0) up.patch_lock.store(holder == g_forking_tid ? me : 0, std::memory_order_relaxed);
  }
}

void before_fork() {
  // (Not when this thread holds it: a consumer's handler that forks on a
  // probe hit inside a registration; ForkHeldMutex.)
  registry().mutex.fork_prepare();
  g_forking_tid = current_tid();
  note_fork();
  // A hit during the fork (on what fork() runs) needs only a read-side
  // section, which takes no lock once this thread is a registered reader:
  // register it now, before liburcu-bp's prepare handler (registered before
  // this one, so run after it: install_rcu_fork_handlers()) takes its
  // registry lock and blocks every signal but SIGTRAP.
  uprobe_rcu_read_lock();
  uprobe_rcu_read_unlock();
}
void after_fork_parent() { registry().mutex.fork_after(); }
void after_fork_child() {
  // (liburcu-bp's child handler, run before this one, gave this thread its
  // id: thread_state_after_fork_child().)
  // The locks a hit or the program's sigaction() takes beside the registry
  // mutex: the threads that held them did not come along.
  g_hot.mm_lock.reset_in_child();
  patch_locks_after_fork_child(registry());
  signals_after_fork_child();
  uretprobe_after_fork_child();
  xol_area().privatize_all();
  detached_pages_after_fork_child();
  registry().mutex.fork_after();
  // Do now what a first hit in the child would otherwise do with system
  // calls (RCU reader registration, gettid), so that a child that installs a
  // seccomp filter right after fork still takes probes without a syscall.
  uprobe_rcu_read_lock();
  uprobe_rcu_read_unlock();
  (void)current_tid();
}
}  // namespace

namespace {
/// Whether the process has another thread than the caller: /proc/self/task
/// links one entry per thread to its two (an unreadable directory: assumed).
bool other_threads_exist() noexcept {
  struct stat st;
  return ::stat("/proc/self/task", &st) != 0 || st.st_nlink > 3;
}
}  // namespace

void lock_registry(std::unique_lock<ForkHeldMutex>& lock) {
  prepare_forbidden_checks();
  lock.lock();
  if (elfutils_load_pending() && other_threads_exist()) {
    lock.unlock();
    prepare_elf_reads();
    lock.lock();
  }
}

void start_runtime(Registry& r) {
  // The calling thread is ready for hits (RCU reader, cached thread id), as
  // a thread created through pthread_create() is from its start: its hits
  // make no system call of ours (README, "System calls of a hit"). (Also
  // what brings thread_start.o, with the pthread_create interposer, into a
  // program linked with libuprobe.a.) liburcu-bp's fork handlers first
  // (registered before ours: their prepare runs after ours, their child
  // handler before it).
  install_rcu_fork_handlers();
  prepare_thread_for_hits(false);
  if (r.started) return;
  pthread_atfork(before_fork, after_fork_parent, after_fork_child);
  uretprobe_init();
  init_core_sync();
  uretprobe_configure(static_cast<unsigned>(g_hot.ri_pool_for_install), static_cast<unsigned>(g_hot.ri_lock_for_install),
                      g_hot.max_depth_for_install);
  install_trap_handler(g_hot.signal_mask_for_install);
  r.started = true;
}

}  // namespace uprobe::detail

namespace uprobe {

void configure(const Config& c) {
  using namespace detail;
  if (c.max_uretprobe_depth < 1 || c.max_uretprobe_depth > kMaxReturnDepth)
    throw std::invalid_argument("libuprobe: Config::max_uretprobe_depth must be 1.." +
                                std::to_string(kMaxReturnDepth) + ", not " + std::to_string(c.max_uretprobe_depth));
  Registry& r = registry();
  if (r.mutex.held_by_this_thread())
    throw Error(Errc::in_handler, "", 0,
                "cannot configure while this thread's fork() holds libuprobe's registry (from a pthread_atfork "
                "handler?): it would wait for itself");
  std::unique_lock<ForkHeldMutex> lock(r.mutex, std::defer_lock);
  lock_registry(lock);
  set_sample_signal(c.sample_signal);  // validates first: throws std::invalid_argument, nothing changed
  g_hot.lookup.store(c.lookup, std::memory_order_relaxed);
  g_hot.xol.store(c.xol, std::memory_order_relaxed);
  g_hot.emulate.store(c.emulate, std::memory_order_relaxed);
  g_hot.full_state.store(c.site_state == SiteState::full, std::memory_order_relaxed);
  bool changed = g_hot.signal_mask_for_install != c.signal_mask;
  g_hot.signal_mask_for_install = c.signal_mask;
  if (r.started && changed) install_trap_handler(c.signal_mask);
  g_hot.ri_pool_for_install = c.ri_pool;
  g_hot.ri_lock_for_install = c.ri_lock;
  g_hot.max_depth_for_install = c.max_uretprobe_depth;
  g_hot.optimize_for_install = c.optimize;
  const bool optimize_changed = g_hot.optimize.load(std::memory_order_relaxed) != c.optimize ||
                                g_hot.optimize_entries.load(std::memory_order_relaxed) != c.optimize_entries ||
                                g_hot.optimize_windows.load(std::memory_order_relaxed) != c.optimize_windows ||
                                g_hot.optimize_punned.load(std::memory_order_relaxed) != c.optimize_punned;
  g_hot.optimize.store(c.optimize, std::memory_order_relaxed);
  g_hot.optimize_entries.store(c.optimize_entries, std::memory_order_relaxed);
  g_hot.optimize_windows.store(c.optimize_windows, std::memory_order_relaxed);
  g_hot.optimize_punned.store(c.optimize_punned, std::memory_order_relaxed);
  g_hot.site_tactics.store(c.site_tactics, std::memory_order_relaxed);
  g_hot.optimize_evicted.store(c.optimize_evicted, std::memory_order_relaxed);
  set_detach_patched_pages(c.detach_patched_pages);
  if (r.started && optimize_changed) reoptimize_all(r);
  if (r.started)
    uretprobe_configure(static_cast<unsigned>(c.ri_pool), static_cast<unsigned>(c.ri_lock), c.max_uretprobe_depth);
}

std::string load_decoder() { return {}; }

Config configuration() {
  using namespace detail;
  // The *_for_install fields are plain: written by configure() under the
  // registry mutex, so read under it too (unless this thread holds it: a
  // pthread_atfork handler inside its fork(), before_fork()).
  std::unique_lock<ForkHeldMutex> lock(registry().mutex, std::defer_lock);
  if (!registry().mutex.held_by_this_thread()) lock.lock();
  Config c;
  c.lookup = g_hot.lookup.load(std::memory_order_relaxed);
  c.xol = g_hot.xol.load(std::memory_order_relaxed);
  c.emulate = g_hot.emulate.load(std::memory_order_relaxed);
  c.site_state = g_hot.full_state.load(std::memory_order_relaxed) ? SiteState::full : SiteState::abi;
  c.signal_mask = g_hot.signal_mask_for_install;
  c.ri_pool = g_hot.ri_pool_for_install;
  c.ri_lock = g_hot.ri_lock_for_install;
  c.max_uretprobe_depth = g_hot.max_depth_for_install;
  c.optimize = g_hot.optimize_for_install;
  c.optimize_entries = g_hot.optimize_entries.load(std::memory_order_relaxed);
  c.optimize_windows = g_hot.optimize_windows.load(std::memory_order_relaxed);
  c.optimize_punned = g_hot.optimize_punned.load(std::memory_order_relaxed);
  c.site_tactics = g_hot.site_tactics.load(std::memory_order_relaxed);
  c.optimize_evicted = g_hot.optimize_evicted.load(std::memory_order_relaxed);
  c.detach_patched_pages = detach_patched_pages();
  c.sample_signal = sample_signal();
  return c;
}

}  // namespace uprobe
