// SPDX-License-Identifier: MIT
// libuprobe-agent.so's exec*() wrappers: the counts of an image that execs
// would be lost, so the record is written before the exec and taken back if
// the exec fails (agent.hpp). Not in a vfork() child: it shares the parent's
// memory, and the parent reports those counts.
//
// _exit(), _Exit() and quick_exit() are not interposed: writing the counts
// allocates, and _exit() is async-signal-safe (a program may call it from a
// signal handler that interrupted malloc). Their counts are lost; the CLI
// names such processes.

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <string>
#include <vector>

#include "agent.hpp"

namespace {

using uptrace::agent::Scope;

class ExecFlush {
 public:
  ExecFlush() : file_(uptrace::agent::write_before_exec()) {}
  ~ExecFlush() {  // the exec failed: this image goes on counting
    Scope scope;
    const int e = errno;
    if (!file_.empty()) uptrace::agent::exec_failed(file_);
    std::string().swap(file_);  // freed here, not by the member's destructor (outside the scope)
    errno = e;
  }
  ExecFlush(const ExecFlush&) = delete;
  ExecFlush& operator=(const ExecFlush&) = delete;

 private:
  std::string file_;
};

template <typename F>
F next_fn(const char* name) {
  Scope scope;
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

// execl*(): the argument vector is the agent's (glibc's own execl uses the
// stack): built and freed inside a scope.
std::vector<char*>* new_argv(const char* arg0, va_list ap, char*** envp) {
  Scope scope;
  auto* argv = new std::vector<char*>{const_cast<char*>(arg0)};
  while (argv->back() != nullptr) argv->push_back(va_arg(ap, char*));
  if (envp) *envp = va_arg(ap, char**);
  return argv;
}

int free_argv(std::vector<char*>* argv, int ret) {
  Scope scope;
  const int e = errno;
  delete argv;
  errno = e;
  return ret;
}

using execve_t = int (*)(const char*, char* const[], char* const[]);
using execv_t = int (*)(const char*, char* const[]);

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int execve(const char* path, char* const argv[], char* const envp[]) {
  static auto real = next_fn<execve_t>("execve");
  ExecFlush f;
  return real(path, argv, envp);
}

__attribute__((visibility("default"))) int execv(const char* path, char* const argv[]) {
  static auto real = next_fn<execv_t>("execv");
  ExecFlush f;
  return real(path, argv);
}

__attribute__((visibility("default"))) int execvp(const char* file, char* const argv[]) {
  static auto real = next_fn<execv_t>("execvp");
  ExecFlush f;
  return real(file, argv);
}

__attribute__((visibility("default"))) int execvpe(const char* file, char* const argv[], char* const envp[]) {
  static auto real = next_fn<execve_t>("execvpe");
  ExecFlush f;
  return real(file, argv, envp);
}

__attribute__((visibility("default"))) int fexecve(int fd, char* const argv[], char* const envp[]) {
  static auto real = next_fn<int (*)(int, char* const[], char* const[])>("fexecve");
  ExecFlush f;
  return real(fd, argv, envp);
}

__attribute__((visibility("default"))) int execl(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*>* argv = new_argv(arg, ap, nullptr);
  va_end(ap);
  return free_argv(argv, execv(path, argv->data()));
}

__attribute__((visibility("default"))) int execlp(const char* file, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*>* argv = new_argv(arg, ap, nullptr);
  va_end(ap);
  return free_argv(argv, execvp(file, argv->data()));
}

__attribute__((visibility("default"))) int execle(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  char** envp = nullptr;
  std::vector<char*>* argv = new_argv(arg, ap, &envp);
  va_end(ap);
  return free_argv(argv, execve(path, argv->data(), envp));
}

}  // extern "C"
