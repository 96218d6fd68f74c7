// SPDX-License-Identifier: MIT
#include "vma.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "format.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe::detail {

namespace {

std::string slurp(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(Errc::system, path, 0, std::string("open failed: ") + std::strerror(errno));
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      throw Error(Errc::system, path, 0, std::string("read failed: ") + std::strerror(e));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

/// Parses hex or decimal digits at `p`, advancing it; false when there are none.
bool parse_number(const char*& p, const char* end, unsigned base, unsigned long long& out) {
  const char* start = p;
  unsigned long long v = 0;
  for (; p < end; ++p) {
    unsigned d;
    if (*p >= '0' && *p <= '9') d = static_cast<unsigned>(*p - '0');
    else if (base == 16 && *p >= 'a' && *p <= 'f') d = static_cast<unsigned>(*p - 'a' + 10);
    else if (base == 16 && *p >= 'A' && *p <= 'F') d = static_cast<unsigned>(*p - 'A' + 10);
    else break;
    v = v * base + d;
  }
  out = v;
  return p != start;
}

bool expect(const char*& p, const char* end, char c) {
  if (p >= end || *p != c) return false;
  ++p;
  return true;
}

/// One line: `start-end perms pgoff major:minor ino   path`. Parsed by hand,
/// not with sscanf: with probes on libc's stdio and strto* functions, every
/// libc call here would be a trap, and this runs on every (un)registration.
bool parse_maps_line(const char* p, const char* end, Vma& v) {
  unsigned long long start, stop, pgoff, major, minor, ino;
  if (!parse_number(p, end, 16, start) || !expect(p, end, '-') || !parse_number(p, end, 16, stop) ||
      !expect(p, end, ' ') || end - p < 5)
    return false;
  const char* perms = p;
  p += 4;
  if (!expect(p, end, ' ') || !parse_number(p, end, 16, pgoff) || !expect(p, end, ' ') ||
      !parse_number(p, end, 16, major) || !expect(p, end, ':') || !parse_number(p, end, 16, minor) ||
      !expect(p, end, ' ') || !parse_number(p, end, 10, ino))
    return false;
  while (p < end && *p == ' ') ++p;
  v.start = start;
  v.end = stop;
  v.pgoff = pgoff;
  v.dev = makedev(static_cast<unsigned>(major), static_cast<unsigned>(minor));
  v.ino = static_cast<ino_t>(ino);
  v.prot = static_cast<std::uint8_t>((perms[0] == 'r' ? 1 : 0) | (perms[1] == 'w' ? 2 : 0) |
                                     (perms[2] == 'x' ? 4 : 0));
  v.shared = perms[3] == 's';
  v.path.assign(p, static_cast<std::size_t>(end - p));
  return true;
}

}  // namespace


std::vector<Vma> read_proc_maps() {
  const std::string text = slurp("/proc/self/maps");
  std::vector<Vma> vmas;
  const char* p = text.data();
  const char* const end = p + text.size();
  while (p < end) {
    const char* eol = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
    if (!eol) eol = end;
    Vma v;
    if (parse_maps_line(p, eol, v)) vmas.push_back(std::move(v));
    p = eol + 1;
  }
  std::sort(vmas.begin(), vmas.end(), [](const Vma& a, const Vma& b) { return a.start < b.start; });
  return vmas;
}

bool same_layout(const VmaSnapshot& x, const VmaSnapshot& y) noexcept {
  if (x.vmas().size() != y.vmas().size()) return false;
  for (std::size_t i = 0; i < x.vmas().size(); ++i) {
    const Vma &a = x.vmas()[i], &b = y.vmas()[i];
    if (a.start != b.start || a.end != b.end || a.prot != b.prot || a.pgoff != b.pgoff || a.dev != b.dev ||
        a.ino != b.ino)
      return false;
  }
  return true;
}

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

namespace {

std::atomic<bool> g_procmap_unsupported{false};

/// One PROCMAP_QUERY of /proc/self/maps (`fd`): 0, ENOENT (no such
/// mapping), or another errno (then the ioctl is noted unsupported when the
/// kernel lacks it).
int procmap_query_at(int fd, std::uint64_t addr, std::uint64_t flags, procmap_query& q) {
  std::memset(&q, 0, sizeof q);
  q.size = sizeof q;
  q.query_addr = addr;
  q.query_flags = flags;
  if (::ioctl(fd, PROCMAP_QUERY, &q) == 0) return 0;
  const int err = errno;
  if (err == ENOTTY || err == EINVAL || err == EOPNOTSUPP) g_procmap_unsupported.store(true);
  return err;
}

/// Whether the kernel's mapping `q` is `v` exactly.
bool same_mapping(const Vma& v, const procmap_query& q) {
  const std::uint8_t prot = static_cast<std::uint8_t>((q.vma_flags & PROCMAP_QUERY_VMA_READABLE ? 1 : 0) |
                                                      (q.vma_flags & PROCMAP_QUERY_VMA_WRITABLE ? 2 : 0) |
                                                      (q.vma_flags & PROCMAP_QUERY_VMA_EXECUTABLE ? 4 : 0));
  return v.start == q.vma_start && v.end == q.vma_end && v.pgoff == q.vma_offset &&
         v.ino == static_cast<ino_t>(q.inode) && v.dev == makedev(q.dev_major, q.dev_minor) && v.prot == prot &&
         v.shared == ((q.vma_flags & PROCMAP_QUERY_VMA_SHARED) != 0);
}

}  // namespace

std::optional<bool> file_mappings_unchanged(const VmaSnapshot& snap) {
  if (g_procmap_unsupported.load(std::memory_order_relaxed)) return std::nullopt;
  // Opened per call: a descriptor opened before a fork() would still name
  // the parent's address space in the child.
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const std::vector<Vma>& v = snap.vmas();
  std::optional<bool> result = true;
  // Two sweeps, each over the file-backed mappings with one protection bit
  // (the kernel filters: one query per such mapping): code, where sites
  // are, then writable data, where USDT semaphores are. A read-only one
  // (headers, .rodata, RELRO: two of a library's five) holds neither.
  for (const auto& [bit, flag] : {std::pair<std::uint8_t, std::uint64_t>{4, PROCMAP_QUERY_VMA_EXECUTABLE},
                                 std::pair<std::uint8_t, std::uint64_t>{2, PROCMAP_QUERY_VMA_WRITABLE}}) {
    std::size_t i = 0;
    auto next_wanted = [&] {
      while (i < v.size() && (v[i].ino == 0 || !(v[i].prot & bit))) ++i;
    };
    std::uint64_t addr = 0;
    for (;;) {
      procmap_query q;
      next_wanted();
      const std::uint64_t flags = PROCMAP_QUERY_COVERING_OR_NEXT_VMA | PROCMAP_QUERY_FILE_BACKED_VMA | flag;
      if (const int err = procmap_query_at(fd, addr, flags, q)) {
        if (err == ENOENT) {  // no such mapping at or above addr
          if (i != v.size()) result = false;
        } else {
          result = std::nullopt;
        }
        break;
      }
      if (i == v.size() || !same_mapping(v[i], q)) {
        result = false;
        break;
      }
      ++i;
      addr = q.vma_end;
    }
    if (result != true) break;
  }
  ::close(fd);
  return result;
}

std::optional<bool> mapping_unchanged(const Vma& v) {
  if (g_procmap_unsupported.load(std::memory_order_relaxed)) return std::nullopt;
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);  // (per call: see above)
  if (fd < 0) return std::nullopt;
  procmap_query q;
  const int err = procmap_query_at(fd, v.start, 0, q);  // the mapping covering v.start, if any
  ::close(fd);
  if (err == ENOENT) return false;
  if (err) return std::nullopt;
  return same_mapping(v, q);
}

