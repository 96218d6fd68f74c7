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
// uprobe_rcu_synchronize() (urcu_bp_synchronize_rcu()).
#include <urcu/urcu-bp.h>

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
