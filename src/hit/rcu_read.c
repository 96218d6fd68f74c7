/* SPDX-License-Identifier: MIT */
/* The read side of liburcu-bp, inlined (see rcu.hpp). Written in C so that
 * liburcu's per-thread reader is a plain _Thread_local (C++ would make it a
 * thread_local with an init-function check on every access). */
#define _LGPL_SOURCE
#include <urcu/urcu-bp.h>

#include <time.h>

#include "sanitize.hpp"

#if UPROBE_TSAN
/* ThreadSanitizer cannot see a grace period (liburcu-bp is not instrumented):
 * every read-side section's end releases this object and the writer acquires
 * it when urcu_bp_synchronize_rcu() returns -- RCU's guarantee exactly: what
 * a reader did before its unlock happens before the writer's reclamation. */
static char tsan_grace_period;
#endif

/* Under UBSan this file is built with -fno-sanitize=alignment (CMakeLists.txt):
 * liburcu-bp 0.13 declares struct urcu_bp_reader aligned to 128 bytes
 * (CAA_CACHE_LINE_SIZE) but places the readers in its registry arena after a
 * 32-byte chunk header (addresses ...020, ...120 seen), so every access of
 * its inline read side through URCU_TLS(urcu_bp_reader) is "misaligned" for
 * the type -- harmless on x86 (plain 8-byte accesses), and not our code. */

/* A thread's first read-side section registers it (urcu_bp_register(),
 * which locks and unlocks liburcu-bp's registry mutex, blocks signals, may
 * mmap): a probe on a libc function that registration runs (the internal
 * __pthread_mutex_unlock_usercnt under pthread_mutex_unlock, ...) is hit
 * inside it, before the thread has a reader. That nested hit must not
 * register again (it would wait forever for the registry mutex its own
 * thread holds): its section is skipped, counted here so that its unlock is
 * skipped too (sections nest). The same for a hit while liburcu-bp
 * unregisters the thread at its exit (a key destructor, which clears the
 * reader before it takes the same mutex): a thread that was a reader and has
 * none is being unregistered, or is past it (a return handler of glibc's
 * __nptl_deallocate_tsd, which ran that destructor). Such a hit has no
 * liburcu-bp reader, so a grace period would not wait for it: it counts
 * itself in uprobe_rcu_readers_unregistered instead for the length of its
 * section, and uprobe_rcu_synchronize() waits, after liburcu-bp's grace
 * period, until that count is zero. The count is a shared cache line, but
 * written only by these rare hits (a thread's registration and its exit),
 * never by an ordinary one. Dekker's pattern makes it a grace period: the
 * reader's increment is a full barrier before its loads of the tables, the
 * writer's load of the count follows the publication and liburcu-bp's full
 * barriers, so either the writer sees the reader or the reader sees the new
 * tables. */
static _Thread_local int uprobe_rcu_registering;
static _Thread_local int uprobe_rcu_was_reader;
/* (Not static: rcu.hpp's inline unlock reads it, initial-exec as here.) */
__attribute__((visibility("hidden"))) _Thread_local unsigned uprobe_rcu_skipped;
static unsigned long uprobe_rcu_readers_unregistered;

/* Not instrumented under TSan: on a thread's exit path these run after
 * TSan's own thread-exit destructor (its per-thread state is gone, and an
 * instrumented atomic that needs a new sync object faults). */
UPROBE_NO_SANITIZE static void unregistered_reader_enter(void) {
  __atomic_fetch_add(&uprobe_rcu_readers_unregistered, 1, __ATOMIC_SEQ_CST);
}
UPROBE_NO_SANITIZE static void unregistered_reader_leave(void) {
  __atomic_fetch_sub(&uprobe_rcu_readers_unregistered, 1, __ATOMIC_SEQ_CST);
}
UPROBE_NO_SANITIZE static unsigned long unregistered_readers(void) {
  return __atomic_load_n(&uprobe_rcu_readers_unregistered, __ATOMIC_SEQ_CST);
}

/* A thread that becomes a reader arms libuprobe's thread-exit hook too
 * (thread_state.cpp: it gives the thread's statistics block back): here, in
 * a registration reclaim_retired() watches, not in the stub's code before
 * the read-side section, which must not leave the optimized path's section. */
__attribute__((visibility("hidden"))) void uprobe_arm_thread_exit_hook(void);
__attribute__((visibility("hidden"))) void uprobe_rcu_register_thread(void) {
  if (URCU_TLS(urcu_bp_reader)) return;
  uprobe_rcu_registering = 1;
  urcu_bp_register_thread();
  uprobe_arm_thread_exit_hook();
  uprobe_rcu_registering = 0;
  uprobe_rcu_was_reader = 1;
}

/* Registrations inside a read-side section's entry, begun and finished: a
 * thread registering is not a reader yet, and a grace period does not wait
 * for it (reclaim_retired() in src/attach/sites.cpp watches these). */
static unsigned long uprobe_rcu_reg_started, uprobe_rcu_reg_done;

__attribute__((visibility("hidden"))) unsigned long uprobe_rcu_registrations(unsigned long* done) {
  const unsigned long started = __atomic_load_n(&uprobe_rcu_reg_started, __ATOMIC_SEQ_CST);
  *done = __atomic_load_n(&uprobe_rcu_reg_done, __ATOMIC_SEQ_CST);
  return started;
}

/* The entry and exit of a read-side section are in the optimized path's
 * section (UPROBE_OPT_PATH_TEXT in arch/x86_64/arch.hpp): before its
 * increment and after its decrement a thread is no reader. */
#define UPROBE_OPT_PATH_TEXT __attribute__((section("uprobe_opt_path")))

__attribute__((visibility("hidden"))) UPROBE_OPT_PATH_TEXT void uprobe_rcu_read_lock(void) {
  if (caa_unlikely(!URCU_TLS(urcu_bp_reader))) {
    if (uprobe_rcu_registering || uprobe_rcu_was_reader) {
      unregistered_reader_enter();
      ++uprobe_rcu_skipped;
      return;
    }
    uprobe_rcu_registering = 1;
    __atomic_fetch_add(&uprobe_rcu_reg_started, 1, __ATOMIC_SEQ_CST);
    urcu_bp_register();
    uprobe_arm_thread_exit_hook();
    __atomic_fetch_add(&uprobe_rcu_reg_done, 1, __ATOMIC_SEQ_CST);
    uprobe_rcu_registering = 0;
    uprobe_rcu_was_reader = 1;
  }
  urcu_bp_read_lock();
}
__attribute__((visibility("hidden"))) UPROBE_OPT_PATH_TEXT void uprobe_rcu_read_unlock(void) {
  if (caa_unlikely(uprobe_rcu_skipped != 0)) {
    --uprobe_rcu_skipped;
    unregistered_reader_leave();
    return;
  }
#if UPROBE_TSAN
  __tsan_release(&tsan_grace_period);
#endif
  urcu_bp_read_unlock();
}
__attribute__((visibility("hidden"))) void uprobe_rcu_synchronize(void) {
  urcu_bp_synchronize_rcu();
  /* Readers liburcu-bp does not know (above): a hit lasts microseconds, a
   * consumer that blocks holds the grace period as it would as a reader. */
  while (unregistered_readers() != 0) {
    const struct timespec pause = {0, 50 * 1000};
    nanosleep(&pause, NULL);
  }
#if UPROBE_TSAN
  __tsan_acquire(&tsan_grace_period);
#endif
}
