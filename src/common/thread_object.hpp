// SPDX-License-Identifier: MIT
#pragma once
/// @file thread_object.hpp
/// thread_object<T>(): a per-thread T (a decoder, a scratch buffer) made at
/// the thread's first call and deleted at its exit, whose making takes no
/// lock of the dynamic linker. A C++ thread_local with a destructor
/// registers that destructor (__cxa_thread_atexit_impl) under the dynamic
/// linker's lock at each thread's first use: a first use with libuprobe's
/// registry mutex held would wait forever for a thread inside dlopen() whose
/// new library's constructor registers a probe (or forks), waiting for the
/// mutex. Here the object is deleted by a pthread key's destructor
/// (pthread_setspecific takes no such lock). One object per thread per type:
/// T names its use (a struct of its own, not a bare std::vector).

#include <pthread.h>

namespace uprobe::detail {

template <class T>
struct ThreadObject {
  /// This thread's object, or nullptr (trivially destructible: no
  /// destructor to register).
  static inline constinit thread_local T* mine = nullptr;
  /// Deletes the exiting thread's object (run by pthread's key destructors,
  /// on that thread; a later first use there makes another one, which the
  /// next round of key destructors deletes).
  static void destroy(void* p) noexcept {
    mine = nullptr;
    delete static_cast<T*>(p);
  }
  /// The key, made at the first call in the process (pthread_key_create
  /// takes no lock of the dynamic linker); none when the keys ran out (then
  /// the objects are never deleted).
  static bool key(pthread_key_t& out) noexcept {
    static pthread_key_t k;
    static const bool made = pthread_key_create(&k, &destroy) == 0;
    out = k;
    return made;
  }
};

/// This thread's T, value-initialized at its first call here, deleted at
/// the thread's exit. Thread-safe (each thread its own); not
/// async-signal-safe (operator new). @throws what T's constructor and
/// operator new throw.
template <class T>
T& thread_object() {
  T* t = ThreadObject<T>::mine;
  if (__builtin_expect(t != nullptr, 1)) return *t;
  t = new T();
  ThreadObject<T>::mine = t;
  if (pthread_key_t k; ThreadObject<T>::key(k)) pthread_setspecific(k, t);
  return *t;
}

/// This thread's T if thread_object<T>() made one, else nullptr (makes
/// none). Async-signal-safe.
template <class T>
T* thread_object_if_made() noexcept {
  return ThreadObject<T>::mine;
}

}  // namespace uprobe::detail
