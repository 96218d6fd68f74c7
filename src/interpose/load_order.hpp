// SPDX-License-Identifier: MIT
#pragma once
// Whether libuprobe's interposers are where they must be: in front of libc.

namespace uprobe::detail {

/// Whether libuprobe comes before libc in the process's search order, so that
/// the program's calls of sigaction, sigprocmask, pthread_create, dlopen...
/// reach libuprobe's interposers (interpose/README.md): true when the program
/// links libuprobe (or libuprobe.a), or LD_PRELOADs it; false when it was
/// loaded after libc (a library that links libuprobe, loaded as a dependency
/// after libc; an LD_PRELOADed library that needs it; a program that names
/// libc before libuprobe; a dlopen()), or into a namespace of its own
/// (dlmopen(), whose calls of libc are not the program's). Then a
/// thread that blocks SIGTRAP with libc's own sigprocmask could take a hit,
/// which the kernel makes fatal: every registration is refused
/// (check_not_forbidden(), attach/validate.cpp). Computed once (the initial
/// objects' order never changes); thread-safe; not async-signal-safe.
bool interposers_in_front() noexcept;

}  // namespace uprobe::detail
