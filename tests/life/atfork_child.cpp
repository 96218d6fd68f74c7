// SPDX-License-Identifier: MIT
// A program whose own pthread_atfork handlers call libuprobe's API, registered
// before libuprobe's (which come with its first registration): in the
// prepare handler libuprobe's prepare handlers have run and hold its locks
// for the fork, in the parent and child handlers they still do (those run in
// registration order, the program's first). Every call must return, with
// EDEADLK and why, not wait for a lock its own fork() holds. Prints what the
// calls returned; life.CApiFork.ApiCallsFromAtforkHandlersReturnAnError runs it.

#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include <uprobe/uprobe.h>
#include <uprobe/uprobe.hpp>

extern "C" __attribute__((noipa)) long af_target(long x) {
  __asm__ volatile("");
  return x + 1;
}

namespace {

int nop_hit(uprobe_consumer*, uprobe_regs*, std::uint64_t*) { return 0; }

struct Nop : uprobe::Consumer {
  uprobe::Action handler(uprobe::Regs&) override { return uprobe::Action::keep; }
};

uprobe_consumer g_other{};
Nop g_nop;
std::string g_prepare, g_parent;

/// A C API registration and a C++ one, each as "rc" or the error's errno name.
std::string try_both() {
  std::string out;
  uprobe_probe* p = nullptr;
  const int rc = uprobe_register_addr(reinterpret_cast<const void*>(&af_target), &g_other, &p);
  out += "C " + std::string(rc == -EDEADLK ? "EDEADLK" : std::to_string(rc));
  if (rc == 0) uprobe_unregister(p, &g_other);
  try {
    uprobe::Uprobe* u = uprobe::register_uprobe(reinterpret_cast<const void*>(&af_target), g_nop);
    out += ", C++ registered";
    uprobe::unregister_uprobe(u, g_nop);
  } catch (const uprobe::Error& e) {
    out += std::string(", C++ ") + (e.code() == uprobe::Errc::in_handler ? "in_handler" : "other: ") +
           (e.code() == uprobe::Errc::in_handler ? "" : e.what());
  }
  return out;
}

void prepare() { g_prepare = try_both(); }
void parent() { g_parent = try_both(); }
void child() {
  const std::string c = try_both();
  _exit(c == "C EDEADLK, C++ in_handler" ? 0 : 3);
}

}  // namespace

int main() {
  if (pthread_atfork(prepare, parent, child) != 0) return 10;  // before libuprobe's
  g_other.handler = nop_hit;
  uprobe_consumer first{};
  first.handler = nop_hit;
  uprobe_probe* p = nullptr;
  if (uprobe_register_addr(reinterpret_cast<const void*>(&af_target), &first, &p) != 0) return 11;
  const pid_t pid = fork();
  if (pid == 0) _exit(4);  // (the child handler exits first)
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 12;
  std::printf("prepare: %s\nparent: %s\nchild: exit %d\n", g_prepare.c_str(), g_parent.c_str(),
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  // After the fork, the API works again.
  if (af_target(1) != 2 || uprobe_unregister(p, &first) != 0) return 13;
  std::printf("after: %s\n", try_both().c_str());
  return 0;
}
