// SPDX-License-Identifier: MIT
#include "text_pages.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <new>

#include "arch.hpp"
#include "bytes.hpp"
#include "procmap.hpp"
#include "raw_syscall.hpp"

namespace uprobe::detail {

namespace {

constexpr std::uint64_t kPage = 4096;
/// Room for every code page of a large process probed everywhere (all of
/// libc's entries: ~350 pages); 512 KiB of .bss, touched as it fills.
constexpr std::size_t kMaxDetached = 16384;
/// Each copy costs the process up to two mappings of its vm.max_map_count
/// (65530 by default: the file's mapping split, the copy): copies take at
/// most a quarter of it, so that the program's own mmap() calls never fail
/// for ours. Read once (0: not yet).
std::size_t g_cap = 0;

std::atomic<bool> g_enabled{true};  // Config::detach_patched_pages (default true)
DetachedPage g_pages[kMaxDetached];  // sorted by page
std::size_t g_count = 0;
/// Pages libuprobe wrote in place (not copied): never copied later (a copy
/// would take our own int3s out as the kernel's). Sorted; when full, no
/// page is copied any more.
std::uint64_t g_in_place[kMaxDetached];
std::size_t g_in_place_count = 0;
/// Held for a few instructions (a lookup, an insert, a copy of the table);
/// never across fork(): a child made while another thread held it gets a
/// fresh one (detached_pages_after_fork_child()).
std::mutex g_mutex;

/// While a write session lasts (begin_text_session() .. end_text_session():
/// a PokeSession), /proc/self/maps and the last file whose page was read
/// stay open across pages: `uprobe:libc:*` copies ~350 pages, each an open
/// and a close of both before. None is kept outside a session (libuprobe
/// holds no descriptor across calls). g_mutex held.
bool g_keeping = false;
long g_keep_maps = -1;
long g_keep_file = -1;
dev_t g_keep_dev = 0;
ino_t g_keep_ino = 0;

long sys(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0, long a5 = 0, long a6 = 0) noexcept {
  return arch::raw_syscall(nr, a1, a2, a3, a4, a5, a6);
}
bool failed(long r) noexcept { return r < 0 && r > -4096; }

/// The first index whose page is >= `page` (std::lower_bound: allocates
/// nothing). g_mutex held.
std::size_t lower(std::uint64_t page) noexcept {
  return static_cast<std::size_t>(
      std::lower_bound(g_pages, g_pages + g_count, page, [](const DetachedPage& d, std::uint64_t p) { return d.page < p; }) -
      g_pages);
}
bool in_table(std::uint64_t page) noexcept {
  const std::size_t i = lower(page);
  return i < g_count && g_pages[i].page == page;
}

/// The first index of g_in_place whose page is >= `page`. g_mutex held.
std::size_t lower_in_place(std::uint64_t page) noexcept {
  return static_cast<std::size_t>(std::lower_bound(g_in_place, g_in_place + g_in_place_count, page) - g_in_place);
}
/// Whether `page` was written in place (or may have been: the list is full).
bool written_in_place(std::uint64_t page) noexcept {
  if (g_in_place_count == kMaxDetached) return true;
  const std::size_t i = lower_in_place(page);
  return i < g_in_place_count && g_in_place[i] == page;
}
void note_in_place(std::uint64_t page) noexcept {
  const std::size_t at = lower_in_place(page);
  if ((at < g_in_place_count && g_in_place[at] == page) || g_in_place_count == kMaxDetached) return;
  for (std::size_t i = g_in_place_count; i > at; --i) g_in_place[i] = g_in_place[i - 1];
  g_in_place[at] = page;
  ++g_in_place_count;
}

/// The file's bytes of the page at `off` of `path` (when it is still the
/// file `dev`/`ino`): how many were read, 0 when none could be.
std::size_t read_file_page(const char* path, dev_t dev, ino_t ino, std::uint64_t off, std::uint8_t* out) noexcept {
  const bool kept = g_keeping && g_keep_file >= 0 && g_keep_dev == dev && g_keep_ino == ino;
  const long fd = kept ? g_keep_file : sys(SYS_openat, AT_FDCWD, reinterpret_cast<long>(path), O_RDONLY | O_CLOEXEC);
  if (failed(fd)) return 0;
  struct stat st;
  std::size_t got = 0;
  if (kept || (!failed(sys(SYS_fstat, fd, reinterpret_cast<long>(&st))) && st.st_dev == dev && st.st_ino == ino)) {
    while (got < kPage) {
      const long n = sys(SYS_pread64, fd, reinterpret_cast<long>(out + got), static_cast<long>(kPage - got),
                         static_cast<long>(off + got));
      if (n == -EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (g_keeping && !kept) {  // (the file of the next pages too, most likely)
      if (g_keep_file >= 0) sys(SYS_close, g_keep_file);
      g_keep_file = fd, g_keep_dev = dev, g_keep_ino = ino;
      return got;
    }
  }
  if (!kept) sys(SYS_close, fd);
  return got;
}

/// How many pages may be copies (g_cap, read once). g_mutex held.
std::size_t cap() noexcept {
  if (g_cap) return g_cap;
  std::size_t max_map_count = 65530;
  const long fd = sys(SYS_openat, AT_FDCWD, reinterpret_cast<long>("/proc/sys/vm/max_map_count"), O_RDONLY | O_CLOEXEC);
  if (!failed(fd)) {
    char buf[32];
    const long n = sys(SYS_read, fd, reinterpret_cast<long>(buf), sizeof buf);
    std::size_t v = 0;
    for (long i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) v = v * 10 + static_cast<std::size_t>(buf[i] - '0');
    if (v) max_map_count = v;
    sys(SYS_close, fd);
  }
  const std::size_t room = max_map_count / 8;  // pages: two mappings each, a quarter of the limit
  g_cap = room < kMaxDetached ? (room ? room : 1) : kMaxDetached;
  return g_cap;
}

/// Replaces the page at `page` by an anonymous copy (the kernel's
/// breakpoints taken out) when it is a private file mapping of code.
/// `maps_fd`: /proc/self/maps. g_mutex held.
bool detach_one(std::uint64_t page, int maps_fd) noexcept {
  if (g_count >= cap()) return false;
  char name[4096];
  procmap_query q{};
  q.vma_name_addr = reinterpret_cast<__u64>(name);
  q.vma_name_size = sizeof name;
  if (procmap_query_at(maps_fd, page, 0, q) != 0) return false;
  constexpr std::uint64_t kWanted = PROCMAP_QUERY_VMA_READABLE | PROCMAP_QUERY_VMA_EXECUTABLE;
  if (q.inode == 0 || (q.vma_flags & (kWanted | PROCMAP_QUERY_VMA_WRITABLE | PROCMAP_QUERY_VMA_SHARED)) != kWanted ||
      q.vma_page_size != kPage || q.vma_name_size == 0)
    return false;
  DetachedPage d;
  d.page = page;
  d.pgoff = q.vma_offset + (page - q.vma_start);
  d.dev = makedev(q.dev_major, q.dev_minor);
  d.ino = static_cast<ino_t>(q.inode);
  d.prot = 1 | 4;
  const long copy = sys(SYS_mmap, 0, static_cast<long>(kPage), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (failed(copy)) return false;
  auto* bytes = reinterpret_cast<std::uint8_t*>(copy);
  copy_bytes(bytes, reinterpret_cast<const std::uint8_t*>(page), kPage);
  std::uint8_t file[kPage];
  if (const std::size_t n = read_file_page(name, d.dev, d.ino, d.pgoff, file))
    arch::take_out_kernel_uprobes(bytes, file, n);
  if (failed(sys(SYS_mprotect, copy, static_cast<long>(kPage), PROT_READ | PROT_EXEC)) ||
      sys(SYS_mremap, copy, static_cast<long>(kPage), static_cast<long>(kPage), MREMAP_MAYMOVE | MREMAP_FIXED,
          static_cast<long>(page)) != static_cast<long>(page)) {
    sys(SYS_munmap, copy, static_cast<long>(kPage));
    return false;
  }
  const std::size_t at = lower(page);
  for (std::size_t i = g_count; i > at; --i) g_pages[i] = g_pages[i - 1];
  g_pages[at] = d;
  ++g_count;
  return true;
}

}  // namespace

void set_detach_patched_pages(bool on) noexcept { g_enabled.store(on, std::memory_order_relaxed); }
bool detach_patched_pages() noexcept { return g_enabled.load(std::memory_order_relaxed); }

std::size_t detach_text_pages(std::uint64_t addr, std::size_t len) noexcept {
  if (len == 0) return 0;
  const bool enabled =
      g_enabled.load(std::memory_order_relaxed) && !g_procmap_unsupported.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> hold(g_mutex);
  std::size_t done = 0;
  long maps_fd = g_keeping ? g_keep_maps : -1;
  for (std::uint64_t p = addr & ~(kPage - 1); p < addr + len; p += kPage) {
    if (in_table(p)) continue;
    bool copied = false;
    if (enabled && !written_in_place(p)) {
      if (maps_fd == -1)
        maps_fd = sys(SYS_openat, AT_FDCWD, reinterpret_cast<long>("/proc/self/maps"), O_RDONLY | O_CLOEXEC);
      copied = !failed(maps_fd) && detach_one(p, static_cast<int>(maps_fd));
    }
    if (copied)
      ++done;
    else
      note_in_place(p);  // (the write that follows goes into the file's mapping)
  }
  if (g_keeping && !failed(maps_fd))
    g_keep_maps = maps_fd;
  else if (maps_fd >= 0)
    sys(SYS_close, maps_fd);
  return done;
}

void begin_text_session() noexcept {
  std::lock_guard<std::mutex> hold(g_mutex);
  g_keeping = true;
}

void end_text_session() noexcept {
  std::lock_guard<std::mutex> hold(g_mutex);
  if (g_keep_maps >= 0) sys(SYS_close, g_keep_maps);
  if (g_keep_file >= 0) sys(SYS_close, g_keep_file);
  g_keep_maps = g_keep_file = -1;
  g_keeping = false;
}

std::size_t copied_pages_in(std::uint64_t lo, std::uint64_t hi, std::uint64_t* out, std::size_t max) noexcept {
  std::lock_guard<std::mutex> hold(g_mutex);
  std::size_t n = 0;
  for (std::size_t i = lower(lo & ~(kPage - 1)); i < g_count && g_pages[i].page < hi; ++i, ++n)
    if (n < max) out[n] = g_pages[i].page;
  return n;
}

bool text_page_detached(std::uint64_t page) noexcept {
  std::lock_guard<std::mutex> hold(g_mutex);
  return in_table(page);
}

std::vector<DetachedPage> detached_pages() {
  std::lock_guard<std::mutex> hold(g_mutex);
  return std::vector<DetachedPage>(g_pages, g_pages + g_count);
}

void forget_detached_page(std::uint64_t page) noexcept {
  std::lock_guard<std::mutex> hold(g_mutex);
  const std::size_t at = lower(page);
  if (at == g_count || g_pages[at].page != page) return;
  for (std::size_t i = at; i + 1 < g_count; ++i) g_pages[i] = g_pages[i + 1];
  --g_count;
}

void detached_pages_after_fork_child() {
  new (&g_mutex) std::mutex;
  // (A session of the parent's does not go on here: its descriptors, inherited, are closed.)
  if (g_keep_maps >= 0) sys(SYS_close, g_keep_maps);
  if (g_keep_file >= 0) sys(SYS_close, g_keep_file);
  g_keep_maps = g_keep_file = -1;
  g_keeping = false;
}

}  // namespace uprobe::detail
