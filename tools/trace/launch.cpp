// SPDX-License-Identifier: MIT
// uprobe-trace's CLI: what its bare-spec and bpftrace runs share (launch.hpp).

#include "launch.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <uprobe/config.hpp>
#include <uprobe/symbols.hpp>
#include <uprobe/uprobe.hpp>

#include "bt_lang.hpp"
#include "counts.hpp"
#include "spec.hpp"

#ifndef UPROBE_TRACE_AGENT_NAME
#define UPROBE_TRACE_AGENT_NAME "libuprobe-agent.so"
#endif
#ifndef UPROBE_TRACE_LIBUPROBE_NAME
#define UPROBE_TRACE_LIBUPROBE_NAME "libuprobe.so.0"
#endif
#ifndef UPROBE_TRACE_BIN_TO_LIB
#define UPROBE_TRACE_BIN_TO_LIB "../lib"
#endif

namespace uptrace {

std::string g_dir_to_remove;

constinit thread_local bool t_die_throws = false;

void (*g_before_die)() = nullptr;

[[noreturn]] void die(const std::string& m) {
  if (t_die_throws) throw Died{m};
  if (g_before_die) g_before_die();
  std::fprintf(stderr, "uprobe-trace: %s\n", m.c_str());
  if (!g_dir_to_remove.empty()) remove_tree(g_dir_to_remove);
  std::exit(2);
}

// ---------------------------------------------------------------- the start gate

void StartGate::make() {
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fd) != 0) die(std::string("socketpair: ") + std::strerror(errno));
  fcntl(fd[0], F_SETFD, FD_CLOEXEC);
}

void StartGate::in_parent() {
  if (fd[1] >= 0) close(fd[1]);
  fd[1] = -1;
}

void StartGate::tables_ready() {
  if (fd[0] >= 0 && send(fd[0], "t", 1, MSG_NOSIGNAL) < 0) {
  }  // (a child already gone: its status says why)
}

void StartGate::open() {
  if (fd[0] >= 0 && send(fd[0], "1", 1, MSG_NOSIGNAL) < 0) {
  }  // (a child already gone: its status says why)
  shut();
}

void StartGate::shut() {
  if (fd[0] >= 0) close(fd[0]);
  fd[0] = -1;
}

// ---------------------------------------------------------------- signals

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_stop_signal = 0;

namespace {
void forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
  else g_stop_signal = sig;
}
}  // namespace

TraceSignals::TraceSignals() {
  struct sigaction dfl{}, ign{}, fwd{};
  dfl.sa_handler = SIG_DFL;
  ign.sa_handler = SIG_IGN;
  fwd.sa_handler = forward;
  sigset_t waited;
  sigemptyset(&waited);
  sigaddset(&waited, SIGINT);
  sigaddset(&waited, SIGCHLD);
  sigprocmask(SIG_BLOCK, &waited, &old_mask);
  sigaction(SIGINT, &dfl, &old_int);
  sigaction(SIGQUIT, &ign, &old_quit);
  sigaction(SIGTERM, &fwd, nullptr);
  sigaction(SIGHUP, &fwd, nullptr);
  fd = signalfd(-1, &waited, SFD_CLOEXEC);
  if (fd < 0) die(std::string("signalfd: ") + std::strerror(errno));
}

namespace {

/// glibc's own signals 32 and 33 (SIGCANCEL, SIGSETXID) as this process
/// inherited them, read before main(): glibc installs its SIGSETXID handler
/// at the first pthread_create() (SpecChecks' thread), after which this
/// process's own disposition says nothing of what the program should get.
/// (Through the system call: sigaction() refuses them.)
struct KernelSigaction {
  void* handler;
  unsigned long flags;
  void* restorer;
  unsigned long mask;
};
bool g_inherited_ignored[2] = {false, false};

__attribute__((constructor)) void note_inherited_glibc_signals() {
  for (int sig : {32, 33}) {
    KernelSigaction k{};
    g_inherited_ignored[sig - 32] = syscall(SYS_rt_sigaction, sig, nullptr, &k, sizeof k.mask) == 0 &&
                                    k.handler == reinterpret_cast<void*>(SIG_IGN);
  }
}

bool inherited_ignored(int sig) { return g_inherited_ignored[sig - 32]; }

}  // namespace

void TraceSignals::restore_in_child() const {
  for (int sig : {32, 33})  // (exec resets glibc's SIGSETXID handler, not the ignore inherited)
    if (inherited_ignored(sig)) {
      KernelSigaction ign{};
      ign.handler = reinterpret_cast<void*>(SIG_IGN);
      syscall(SYS_rt_sigaction, sig, &ign, nullptr, sizeof ign.mask);
    }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGQUIT, &old_quit, nullptr);
  signal(SIGTERM, SIG_DFL);
  signal(SIGHUP, SIG_DFL);
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
}

