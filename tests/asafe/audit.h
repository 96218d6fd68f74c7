/* SPDX-License-Identifier: MIT
 * The async-signal-safety audit's record (interpose.c fills it, the tests read
 * it): calls to allocator and lock functions made on a libuprobe hot path
 * outside the consumer callbacks. C and C++. */
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum asafe_fn {
  ASAFE_MALLOC,
  ASAFE_CALLOC,
  ASAFE_REALLOC,
  ASAFE_FREE,
  ASAFE_MEMALIGN,      /* memalign, aligned_alloc, posix_memalign */
  ASAFE_NEW,           /* operator new, new[] */
  ASAFE_DELETE,        /* operator delete, delete[] */
  ASAFE_MUTEX_LOCK,
  ASAFE_MUTEX_TRYLOCK,
  ASAFE_RWLOCK,        /* pthread_rwlock_rdlock, pthread_rwlock_wrlock */
  ASAFE_FN_COUNT
};

struct asafe_record {
  uint64_t calls[ASAFE_FN_COUNT];     /* violations per function */
  void *first_caller[ASAFE_FN_COUNT]; /* return address of the first one */
  /* pthread_mutex_lock calls made by liburcu-bp on a hot path, counted apart:
   * liburcu-bp registers a thread as an RCU reader on its first read-side
   * section and takes its registry mutexes to do so, with every signal
   * blocked (so no handler can interrupt a holder on the same thread). The
   * tests check that this happens on a thread's first hit only. */
  uint64_t urcu_registration_locks;
};

extern struct asafe_record asafe_record;
/* >0 while a consumer callback of the test runs on this thread: calls there are the user's. */
extern __thread int asafe_in_consumer __attribute__((tls_model("initial-exec")));

/* liburcu-bp's code, [lo, hi): set by the tests before the first hit. */
extern uintptr_t asafe_urcu_lo, asafe_urcu_hi;
/* This thread's share of urcu_registration_locks. */
extern __thread uint64_t asafe_thread_urcu_locks __attribute__((tls_model("initial-exec")));

/* Records a call of `fn` from `caller` if this thread is on a hot path and not in a consumer. */
void asafe_note(enum asafe_fn fn, void *caller);
/* libuprobe's t_state.hot > 0 (audit_test.cpp). */
int asafe_on_hot_path(void);

#ifdef __cplusplus
}
#endif
