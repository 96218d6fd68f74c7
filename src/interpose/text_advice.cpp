// SPDX-License-Identifier: MIT
// madvise(2) on code pages libuprobe copied out of their files
// (Config::detach_patched_pages, src/attach/text_pages.hpp). On the file's
// mapping MADV_DONTNEED drops the private page and the file's bytes come
// back; on the anonymous copy it would leave a zero page to run, and
// MADV_FREE/MADV_WIPEONFORK, refused (EINVAL) for a file mapping, would be
// taken. So the copies are left out of MADV_DONTNEED (the program sees the
// same bytes as before either way, but for our probes' own), and the two
// that only anonymous memory takes fail as on the file's mapping.

#include <errno.h>
#include <sys/mman.h>

#include <cstdint>

#include "next_symbol.hpp"
#include "text_pages.hpp"

namespace {

using MadviseFn = int (*)(void*, std::size_t, int);
constexpr std::uint64_t kPage = 4096;

#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif

/// libc's madvise, looked up at libuprobe's load (next_symbol_in()).
MadviseFn g_real_madvise;
__attribute__((constructor)) void resolve_madvise() noexcept { (void)uprobe::detail::libc_symbol_in(g_real_madvise, "madvise"); }

}  // namespace

/// Interposed madvise(2): as libc's, but for the pages libuprobe copied
/// (above). Thread-safe; not async-signal-safe (neither is madvise in
/// POSIX; a mutex guards the table of copies). Errors as madvise's.
extern "C" __attribute__((visibility("default"))) int madvise(void* addr, std::size_t len, int advice) {
  const MadviseFn real = uprobe::detail::libc_symbol_in(g_real_madvise, "madvise");
  const bool drops = advice == MADV_DONTNEED || advice == MADV_DONTNEED_LOCKED;
  const bool anon_only = advice == MADV_FREE || advice == MADV_WIPEONFORK;
  if ((!drops && !anon_only) || len == 0) return real(addr, len, advice);
  const auto lo = reinterpret_cast<std::uint64_t>(addr);
  const std::uint64_t hi = lo + ((len + kPage - 1) & ~(kPage - 1));
  std::uint64_t copies[64];
  const std::size_t n = uprobe::detail::copied_pages_in(lo, hi, copies, 64);
  if (n == 0) return real(addr, len, advice);
  if (anon_only || n > 64) {  // (more copies than one call looks at: refused whole, as a file mapping would be)
    errno = EINVAL;
    return -1;
  }
  // The pieces between the copies.
  std::uint64_t from = lo;
  int rc = 0;
  for (std::size_t i = 0; i <= n; ++i) {
    const std::uint64_t to = i < n ? copies[i] : hi;
    if (to > from && real(reinterpret_cast<void*>(from), to - from, advice) != 0 && rc == 0) rc = -1;
    if (i < n) from = copies[i] + kPage;
  }
  return rc;
}
