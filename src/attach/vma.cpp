// SPDX-License-Identifier: MIT
#include "vma.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "format.hpp"
#include "procmap.hpp"
#include "text_pages.hpp"
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


namespace {

constexpr std::uint64_t kPage = 4096;

/// Puts the detached pages (text_pages.hpp) back into `vmas` (sorted) as
/// the file mappings they were, each merged with the pieces of its file's
/// mapping around it; a table entry whose page is no longer an anonymous
/// mapping of that protection is forgotten (unmapped, or mapped anew).
void put_back_detached(std::vector<Vma>& vmas) {
  const std::vector<DetachedPage> pages = detached_pages();
  if (pages.empty()) return;
  std::vector<Vma> out;
  out.reserve(vmas.size() + pages.size());
  std::size_t k = 0;
  for (Vma& v : vmas) {
    while (k < pages.size() && pages[k].page < v.start) forget_detached_page(pages[k++].page);
    if (v.ino != 0 || v.shared) {
      out.push_back(std::move(v));
      continue;
    }
    std::uint64_t pos = v.start;
    for (; k < pages.size() && pages[k].page < v.end; ++k) {
      const DetachedPage& d = pages[k];
      if (d.prot != v.prot) {
        forget_detached_page(d.page);
        continue;
      }
      if (d.page > pos) {
        Vma rest = v;
        rest.start = pos;
        rest.end = d.page;
        out.push_back(std::move(rest));
      }
      Vma f;
      f.start = d.page;
      f.end = d.page + kPage;
      f.pgoff = d.pgoff;
      f.dev = d.dev;
      f.ino = d.ino;
      f.prot = d.prot;
      f.detached = true;
      out.push_back(std::move(f));
      pos = d.page + kPage;
    }
    if (pos < v.end) {
      Vma rest = std::move(v);
      rest.start = pos;
      out.push_back(std::move(rest));
    }
  }
  for (; k < pages.size(); ++k) forget_detached_page(pages[k].page);
  // Each detached page takes its file's name; pieces of one file mapping
  // that the kernel shows apart only because of a detached page become one.
  std::vector<Vma> merged;
  merged.reserve(out.size());
  for (Vma& v : out) {
    if (v.detached)
      for (const Vma& o : out)
        if (o.ino == v.ino && o.dev == v.dev && !o.detached && !o.path.empty()) {
          v.path = o.path;
          break;
        }
    if (v.detached && v.path.empty()) {  // (no mapping of its file left to name it)
      forget_detached_page(v.start);
      v = Vma{v.start, v.end, 0, 0, 0, v.prot, false, false, {}};
    }
    if (!merged.empty()) {
      Vma& m = merged.back();
      if ((m.detached || v.detached) && m.ino != 0 && m.ino == v.ino && m.dev == v.dev && m.end == v.start &&
          m.prot == v.prot && m.shared == v.shared && m.pgoff + (m.end - m.start) == v.pgoff) {
        m.end = v.end;
        m.detached = true;
        continue;
      }
    }
    merged.push_back(std::move(v));
  }
  vmas.swap(merged);
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
  put_back_detached(vmas);
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

namespace {

/// The kernel's protection bits of `q` as Vma::prot.
std::uint8_t prot_of(const procmap_query& q) {
  return static_cast<std::uint8_t>((q.vma_flags & PROCMAP_QUERY_VMA_READABLE ? 1 : 0) |
                                   (q.vma_flags & PROCMAP_QUERY_VMA_WRITABLE ? 2 : 0) |
                                   (q.vma_flags & PROCMAP_QUERY_VMA_EXECUTABLE ? 4 : 0));
}

/// The detached pages (text_pages.hpp): a sorted copy.
struct DetachedSet {
  std::vector<DetachedPage> pages = detached_pages();
  const DetachedPage* find(std::uint64_t page) const {
    auto it = std::lower_bound(pages.begin(), pages.end(), page,
                               [](const DetachedPage& d, std::uint64_t p) { return d.page < p; });
    return it != pages.end() && it->page == page ? &*it : nullptr;
  }
  /// `pos` moved past the detached pages that start there, up to `end`,
  /// each asked of the kernel (`fd`): still an anonymous mapping with its
  /// protection. nullopt when one is not (unmapped, or mapped anew).
  std::optional<std::uint64_t> skip(int fd, std::uint64_t pos, std::uint64_t end) const {
    for (const DetachedPage* d; pos < end && (d = find(pos)) != nullptr; pos += kPage) {
      procmap_query q{};
      if (procmap_query_at(fd, pos, 0, q) != 0 || q.inode != 0 || prot_of(q) != d->prot) return std::nullopt;
    }
    return pos;
  }
};

/// Whether the kernel's mapping `q` is the piece of `v` that starts at
/// `pos`: the same file at the same offset, protection and sharing, within
/// `v` (the rest of `v` beyond it: further pieces, or detached pages).
bool same_piece(const Vma& v, std::uint64_t pos, const procmap_query& q) {
  return q.vma_start == pos && q.vma_end <= v.end && q.vma_offset == v.pgoff + (pos - v.start) &&
         v.ino == static_cast<ino_t>(q.inode) && v.dev == makedev(q.dev_major, q.dev_minor) && v.prot == prot_of(q) &&
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
  const DetachedSet detached;
  std::optional<bool> result = true;
  // Two sweeps, each over the file-backed mappings with one protection bit
  // (the kernel filters: one query per such mapping): code, where sites
  // are, then writable data, where USDT semaphores are. A read-only one
  // (headers, .rodata, RELRO: two of a library's five) holds neither. A
  // mapping with detached pages is seen by the kernel as the pieces between
  // them: each piece is checked, the detached pages are skipped.
  for (const auto& [bit, flag] : {std::pair<std::uint8_t, std::uint64_t>{4, PROCMAP_QUERY_VMA_EXECUTABLE},
                                 std::pair<std::uint8_t, std::uint64_t>{2, PROCMAP_QUERY_VMA_WRITABLE}}) {
    std::size_t i = 0;
    std::uint64_t pos = 0;   // where the next kernel piece of v[i] must start
    std::uint64_t addr = 0;  // where the last piece matched ended: asked from there (a new mapping between shows)
    // To the next wanted mapping with a piece the kernel shows.
    auto settle = [&] {
      for (;; ++i) {
        while (i < v.size() && (v[i].ino == 0 || !(v[i].prot & bit))) ++i;
        if (i == v.size()) return true;
        if (pos < v[i].start) pos = v[i].start;
        const std::optional<std::uint64_t> past = detached.skip(fd, pos, v[i].end);
        if (!past) return false;
        pos = *past;
        if (pos < v[i].end) return true;
      }
    };
    for (;;) {
      procmap_query q{};
      if (!settle()) {
        result = false;
        break;
      }
      const std::uint64_t flags = PROCMAP_QUERY_COVERING_OR_NEXT_VMA | PROCMAP_QUERY_FILE_BACKED_VMA | flag;
      if (const int err = procmap_query_at(fd, addr, flags, q)) {
        if (err == ENOENT) {  // no such mapping at or above addr
          if (i != v.size()) result = false;
        } else {
          result = std::nullopt;
        }
        break;
      }
      if (i == v.size() || !same_piece(v[i], pos, q)) {
        result = false;
        break;
      }
      pos = addr = q.vma_end;
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
  const DetachedSet detached;
  std::optional<bool> result = true;
  for (std::uint64_t pos = v.start;;) {
    const std::optional<std::uint64_t> past = detached.skip(fd, pos, v.end);
    if (!past) {
      result = false;
      break;
    }
    pos = *past;
    if (pos >= v.end) break;
    procmap_query q{};
    const int err = procmap_query_at(fd, pos, 0, q);  // the mapping covering pos, if any
    if (err || !same_piece(v, pos, q)) {
      result = err && err != ENOENT ? std::nullopt : std::optional<bool>(false);
      break;
    }
    pos = q.vma_end;
  }
  ::close(fd);
  return result;
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
