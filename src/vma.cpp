// SPDX-License-Identifier: MIT
#include "vma.hpp"

#include <fcntl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

const Vma* VmaSnapshot::find(std::uint64_t addr) const noexcept {
  // Last VMA with start <= addr (binary search; no allocation).
  std::size_t lo = 0, hi = vmas_.size();
  while (lo < hi) {
    std::size_t mid = lo + (hi - lo) / 2;
    if (vmas_[mid].start <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return nullptr;
  const Vma& v = vmas_[lo - 1];
  return v.contains(addr) ? &v : nullptr;
}

bool VmaSnapshot::same_layout(const VmaSnapshot& other) const noexcept {
  if (vmas_.size() != other.vmas_.size()) return false;
  for (std::size_t i = 0; i < vmas_.size(); ++i) {
    const Vma &a = vmas_[i], &b = other.vmas_[i];
    if (a.start != b.start || a.end != b.end || a.prot != b.prot || a.pgoff != b.pgoff || a.dev != b.dev ||
        a.ino != b.ino)
      return false;
  }
  return true;
}

}  // namespace uprobe::detail
