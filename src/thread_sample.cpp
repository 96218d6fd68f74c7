// SPDX-License-Identifier: MIT
#include "thread_sample.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "arch.hpp"
#include "format.hpp"

namespace uprobe::detail {

namespace {

constexpr long kTimeoutNs = 2'000'000;

bool inside(const std::vector<AddrRange>& ranges, std::uint64_t ip) {
  for (const AddrRange& r : ranges)
    if (ip > r.first && ip < r.second) return true;  // at r.first the thread meets the int3 or the jump
  return false;
}

constexpr int kRunning = 0, kBlocked = 1, kGone = 2;

/// The user rip of a thread blocked in the kernel, from
/// /proc/self/task/<tid>/syscall ("nr a1..a6 sp pc" in a system call, "-1 sp
/// pc" blocked elsewhere, e.g. in a page fault): kBlocked with `ip`;
/// kRunning when it is runnable ("running": on a CPU or preempted); kGone
/// when the thread has exited.
int blocked_ip(long tid, std::uint64_t& ip) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", tid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? kGone : kRunning;
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return kGone;
  buf[n] = '\0';
  if (std::strncmp(buf, "running", 7) == 0) return kRunning;
  const char* last = std::strrchr(buf, ' ');
  if (!last) return kRunning;
  char* end = nullptr;
  ip = std::strtoull(last + 1, &end, 16);
  return end != last + 1 ? kBlocked : kRunning;
}

long now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1'000'000'000L + ts.tv_nsec;
}

}  // namespace

bool threads_outside(const std::vector<AddrRange>& ranges, std::string& why) {
  why.clear();
  if (ranges.empty()) return true;
  const long self = ::syscall(SYS_gettid);
  DIR* d = ::opendir("/proc/self/task");
  if (!d) {
    why = std::string("cannot list the threads (/proc/self/task): ") + std::strerror(errno);
    return false;
  }
  std::vector<long> tids;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9') tids.push_back(std::strtol(e->d_name, nullptr, 10));
  ::closedir(d);
  // A thread that just kept running through a whole poll is not polled again
  // for 50 ms (one read only): attaching many entries while a thread computes
  // does not wait 2 ms per entry.
  static long busy_tid = 0, busy_until = 0;
  const long start = now_ns();
  const long deadline = start + kTimeoutNs;
  for (long tid : tids) {
    if (tid == self) continue;
    std::uint64_t ip = 0;
    for (;;) {
      const int st = blocked_ip(tid, ip);
      if (st == kGone) break;
      if (st == kBlocked) {
        if (inside(ranges, ip)) {
          why = "thread " + std::to_string(tid) + " is stopped at " + hex(ip) +
                ", inside the instructions the jump would displace";
          return false;
        }
        break;
      }
      if (now_ns() >= deadline || (tid == busy_tid && start < busy_until)) {
        if (tid != busy_tid || start >= busy_until) {
          busy_tid = tid;
          busy_until = now_ns() + 50'000'000;
        }
        why = "thread " + std::to_string(tid) + " kept running for " + std::to_string(kTimeoutNs / 1000000) +
              " ms, so it could not be observed outside the displaced instructions";
        return false;
      }
      ::sched_yield();
    }
  }
  return true;
}

}  // namespace uprobe::detail
