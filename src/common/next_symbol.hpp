// SPDX-License-Identifier: MIT
#pragma once
// The definition a forwarder of libuprobe's calls: libc's dlopen, sigaction,
// pthread_create..., libgcc_s's _Unwind_* (interpose/, elf/ifunc.cpp,
// attach/validate.cpp, and arch/x86_64/capstone_lib.cpp: the one header of
// src/ that arch/ includes).

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <link.h>

namespace uprobe::detail {

/// libc's own definition of `name` (dlopen, dlclose) whatever the search
/// order, kept in `slot`: a versioned lookup skips libuprobe's interposer,
/// which is unversioned (src/api/libuprobe.map); glibc 2.34 moved them into
/// libc, GLIBC_2.2.5 is libdl's before. nullptr when neither is there.
/// Looked up once, without a guard (two first calls both look; a guarded
/// static would make a thread inside dlopen() wait for one that waits for
/// the dynamic linker's lock to look). Thread-safe; not async-signal-safe.
template <typename F>
F libc_dl_function(F& slot, const char* name) noexcept {
  F f = __atomic_load_n(&slot, __ATOMIC_RELAXED);
  if (f) return f;
  void* p = dlvsym(RTLD_DEFAULT, name, "GLIBC_2.34");
  f = reinterpret_cast<F>(p ? p : dlvsym(RTLD_DEFAULT, name, "GLIBC_2.2.5"));
  __atomic_store_n(&slot, f, __ATOMIC_RELAXED);
  return f;
}

/// libc's own dlopen (libc_dl_function()).
inline void* (*libc_dlopen() noexcept)(const char*, int) {
  using Fn = void* (*)(const char*, int);
  static constinit Fn slot = nullptr;
  return libc_dl_function(slot, "dlopen");
}

/// libc's own dlclose (libc_dl_function()).
inline int (*libc_dlclose() noexcept)(void*) {
  using Fn = int (*)(void*);
  static constinit Fn slot = nullptr;
  return libc_dl_function(slot, "dlclose");
}

/// The definition of `name` after libuprobe's own in the search order
/// (dlsym(RTLD_NEXT)); when there is none there because libuprobe was
/// loaded after the library that defines it (a library that links
/// libuprobe, loaded as a dependency after libc; an LD_PRELOADed library that
/// needs libuprobe), the definition in the library that holds `anchor` (an
/// address in it), looked up through a handle on it (libc's own dlopen,
/// RTLD_NOLOAD: a link map of a library loaded as a dependency is no handle,
/// its search list is not built). nullptr when neither has one.
/// Thread-safe; not async-signal-safe (dlsym, dladdr): resolve up front.
/// Never inlined: its Dl_info would put an ASan-poisoned stack object into
/// the caller's frame, and an interposed _Unwind_RaiseException's frame is
/// left without an epilogue when the unwinder jumps to a landing pad (the
/// stale poison then failed every later throw under ASan).
__attribute__((noinline)) inline void* next_symbol(const char* name, const void* anchor) noexcept {
  if (void* f = dlsym(RTLD_NEXT, name)) return f;
  Dl_info di;
  if (!anchor || !dladdr(anchor, &di) || !di.dli_fname) return nullptr;
  const auto open = libc_dlopen();
  void* const lib = open ? open(di.dli_fname, RTLD_LAZY | RTLD_NOLOAD) : nullptr;  // (kept)
  return lib ? dlsym(lib, name) : nullptr;
}

/// next_symbol() of a libc function (gnu_get_libc_version() is libc's own).
inline void* libc_symbol(const char* name) noexcept {
  return next_symbol(name, reinterpret_cast<const void*>(&gnu_get_libc_version));
}

/// next_symbol(name, anchor) kept in `slot`: looked up when `slot` is still
/// empty, without a guard (two first calls store the same answer). For an
/// interposer's definition after ours, filled at libuprobe's load (a
/// constructor calls it once): a first call made later with the registry
/// mutex held would wait for the dynamic linker's lock, which a thread in
/// dlopen() holds while a constructor that registers a probe waits for the
/// mutex. Thread-safe; async-signal-safe once filled.
template <typename F>
F next_symbol_in(F& slot, const char* name, const void* anchor) noexcept {
  F f = __atomic_load_n(&slot, __ATOMIC_RELAXED);
  if (__builtin_expect(f == nullptr, 0)) {
    f = reinterpret_cast<F>(next_symbol(name, anchor));
    __atomic_store_n(&slot, f, __ATOMIC_RELAXED);
  }
  return f;
}

/// libc_symbol(name) kept in `slot` (next_symbol_in()).
template <typename F>
F libc_symbol_in(F& slot, const char* name) noexcept {
  return next_symbol_in(slot, name, reinterpret_cast<const void*>(&gnu_get_libc_version));
}

}  // namespace uprobe::detail
