// SPDX-License-Identifier: MIT
#pragma once
/// @file bt_clock.hpp
/// The clock of bpftrace's nsecs, elapsed, time() and the latency
/// histogram at a hit: CLOCK_MONOTONIC through the vDSO, called directly
/// (libc's clock_gettime would be a probe hit inside the hit under
/// `uprobe:libc:*`), else the system call. Internal to uprobe-trace (CLI and
/// agent of one build).

#include <dlfcn.h>
#include <sys/syscall.h>
#include <time.h>

#include <cstdint>

#include "raw_syscall.hpp"

namespace uptrace::bt {

/// The vDSO's clock_gettime (`__vdso_clock_gettime`), or null: the
/// system call then. Found once by init_vdso_clock(), before any hit.
inline int (*g_vdso_clock_gettime)(clockid_t, timespec*) = nullptr;

/// Finds the vDSO's clock_gettime (libc's would be a probe hit inside the
/// hit under `uprobe:libc:*`). Not async-signal-safe: at start-up (the
/// agent's load of the program, the CLI's main).
inline void init_vdso_clock() noexcept {
  if (void* vdso = dlopen("linux-vdso.so.1", RTLD_NOW | RTLD_NOLOAD))
    g_vdso_clock_gettime = reinterpret_cast<int (*)(clockid_t, timespec*)>(dlsym(vdso, "__vdso_clock_gettime"));
}

/// CLOCK_MONOTONIC in ns (bpftrace's nsecs). Async-signal-safe; no libc call.
/// Not inlined: its call through g_vdso_clock_gettime is the one indirect
/// call of the agent's hit path (tests/trace/agent_gpr_check.py allows it
/// here, in this function only: the vDSO is built without vector code).
__attribute__((noinline)) inline std::uint64_t now_ns() noexcept {
  timespec ts{};
  if (!g_vdso_clock_gettime || g_vdso_clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
    uprobe::arch::raw_syscall(SYS_clock_gettime, CLOCK_MONOTONIC, reinterpret_cast<long>(&ts));
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

}  // namespace uptrace::bt
