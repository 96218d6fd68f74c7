// SPDX-License-Identifier: MIT
// probe_read_user() and probe_read_user_str() (include/uprobe/uprobe.hpp):
// reads of memory that may not be readable, the user-space counterpart of
// the kernel's copy_from_user_nofault() and strncpy_from_user_nofault()
// (mm/maccess.c) behind bpf_probe_read_user() and bpf_probe_read_user_str()
// (kernel/trace/bpf_trace.c).
//
// In process (arch::copy_user(), copy_user_str(): loads whose faults the
// SIGSEGV/SIGBUS wrapper resumes at a fixup) when a fault would reach that
// wrapper now (user_copy_faults_recoverable(): armed, and neither signal
// blocked in the thread's mask); else with process_vm_readv(2) on this
// process, which fails where a load would fault. Both give the same answer
// for any address. Built as the rest of src/hit/ (general registers only).

#include <errno.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "arch.hpp"
#include "raw_syscall.hpp"
#include "services.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe {

namespace {

constexpr std::uint64_t kPage = 4096;

void zero(void* dst, std::size_t n) noexcept {
  auto* d = static_cast<volatile unsigned char*>(dst);  // (not a memset call: no vector code here)
  for (std::size_t i = 0; i < n; ++i) d[i] = 0;
}

/// process_vm_readv(2) of [src, src + n) into dst: the bytes read (fewer at
/// the first unreadable page). Made directly: libc's wrapper may be probed.
std::size_t vm_read(void* dst, const void* src, std::size_t n) noexcept {
  struct iovec local = {dst, n}, remote = {const_cast<void*>(src), n};
  const long got = arch::raw_syscall(SYS_process_vm_readv, arch::raw_syscall(SYS_getpid), reinterpret_cast<long>(&local),
                                     1, reinterpret_cast<long>(&remote), 1, 0);
  return got > 0 ? static_cast<std::size_t>(got) : 0;
}

/// copy_user_str()'s answer with process_vm_readv(2): a page at a time, so
/// that the readable part before an unreadable page counts.
long vm_read_str(char* dst, const char* src, std::size_t size) noexcept {
  std::size_t done = 0;
  while (done < size) {
    const auto at = reinterpret_cast<std::uint64_t>(src) + done;
    std::size_t chunk = kPage - (at & (kPage - 1));
    if (chunk > size - done) chunk = size - done;
    const std::size_t got = vm_read(dst + done, src + done, chunk);
    for (std::size_t i = 0; i < got; ++i)
      if (dst[done + i] == 0) return static_cast<long>(done + i);
    if (got < chunk) return -1;
    done += chunk;
  }
  return static_cast<long>(size);
}

/// An address no process maps, answered without a read (a fault costs a
/// signal delivery, tens of microseconds in some VMs): the first page (NULL
/// and small integers; Linux maps nothing there, vm.mmap_min_addr, unless a
/// privileged program asks), and at or above 2^56, past user space with
/// 5-level page tables too (kernel addresses, most non-canonical ones).
bool never_mapped(const void* src) noexcept {
  const auto a = reinterpret_cast<std::uint64_t>(src);
  return a < kPage || a >= (std::uint64_t{1} << 56);
}

}  // namespace

long probe_read_user(void* dst, std::uint32_t size, const void* src) noexcept {
  if (size == 0) return 0;
  const std::size_t got = never_mapped(src)                           ? 0
                          : detail::user_copy_faults_recoverable() ? arch::copy_user(dst, src, size)
                                                                     : vm_read(dst, src, size);
  if (got == size) return 0;
  zero(dst, size);
  return -EFAULT;
}

long probe_read_user_str(void* dst, std::uint32_t size, const void* src) noexcept {
  if (size == 0) return 0;
  auto* d = static_cast<char*>(dst);
  const long n = never_mapped(src)                           ? -1
                 : detail::user_copy_faults_recoverable() ? arch::copy_user_str(d, src, size)
                                                            : vm_read_str(d, static_cast<const char*>(src), size);
  if (n < 0) {
    zero(dst, size);
    return -EFAULT;
  }
  if (n >= static_cast<long>(size)) {  // no NUL in the first size bytes: cut
    d[size - 1] = 0;
    return static_cast<long>(size);
  }
  return n + 1;
}

}  // namespace uprobe
