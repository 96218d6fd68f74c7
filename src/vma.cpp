// SPDX-License-Identifier: MIT
#include "vma.hpp"

#include <fcntl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
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

}  // namespace

std::vector<Vma> read_proc_maps() {
  std::string text = slurp("/proc/self/maps");
  std::vector<Vma> vmas;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    unsigned long long start, end, pgoff, ino;
    unsigned major, minor;
    char perms[5] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %4s %llx %x:%x %llu %n", &start, &end, perms, &pgoff, &major, &minor,
                    &ino, &path_at) < 7)
      continue;
    Vma v;
    v.start = start;
    v.end = end;
    v.pgoff = pgoff;
    v.dev = makedev(major, minor);
    v.ino = static_cast<ino_t>(ino);
    v.prot = static_cast<std::uint8_t>((perms[0] == 'r' ? 1 : 0) | (perms[1] == 'w' ? 2 : 0) |
                                       (perms[2] == 'x' ? 4 : 0));
    v.shared = perms[3] == 's';
    if (path_at > 0 && static_cast<std::size_t>(path_at) < line.size()) v.path = line.substr(path_at);
    vmas.push_back(std::move(v));
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
