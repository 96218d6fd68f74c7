/* SPDX-License-Identifier: MIT
 * The interposer of the async-signal-safety audit: this executable defines
 * the allocator and lock entry points, so every call to them in the process
 * (libuprobe's objects are linked into the executable, and shared libraries
 * such as liburcu-bp, libstdc++ and libc's own callers bind to the
 * executable's definitions first) comes here first. A call made while the
 * calling thread is on one of libuprobe's hot paths (the runtime's
 * HotPathScope: t_state.hot > 0) and not inside a consumer callback of the
 * test (asafe_in_consumer > 0) is recorded; then the call goes on to glibc's
 * implementation. Recording is lock-free and allocation-free. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "audit.h"

void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void __libc_free(void *);
void *__libc_memalign(size_t, size_t);
/* glibc's own entry points under their other names (compat symbols since
 * glibc 2.34 merged libpthread: bound by version, not linkable by name). */
int real_mutex_lock(pthread_mutex_t *);
int real_mutex_trylock(pthread_mutex_t *);
int real_rwlock_rdlock(pthread_rwlock_t *);
int real_rwlock_wrlock(pthread_rwlock_t *);
__asm__(".symver real_mutex_lock, __pthread_mutex_lock@GLIBC_2.2.5");
__asm__(".symver real_mutex_trylock, __pthread_mutex_trylock@GLIBC_2.2.5");
__asm__(".symver real_rwlock_rdlock, __pthread_rwlock_rdlock@GLIBC_2.2.5");
__asm__(".symver real_rwlock_wrlock, __pthread_rwlock_wrlock@GLIBC_2.2.5");

struct asafe_record asafe_record;
__thread int asafe_in_consumer __attribute__((tls_model("initial-exec")));

uintptr_t asafe_urcu_lo, asafe_urcu_hi;
__thread uint64_t asafe_thread_urcu_locks __attribute__((tls_model("initial-exec")));

void asafe_note(enum asafe_fn fn, void *caller) {
  if (!asafe_on_hot_path() || asafe_in_consumer > 0) return;
  if (fn == ASAFE_MUTEX_LOCK && (uintptr_t)caller >= asafe_urcu_lo && (uintptr_t)caller < asafe_urcu_hi) {
    ++asafe_thread_urcu_locks;
    __atomic_fetch_add(&asafe_record.urcu_registration_locks, 1, __ATOMIC_RELAXED);
    return;
  }
  if (__atomic_fetch_add(&asafe_record.calls[fn], 1, __ATOMIC_RELAXED) == 0)
    __atomic_store_n(&asafe_record.first_caller[fn], caller, __ATOMIC_RELAXED);
}

#define CALLER __builtin_extract_return_addr(__builtin_return_address(0))

void *malloc(size_t n) {
  asafe_note(ASAFE_MALLOC, CALLER);
  return __libc_malloc(n);
}
void *calloc(size_t n, size_t size) {
  asafe_note(ASAFE_CALLOC, CALLER);
  return __libc_calloc(n, size);
}
void *realloc(void *p, size_t n) {
  asafe_note(ASAFE_REALLOC, CALLER);
  return __libc_realloc(p, n);
}
void free(void *p) {
  asafe_note(ASAFE_FREE, CALLER);
  __libc_free(p);
}
void *memalign(size_t align, size_t n) {
  asafe_note(ASAFE_MEMALIGN, CALLER);
  return __libc_memalign(align, n);
}
void *aligned_alloc(size_t align, size_t n) {
  asafe_note(ASAFE_MEMALIGN, CALLER);
  return __libc_memalign(align, n);
}
int posix_memalign(void **out, size_t align, size_t n) {
  asafe_note(ASAFE_MEMALIGN, CALLER);
  if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
  void *p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
int pthread_mutex_lock(pthread_mutex_t *m) {
  asafe_note(ASAFE_MUTEX_LOCK, CALLER);
  return real_mutex_lock(m);
}
int pthread_mutex_trylock(pthread_mutex_t *m) {
  asafe_note(ASAFE_MUTEX_TRYLOCK, CALLER);
  return real_mutex_trylock(m);
}
int pthread_rwlock_rdlock(pthread_rwlock_t *l) {
  asafe_note(ASAFE_RWLOCK, CALLER);
  return real_rwlock_rdlock(l);
}
int pthread_rwlock_wrlock(pthread_rwlock_t *l) {
  asafe_note(ASAFE_RWLOCK, CALLER);
  return real_rwlock_wrlock(l);
}
