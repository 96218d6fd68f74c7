/* SPDX-License-Identifier: MIT */
#pragma once
/* Sanitizer builds (-DUPROBE_SANITIZE=..., see cmake/sanitize.cmake). C and C++.
 *
 * UPROBE_NO_SANITIZE marks the few functions that must not be instrumented,
 * each with its reason at the use. UPROBE_TSAN is 1 in ThreadSanitizer builds,
 * where the synchronisation TSan cannot see (liburcu-bp's grace periods, the
 * pool's cmpxchg16b) is annotated with __tsan_acquire()/__tsan_release().
 * Neither changes an ordinary build. */

/* No ASan/UBSan/TSan instrumentation in this function (inlined callees included). */
#define UPROBE_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))

#if defined(__SANITIZE_THREAD__)
#define UPROBE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UPROBE_TSAN 1
#endif
#endif
#ifndef UPROBE_TSAN
#define UPROBE_TSAN 0
#endif

#if UPROBE_TSAN
#include <sanitizer/tsan_interface.h>
#endif