std::optional<FileOffset> file_offset_if_unchanged(const VmaSnapshot& snap, std::uint64_t addr) {
  const Vma* v = snap.find(addr);
  if (!v || v->ino == 0 || !mapping_unchanged(*v).value_or(false)) return std::nullopt;
  try {
    return file_offset_of(snap, addr);
  } catch (const Error&) {
    return std::nullopt;
  }
}

FileOffset file_offset_of(const VmaSnapshot& vmas, std::uint64_t a) {
  const Vma* v = vmas.find(a);
  if (!v) throw Error(Errc::not_file_backed, "", a, "address " + hex(a) + " is in no mapping of this process");
  if (v->ino == 0 || v->path.empty() || v->path[0] != '/')
    throw Error(Errc::not_file_backed, v->path, a,
                "address " + hex(a) + " is in anonymous memory" + (v->path.empty() ? "" : " (" + v->path + ")"));
  const std::string deleted = " (deleted)";
  if (v->path.size() > deleted.size() && v->path.compare(v->path.size() - deleted.size(), deleted.size(), deleted) == 0)
    throw Error(Errc::not_file_backed, v->path, a, "the file mapped at " + hex(a) + " was deleted");
  return FileOffset{v->path, v->pgoff + (a - v->start), v->dev, v->ino};
}

}  // namespace uprobe::detail