// ---------------------------------------------------------------- files

std::string dir_name(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

bool is_file(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string real_path(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) ? std::string(buf) : p;
}

namespace {
// The file execvp() would run for `name`, as it names it (no symbolic link
// resolved: a script's $0 is what execvp gives it); "" when none.
/// The file execvp(3) would run for `name` ("" when none); with
/// `not_executable`, the first regular file of that name in PATH that is not
/// executable instead (a shell's "Permission denied", 126).
std::string search_path(const std::string& name, bool not_executable = false) {
  if (name.find('/') != std::string::npos) return is_file(name) ? name : std::string();
  // PATH unset: execvp's default (glibc: confstr(_CS_PATH), "/bin:/usr/bin").
  // Each element, empty ones too (the current directory, as execvp takes them).
  std::string path;
  if (const char* p = getenv("PATH")) {
    path = p;
  } else {
    char def[256];
    const std::size_t n = confstr(_CS_PATH, def, sizeof def);
    path = n > 0 && n <= sizeof def ? def : "/bin:/usr/bin";
  }
  for (std::size_t at = 0;;) {
    const std::size_t colon = path.find(':', at);
    const std::string d = path.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
    const std::string c = (d.empty() ? "." : d) + "/" + name;
    if (is_file(c) && (access(c.c_str(), X_OK) == 0) != not_executable) return c;
    if (colon == std::string::npos) return {};
    at = colon + 1;
  }
}
}  // namespace

// execvp's search.
std::string find_program(const std::string& name) {
  const std::string found = search_path(name);
  return found.empty() ? found : real_path(found);
}

std::string runnable_program(const std::string& prog, int& status) {
  if (prog.find('/') != std::string::npos) {  // what execvp would say, before anything runs
    struct stat st;
    if (stat(prog.c_str(), &st) != 0) {
      const int err = errno;
      std::fprintf(stderr, "uprobe-trace: %s: %s\n", prog.c_str(), std::strerror(err));
      status = err == ENOENT ? 127 : 126;  // (a shell: 127 only for a file that is not there)
      return "";
    }
    const char* why = S_ISDIR(st.st_mode)           ? "is a directory"
                      : !S_ISREG(st.st_mode)        ? "not a regular file"
                      : access(prog.c_str(), X_OK) ? "not executable (Permission denied)"
                                                    : nullptr;
    if (why) {
      std::fprintf(stderr, "uprobe-trace: %s: %s\n", prog.c_str(), why);
      status = 126;
      return "";
    }
  }
  std::string path = find_program(prog);
  if (path.empty() && !search_path(prog, true).empty()) {  // only a file that is not executable: a shell's 126
    std::fprintf(stderr, "uprobe-trace: %s: Permission denied\n", prog.c_str());
    status = 126;
    return "";
  }
  if (path.empty()) {
    std::fprintf(stderr, "uprobe-trace: %s: command not found\n", prog.c_str());
    status = 127;
  }
  return path;
}

namespace {
/// Up to `n` bytes of file `p` at `off` (open + pread: this is on the way to
/// the program's start); -1 when it cannot be read.
ssize_t read_at(const std::string& p, void* buf, std::size_t n, off_t off) {
  const int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const ssize_t got = pread(fd, buf, n, off);
  close(fd);
  return got;
}
}  // namespace

bool is_elf(const std::string& p) {
  char m[SELFMAG] = {};
  return read_at(p, m, sizeof m, 0) == SELFMAG && std::memcmp(m, ELFMAG, SELFMAG) == 0;
}

// (What the header says: ELF with PT_INTERP, or a #! script run by one.)
bool loads_the_agent(const std::string& path, int depth) {
  struct stat st;
  if (depth > 2 || stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (st.st_mode & (S_ISUID | S_ISGID)) return false;
  if (getxattr(path.c_str(), "security.capability", nullptr, 0) >= 0) return false;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct Close {
    int fd;
    ~Close() { close(fd); }
  } closer{fd};
  char head[256] = {};
  const ssize_t n = pread(fd, head, sizeof head, 0);
  if (n >= 2 && head[0] == '#' && head[1] == '!') {
    std::string line(head + 2, static_cast<std::size_t>(n - 2));
    line = line.substr(0, line.find('\n'));
    const std::size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos) return false;
    const std::string interp = line.substr(b, line.find_first_of(" \t", b) - b);
    return interp.find('/') != std::string::npos && loads_the_agent(interp, depth + 1);
  }
  Elf64_Ehdr eh;
  if (n < static_cast<ssize_t>(sizeof eh) || std::memcmp(head, ELFMAG, SELFMAG) != 0) return false;
  std::memcpy(&eh, head, sizeof eh);
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr)) return false;
  std::vector<Elf64_Phdr> ph(eh.e_phnum);  // (the whole table in one read)
  const auto bytes = static_cast<ssize_t>(ph.size() * sizeof(Elf64_Phdr));
  if (pread(fd, ph.data(), static_cast<std::size_t>(bytes), static_cast<off_t>(eh.e_phoff)) != bytes) return false;
  // (No PT_INTERP: statically linked.)
  return std::any_of(ph.begin(), ph.end(), [](const Elf64_Phdr& p) { return p.p_type == PT_INTERP; });
}

