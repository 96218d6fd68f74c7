// SPDX-License-Identifier: MIT
// A registration while another thread is inside dlopen() (dl_lock_child.cpp,
// dl_lock_lib.c): the loading thread holds the dynamic linker's lock while
// the new library's constructor runs, and that constructor registers a
// probe. libuprobe must never ask the dynamic linker (dlsym, dladdr,
// dlopen, a thread_local's destructor registration) with its registry mutex
// held: the other thread's registration waits for the mutex, and the
// process hung (a bug report: both threads blocked for good). Here the main
// thread's first registrations of the process run to the end while the
// constructor holds the lock (none of them needs it), then the constructor
// registers and hits its own probe. Run in a child with a deadline: a hang
// is a failure, not a hung suite.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace {

/// The child's standard output and exit status (-1: killed at the deadline).
std::pair<std::string, int> run_child(const char* child, const char* wait_ms, std::chrono::seconds deadline) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {"pipe failed", -2};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    execl(child, child, DL_LOCK_LIB, wait_ms, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  std::string out;
  int status = 0;
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    char buf[512];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::steady_clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      close(fds[0]);
      return {out, -1};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ssize_t n;
  char buf[512];
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
}

TEST(DlLock, ARegistrationNeverWaitsForTheDynamicLinkerWhileAConstructorRegisters) {
  const auto [out, status] = run_child(DL_LOCK_CHILD, "10000", std::chrono::seconds(60));
  ASSERT_NE(status, -1) << "hung (killed after 60 s): " << out;
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(out, "elfutils_at_start=1 a_done_while_locked=1 a_hits=2 a_ret=22 a_refused=1 ctor_hits=1\n");
}

// elfutils deferred to the first ELF read (uprobe::defer_elfutils(), as
// uprobe-trace's agent does): the main thread's first registration must load
// it, a dlopen() that waits for the constructor's lock -- before the
// registry mutex, so the constructor's nested dlopen (a resync) and its
// registration go through when its wait (1 s) ends, and then the main
// thread's (a bug report: both threads blocked for good).
TEST(DlLock, WithElfutilsDeferredTheFirstReadLoadsItOutsideTheRegistryMutex) {
  const auto [out, status] = run_child(DL_LOCK_CHILD_DEFERRED, "1000", std::chrono::seconds(60));
  ASSERT_NE(status, -1) << "hung (killed after 60 s): " << out;
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(out, "elfutils_at_start=0 a_done_while_locked=0 a_hits=2 a_ret=22 a_refused=1 ctor_hits=1\n");
}

}  // namespace
