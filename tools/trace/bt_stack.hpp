// SPDX-License-Identifier: MIT
#pragma once
// A traced thread's stack as ustack reads it (bt_vm.hpp's walk_stack()): its
// bounds, looked up once in /proc/self/maps, and reads of its words, plain
// loads inside them, uprobe::probe_read_user() elsewhere. Async-signal-safe.

#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <uprobe/uprobe.hpp>

#include "raw_syscall.hpp"

namespace uptrace::bt {

/// A thread's stack as ustack reads it without a system call (each is
/// microseconds): the mapping [lo, hi) that held the stack pointer at the
/// thread's first walk, when it is certainly the thread's stack up to hi:
/// the main thread's `[stack]`, or, below the thread's own descriptor
/// (pthread_self(): glibc puts it at the top of a thread's stack mapping),
/// a thread's. Memory from the stack pointer up to hi is mapped and
/// readable while the thread runs, so a frame there is read with a plain
/// load; any other address with uprobe::probe_read_user() (never a fault). One per
/// thread, zero-initialized (the agent's initial-exec TLS: a fork child
/// keeps its parent's, which its copied stack still matches).
struct StackBounds {
  std::uint64_t lo = 0, hi = 0;  ///< hi 0: no such mapping (every frame by uprobe::probe_read_user())
  std::uint64_t known = 0;       ///< 1 once looked up
};

/// Looks up the calling thread's stack (StackBounds) in /proc/self/maps:
/// the mapping that holds `sp`, if it is `[stack]` (the main thread's),
/// else up to the thread's descriptor if that is in it above `sp` (a glibc
/// thread's stack). Async-signal-safe: open, read, close and a parse in a
/// fixed buffer; once per thread.
inline void find_stack(StackBounds& b, std::uint64_t sp) noexcept {
  b.known = 1;
  const long fd = uprobe::arch::raw_syscall(SYS_openat, AT_FDCWD, reinterpret_cast<long>("/proc/self/maps"),
                                            O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[1024];
  char line[160];  // (a longer line is cut: only a short one can be `[stack]`)
  std::size_t len = 0;
  bool cut = false, done = false;
  auto parse = [&]() {  // "START-END PERMS ... [PATH]"
    std::uint64_t start = 0, end = 0;
    std::size_t i = 0;
    auto hex = [&](std::uint64_t& v) {
      for (; i < len; ++i) {
        const char c = line[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) break;
        v = v * 16 + static_cast<std::uint64_t>(d);
      }
    };
    hex(start);
    if (i >= len || line[i] != '-') return;
    ++i;
    hex(end);
    if (!(start <= sp && sp < end)) return;
    done = true;
    if (i + 1 >= len || line[i + 1] != 'r') return;
    if (!cut && len >= 7 && std::memcmp(line + len - 7, "[stack]", 7) == 0) {
      b.lo = start, b.hi = end;
      return;
    }
    const auto self = reinterpret_cast<std::uint64_t>(__builtin_thread_pointer());  // (glibc's pthread_self())
    if (sp < self && self <= end) b.lo = start, b.hi = self;
  };
  for (long got; !done && (got = uprobe::arch::raw_syscall(SYS_read, fd, reinterpret_cast<long>(buf), sizeof buf)) > 0;) {
    for (long k = 0; k < got && !done; ++k) {
      if (buf[k] == '\n') {
        parse();
        len = 0, cut = false;
      } else if (len < sizeof line) {
        line[len++] = buf[k];
      } else {
        cut = true;
      }
    }
  }
  uprobe::arch::raw_syscall(SYS_close, fd);
}

/// The `n` words at `addr` into `out`: plain loads when they lie in [lo, hi)
/// (the thread's stack above its stack pointer: mapped while it runs),
/// else uprobe::probe_read_user() (a bad address fails, never faults).
/// False when they cannot be read.
inline bool read_stack_words(std::uint64_t addr, std::uint64_t* out, std::size_t n, std::uint64_t lo,
                             std::uint64_t hi) noexcept {
  if (addr >= lo && addr < hi && hi - addr >= n * 8 && addr % 8 == 0) {
    for (std::size_t k = 0; k < n; ++k)
      out[k] = __atomic_load_n(reinterpret_cast<const std::uint64_t*>(addr) + k, __ATOMIC_RELAXED);
    return true;
  }
  return uprobe::probe_read_user(out, n * 8, reinterpret_cast<const void*>(addr)) == 0;
}

}  // namespace uptrace::bt