void remove_tree(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") unlink((dir + "/" + n).c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

// The trace's private directory (counts file, records, program): under
// $TMPDIR when it is set, else in /dev/shm when that is a writable tmpfs
// directory, else under /tmp. Memory-backed, its files cost no journal: a
// shared page a traced thread first writes, a record file, the final unlink
// are page-cache operations only (with /tmp on ext4, a traced process's
// start took ~20% longer). Storage is reserved before any page is written
// (fallocate: create_counts_file(), the agent's alloc_block()), so a full
// filesystem gives unrecorded hits, never a SIGBUS in the program.
std::string make_trace_dir() {
  std::string base;
  if (const char* tmp = getenv("TMPDIR"); tmp && *tmp) {
    base = tmp;
  } else {
    struct statfs fs;
    base = statfs("/dev/shm", &fs) == 0 && fs.f_type == TMPFS_MAGIC && access("/dev/shm", W_OK | X_OK) == 0
               ? "/dev/shm"
               : "/tmp";
  }
  const std::string tmpl = base + "/uprobe-trace.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back(0);
  if (!mkdtemp(buf.data())) die("mkdtemp " + tmpl + ": " + std::strerror(errno));
  return buf.data();
}

int create_counts_file(const std::string& dir) {
  const std::string path = dir + "/" + counts::kFileName;
  auto fail = [&](const std::string& what) {
    const std::string m = path + ": " + what + ": " + std::strerror(errno);
    remove_tree(dir);
    die(m);
  };
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) fail("create");
  if (ftruncate(fd, static_cast<off_t>(counts::kHeaderBytes)) != 0) fail("ftruncate");
  // The header's first page, which this writes (the rest is sparse: a page
  // of the tables is reserved by the process that first writes it).
  if (fallocate(fd, 0, 0, static_cast<off_t>(counts::kPage)) != 0 && errno != EOPNOTSUPP && errno != ENOSYS)
    fail("fallocate");
  void* m = mmap(nullptr, counts::kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) fail("mmap");
  auto* h = static_cast<counts::Header*>(m);
  h->page_size = counts::kPage;
  h->next_page.store(counts::kHeaderPages);
  h->bt_start_ns = bt::now_ns();
  h->magic = counts::kMagic;
  munmap(m, counts::kHeaderBytes);
  return fd;
}

// ---------------------------------------------------------------- the traced program

namespace {

std::string find_agent() {
  if (const char* a = getenv("UPROBE_TRACE_AGENT")) return a;
  const std::string dir = dir_name(self_exe());
  for (const std::string& c : {dir + "/" + UPROBE_TRACE_AGENT_NAME,
                               dir + "/" + UPROBE_TRACE_BIN_TO_LIB + "/" + UPROBE_TRACE_AGENT_NAME})
    if (is_file(c)) return real_path(c);
  die(std::string("cannot find ") + UPROBE_TRACE_AGENT_NAME + " next to " + dir + " (set UPROBE_TRACE_AGENT)");
}

// libuprobe.so, preloaded too, so that its sigaction()/signal()/dlopen()
// interposition comes before libc's. Without it the traced program would
// load libuprobe after libc, as the agent's dependency, where every probe is
// refused.
std::string find_libuprobe(const std::string& agent) {
  // As this process loaded it, when it did (a build that links it shared):
  // the file mapped there (/proc/self/maps: an absolute path, also when the
  // dynamic linker found it through a relative LD_LIBRARY_PATH, whose
  // dli_fname is relative).
  // (dladdr() first: no read of the maps when it is linked in.)
  Dl_info in{};
  if (dladdr(reinterpret_cast<const void*>(&uprobe::stats), &in) && in.dli_fname &&
      base_name(in.dli_fname).rfind("libuprobe.so", 0) == 0) {
    try {
      return real_path(uprobe::resolve_address(reinterpret_cast<const void*>(&uprobe::stats)).path);
    } catch (const uprobe::Error&) {
    }
  }
  // Linked into this program (libuprobe.a): the agent's, where its RUNPATH
  // ($ORIGIN) finds it installed, or the build tree's, one directory up.
  const std::string dir = dir_name(agent);
  for (const std::string& c : {dir + "/" + UPROBE_TRACE_LIBUPROBE_NAME, dir + "/../" + UPROBE_TRACE_LIBUPROBE_NAME})
    if (is_file(c)) return real_path(c);
  die(std::string("cannot find ") + UPROBE_TRACE_LIBUPROBE_NAME + " next to " + agent + " or in the directory above " +
      "(the traced program must load it before libc, or every probe is refused)");
}

}  // namespace

