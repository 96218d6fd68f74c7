/* SPDX-License-Identifier: MIT */
/* The read side of liburcu-bp, inlined (see rcu.hpp). Written in C so that
 * liburcu's per-thread reader is a plain _Thread_local (C++ would make it a
 * thread_local with an init-function check on every access). */
#define _LGPL_SOURCE
#include <urcu/urcu-bp.h>

__attribute__((visibility("hidden"))) void uprobe_rcu_read_lock(void) { urcu_bp_read_lock(); }
__attribute__((visibility("hidden"))) void uprobe_rcu_read_unlock(void) { urcu_bp_read_unlock(); }
