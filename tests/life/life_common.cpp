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

testing::Environment* windows_off_environment() {
  class WindowsOff : public testing::Environment {
   public:
    void SetUp() override {
      uprobe::Config c = uprobe::configuration();
      c.optimize_windows = false;
      uprobe::configure(c);
    }
  };
  return new WindowsOff;
}

}  // namespace lifetest
