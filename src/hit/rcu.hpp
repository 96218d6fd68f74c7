// SPDX-License-Identifier: MIT
#pragma once
// liburcu's bulletproof flavour (urcu-bp: threads register themselves on
// their first read-side section, so any thread of the program may hit a
// probe). The hot paths enter and leave read-side sections through
// rcu_read.c, which inlines liburcu-bp's read side (_LGPL_SOURCE: liburcu is
// LGPL-2.1, and its README allows the inline read side to GPL-compatible code
// such as MIT) and reaches the per-thread reader through a TLS descriptor
// (-mtls-dialect=gnu2): a few instructions instead of two calls into
// liburcu-bp and two __tls_get_addr calls per hit. Writers use liburcu-bp's
// uprobe_rcu_synchronize() (urcu_bp_synchronize_rcu()). The optimized
// path and the return path inline the common case of both calls
// (rcu_read_lock_hot(), rcu_read_unlock_hot() below: a registered reader,
// no skipped section): two calls and their register saves were ~7 of an
// optimized hit's ~40 ticks.
#define _LGPL_SOURCE
#include <urcu/urcu-bp.h>
#undef _LGPL_SOURCE

#include "sanitize.hpp"

extern "C" {
/// urcu_bp_read_lock(), inlined. Async-signal-safe; nests. A section
/// entered inside liburcu-bp's own registration of the calling thread (a
/// probe on what registration calls) is skipped, as its unlock (rcu_read.c).
void uprobe_rcu_read_lock(void);
/// urcu_bp_register_thread() for a thread not yet a reader, marked as a
/// registration (hits inside it skip their sections: see rcu_read.c).
void uprobe_rcu_register_thread(void);
/// How many first read-side sections of a thread (its registration with
/// liburcu-bp) have begun (returned) and finished (`*done`). Any thread.
unsigned long uprobe_rcu_registrations(unsigned long* done);
/// urcu_bp_read_unlock(), inlined. Async-signal-safe.
void uprobe_rcu_read_unlock(void);
/// urcu_bp_synchronize_rcu(): waits for a grace period (writers; not in a
/// read-side section). Tells ThreadSanitizer about it in TSan builds.
void uprobe_rcu_synchronize(void);
}

namespace uprobe::detail {

// liburcu-bp's per-thread reader and rcu_read.c's count of skipped sections,
// reached as rcu_read.c reaches them: __thread, initial-exec (a C++
// `thread_local` as liburcu's header declares it would go through a TLS
// init wrapper per access). The asm name is liburcu-bp's symbol.
extern __thread struct urcu_bp_reader* rcu_reader __asm__("urcu_bp_reader")
    __attribute__((tls_model("initial-exec")));
extern "C" __thread unsigned uprobe_rcu_skipped __attribute__((tls_model("initial-exec")));

/// uprobe_rcu_read_lock(), its common case inline: a thread that is a
/// registered reader enters a (possibly nested) read-side section as
/// liburcu-bp's _urcu_bp_read_lock() does; any other thread takes the call.
/// Async-signal-safe. Sanitizer builds call (rcu_read.c is built without the
/// alignment check; TSan's release is there).
static inline __attribute__((always_inline)) void rcu_read_lock_hot() noexcept {
#if UPROBE_TSAN || defined(__SANITIZE_ADDRESS__)
  uprobe_rcu_read_lock();
#else
  struct urcu_bp_reader* r = rcu_reader;
  if (__builtin_expect(r == nullptr, 0)) return uprobe_rcu_read_lock();
  cmm_barrier();
  const unsigned long tmp = CMM_LOAD_SHARED(r->ctr);
  if (__builtin_expect(!(tmp & URCU_BP_GP_CTR_NEST_MASK), 1)) {
    CMM_STORE_SHARED(r->ctr, CMM_LOAD_SHARED(urcu_bp_gp.ctr));
    urcu_bp_smp_mb_slave();
  } else {
    CMM_STORE_SHARED(r->ctr, tmp + URCU_BP_GP_COUNT);
  }
#endif
}

/// uprobe_rcu_read_unlock(), its common case inline (liburcu-bp's
/// _urcu_bp_read_unlock()); a section that rcu_read.c skipped takes the call.
static inline __attribute__((always_inline)) void rcu_read_unlock_hot() noexcept {
#if UPROBE_TSAN || defined(__SANITIZE_ADDRESS__)
  uprobe_rcu_read_unlock();
#else
  if (__builtin_expect(uprobe_rcu_skipped != 0, 0)) return uprobe_rcu_read_unlock();
  struct urcu_bp_reader* r = rcu_reader;
  const unsigned long tmp = CMM_LOAD_SHARED(r->ctr);
  urcu_bp_smp_mb_slave();
  CMM_STORE_SHARED(r->ctr, tmp - URCU_BP_GP_COUNT);
  cmm_barrier();
#endif
}

}  // namespace uprobe::detail

