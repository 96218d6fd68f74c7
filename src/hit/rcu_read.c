/* SPDX-License-Identifier: MIT */
/* The read side of liburcu-bp, inlined (see rcu.hpp). Written in C so that
 * liburcu's per-thread reader is a plain _Thread_local (C++ would make it a
 * thread_local with an init-function check on every access). */
#define _LGPL_SOURCE
#include <urcu/urcu-bp.h>

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

__attribute__((visibility("hidden"))) void uprobe_rcu_read_lock(void) {
  urcu_bp_read_lock();
}
__attribute__((visibility("hidden"))) void uprobe_rcu_read_unlock(void) {
#if UPROBE_TSAN
  __tsan_release(&tsan_grace_period);
#endif
  urcu_bp_read_unlock();
}
__attribute__((visibility("hidden"))) void uprobe_rcu_synchronize(void) {
  urcu_bp_synchronize_rcu();
#if UPROBE_TSAN
  __tsan_acquire(&tsan_grace_period);
#endif
}