Preload find_preload() {
  Preload p;
  p.agent = find_agent();
  p.libuprobe = find_libuprobe(p.agent);
  for (const std::string& f : {p.agent, p.libuprobe})  // LD_PRELOAD separates with ':' and blanks
    if (f.find_first_of(": \t") != std::string::npos) die("cannot preload " + f + ": its path has ':' or a blank");
  return p;
}

namespace {

/// `environ` with `set`'s variables put in (NAME=VALUE each; `unset` left out).
std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    if (std::none_of(set.begin(), set.end(), [&](const auto& v) { return v.first == name; })) out.emplace_back(kv);
  }
  for (const auto& [k, v] : set) out.push_back(k + "=" + v);
  return out;
}

/// posix_spawn() of `file` (a vfork: no copy of this process's page tables
/// to make and tear down again, ~0.1-0.2 ms of the start on a VM), with the
/// signal dispositions and mask the program would get from uprobe-trace's
/// caller (restore_in_child()'s). -1 when it cannot run it that way (the
/// caller forks instead, for execvp's own errors and /bin/sh fallback).
pid_t spawn(const std::string& file, std::vector<char*>& args, const std::vector<std::string>& env,
            const TraceSignals& sigs) {
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawnattr_t attr;
  if (posix_spawnattr_init(&attr) != 0) return -1;
  // Dispositions: exec resets handled signals (SIGTERM, SIGHUP here) and
  // keeps ignored ones; SIGINT (default here) and SIGQUIT (ignored here)
  // get what the caller had: default unless it ignored them. SIGINT is
  // blocked meanwhile: made ignored for the spawn when the caller ignored it.
  sigset_t dfl;
  sigemptyset(&dfl);
  sigaddset(&dfl, SIGTERM);
  sigaddset(&dfl, SIGHUP);
  // glibc's own signals (SIGCANCEL 32, SIGSETXID 33), which sigaddset()
  // refuses: glibc 2.36's posix_spawn() makes them ignored in the program;
  // the program gets what this process inherited (inherited_ignored()),
  // ignored or default. Default unless ignored then.
  for (int sig : {32, 33})
    if (!inherited_ignored(sig)) dfl.__val[0] |= 1UL << (sig - 1);
  if (sigs.old_quit.sa_handler != SIG_IGN) sigaddset(&dfl, SIGQUIT);
  const bool int_ignored = sigs.old_int.sa_handler == SIG_IGN;
  if (!int_ignored) sigaddset(&dfl, SIGINT);
  posix_spawnattr_setsigdefault(&attr, &dfl);
  posix_spawnattr_setsigmask(&attr, &sigs.old_mask);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  struct sigaction ign{}, here{};
  ign.sa_handler = SIG_IGN;
  if (int_ignored) sigaction(SIGINT, &ign, &here);
  pid_t child = -1;
  const int err = posix_spawn(&child, file.c_str(), nullptr, &attr, args.data(), envp.data());
  if (int_ignored) sigaction(SIGINT, &here, nullptr);
  posix_spawnattr_destroy(&attr);
  return err == 0 ? child : -1;
}

}  // namespace

