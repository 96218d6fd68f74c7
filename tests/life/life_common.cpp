// SPDX-License-Identifier: MIT
#include "life_common.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

extern "C" {
long (*g_outer_body)(long) = nullptr;
__attribute__((noinline)) long lf_outer_body(long a) {
  long (*f)(long) = g_outer_body;
  long r = f ? f(a) : a + 1000;
  __asm__ volatile("" : "+r"(r));  // not a tail call: this frame stays on the stack
  return r;
}
}

namespace lifetest {

void use_kind(Kind k) {
  uprobe::Config c = uprobe::configuration();
  c.optimize = k == Kind::optimized;
  uprobe::configure(c);
}

uprobe::Stats stats_delta(const uprobe::Stats& a, const uprobe::Stats& b) {
  uprobe::Stats d;
  d.hits = b.hits - a.hits;
  d.recursion_misses = b.recursion_misses - a.recursion_misses;
  d.emulated = b.emulated - a.emulated;
  d.out_of_line = b.out_of_line - a.out_of_line;
  d.redirected = b.redirected - a.redirected;
  d.restarts = b.restarts - a.restarts;
  d.locked_lookups = b.locked_lookups - a.locked_lookups;
  d.foreign_traps = b.foreign_traps - a.foreign_traps;
  d.return_hits = b.return_hits - a.return_hits;
  d.return_misses = b.return_misses - a.return_misses;
  d.return_dropped = b.return_dropped - a.return_dropped;
  d.optimized = b.optimized - a.optimized;
  return d;
}

std::string stats_str(const uprobe::Stats& s) {
  std::ostringstream os;
  os << "{hits " << s.hits << ", optimized " << s.optimized << ", emulated " << s.emulated << ", out_of_line "
     << s.out_of_line << ", redirected " << s.redirected << ", restarts " << s.restarts << ", foreign_traps "
     << s.foreign_traps << ", recursion_misses " << s.recursion_misses << ", return_hits " << s.return_hits
     << ", return_misses " << s.return_misses << ", return_dropped " << s.return_dropped << "}";
  return os.str();
}

std::string status_str(int st) {
  if (WIFEXITED(st)) return "exited " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st))
    return std::string("killed by signal ") + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) + ")";
  return "status " + std::to_string(st);
}

void write_all(int fd, const void* p, std::size_t len) {
  const char* c = static_cast<const char*>(p);
  while (len) {
    ssize_t n = ::write(fd, c, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    c += n;
    len -= static_cast<std::size_t>(n);
  }
}

std::size_t read_all(int fd, void* p, std::size_t len) {
  char* c = static_cast<char*>(p);
  std::size_t got = 0;
  while (got < len) {
    ssize_t n = ::read(fd, c + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  return got;
}

int wait_child(pid_t pid, int seconds) {
  int status = 0;
  for (int i = 0; i < seconds * 100; ++i) {
    pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) return status;
    if (w < 0 && errno != EINTR) return -1;
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return status;
}

}  // namespace lifetest
