// SPDX-License-Identifier: MIT
#include "proc_text.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>

namespace uprobe_test {

std::vector<MapLine> read_maps() { return as_files(read_maps_raw()); }

std::vector<MapLine> read_maps_raw() {
  std::vector<MapLine> out;
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    char perms[8] = {};
    unsigned long long start = 0, end = 0, off = 0, ino = 0;
    unsigned maj = 0, min = 0;
    int pos = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu%n", &start, &end, perms, &off, &maj, &min, &ino,
                    &pos) < 7)
      continue;
    MapLine m;
    m.start = start;
    m.end = end;
    m.perms = perms;
    m.offset = off;
    m.dev = makedev(maj, min);
    m.ino = static_cast<ino_t>(ino);
    std::string rest = line.substr(static_cast<std::size_t>(pos));
    rest.erase(0, rest.find_first_not_of(' '));
    m.path = rest;
    m.line = line;
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<MapLine> as_files(std::vector<MapLine> maps) {
  auto is_copy = [](const MapLine& m) { return m.ino == 0 && m.path.empty() && m.perms.size() == 4 && m.perms[3] == 'p'; };
  auto is_file = [](const MapLine& m) { return m.ino != 0 && !m.path.empty() && m.path[0] == '/'; };
  auto same_file = [](const MapLine& a, const MapLine& b) {
    return a.ino == b.ino && a.dev == b.dev && a.path == b.path && a.perms == b.perms;
  };
  std::vector<MapLine> out;
  out.reserve(maps.size());
  for (std::size_t i = 0; i < maps.size(); ++i) {
    MapLine m = std::move(maps[i]);
    if (is_copy(m)) {
      if (!out.empty() && is_file(out.back()) && out.back().perms == m.perms && out.back().end == m.start) {
        out.back().end = m.end;  // the file's mapping goes on through the copy
        out.back().copied = true;
        continue;
      }
      const std::uint64_t len = m.end - m.start;
      if (!out.empty() && i + 1 < maps.size() && is_file(out.back()) && is_file(maps[i + 1]) &&
          out.back().dev == maps[i + 1].dev && out.back().ino == maps[i + 1].ino && out.back().end == m.start &&
          maps[i + 1].start == m.end &&
          out.back().offset + (out.back().end - out.back().start) + len == maps[i + 1].offset) {
        // (a segment copied whole, between two of its file's others: a small library's one page of code)
        m.offset = out.back().offset + (out.back().end - out.back().start);
        m.dev = out.back().dev;
        m.ino = out.back().ino;
        m.path = out.back().path;
        m.copied = true;
      } else if (i + 1 < maps.size() && is_file(maps[i + 1]) && maps[i + 1].perms == m.perms &&
                 maps[i + 1].start == m.end && maps[i + 1].offset >= len) {
        const MapLine& next = maps[i + 1];
        m.offset = next.offset - len;
        m.dev = next.dev;
        m.ino = next.ino;
        m.path = next.path;
        m.copied = true;
      }
    }
    if (!out.empty() && is_file(m) && is_file(out.back()) && (m.copied || out.back().copied) &&
        same_file(out.back(), m) && out.back().end == m.start &&
        out.back().offset + (out.back().end - out.back().start) == m.offset) {
      out.back().end = m.end;
      out.back().copied = true;
      continue;
    }
    out.push_back(std::move(m));
  }
  for (MapLine& m : out)
    if (m.copied) {
      char head[128];
      std::snprintf(head, sizeof head, "%llx-%llx %s %08llx %02x:%02x %llu", static_cast<unsigned long long>(m.start),
                    static_cast<unsigned long long>(m.end), m.perms.c_str(), static_cast<unsigned long long>(m.offset),
                    major(m.dev), minor(m.dev), static_cast<unsigned long long>(m.ino));
      m.line = std::string(head) + " " + m.path + "  (with libuprobe's copied pages)";
    }
  return out;
}

std::vector<std::string> rwx_mappings() {
  std::vector<std::string> out;
  for (const MapLine& m : read_maps())
    if (m.writable() && m.executable()) out.push_back(m.line);
  return out;
}

std::string hex(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

TextCheck compare_text_with_files(const std::function<bool(const MapLine&)>& want, unsigned max_diffs) {
  TextCheck r;
  for (const MapLine& m : read_maps()) {
    if (!m.executable() || m.ino == 0 || m.path.empty() || m.path[0] != '/') continue;
    if (want && !want(m)) continue;
    const int fd = ::open(m.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (::fstat(fd, &st) != 0 || st.st_dev != m.dev || st.st_ino != m.ino || !S_ISREG(st.st_mode)) {
      ::close(fd);  // the path names another file now (deleted, replaced, memfd)
      continue;
    }
    const std::uint64_t file_size = static_cast<std::uint64_t>(st.st_size);
    const std::uint64_t len =
        m.offset >= file_size ? 0 : std::min<std::uint64_t>(m.end - m.start, file_size - m.offset);
    std::vector<std::uint8_t> file(len);
    std::uint64_t got = 0;
    while (got < len) {
      ssize_t n = ::pread(fd, file.data() + got, len - got, static_cast<off_t>(m.offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
    ++r.mappings;
    r.paths.push_back(m.path);
    if (got != len) {
      r.diffs.push_back(m.path + ": short read of the file at " + hex(m.offset));
      ++r.differing;
      continue;
    }
    const volatile std::uint8_t* p = reinterpret_cast<const volatile std::uint8_t*>(m.start);
    for (std::uint64_t i = 0; i < len; ++i) {
      const std::uint8_t b = p[i];
      if (b == file[i]) continue;
      if (r.differing++ < max_diffs) {
        char d[64];
        std::snprintf(d, sizeof d, ": mem %02x, file %02x", b, file[i]);
        r.diffs.push_back(m.path + "+" + hex(m.offset + i) + " (" + hex(m.start + i) + ")" + d);
      }
    }
    r.bytes += len;
  }
  return r;
}

}  // namespace uprobe_test
