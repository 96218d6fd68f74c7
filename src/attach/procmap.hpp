// SPDX-License-Identifier: MIT
#pragma once
// One mapping of this process, asked of the kernel: the PROCMAP_QUERY ioctl
// on /proc/self/maps (Linux 6.11), made directly (libc's ioctl() may be
// probed: raw_syscall.hpp). Shared by the VMA model (vma.cpp) and the text
// pages it detaches from their files (text_pages.cpp).

#include <linux/fs.h>
#include <linux/types.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "raw_syscall.hpp"

#ifndef PROCMAP_QUERY
// include/uapi/linux/fs.h of Linux 6.11 (the headers installed may be older
// than the kernel that runs).
struct procmap_query {
  __u64 size;
  __u64 query_flags;
  __u64 query_addr;
  __u64 vma_start;
  __u64 vma_end;
  __u64 vma_flags;
  __u64 vma_page_size;
  __u64 vma_offset;
  __u64 inode;
  __u32 dev_major;
  __u32 dev_minor;
  __u32 vma_name_size;
  __u32 build_id_size;
  __u64 vma_name_addr;
  __u64 build_id_addr;
};
#define PROCMAP_QUERY _IOWR('f', 17, struct procmap_query)
#define PROCMAP_QUERY_VMA_READABLE 0x01
#define PROCMAP_QUERY_VMA_WRITABLE 0x02
#define PROCMAP_QUERY_VMA_EXECUTABLE 0x04
#define PROCMAP_QUERY_VMA_SHARED 0x08
#define PROCMAP_QUERY_COVERING_OR_NEXT_VMA 0x10
#define PROCMAP_QUERY_FILE_BACKED_VMA 0x20
#endif

namespace uprobe::detail {

/// Set once the kernel has said it has no PROCMAP_QUERY (Linux < 6.11).
inline std::atomic<bool> g_procmap_unsupported{false};

/// One PROCMAP_QUERY of /proc/self/maps (`fd`) at `addr` with `flags`; `q`
/// may carry a name buffer (vma_name_addr/size) on entry. Returns 0, ENOENT
/// (no such mapping) or another errno value (then the ioctl is noted
/// unsupported when the kernel lacks it). Async-signal-safe (one system call).
inline int procmap_query_at(int fd, std::uint64_t addr, std::uint64_t flags, procmap_query& q) noexcept {
  const __u64 name = q.vma_name_addr;
  const __u32 name_size = q.vma_name_size;
  std::memset(&q, 0, sizeof q);
  q.size = sizeof q;
  q.query_addr = addr;
  q.query_flags = flags;
  q.vma_name_addr = name;
  q.vma_name_size = name_size;
  const long r = arch::raw_syscall(SYS_ioctl, fd, static_cast<long>(PROCMAP_QUERY), reinterpret_cast<long>(&q));
  if (r == 0) return 0;
  const int err = r < 0 && r > -4096 ? static_cast<int>(-r) : EIO;
  if (err == ENOTTY || err == EINVAL || err == EOPNOTSUPP) g_procmap_unsupported.store(true);
  return err;
}

}  // namespace uprobe::detail
