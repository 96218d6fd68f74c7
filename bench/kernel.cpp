// SPDX-License-Identifier: MIT
// The kernel's own uprobes on the bench's targets, for reference rows: a
// counting perf event of the uprobe PMU (perf_event_open(2) with
// attr.type = /sys/bus/event_source/devices/uprobe/type, config1 = the path,
// config2 = the file offset, the retprobe bit of config from
// .../format/retprobe), opened on this process and inherited by the producer
// threads created after it. The kernel counts every hit; read() sums the
// counts of all threads.

#include <fcntl.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "bench.hpp"

namespace bench::kernel {
namespace {

constexpr const char* kPmu = "/sys/bus/event_source/devices/uprobe";

bool read_line(const std::string& path, std::string& out) {
  std::ifstream f(path);
  return static_cast<bool>(std::getline(f, out));
}

int pmu_type(std::string& error) {
  std::string line;
  if (!read_line(std::string(kPmu) + "/type", line)) {
    error = std::string("no uprobe PMU (") + kPmu + "/type: " + std::strerror(errno) +
            "; the kernel needs CONFIG_UPROBE_EVENTS)";
    return -1;
  }
  return std::atoi(line.c_str());
}

// "config:0" -> 0.
int retprobe_bit(std::string& error) {
  std::string line;
  const std::string path = std::string(kPmu) + "/format/retprobe";
  int bit = -1;
  if (!read_line(path, line) || std::sscanf(line.c_str(), "config:%d", &bit) != 1 || bit < 0 || bit > 63) {
    error = "cannot read the retprobe bit from " + path;
    return -1;
  }
  return bit;
}

std::string paranoid() {
  std::string line;
  return read_line("/proc/sys/kernel/perf_event_paranoid", line) ? line : "?";
}

}  // namespace

bool locate(const void* address, Location& out, std::string& error) {
  const auto a = reinterpret_cast<std::uint64_t>(address);
  std::ifstream maps("/proc/self/maps");
  if (!maps) {
    error = std::string("cannot read /proc/self/maps: ") + std::strerror(errno);
    return false;
  }
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long long start, end, pgoff, ino;
    char perms[5] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %4s %llx %*x:%*x %llu %n", &start, &end, perms, &pgoff, &ino,
                    &path_at) < 5)
      continue;
    if (a < start || a >= end) continue;
    if (ino == 0 || path_at <= 0 || static_cast<std::size_t>(path_at) >= line.size() || line[path_at] != '/') {
      error = "address is not in a file-backed mapping";
      return false;
    }
    out.path = line.substr(static_cast<std::size_t>(path_at));
    out.offset = pgoff + (a - start);
    return true;
  }
  error = "address is not mapped";
  return false;
}

int open_uprobe(const Location& where, bool retprobe, std::string& error) {
  const int type = pmu_type(error);
  if (type < 0) return -1;
  perf_event_attr attr;
  std::memset(&attr, 0, sizeof attr);
  attr.size = sizeof attr;
  attr.type = static_cast<std::uint32_t>(type);
  if (retprobe) {
    const int bit = retprobe_bit(error);
    if (bit < 0) return -1;
    attr.config = 1ull << bit;
  }
  attr.config1 = reinterpret_cast<std::uint64_t>(where.path.c_str());  // uprobe_path
  attr.config2 = where.offset;                                         // probe_offset
  attr.inherit = 1;  // the producers are created after the event: count them too
  // Counting mode: no sample_period, no ring buffer. pid 0 = this process, any CPU.
  const int fd = static_cast<int>(syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC));
  if (fd < 0) {
    const int e = errno;
    error = std::string("perf_event_open(uprobe PMU, ") + where.path + "+0x";
    char hex[32];
    std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(where.offset));
    error += hex;
    // 524 is the kernel-internal ENOTSUPP, which libc has no name for.
    error += std::string("): ") + (e == 524 ? "ENOTSUPP (524): the kernel cannot probe the instruction there"
                                            : std::strerror(e));
    if (e == EACCES || e == EPERM)
      error += " (the uprobe PMU needs root or CAP_PERFMON; kernel.perf_event_paranoid=" + paranoid() + ")";
    else if (e == ENOENT || e == EOPNOTSUPP)
      error += " (no uprobe PMU in this kernel)";
  }
  return fd;
}

std::uint64_t read_count(int fd) noexcept {
  std::uint64_t value = 0;
  if (read(fd, &value, sizeof value) != static_cast<ssize_t>(sizeof value)) return 0;
  return value;
}

std::string preflight() {
  Location where;
  std::string error;
  if (!locate(reinterpret_cast<const void*>(&uprobe_target_nop), where, error)) return error;
  const int fd = open_uprobe(where, false, error);
  if (fd < 0) return error;
  close(fd);
  std::string bit_error;
  if (retprobe_bit(bit_error) < 0) return bit_error;
  return "";
}

}  // namespace bench::kernel
