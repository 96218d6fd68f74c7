// SPDX-License-Identifier: MIT
#pragma once
/// @file raw_syscall.hpp
/// System calls made with the `syscall` instruction itself, not through
/// libc's wrappers. libuprobe's own patching (pwrite to /proc/self/mem,
/// process_vm_readv, membarrier) must not run through pwrite64(), getpid()
/// and friends when a user has probed them: each such call would be a hit
/// the program never made (reported to the user's consumers), and on the
/// int3 path a signal per write (attaching, converting or detaching every
/// entry of libc made ~9000 such hits). The kernel's uprobes write text from
/// kernel code, which no uprobe can be on; this keeps that property.

namespace uprobe::arch {

/// One system call: `nr` with up to six arguments. Returns what the kernel
/// returns, a negative errno value on failure (errno is not set).
/// Async-signal-safe, allocates nothing, thread-safe.
inline long raw_syscall(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0, long a5 = 0,
                        long a6 = 0) noexcept {
  long ret;
  register long r10 asm("r10") = a4;
  register long r8 asm("r8") = a5;
  register long r9 asm("r9") = a6;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
  return ret;
}

}  // namespace uprobe::arch
