// SPDX-License-Identifier: MIT
#pragma once
// Where a probe must never go (forbidden.cpp): libuprobe's own trap path and
// the code glibc runs with every signal blocked.

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace uprobe::detail {

struct Target;       // validate.hpp
class VmaSnapshot;  // vma_snapshot.hpp

/// Asks the dynamic linker, once per process, what check_not_forbidden() and
/// signals_blocked_windows() need (dlsym()/dlopen(RTLD_NOLOAD) of the trap
/// path's and glibc's signal-blocking functions, the files of libuprobe's own
/// code), and whether libuprobe's interposers are in front of libc. Called
/// at libuprobe's load and before the registry mutex is taken, never with
/// it held: those calls wait for the dynamic linker's lock, which a thread
/// inside dlopen() holds while a constructor that registers a probe (or
/// forks) waits for the registry mutex. Lock-free after the first call;
/// thread-safe (two first calls ask twice, one answer is kept); not
/// async-signal-safe. @throws std::bad_alloc.
void prepare_forbidden_checks();

/// Where glibc runs the function at (dev, ino, offset) with every signal
/// blocked by a system call of its own (an int3 hit there is fatal): a list
/// of those code paths ("thread exit; ..."), or "" when none is known.
/// Registry mutex held (computes its table once; no dynamic-linker call
/// after prepare_forbidden_checks()).
/// `vmas`: the caller's snapshot of the address space, where libc's
/// functions are looked up the first time (nullptr: /proc/self/maps read).
std::string signals_blocked_windows(dev_t dev, ino_t ino, std::uint64_t offset, const VmaSnapshot* vmas = nullptr);

/// Refuses libuprobe's own code and the libraries its trap path calls.
/// `vmas`: the caller's snapshot of the address space, where the trap path's
/// libc functions and the signal-return trampoline are located the first
/// time (nullptr: /proc/self/maps read). Registry mutex held (no
/// dynamic-linker call after prepare_forbidden_checks()).
/// @throws uprobe::Error(forbidden_target).
void check_not_forbidden(const Target& t, std::uint64_t offset, const VmaSnapshot* vmas = nullptr);

}  // namespace uprobe::detail