pid_t start_traced(const std::vector<std::string>& cmd, const Preload& preload, const AgentEnv& env,
                   const TraceSignals& sigs, StartGate& gate, bool gated, int& exec_errno) {
  const char* orig = getenv("LD_PRELOAD");
  std::string preloaded = (preload.libuprobe.empty() ? "" : preload.libuprobe + ":") + preload.agent;
  if (orig && *orig) preloaded.append(":").append(orig);
  std::vector<char*> args;
  for (const auto& a : cmd) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  if (gated) gate.make();
  // The file execvp() would find, run without its walk along PATH (a
  // failed execve() per directory before it).
  const std::string exec_file = search_path(cmd[0]);
  std::vector<std::pair<std::string, std::string>> vars = {
      {kEnvSpecs, env.specs}, {kEnvOut, env.dir}, {kEnvFollow, env.follow ? "1" : "0"},
      {kEnvOrigPreload, orig ? orig : "-"}, {"LD_PRELOAD", preloaded}};
  if (!env.program_file.empty()) vars.emplace_back(kEnvProgram, env.program_file);
  if (env.tables) vars.emplace_back(kEnvTables, env.kept_tables.empty() ? "1" : "1:" + env.kept_tables);
  if (gate.fd[1] >= 0) vars.emplace_back(kEnvGate, std::to_string(gate.fd[1]));
  g_dir_to_remove = env.dir;
  exec_errno = 0;
  if (!exec_file.empty()) {
    const pid_t child = spawn(exec_file, args, child_environment(vars), sigs);
    if (child > 0) {
      gate.in_parent();
      return child;
    }
  }
  // The child reports a failed exec through this pipe (closed by a
  // successful one): no "no process loaded the agent" for a program that never ran.
  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) die(std::string("pipe: ") + std::strerror(errno));
  const pid_t child = fork();
  if (child < 0) die(std::string("fork: ") + std::strerror(errno));
  if (child == 0) {
    close(exec_pipe[0]);
    sigs.restore_in_child();
    if (gate.fd[0] >= 0) close(gate.fd[0]);
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
    // An ELF file the kernel refuses (ENOEXEC) is not handed to /bin/sh as
    // execvp() would: "Exec format error", 126, as a shell says it.
    if (!exec_file.empty() && is_elf(exec_file)) execv(exec_file.c_str(), args.data());
    else execvp(args[0], args.data());
    const int err = errno;
    std::fprintf(stderr, "uprobe-trace: %s: %s\n", cmd[0].c_str(), std::strerror(err));
    if (write(exec_pipe[1], &err, sizeof err) < 0) {
    }
    _exit(err == ENOENT ? 127 : 126);
  }
  close(exec_pipe[1]);
  gate.in_parent();
  while (read(exec_pipe[0], &exec_errno, sizeof exec_errno) < 0 && errno == EINTR) {
  }
  close(exec_pipe[0]);
  return child;
}

/// The program's status as uprobe-trace's own: its exit code; or, when a
/// signal ended it, the same signal raised here once the report is out (core
/// dumps off: the program dumped its own), as timeout(1) and strace do, so
/// that a caller sees a death by signal, not an exit (128 + N if the signal
/// does not end this process).
int pass_on_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (!WIFSIGNALED(status)) return 1;
  const int sig = WTERMSIG(status);
  std::fflush(nullptr);
  const rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  std::signal(sig, SIG_DFL);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, sig);
  sigprocmask(SIG_UNBLOCK, &only, nullptr);
  raise(sig);
  return 128 + sig;
}

bool crashed(int status) {
  if (!WIFSIGNALED(status)) return false;
  switch (WTERMSIG(status)) {
    case SIGQUIT: case SIGILL: case SIGTRAP: case SIGABRT: case SIGBUS: case SIGFPE: case SIGSEGV: case SIGSYS:
    case SIGXCPU: case SIGXFSZ:
      return true;
    default:
      return false;
  }
}

std::vector<pid_t> children_left() {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc/self/task");
  if (!d) return out;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::FILE* f = std::fopen(("/proc/self/task/" + std::string(e->d_name) + "/children").c_str(), "re");
    if (!f) continue;
    for (long pid; std::fscanf(f, "%ld", &pid) == 1;) out.push_back(static_cast<pid_t>(pid));
    std::fclose(f);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string left_running_message(int status, const std::vector<pid_t>& left) {
  if (left.empty()) return "";
  const char* name = sigabbrev_np(WTERMSIG(status));
  std::string pids;
  for (pid_t p : left) pids += (pids.empty() ? "" : ", ") + std::to_string(p);
  return "uprobe-trace: the program died by SIG" + std::string(name ? name : std::to_string(WTERMSIG(status)).c_str()) +
         "; " + std::to_string(left.size()) + (left.size() == 1 ? " process it started still runs" : " processes it started still run") +
         ", not waited for (pid" + (left.size() == 1 ? " " : "s ") + pids + "): " +
         (left.size() == 1 ? "its" : "their") + " counts so far are in the report\n";
}

}  // namespace uptrace
