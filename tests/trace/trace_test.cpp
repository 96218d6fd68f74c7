// SPDX-License-Identifier: MIT
// uprobe-trace end to end: the CLI runs tests/trace/fixture.c (and, when
// installed, python3.11 and postgres) with the agent preloaded; every count
// is checked exactly against what the program did.

#include <elf.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/magic.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <chrono>
#include <string>
#include <vector>

#include "early.h"

namespace {

const std::string kTrace = UPROBE_TRACE_BIN;
const std::string kFixture = TRACE_FIXTURE;
const std::string kFibPy = TRACE_FIB_PY;
const std::string kEarly = TRACE_EARLY, kEarlyLib = TRACE_EARLY_LIB;
const std::string kInitFirst = TRACE_INITFIRST, kInitFirstLib = TRACE_INITFIRST_LIB;
const std::string kPython = "/usr/bin/python3.11";
const std::string kPostgres = "/usr/lib/postgresql/15/bin/postgres";

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string real(const std::string& p) {
  char b[PATH_MAX];
  return realpath(p.c_str(), b) ? b : p;
}

struct Result {
  int status = -1;  // exit code, or 128 + signal
  int signal = 0;   // the signal that ended uprobe-trace itself, 0 when it exited
  std::string out, err, report;
};

class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/trace-test.XXXXXX";
    path_ = mkdtemp(t);
  }
  ~TempDir() {
    for (const char* f : {"out", "err", "report"}) unlink((path_ + "/" + f).c_str());
    rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Result run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
           bool with_report = false) {
  TempDir d;
  std::vector<std::string> args = argv;
  if (with_report) {  // -o goes before "--"
    auto it = std::find(args.begin(), args.end(), std::string("--"));
    args.insert(it, {"-o", d.path() + "/report"});
  }
  pid_t p = fork();
  if (p == 0) {
    int o = open((d.path() + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open((d.path() + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1), dup2(e, 2);
    for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(const_cast<char*>(a.c_str()));
    cargs.push_back(nullptr);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  int st = 0;
  waitpid(p, &st, 0);
  Result r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  r.out = slurp(d.path() + "/out");
  r.err = slurp(d.path() + "/err");
  r.report = slurp(d.path() + "/report");
  return r;
}

// uprobe-trace -e SPEC... [opts] -o REPORT -- PROG ARGS...
Result trace(const std::vector<std::string>& specs, const std::vector<std::string>& prog,
             const std::vector<std::string>& opts = {}, const std::vector<std::string>& env = {}) {
  std::vector<std::string> a{kTrace};
  for (const auto& s : specs) a.insert(a.end(), {"-e", s});
  a.insert(a.end(), opts.begin(), opts.end());
  a.push_back("--");
  a.insert(a.end(), prog.begin(), prog.end());
  return run(a, env, true);
}

// uprobe-trace -e SPEC... -o REPORT -- PROG ARGS... as a shell runs a
// foreground job (a process group of its own), interrupted as the terminal
// does on ^C: once the program has printed `ready`, SIGINT to the whole
// group -- once, or (`until_exit`) every 100 ms until uprobe-trace exits.
// What is left of the group afterwards is killed.
Result trace_interrupted(const std::vector<std::string>& specs, const std::vector<std::string>& prog,
                         const std::string& ready, bool until_exit) {
  TempDir d;
  std::vector<std::string> args{kTrace, "-o", d.path() + "/report"};
  for (const auto& s : specs) args.insert(args.end(), {"-e", s});
  args.push_back("--");
  args.insert(args.end(), prog.begin(), prog.end());
  pid_t p = fork();
  if (p == 0) {
    setpgid(0, 0);
    int o = open((d.path() + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open((d.path() + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1), dup2(e, 2);
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(const_cast<char*>(a.c_str()));
    cargs.push_back(nullptr);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  setpgid(p, p);
  for (int i = 0; i < 3000 && slurp(d.path() + "/out").find(ready) == std::string::npos; ++i) usleep(10000);
  kill(-p, SIGINT);
  int st = 0;
  pid_t done = 0;
  for (int i = 0; until_exit && i < 300 && (done = waitpid(p, &st, WNOHANG)) == 0; ++i) {
    usleep(100000);
    kill(-p, SIGINT);
  }
  if (done != p) waitpid(p, &st, 0);
  kill(-p, SIGKILL);
  Result r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  r.out = slurp(d.path() + "/out");
  r.err = slurp(d.path() + "/err");
  r.report = slurp(d.path() + "/report");
  return r;
}

std::map<std::string, long> hits(const std::string& report) {
  std::map<std::string, long> m;
  static const std::regex re(R"(^@hits\[(.*)\]: (\d+)$)");
  std::istringstream in(report);
  for (std::string line; std::getline(in, line);) {
    std::smatch sm;
    if (std::regex_match(line, sm, re)) m[sm[1]] = std::stol(sm[2]);
  }
  return m;
}

// (key, pid) -> sum over threads; and number of (key, pid, tid) rows.
struct PerThread {
  std::map<std::pair<std::string, long>, long> per_pid;
  std::vector<long> thread_counts;
};

PerThread per_thread(const std::string& report, const std::string& key) {
  PerThread r;
  static const std::regex re(R"(^@hits_per_thread\[(.*), (\d+), (-?\d+)\]: (\d+)$)");
  std::istringstream in(report);
  for (std::string line; std::getline(in, line);) {
    std::smatch sm;
    if (!std::regex_match(line, sm, re) || sm[1] != key) continue;
    r.per_pid[{sm[1], std::stol(sm[2])}] += std::stol(sm[4]);
    r.thread_counts.push_back(std::stol(sm[4]));
  }
  return r;
}

struct HistRow {
  std::string label;
  long count;
};

std::vector<HistRow> hist(const std::string& report, const std::string& key) {
  std::vector<HistRow> rows;
  std::istringstream in(report);
  bool inside = false;
  static const std::regex row(R"(^(\[[^\]]*[\])])\s+(\d+) \|@*\s*\|$)");
  for (std::string line; std::getline(in, line);) {
    if (line == "@latency_ns[" + key + "]:") {
      inside = true;
      continue;
    }
    if (!inside) continue;
    std::smatch sm;
    if (!std::regex_match(line, sm, row)) break;
    rows.push_back({sm[1], std::stol(sm[2])});
  }
  return rows;
}

// The key of the libc probe of `kind` on `sym` (the agent names libc by its real path).
std::string libc_key(const std::map<std::string, long>& h, const std::string& kind, const std::string& sym) {
  for (const auto& [k, n] : h)
    if (k.rfind(kind + ":", 0) == 0 && k.find("/libc.so") != std::string::npos &&
        k.size() > sym.size() && k.compare(k.size() - sym.size() - 1, std::string::npos, ":" + sym) == 0)
      return k;
  return {};
}

std::string dump(const Result& r) { return "status " + std::to_string(r.status) + "\n--- stdout\n" + r.out +
                                           "--- stderr\n" + r.err + "--- report\n" + r.report; }

const std::string& fixture() {
  static const std::string p = real(kFixture);
  return p;
}

bool has_usdt_notes(const std::string& path) {
  Result r = run({"/usr/bin/readelf", "-n", path});
  return r.status == 0 && r.out.find("stapsdt") != std::string::npos;
}

// ---------------------------------------------------------------- fixture program

TEST(Trace, FunctionAndMallocCountsAreExact) {
  const long n = 1000, m = 500;
  Result plain = run({kFixture, "basic", std::to_string(n), std::to_string(m)});
  ASSERT_EQ(plain.status, 0);
  ASSERT_EQ(plain.out, "fn=1000\nmalloc=500\n");

  Result r = trace({"uprobe:trace_fixture:trace_fn", "uprobe:libc:malloc", "uretprobe:libc:malloc"},
                   {kFixture, "basic", std::to_string(n), std::to_string(m)});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, plain.out);  // the program's own count
  auto h = hits(r.report);
  EXPECT_EQ(h["uprobe:" + fixture() + ":trace_fn"], n) << dump(r);
  const std::string entry = libc_key(h, "uprobe", "malloc"), ret = libc_key(h, "uretprobe", "malloc");
  ASSERT_FALSE(entry.empty()) << dump(r);
  ASSERT_FALSE(ret.empty()) << dump(r);
  EXPECT_EQ(h[entry], m) << dump(r);
  EXPECT_EQ(h[ret], m) << dump(r);
  // malloc has both probes: a latency histogram with one sample per call.
  const std::string fn = entry.substr(std::string("uprobe:").size());
  long samples = 0;
  for (const auto& row : hist(r.report, fn)) samples += row.count;
  EXPECT_EQ(samples, m) << dump(r);
  EXPECT_EQ(r.err.find("WARNING"), std::string::npos) << r.err;
}

// The working directory's files are never libraries of uprobe-trace's nor
// of the traced program's agent: CMake pads a build-tree RUNPATH it rewrites
// at install with ':', and an empty entry is the working directory to the
// dynamic linker (the CLI could not start in a directory holding a file
// named libc.so.6; the agent's libstdc++ was looked for there too).
TEST(Trace, FilesNamedLikeLibrariesInTheWorkingDirectoryAreNotLoaded) {
  TempDir cwd, out;
  const char* const kNames[] = {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libm.so.6", "libuprobe.so.0.1"};
  for (const char* n : kNames) {
    std::ofstream f(cwd.path() + "/" + n);
    f << "not a library\n";
  }
  const pid_t p = fork();
  if (p == 0) {
    if (chdir(cwd.path().c_str()) != 0) _exit(126);
    const int o = open((out.path() + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = open((out.path() + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1), dup2(e, 2);
    const std::string report = out.path() + "/report";
    execl(kTrace.c_str(), kTrace.c_str(), "-e", "uprobe:libc:malloc", "-o", report.c_str(), "--", kFixture.c_str(),
          "basic", "10", "7", static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  waitpid(p, &st, 0);
  for (const char* n : kNames) unlink((cwd.path() + "/" + n).c_str());
  const std::string err = slurp(out.path() + "/err");
  ASSERT_TRUE(WIFEXITED(st)) << err;
  EXPECT_EQ(WEXITSTATUS(st), 0) << err;
  EXPECT_EQ(slurp(out.path() + "/out"), "fn=10\nmalloc=7\n") << err;
  auto h = hits(slurp(out.path() + "/report"));
  EXPECT_EQ(h[libc_key(h, "uprobe", "malloc")], 7) << err;
}

TEST(Trace, MallocCountIsExactWithoutOtherProbes) {
  for (long m : {0L, 1L, 7L, 3000L}) {
    Result r = trace({"uprobe:libc:malloc"}, {kFixture, "basic", "0", std::to_string(m)});
    ASSERT_EQ(r.status, 0) << dump(r);
    auto h = hits(r.report);
    const std::string k = libc_key(h, "uprobe", "malloc");
    ASSERT_FALSE(k.empty()) << dump(r);
    EXPECT_EQ(h[k], m) << dump(r);
  }
}

/// Every function of libc (with libc6-dbg: its local symbols too, glibc's
/// signal-return trampoline __restore_rt among them, which libuprobe
/// refuses: its own SIGTRAP handler returns through it, and a probe there
/// recursed until the program died of SIGSEGV at its first trap). The
/// program runs as without the tracer; malloc counts exactly its calls.
TEST(Trace, EveryLibcFunctionLeavesTheProgramAlive) {
  const long m = 300;
  Result plain = run({kFixture, "basic", "0", std::to_string(m)});
  ASSERT_EQ(plain.status, 0);
  Result r = trace({"uprobe:libc:*"}, {kFixture, "basic", "0", std::to_string(m)});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, plain.out);
  auto h = hits(r.report);
  const std::string k = libc_key(h, "uprobe", "malloc");
  ASSERT_FALSE(k.empty()) << dump(r);
  EXPECT_EQ(h[k], m) << dump(r);
  EXPECT_EQ(libc_key(h, "uprobe", "__restore_rt"), "") << dump(r);
}

/// A return probe on every function of libc, in a program whose threads
/// end and which vforks: glibc's thread exit (__nptl_deallocate_tsd, which
/// runs libuprobe's thread-exit hook) lost its return instance to the hook,
/// and vfork's child took the parent's (uretprobe:libc:* aborted both with
/// "return trampoline reached with no pending return instance"). The
/// programs run as without the tracer; malloc's returns are counted exactly.
TEST(Trace, EveryLibcReturnLeavesThreadsAndVforkAlive) {
  Result plain = run({kFixture, "vfork", "2"});
  ASSERT_EQ(plain.out, "vforked=2\n");
  Result v = trace({"uretprobe:libc:*"}, {kFixture, "vfork", "2"});
  ASSERT_EQ(v.status, 0) << dump(v);
  EXPECT_EQ(v.out, plain.out) << dump(v);
  EXPECT_EQ(libc_key(hits(v.report), "uretprobe", "vfork"), "") << dump(v);
  Result t = trace({"uretprobe:libc:*", "uprobe:trace_fixture:trace_fn"}, {kFixture, "threads", "3", "10"});
  ASSERT_EQ(t.status, 0) << dump(t);
  auto h = hits(t.report);
  EXPECT_EQ(h["uprobe:" + fixture() + ":trace_fn"], 30) << dump(t);
}

/// A return probe on vfork is refused, with the reason, and the program runs
/// as without it (its child returned first, on the parent's stack and TLS,
/// and took the parent's return instance); an entry probe counts each call.
TEST(Trace, ReturnProbeOnVforkIsRefusedEntryProbeCounts) {
  Result r = trace({"uretprobe:libc:vfork"}, {kFixture, "vfork", "3"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, "vforked=3\n");
  EXPECT_EQ(hits(r.report), (std::map<std::string, long>{})) << dump(r);
  EXPECT_NE(r.err.find("uretprobe:libc:vfork attached in no process"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("vfork returns twice in one address space"), std::string::npos) << r.err;
  Result e = trace({"uprobe:libc:vfork"}, {kFixture, "vfork", "3"});
  ASSERT_EQ(e.status, 0) << dump(e);
  EXPECT_EQ(e.out, "vforked=3\n");
  auto h = hits(e.report);
  const std::string k = libc_key(h, "uprobe", "vfork");
  ASSERT_FALSE(k.empty()) << dump(e);
  EXPECT_EQ(h[k], 3) << dump(e);
  // Both in one run (one consumer per site in the agent): the return side is
  // refused, the entry side still counts every call. The entry was refused
  // with it.
  Result b = trace({"uprobe:libc:vfork", "uretprobe:libc:vfork"}, {kFixture, "vfork", "3"});
  ASSERT_EQ(b.status, 0) << dump(b);
  EXPECT_EQ(b.out, "vforked=3\n");
  auto hb = hits(b.report);
  const std::string kb = libc_key(hb, "uprobe", "vfork");
  ASSERT_FALSE(kb.empty()) << dump(b);
  EXPECT_EQ(hb[kb], 3) << dump(b);
  EXPECT_EQ(libc_key(hb, "uretprobe", "vfork"), "") << dump(b);
  EXPECT_NE(b.err.find("uretprobe:libc:vfork attached in no process"), std::string::npos) << b.err;
  EXPECT_EQ(b.err.find("WARNING: uprobe:libc:vfork"), std::string::npos) << b.err;
}

/// A return probe on glibc's thread-exit path (__nptl_deallocate_tsd, named
/// with libc6-dbg): one return per ended thread, the program unharmed.
TEST(Trace, ReturnProbeOnThreadExitPathCountsEachThread) {
  Result l = run({kTrace, "-l", "uprobe:libc:__nptl_deallocate_tsd"});
  if (l.out.empty()) GTEST_SKIP() << "no __nptl_deallocate_tsd in libc's symbols (libc6-dbg not installed?)";
  Result r = trace({"uretprobe:libc:__nptl_deallocate_tsd", "uprobe:trace_fixture:trace_fn"},
                   {kFixture, "threads", "4", "100"});
  ASSERT_EQ(r.status, 0) << dump(r);
  auto h = hits(r.report);
  EXPECT_EQ(h["uprobe:" + fixture() + ":trace_fn"], 400) << dump(r);
  const std::string k = libc_key(h, "uretprobe", "__nptl_deallocate_tsd");
  ASSERT_FALSE(k.empty()) << dump(r);
  EXPECT_EQ(h[k], 4) << dump(r);
}

/// A vfork child that resets a handler of its parent (Python's subprocess
/// resets every handler the program set in its vfork child): the parent's
/// handler still runs for each signal. The child's sigaction() wrote
/// libuprobe's handler table, the parent's memory, and the parent's signals
/// were dropped (Python's test_signal hung waiting for its SIGHUP).
TEST(Trace, VforkChildResettingAHandlerLeavesTheParentsHandler) {
  Result plain = run({kFixture, "vforksig", "3"});
  ASSERT_EQ(plain.out, "usr1=3\n");
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "vforksig", "3"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, plain.out) << dump(r);
}

/// The traced program has the file descriptors it has without the tracer:
/// libuprobe keeps no descriptor (each XOL region's memfd is closed once its
/// R-X view is mapped; src/attach/xol.cpp), nor does the agent (its counts
/// file is mapped and closed), so /proc/self/fd lists the same numbers, with
/// one probe and with every libc function probed (28 regions, once one fd
/// each, which took the lowest free numbers after an exec: Python's
/// test_subprocess found "fds not in pass_fds left open" in its children).
TEST(Trace, ProgramSeesOnlyItsOwnFileDescriptors) {
  Result plain = run({kFixture, "fds"});
  ASSERT_EQ(plain.status, 0);
  ASSERT_EQ(plain.out.rfind("fds=0,1,2", 0), 0u) << plain.out;
  // The same descriptors in the fork()ed child, and no memfd there: "fds=0,1,2,...\nopen=N\nchild
  // fds=0,1,2,...\nchild_status=0\n" with the child's list the parent's.
  const std::size_t nl = plain.out.find('\n');
  const std::string list = plain.out.substr(4, nl - 4);
  ASSERT_NE(plain.out.find("\nchild fds=" + list + "\nchild_status=0\n"), std::string::npos) << plain.out;
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "fds"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, plain.out) << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn"], 1) << dump(r);  // the child's call
  Result all = trace({"uprobe:libc:*"}, {kFixture, "fds"});
  ASSERT_EQ(all.status, 0) << dump(all);
  EXPECT_EQ(all.out, plain.out) << dump(all);
}

// The program starts with the signal dispositions and mask it would have
// without uprobe-trace, glibc's own signals (32, 33) included: posix_spawn()
// leaves those ignored in the child unless asked not to.
TEST(Trace, ProgramStartsWithTheCallersSignalDispositions) {
  const std::vector<std::string> cmd = {"/bin/sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"};
  // With glibc's own signals 32 and 33 as this process has them, then
  // ignored (a caller may ignore them: the program must inherit that too,
  // although glibc handles 33 in uprobe-trace once it has a thread).
  struct KernelSigaction {
    void* handler;
    unsigned long flags;
    void* restorer;
    unsigned long mask;
  } saved[2]{}, ign{};
  ign.handler = reinterpret_cast<void*>(SIG_IGN);
  for (int sig : {32, 33}) ASSERT_EQ(syscall(SYS_rt_sigaction, sig, nullptr, &saved[sig - 32], 8), 0);
  for (bool ignored : {false, true}) {
    if (ignored) {
      for (int sig : {32, 33}) ASSERT_EQ(syscall(SYS_rt_sigaction, sig, &ign, nullptr, 8), 0);
    }
    Result plain = run(cmd);
    Result r = trace({"uprobe:libc:malloc"}, cmd);
    if (ignored) {
      for (int sig : {32, 33}) ASSERT_EQ(syscall(SYS_rt_sigaction, sig, &saved[sig - 32], nullptr, 8), 0);
    }
    ASSERT_EQ(plain.status, 0);
    ASSERT_NE(plain.out.find("SigIgn:"), std::string::npos) << plain.out;
    if (ignored) {
      EXPECT_NE(plain.out.find("SigIgn:\t00000001800"), std::string::npos) << plain.out;
    }
    ASSERT_EQ(r.status, 0) << dump(r);
    EXPECT_EQ(r.out, plain.out) << (ignored ? "32 and 33 ignored: " : "") << dump(r);
  }
}

TEST(Trace, WildcardMatchesExactlyTheThreeFunctions) {
  Result r = trace({"uprobe:trace_fixture:wc_*"}, {kFixture, "wild"});
  ASSERT_EQ(r.status, 0) << dump(r);
  auto h = hits(r.report);
  const std::string p = "uprobe:" + fixture() + ":";
  std::map<std::string, long> want{{p + "wc_alpha", 1}, {p + "wc_beta", 2}, {p + "wc_gamma", 3}};
  EXPECT_EQ(h, want) << dump(r);
}

TEST(Trace, UsdtSemaphoreGuardedBranchRunsOnlyWhileTraced) {
  const long k = 250;
  Result plain = run({kFixture, "usdt", std::to_string(k)});
  EXPECT_EQ(plain.out, "guarded=0\n");

  Result r = trace({"usdt:trace_fixture:tracefix:guarded", "usdt:" + kFixture + ":tracefix:plain"},
                   {kFixture, "usdt", std::to_string(k)});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, "guarded=" + std::to_string(k) + "\n") << dump(r);
  auto h = hits(r.report);
  EXPECT_EQ(h["usdt:" + fixture() + ":tracefix:guarded"], k) << dump(r);
  EXPECT_EQ(h["usdt:" + fixture() + ":tracefix:plain"], k) << dump(r);

  // Only the unguarded probe: its semaphore-less site counts, the guarded branch never runs.
  Result only_plain = trace({"usdt:trace_fixture:plain"}, {kFixture, "usdt", std::to_string(k)});
  ASSERT_EQ(only_plain.status, 0) << dump(only_plain);
  EXPECT_EQ(only_plain.out, "guarded=0\n");
  EXPECT_EQ(hits(only_plain.report), (std::map<std::string, long>{{"usdt:" + fixture() + ":tracefix:plain", k}}))
      << dump(only_plain);
}

TEST(Trace, ListShowsSymbolsAndUsdtProbes) {
  Result r = run({kTrace, "-l", kFixture});
  ASSERT_EQ(r.status, 0) << dump(r);
  for (const char* s : {"trace_fn", "wc_alpha", "wc_beta", "wc_gamma", "wcnot", "main", "trace_sleep"})
    EXPECT_NE(r.out.find("uprobe:" + fixture() + ":" + s + "\n"), std::string::npos) << s << "\n" << r.out;
  for (const char* s : {"tracefix:guarded", "tracefix:plain"})
    EXPECT_NE(r.out.find("usdt:" + fixture() + ":" + s + "\n"), std::string::npos) << s << "\n" << r.out;

  Result g = run({kTrace, "-l", "uprobe:" + kFixture + ":wc_*"});
  ASSERT_EQ(g.status, 0) << dump(g);
  const std::string p = "uprobe:" + fixture() + ":";
  EXPECT_EQ(g.out, p + "wc_alpha\n" + p + "wc_beta\n" + p + "wc_gamma\n");

  Result v = run({kTrace, "-l", "usdt:" + kFixture, "-v"});
  ASSERT_EQ(v.status, 0) << dump(v);
  EXPECT_NE(v.out.find("semaphore 0x"), std::string::npos) << v.out;
  EXPECT_EQ(v.out.find("uprobe:"), std::string::npos) << v.out;
}

TEST(Trace, ThreadsCountInTheirOwnSlots) {
  const long threads = 8, each = 20000;
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "threads", std::to_string(threads),
                                                        std::to_string(each)},
                   {"--per-thread"});
  ASSERT_EQ(r.status, 0) << dump(r);
  const std::string key = "uprobe:" + fixture() + ":trace_fn";
  EXPECT_EQ(hits(r.report)[key], threads * each) << dump(r);
  auto pt = per_thread(r.report, key);
  ASSERT_EQ(pt.thread_counts.size(), static_cast<std::size_t>(threads)) << dump(r);
  for (long c : pt.thread_counts) EXPECT_EQ(c, each);
}

TEST(Trace, ForkedChildCountsSeparately) {
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "fork", "100"}, {"--per-thread"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, "child_status=0\n");
  const std::string key = "uprobe:" + fixture() + ":trace_fn";
  EXPECT_EQ(hits(r.report)[key], 300) << dump(r);
  auto pt = per_thread(r.report, key);
  ASSERT_EQ(pt.per_pid.size(), 2u) << dump(r);
  std::vector<long> v;
  for (const auto& [k, n] : pt.per_pid) v.push_back(n);
  std::sort(v.begin(), v.end());
  EXPECT_EQ(v, (std::vector<long>{100, 200})) << dump(r);
}

TEST(Trace, ExecIsFollowedUnlessNoFollow) {
  const std::string key = "uprobe:" + fixture() + ":trace_fn";
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "exec", "100"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, "fn=200\nmalloc=0\n");
  EXPECT_EQ(hits(r.report)[key], 300) << dump(r);  // 100 before the exec (written by the exec wrapper) + 200

  Result nf = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "exec", "100"}, {"--no-follow"});
  ASSERT_EQ(nf.status, 0) << dump(nf);
  EXPECT_EQ(nf.out, "fn=200\nmalloc=0\n");
  EXPECT_EQ(hits(nf.report)[key], 100) << dump(nf);

  // An existing LD_PRELOAD is kept (and not clobbered in the exec'd program).
  Result lp = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "exec", "10"}, {},
                    {"LD_PRELOAD=/nonexistent-preload.so"});
  ASSERT_EQ(lp.status, 0) << dump(lp);
  EXPECT_EQ(hits(lp.report)[key], 30) << dump(lp);
  EXPECT_NE(lp.err.find("nonexistent-preload.so"), std::string::npos) << dump(lp);  // ld.so's warning
}

TEST(Trace, BashRunsItsCommandsAndNoFollowLeavesThemUntraced) {
  // bash defines its own getenv/setenv/unsetenv: the agent's unsetenv of the
  // start gate's variable reached bash's, which before bash's main() leaves
  // the environment as it is, and bash passed UPROBE_TRACE_GATE on to every
  // command it ran: each exited 125 at the gate, printing nothing (a bug
  // report: `uprobe-trace ... -- bash -c 'ls'`). Likewise --no-follow's
  // LD_PRELOAD reset.
  if (access("/bin/bash", X_OK) != 0) GTEST_SKIP() << "no /bin/bash";
  const std::string script =
      "/bin/echo hi; ls /nonexistent-dir 2>/dev/null; echo st=$?; /usr/bin/env | grep -c '^UPROBE_TRACE_GATE=' || true";
  Result r = trace({"uprobe:libc:malloc"}, {"/bin/bash", "-c", script});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, "hi\nst=2\n0\n") << dump(r);
  long mallocs = 0;
  for (const auto& [k, n] : hits(r.report))
    if (k.size() > 7 && k.compare(k.size() - 7, 7, ":malloc") == 0) mallocs += n;
  EXPECT_GT(mallocs, 0) << dump(r);

  Result nf = trace({"uprobe:libc:malloc"},
                    {"/bin/bash", "-c", "echo \"[$LD_PRELOAD]\"; /usr/bin/env | grep -c '^UPROBE_TRACE_' || true"},
                    {"--no-follow"});
  ASSERT_EQ(nf.status, 0) << dump(nf);
  EXPECT_EQ(nf.out, "[]\n0\n") << dump(nf);
}

TEST(Trace, TheProgramStartsSingleThreaded) {
  // The agent makes no thread (it loaded libuprobe's decoder on a helper
  // thread once): glibc takes a process that ever made one for
  // multi-threaded for good, and malloc and stdio lock from then on.
  Result r = trace({"uprobe:trace_fixture:trace_fn", "uprobe:libc:malloc"}, {kFixture, "single", "4"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, "fn=4\nsingle=1\n") << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn"], 4) << dump(r);
}

TEST(Trace, UnderscoreExitKeepsTheCounts) {
  // _exit() skips every destructor: the counts are in the counts file
  // already (the CLI's), so a child that leaves with _exit() keeps its 10.
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "lost", "10"}, {"--per-thread"});
  ASSERT_EQ(r.status, 0) << dump(r);
  const std::string key = "uprobe:" + fixture() + ":trace_fn";
  EXPECT_EQ(hits(r.report)[key], 20) << dump(r);
  EXPECT_EQ(per_thread(r.report, key).per_pid.size(), 2u) << dump(r);
  EXPECT_EQ(r.err.find("WARNING"), std::string::npos) << dump(r);

  // The program itself: its exit status passes through, its counts are kept.
  Result q = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "quickexit", "7"});
  EXPECT_EQ(q.status, 3) << dump(q);
  EXPECT_EQ(hits(q.report)[key], 7) << dump(q);
  EXPECT_EQ(q.err.find("WARNING"), std::string::npos) << dump(q);

  // _exit() from a SIGALRM handler that interrupts free() in a multi-threaded
  // program: the program ends (the agent does nothing on that path).
  Result s = trace({"uprobe:libc:getppid"}, {kFixture, "sigexit"});
  EXPECT_EQ(s.status, 3) << dump(s);
}

TEST(Trace, ProcessesThatSkipExitKeepTheirCounts) {
  // A child that leaves through the exit system call keeps its counts.
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "rawlost", "10"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn"], 20) << dump(r);
  EXPECT_EQ(r.err.find("WARNING"), std::string::npos) << dump(r);

  // The program itself, in text and json.
  for (const char* format : {"text", "json"}) {
    Result m = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "rawexit", "4"}, {"--format", format});
    EXPECT_EQ(m.status, 3) << dump(m);
    EXPECT_EQ(m.err.find("WARNING"), std::string::npos) << format << dump(m);
    EXPECT_EQ(m.err.find("no process loaded the agent"), std::string::npos) << dump(m);
    if (std::string(format) == "text") {
      EXPECT_EQ(hits(m.report)["uprobe:" + fixture() + ":trace_fn"], 4) << dump(m);
    } else {
      EXPECT_NE(m.report.find("\"uprobe:" + fixture() + ":trace_fn\": 4\n"), std::string::npos) << dump(m);
      EXPECT_NE(m.report.find("\"unrecorded_hits\": 0,\n"), std::string::npos) << dump(m);
    }
  }
}

// A fatal signal: the counts are the CLI's already.
TEST(Trace, FatalSignalKeepsTheCounts) {
  const std::string key = "uprobe:" + fixture() + ":trace_fn";
  Result k = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "killself", "9"});
  EXPECT_EQ(k.status, 128 + SIGKILL) << dump(k);
  EXPECT_EQ(k.signal, SIGKILL) << dump(k);  // uprobe-trace passed the death on (after its report)
  EXPECT_EQ(hits(k.report)[key], 9) << dump(k);
  Result a = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "abort", "11"});
  EXPECT_EQ(a.status, 128 + SIGABRT) << dump(a);
  EXPECT_EQ(a.signal, SIGABRT) << dump(a);
  EXPECT_EQ(hits(a.report)[key], 11) << dump(a);
  for (const Result* r : {&k, &a}) {
    EXPECT_EQ(r->err.find("lost"), std::string::npos) << dump(*r);
    EXPECT_EQ(r->err.find("WARNING"), std::string::npos) << dump(*r);
  }
}

// A crash leaves a worker that waits forever: uprobe-trace, which waits for
// every process the program started, stops waiting once the program has
// crashed, reports the counts so far (the worker's too), names the process
// it left, and ends with the program's signal.
TEST(Trace, ACrashDoesNotWaitForTheProcessesItLeft) {
  const std::string key = "uprobe:" + fixture() + ":trace_fn";
  const auto t0 = std::chrono::steady_clock::now();
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "crashorphan", "13"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 30.0) << dump(r);
  EXPECT_EQ(r.status, 128 + SIGABRT) << dump(r);
  EXPECT_EQ(r.signal, SIGABRT) << dump(r);
  EXPECT_EQ(hits(r.report)[key], 26) << dump(r);  // 13 in the program, 13 in the worker before it waited
  const std::string said = "uprobe-trace: the program died by SIGABRT; 1 process it started still runs, not waited for (pid ";
  const std::size_t at = r.err.find(said);
  ASSERT_NE(at, std::string::npos) << dump(r);
  const long pid = std::strtol(r.err.c_str() + at + said.size(), nullptr, 10);
  EXPECT_NE(r.err.find("): its counts so far are in the report\n", at), std::string::npos) << dump(r);
  ASSERT_GT(pid, 1) << dump(r);
  EXPECT_EQ(::kill(static_cast<pid_t>(pid), 0), 0) << "the worker left is gone: " << dump(r);
  ::kill(static_cast<pid_t>(pid), SIGKILL);
}

// ^C: SIGINT to the foreground group kills the program; uprobe-trace survives
// it, waits for the program to end and prints its counts (as bpftrace prints
// its maps), with the program's status.
TEST(Trace, CtrlCPrintsTheCounts) {
  Result r = trace_interrupted({"uprobe:trace_fixture:trace_fn"}, {kFixture, "block", "123"}, "fn=123\n", false);
  EXPECT_EQ(r.status, 128 + SIGINT) << dump(r);
  EXPECT_EQ(r.out, "fn=123\n") << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn"], 123) << dump(r);
  EXPECT_EQ(r.err.find("interrupted"), std::string::npos) << dump(r);  // it waited: the counts are final
}

// A program that ignores SIGINT goes on after ^C, and so does uprobe-trace;
// a second ^C prints the counts so far at once (and says so).
TEST(Trace, SecondCtrlCPrintsTheCountsSoFar) {
  Result r = trace_interrupted({"uprobe:trace_fixture:trace_fn"}, {kFixture, "blockign", "77"}, "fn=77\n", true);
  EXPECT_EQ(r.status, 128 + SIGINT) << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn"], 77) << dump(r);
  EXPECT_NE(r.err.find("uprobe-trace: interrupted: the counts so far; " + kFixture + " is still running"),
            std::string::npos)
      << dump(r);
}

// dash ends every script with _exit(): its counts are there, and so are
// those of the programs it runs (a fork child of dash that execs).
TEST(Trace, DashScriptIsCounted) {
  if (access("/bin/dash", X_OK) != 0) GTEST_SKIP() << "/bin/dash not installed";
  Result r = trace({"uprobe:libc:malloc", "uprobe:trace_fixture:trace_fn"},
                   {"/bin/dash", "-c", kFixture + " basic 5 0; exit 0"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, "fn=5\nmalloc=0\n") << dump(r);
  auto h = hits(r.report);
  EXPECT_EQ(h["uprobe:" + fixture() + ":trace_fn"], 5) << dump(r);
  const std::string k = libc_key(h, "uprobe", "malloc");
  ASSERT_FALSE(k.empty()) << dump(r);
  EXPECT_GT(h[k], 0) << dump(r);  // dash's own (the fixture's "basic 5 0" mallocs nothing)
}

// A child of the raw fork system call runs no atfork handler: its first hit
// finds (MADV_WIPEONFORK) that the blocks it inherited are its parent's, and
// it counts in its own from zero. A return probe on _Fork also fires in the
// child of fork() before any atfork handler.
TEST(Trace, ForkChildrenCountFromTheirFirstInstruction) {
  const std::string key = "uprobe:" + fixture() + ":trace_fn";
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "rawfork", "10"}, {"--per-thread"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, "child_status=0\n");
  EXPECT_EQ(hits(r.report)[key], 30) << dump(r);
  auto pt = per_thread(r.report, key);
  std::vector<long> v;
  for (const auto& [k, n] : pt.per_pid) v.push_back(n);
  std::sort(v.begin(), v.end());
  EXPECT_EQ(v, (std::vector<long>{10, 20})) << dump(r);

  Result f = trace({"uprobe:libc:_Fork", "uretprobe:libc:_Fork"}, {kFixture, "fork", "1"}, {"--per-thread"});
  ASSERT_EQ(f.status, 0) << dump(f);
  auto h = hits(f.report);
  const std::string entry = libc_key(h, "uprobe", "_Fork"), ret = libc_key(h, "uretprobe", "_Fork");
  EXPECT_EQ(h[entry], 1) << dump(f);
  EXPECT_EQ(h[ret], 2) << dump(f);  // parent and child
  EXPECT_EQ(per_thread(f.report, ret).per_pid.size(), 2u) << dump(f);
}

// A thread of a process that can open no file cannot make its block in the
// counts file: its hits are not recorded, and uprobe-trace says exactly how
// many (text and json); the other threads' still count.
/// The trace's directory (counts file, records) is memory-backed by default
/// (/dev/shm when it is a writable tmpfs: no journal on the paths a traced
/// process's start and its first writes take), under $TMPDIR when that is
/// set, and gone after the run either way.
TEST(Trace, TraceDirectoryIsInMemoryUnlessTmpdirIsSet) {
  struct statfs fs;
  const bool shm = ::statfs("/dev/shm", &fs) == 0 && fs.f_type == TMPFS_MAGIC && ::access("/dev/shm", W_OK | X_OK) == 0;
  TempDir mine;
  for (const auto& [env, base] : std::vector<std::pair<std::string, std::string>>{
           {"TMPDIR", shm ? "/dev/shm" : "/tmp"}, {"TMPDIR=" + mine.path(), mine.path()}}) {
    Result r = trace({"uprobe:libc:malloc"}, {"/usr/bin/env"}, {}, {env});
    ASSERT_EQ(r.status, 0) << dump(r);
    const std::string key = "\nUPROBE_TRACE_OUT=";
    const std::size_t at = ("\n" + r.out).find(key);
    ASSERT_NE(at, std::string::npos) << dump(r);
    const std::string rest = r.out.substr(at + key.size() - 1);
    const std::string dir = rest.substr(0, rest.find('\n'));
    EXPECT_EQ(dir.rfind(base + "/uprobe-trace.", 0), 0u) << env << ": " << dir;
    EXPECT_NE(::access(dir.c_str(), F_OK), 0) << dir << " is left behind";
  }
}

TEST(Trace, HitsThatCannotBeRecordedAreReported) {
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "nofd", "25"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn"], 25) << dump(r);
  EXPECT_NE(r.err.find("uprobe-trace: WARNING: 50 hits were not recorded"), std::string::npos) << dump(r);
  Result j = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "nofd", "4"}, {"--format", "json"});
  ASSERT_EQ(j.status, 0) << dump(j);
  EXPECT_NE(j.report.find("\"unrecorded_hits\": 8,\n"), std::string::npos) << dump(j);
}

// From the first initializer to the last destructor: the program's preinit
// array, a DT_NEEDED library's constructor, the program's constructor, main,
// an atexit handler, the program's destructor and the library's destructor
// all call early_fn() and getppid() (early.h); every call counts, as bpftrace
// counts them. Without the destructors when the program leaves with _exit()
// or is killed.
TEST(Trace, EveryInitializerAndDestructorCounts) {
  const long k = 100;
  const long all = EARLY_PREINIT + EARLY_LIB_CTOR + EARLY_CTOR + k + EARLY_ATEXIT + EARLY_DTOR + EARLY_LIB_DTOR;
  const long until_main = EARLY_PREINIT + EARLY_LIB_CTOR + EARLY_CTOR + k;
  const std::string key = "uprobe:" + real(kEarlyLib) + ":early_fn";
  for (const auto& [mode, status, want] : std::vector<std::tuple<std::string, int, long>>{
           {"return", 0, all}, {"_exit", 3, until_main}, {"kill", 128 + SIGKILL, until_main}}) {
    Result r = trace({"uprobe:" + kEarlyLib + ":early_fn", "uprobe:libc:getppid"}, {kEarly, mode, std::to_string(k)});
    EXPECT_EQ(r.status, status) << mode << dump(r);
    auto h = hits(r.report);
    EXPECT_EQ(h[key], want) << mode << dump(r);
    EXPECT_EQ(h[libc_key(h, "uprobe", "getppid")], want) << mode << dump(r);
    EXPECT_EQ(r.err.find("WARNING"), std::string::npos) << dump(r);
  }
  // By the library's name, as loaded (resolved before its constructor ran).
  Result n = trace({"uprobe:libtrace_early.so:early_fn"}, {kEarly, "return", "1"});
  EXPECT_EQ(hits(n.report)[key], all - k + 1) << dump(n);
}

// Only one object's initializer runs first (DF_1_INITFIRST): the last loaded,
// and a program's libraries load after LD_PRELOAD's. A program library that
// is DF_1_INITFIRST too wins over the agent: its constructor's calls are not
// counted, and uprobe-trace says so; the rest counts.
TEST(Trace, AnotherInitFirstLibraryIsNamed) {
  Result r = trace({"uprobe:" + kInitFirstLib + ":initfirst_fn"}, {kInitFirst, "100"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + real(kInitFirstLib) + ":initfirst_fn"], 100 + INITFIRST_LIB_DTOR) << dump(r);
  EXPECT_NE(r.err.find("WARNING: pid "), std::string::npos) << dump(r);
  EXPECT_NE(r.err.find(real(kInitFirstLib) + " is DF_1_INITFIRST too: the dynamic linker ran its initializer before "
                                              "the agent's"),
            std::string::npos)
      << dump(r);
}

// The agent's own work while probes are attached (setting up and writing its
// record, making a thread's block in the counts file, a fork child's set-up
// and libuprobe's atfork handlers, libuprobe's thread_local destructors and
// static data at exit) is not counted: libc functions the program never
// calls count 0, as bpftrace shows.
TEST(Trace, AgentOwnLibcCallsAreNotCounted) {
  const std::vector<std::string> fns{"getppid", "open", "close", "rename", "clock_gettime", "free", "malloc",
                                     "unlink", "fallocate"};
  std::vector<std::string> specs;
  for (const auto& f : fns) specs.push_back("uprobe:libc:" + f);
  const std::vector<std::vector<std::string>> progs{
      {kFixture, "wild"},             // the constructor's end, exit() to the last destructor
      {kFixture, "execfail", "0"},    // an exec: the new image attaches, writes its record
      {kFixture, "execfail", "5"},    // ... after 5 failed execs
      {kFixture, "rawlost", "2"},     // fork: atfork handlers, the child's first block
  };
  for (const auto& prog : progs) {
    for (const std::vector<std::string>& opts : {std::vector<std::string>{}, {"--no-follow"}}) {
      Result r = trace(specs, prog, opts);
      EXPECT_TRUE(r.status == 0 || r.status == 3) << dump(r);
      auto h = hits(r.report);
      for (const auto& f : fns) {
        const std::string k = libc_key(h, "uprobe", f);
        ASSERT_FALSE(k.empty()) << f << "\n" << dump(r);
        EXPECT_EQ(h[k], 0) << prog[1] << " " << f << "\n" << dump(r);
      }
    }
  }
  // The program's own calls still count: "basic 0 5" mallocs and frees 5 times.
  Result b = trace({"uprobe:libc:malloc", "uprobe:libc:free"}, {kFixture, "basic", "0", "5"});
  ASSERT_EQ(b.status, 0) << dump(b);
  auto h = hits(b.report);
  EXPECT_EQ(h[libc_key(h, "uprobe", "malloc")], 5) << dump(b);
  EXPECT_EQ(h[libc_key(h, "uprobe", "free")], 5) << dump(b);
}

TEST(Trace, SpecsNamingOneSiteEachCount) {
  // A glob and a name, and an alias pair, on the same code: every key counts every hit.
  Result r = trace({"uprobe:trace_fixture:wc_*", "uprobe:trace_fixture:wc_beta", "u:" + kFixture + ":wc_beta"},
                   {kFixture, "wild"}, {"-v"});
  ASSERT_EQ(r.status, 0) << dump(r);
  auto h = hits(r.report);
  EXPECT_EQ(h["uprobe:" + fixture() + ":wc_beta"], 2) << dump(r);
  EXPECT_EQ(h.size(), 3u) << dump(r);
  // -v: one site per function, each an optimized function entry.
  EXPECT_NE(r.err.find("sites optimized-entry 3"), std::string::npos) << r.err;
}

// The agent takes the ELF tables the CLI read for its checks (uprobe::
// import_elf_tables(): it waits for the gate's 't', the gate not yet open):
// the fixture's and libc's; then removes the file (room on a small
// $TMPDIR), so the program the traced process execs reads its own (no
// tables kept between runs here: UPROBE_TRACE_CACHE_DIR empty). The counts
// are those of agents that read them themselves.
TEST(Trace, TheAgentTakesTheChecksElfTables) {
  TempDir tmp;
  Result r = trace({"uprobe:libc:malloc", "uprobe:trace_fixture:trace_fn"}, {kFixture, "exec", "100"}, {"-v"},
                   {"TMPDIR=" + tmp.path(), "UPROBE_TRACE_CACHE_DIR="});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, "fn=200\nmalloc=0\n");
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn"], 300) << dump(r);
  std::vector<std::string> tables;
  for (std::size_t at = 0; (at = r.err.find("uprobe-trace: pid ", at)) != std::string::npos; ++at) {
    const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
    tables.push_back(line.substr(line.rfind(' ') + 1));
  }
  std::sort(tables.begin(), tables.end());
  EXPECT_EQ(tables, (std::vector<std::string>{"0", "2"})) << dump(r);
}

// The traced program and what it execs see the same variables, by name,
// with the kept tables or without them (UPROBE_TRACE_TABLES carries the
// kept file: a program that copies its environment makes the same calls
// either way; a second variable made sh malloc once more with the cache on).
TEST(Trace, TheEnvironmentIsTheSameWithTheKeptTablesOrWithout) {
  TempDir tmp;
  const std::vector<std::string> prog{"/bin/sh", "-c", "env | sed -n 's/=.*//p' | grep '^UPROBE_TRACE' | sort; "
                                                       "/bin/sh -c \"env | sed -n 's/=.*//p' | grep '^UPROBE_TRACE' | sort\""};
  Result off = trace({"uprobe:libc:malloc"}, prog, {}, {"UPROBE_TRACE_CACHE_DIR="});
  Result on1 = trace({"uprobe:libc:malloc"}, prog, {}, {"UPROBE_TRACE_CACHE_DIR=" + tmp.path() + "/cache"});
  Result on2 = trace({"uprobe:libc:malloc"}, prog, {}, {"UPROBE_TRACE_CACHE_DIR=" + tmp.path() + "/cache"});
  ASSERT_EQ(off.status, 0) << dump(off);
  EXPECT_NE(off.out.find("UPROBE_TRACE_TABLES\n"), std::string::npos) << off.out;
  EXPECT_EQ(on1.out, off.out);
  EXPECT_EQ(on2.out, off.out);
}

// uprobe-trace's agent defers elfutils (uprobe::defer_elfutils()): a traced
// process that takes its ELF tables from the CLI or from the kept file reads
// no file and maps no libelf or libdw; one that has to read a file (a process
// exec'd with the cache off: no hand-over, nothing kept) loads them then, and
// counts the same. (grep counts the lines of its own maps that name them.)
TEST(Trace, ElfutilsAreMappedOnlyInAProcessThatReadsAFile) {
  TempDir tmp;
  const std::vector<std::string> prog{"/bin/sh", "-c",
                                      "grep -c -e '/libelf[-.]' -e '/libdw[-.]' /proc/self/maps; grep -c -e '/libelf[-.]' "
                                      "-e '/libdw[-.]' /proc/$$/maps; true"};
  const std::vector<std::string> cache{"UPROBE_TRACE_CACHE_DIR=" + tmp.path() + "/cache"};
  Result off = trace({"uprobe:libc:malloc"}, prog, {}, {"UPROBE_TRACE_CACHE_DIR="});
  Result cold = trace({"uprobe:libc:malloc"}, prog, {}, cache);
  Result warm = trace({"uprobe:libc:malloc"}, prog, {}, cache);
  for (const Result* r : {&off, &cold, &warm}) ASSERT_EQ(r->status, 0) << dump(*r);
  // Lines: the exec'd grep's own maps, then the shell's (the first process:
  // its tables handed over by the checks, or kept).
  auto lines = [](const std::string& out) {
    std::vector<long> v;
    for (std::size_t p = 0, e; (e = out.find('\n', p)) != std::string::npos; p = e + 1)
      v.push_back(std::stol(out.substr(p, e - p)));
    return v;
  };
  ASSERT_EQ(lines(off.out).size(), 2u) << off.out;
  EXPECT_GT(lines(off.out)[0], 0) << "grep read libc's tables itself: elfutils loaded then\n" << dump(off);
  EXPECT_EQ(lines(off.out)[1], 0) << dump(off);
  EXPECT_EQ(lines(cold.out), (std::vector<long>{0, 0})) << dump(cold);
  EXPECT_EQ(lines(warm.out), (std::vector<long>{0, 0})) << dump(warm);
  const std::string malloc_key = "uprobe:/usr/lib/x86_64-linux-gnu/libc.so.6:malloc";
  EXPECT_GT(hits(off.report)[malloc_key], 0) << dump(off);
  EXPECT_EQ(hits(cold.report)[malloc_key], hits(warm.report)[malloc_key]) << dump(cold) << dump(warm);
}

// A libdw that cannot be loaded (an empty file first in the library path):
// the process that has to read libc's ELF file (exec'd with the cache off:
// no hand-over, nothing kept) attaches nothing and says which file and why;
// it never reads on without libdw (no .eh_frame bounds: an offset inside an
// instruction would pass for an instruction start). The program runs as
// without the probe.
TEST(Trace, AMissingLibdwRefusesTheProbesOfTheProcessThatNeedsItAndSaysWhy) {
  TempDir tmp;
  { std::ofstream f(tmp.path() + "/libdw.so.1"); }
  Result r = trace({"uprobe:libc:malloc"}, {"/usr/bin/env", "LD_LIBRARY_PATH=" + tmp.path(), "/bin/echo", "ran"}, {},
                   {"UPROBE_TRACE_CACHE_DIR="});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(r.out, "ran\n");
  EXPECT_NE(r.err.find("(/usr/bin/echo): libuprobe: cannot probe /usr/lib/x86_64-linux-gnu/libc.so.6 at offset 0x0: "
                       "cannot read ELF files: libuprobe cannot load libdw.so.1: " +
                       tmp.path() + "/libdw.so.1: file too short\n"),
            std::string::npos)
      << dump(r);
}

// The checks keep the ELF tables they read between runs
// (tools/trace/tables_cache.hpp): the next run of the same files takes them
// instead of reading the files, with the same report; a file changed since
// is read again (and the kept file written anew); a cache directory that
// other users can write is not used.
TEST(Trace, TheChecksKeepTheirElfTablesForTheNextRun) {
  TempDir tmp;
  const std::string cache = tmp.path() + "/cache", copy = tmp.path() + "/fixture_copy";
  ASSERT_EQ(std::system(("cp '" + kFixture + "' '" + copy + "'").c_str()), 0);
  const std::vector<std::string> env{"UPROBE_TRACE_CACHE_DIR=" + cache};
  auto kept_files = [&] {
    std::vector<std::pair<std::string, ino_t>> files;
    if (DIR* d = opendir(cache.c_str())) {
      while (const dirent* e = readdir(d)) {
        struct stat st;
        if (e->d_name[0] != '.' && ::stat((cache + "/" + e->d_name).c_str(), &st) == 0)
          files.emplace_back(e->d_name, st.st_ino);
      }
      closedir(d);
    }
    return files;
  };
  auto run_once = [&](const std::string& kept) {
    Result r = trace({"uprobe:libc:malloc", "uprobe:" + copy + ":trace_fn"}, {copy, "basic", "7", "5"}, {"-v"}, env);
    ASSERT_EQ(r.status, 0) << dump(r);
    EXPECT_EQ(r.out, "fn=7\nmalloc=5\n");
    EXPECT_EQ(hits(r.report)["uprobe:" + copy + ":trace_fn"], 7) << dump(r);
    EXPECT_GE(hits(r.report)["uprobe:/usr/lib/x86_64-linux-gnu/libc.so.6:malloc"], 5) << dump(r);
    EXPECT_NE(r.err.find("uprobe-trace: ELF tables kept by an earlier run: " + kept + "\n"), std::string::npos)
        << "want " << kept << " taken\n" << dump(r);
    EXPECT_NE(r.err.find("ELF tables from uprobe-trace: 2\n"), std::string::npos) << dump(r);
  };
  ::sleep(4);  // (a file changed in the last 3 s is not kept: see below)
  run_once("0");
  struct stat st;
  ASSERT_EQ(::stat(cache.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const auto first = kept_files();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].first.rfind("elf-tables-", 0), 0u) << first[0].first;
  run_once("2");
  EXPECT_EQ(kept_files(), first) << "taken whole: not written again";
  // The program's file changed (its modification time): read again, libc's
  // taken; and, changed just now, not kept until it has stayed so for 3 s
  // (a rewrite within a coarse timestamp's tick could keep its identity).
  const timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, copy.c_str(), times, 0), 0);
  run_once("1");
  const auto second = kept_files();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].first, first[0].first);
  EXPECT_NE(second[0].second, first[0].second) << "written anew";
  run_once("1");
  ::sleep(4);
  run_once("1");
  run_once("2");
  // Every agent takes the kept tables itself (kEnvKeptTables), without
  // waiting for the checks: the traced process and the one it execs
  // (before: that one read its own).
  {
    Result r = trace({"uprobe:libc:malloc", "uprobe:" + copy + ":trace_fn"}, {copy, "exec", "100"}, {"-v"}, env);
    ASSERT_EQ(r.status, 0) << dump(r);
    EXPECT_EQ(r.out, "fn=200\nmalloc=0\n");
    EXPECT_EQ(hits(r.report)["uprobe:" + copy + ":trace_fn"], 300) << dump(r);
    std::vector<std::string> tables;
    for (std::size_t at = 0; (at = r.err.find("uprobe-trace: pid ", at)) != std::string::npos; ++at) {
      const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
      tables.push_back(line.substr(line.rfind(' ') + 1));
    }
    EXPECT_EQ(tables, (std::vector<std::string>{"2", "2"})) << dump(r);
    EXPECT_NE(r.err.find("uprobe-trace: ELF tables kept by an earlier run: 2\n"), std::string::npos) << dump(r);
  }
  // A symlink in the kept file's place (here to a copy of it; to a huge file
  // its hash would hold the start) is not read, by the checks nor by the
  // agent, which takes the checks' hand-over; the kept file is written anew
  // in its place.
  {
    const std::string f = cache + "/" + second[0].first, aside = tmp.path() + "/kept_copy";
    ASSERT_EQ(std::system(("cp '" + f + "' '" + aside + "'").c_str()), 0);
    ASSERT_EQ(::unlink(f.c_str()), 0);
    ASSERT_EQ(::symlink(aside.c_str(), f.c_str()), 0);
    run_once("0");
    struct stat ls;
    ASSERT_EQ(::lstat(f.c_str(), &ls), 0);
    EXPECT_TRUE(S_ISREG(ls.st_mode)) << "the symlink replaced by a kept file";
    run_once("2");
  }
  // A relative UPROBE_TRACE_CACHE_DIR names the directory from where
  // uprobe-trace runs (the agent is told its absolute path): the second run
  // takes the kept tables, the agent too.
  {
    char here[PATH_MAX];
    ASSERT_NE(::getcwd(here, sizeof here), nullptr);
    ASSERT_EQ(::chdir(tmp.path().c_str()), 0);
    const std::vector<std::string> rel{"UPROBE_TRACE_CACHE_DIR=relcache"};
    Result r1 = trace({"uprobe:libc:malloc", "uprobe:" + copy + ":trace_fn"}, {copy, "basic", "7", "5"}, {"-v"}, rel);
    Result r2 = trace({"uprobe:libc:malloc", "uprobe:" + copy + ":trace_fn"}, {copy, "basic", "7", "5"}, {"-v"}, rel);
    ASSERT_EQ(::chdir(here), 0);
    EXPECT_EQ(r2.out, "fn=7\nmalloc=5\n");
    EXPECT_NE(r2.err.find("ELF tables kept by an earlier run: 2\n"), std::string::npos) << dump(r1) << dump(r2);
    EXPECT_NE(r2.err.find("ELF tables from uprobe-trace: 2\n"), std::string::npos) << dump(r2);
  }
  // Damaged on disk (a byte flipped): nothing taken, the same report, written anew.
  {
    const std::string f = cache + "/" + second[0].first;
    std::fstream k(f, std::ios::in | std::ios::out | std::ios::binary);
    k.seekg(200);
    char c = 0;
    k.read(&c, 1);
    c = static_cast<char>(c ^ 0x20);
    k.seekp(200);
    k.write(&c, 1);
    ASSERT_TRUE(k.good());
  }
  run_once("0");
  run_once("2");
  // A FIFO in its place: not waited on.
  ASSERT_EQ(::unlink((cache + "/" + second[0].first).c_str()), 0);
  ASSERT_EQ(::mkfifo((cache + "/" + second[0].first).c_str(), 0600), 0);
  run_once("0");
  ASSERT_EQ(::unlink((cache + "/" + second[0].first).c_str()), 0);
  run_once("0");
  run_once("2");
  // Writable by others: not used (nothing taken, nothing written).
  ASSERT_EQ(::chmod(cache.c_str(), 0777), 0);
  const auto before = kept_files();
  run_once("0");
  EXPECT_EQ(kept_files(), before);
}

// A probe hit in a signal handler that interrupted another hit on its
// thread is not run (libuprobe runs no consumer inside another), which the
// kernel's uprobes would have run: nothing of it is lost silently, the CLI
// says how many (libuprobe's RecursionMissHook): the hits counted and the
// hits reported missing are every call, exactly.
TEST(Trace, HitsMissedInsideAnotherHitAreReported) {
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "sigprof", "3000000"});
  ASSERT_EQ(r.status, 0) << dump(r);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(calls=(\d+))"))) << dump(r);
  const long calls = std::stol(m[1]);
  long missed = 0;
  if (std::regex_search(r.err, m, std::regex(R"(WARNING: (\d+) probe hits were not run \(a probe fired while its thread was inside another hit)")))
    missed = std::stol(m[1]);
  const long counted = hits(r.report)["uprobe:" + fixture() + ":trace_fn"];
  EXPECT_GT(calls, 3000000) << dump(r);  // (the handler ran)
  EXPECT_EQ(counted + missed, calls) << "counted " << counted << ", reported missing " << missed << "\n" << dump(r);
}

// The agent's own libc calls inside a hit (a new thread's or a fork
// child's counting block: open, fallocate, mmap) are not the program's: no
// "probe hits were not run" for them (12 a thread and 8 a fork child were
// reported under uprobe:libc:*, where no signal handler ran).
TEST(Trace, TheAgentsOwnCallsAreNotMissedHits) {
  for (const char* mode : {"threads", "fork"}) {
    Result r = trace({"uprobe:libc:*"}, {kFixture, mode, "4", "0"});
    ASSERT_EQ(r.status, 0) << dump(r);
    EXPECT_EQ(r.err.find("probe hits were not run"), std::string::npos) << mode << "\n" << dump(r);
  }
}

// A $TMPDIR on a small filesystem (a 1,000 KiB tmpfs: libc's tables with
// its debug file's symbols take ~900 KB): the counts file and the program's
// records come first, the tables only if they fit, and the agent removes
// them once taken; the report is whole either way. (Root only: it
// mounts the tmpfs; skipped where mounting is refused.)
TEST(Trace, ASmallTmpdirKeepsTheReportWhole) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounts a tmpfs: root only";
  TempDir mnt;
  if (::mount("none", mnt.path().c_str(), "tmpfs", 0, "size=1000k") != 0)
    GTEST_SKIP() << "mount: " << std::strerror(errno);
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt.path()};
  // sort(1) over 3,000 lines (its threads' blocks and its records), with a
  // glob's return probes (libc's tables with its debug file's symbols, the
  // largest): at this size the counts file failed, or the records were
  // lost, while the tables took their room.
  TempDir data;
  const std::string input = data.path() + "/out";  // (TempDir removes out)
  {
    std::ofstream f(input);
    for (long i = 0; i < 3000; ++i) f << (i * 1777) % 3000 << "\n";
  }
  for (int round = 0; round < 3; ++round) {
    Result r = trace({"uretprobe:libc:str*"}, {"/usr/bin/sort", input}, {}, {"TMPDIR=" + mnt.path()});
    ASSERT_EQ(r.status, 0) << dump(r);
    EXPECT_EQ(r.out.substr(0, 11), "0\n1\n10\n100\n") << dump(r);
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 3000) << dump(r);
    EXPECT_FALSE(hits(r.report).empty()) << dump(r);
    EXPECT_EQ(r.err.find("no process loaded the agent"), std::string::npos) << dump(r);
    // The same as a bpftrace program (its maps, its rings in the counts
    // file): here the CLI died by SIGBUS, the program's output lost with it.
    Result b = run({kTrace, "-q", "-e", "uretprobe:libc:str* { @[probe] = count(); }", "-c", "/usr/bin/sort " + input},
                   {"TMPDIR=" + mnt.path()});
    ASSERT_EQ(b.status, 0) << b.err;
    EXPECT_EQ(b.out.substr(0, 11), "0\n1\n10\n100\n") << b.err;
    EXPECT_NE(b.out.find("@[uretprobe:"), std::string::npos) << b.out.substr(b.out.size() > 2000 ? b.out.size() - 2000 : 0) << b.err;
  }
}

/// Sets an environment variable for the uprobe-trace runs of one scope.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
};

// A probe hit by int3 in a thread that blocks every signal: the kernel would
// force SIGTRAP and kill the program, so libuprobe keeps SIGTRAP out of the
// masks the program sets (issue 14). trace_fn+5 is its `ret`, kept on int3
// by UPROBE_TRACE_NO_OPTIMIZE (-v names the mode).
TEST(Trace, ProbeHitWithSignalsBlocked) {
  ScopedEnv no_opt("UPROBE_TRACE_NO_OPTIMIZE", "1");
  Result r = trace({"uprobe:trace_fixture:trace_fn+5"}, {kFixture, "blocked", "5"}, {"-v"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn+5"], 5) << dump(r);
  EXPECT_NE(r.err.find("sites int3 1"), std::string::npos) << dump(r);
}

// The issue's command: liblzma starts xz's worker threads with every signal
// blocked, and libc's memcpy (the implementation this CPU selected) is an
// int3 site. It exited 133 (SIGTRAP) before.
TEST(Trace, XzWorkersBlockEverySignalAndCallInt3ProbedMemcpy) {
  ScopedEnv no_opt("UPROBE_TRACE_NO_OPTIMIZE", "1");  // memcpy's entry on int3, as before punned jumps
  Result r = run({"/bin/sh", "-c", "echo hi | '" + kTrace + "' -v -e uprobe:libc:memcpy -- xz -T2 -c >/dev/null"});
  ASSERT_EQ(r.status, 0) << dump(r);
  std::smatch m;
  static const std::regex re(R"(@hits\[uprobe:[^\]]*/libc\.so\.6:memcpy\]: (\d+))");
  ASSERT_TRUE(std::regex_search(r.err, m, re)) << dump(r);
  EXPECT_GT(std::stol(m[1]), 0) << dump(r);
  EXPECT_NE(r.err.find("(/usr/bin/xz, parent"), std::string::npos) << dump(r);
  EXPECT_NE(r.err.find("sites int3 1"), std::string::npos) << "memcpy's implementation is an int3 site\n" << dump(r);
  // glibc's posix_spawnp child runs it with every signal blocked: the one
  // place left where a hit would be fatal, and the warning says so.
  EXPECT_NE(r.err.find("uprobe-trace: WARNING: uprobe:libc:memcpy: pid "), std::string::npos) << dump(r);
  EXPECT_NE(r.err.find("(/usr/bin/xz): memcpy (posix_spawn()'s child before execve, with every handler reset to "
                       "SIG_DFL): int3 site in code glibc runs with every signal blocked: a hit there kills the program"),
            std::string::npos)
      << dump(r);
}

// The same with punned jumps (issue 16): memcpy's implementation, whose
// entry a neighbour jumps 3 bytes into, takes a punned jump, so no hit is a
// signal, not even in posix_spawn()'s child, and nothing is left to warn of.
TEST(Trace, XzWorkersCallPunnedMemcpy) {
  Result r = run({"/bin/sh", "-c", "echo hi | '" + kTrace + "' -v -e uprobe:libc:memcpy -- xz -T2 -c >/dev/null"});
  ASSERT_EQ(r.status, 0) << dump(r);
  std::smatch m;
  static const std::regex re(R"(@hits\[uprobe:[^\]]*/libc\.so\.6:memcpy\]: (\d+))");
  ASSERT_TRUE(std::regex_search(r.err, m, re)) << dump(r);
  EXPECT_GT(std::stol(m[1]), 0) << dump(r);
  EXPECT_NE(r.err.find("sites optimized-punned 1"), std::string::npos) << dump(r);
  EXPECT_EQ(r.err.find("sites int3"), std::string::npos) << dump(r);
  EXPECT_EQ(r.err.find("WARNING"), std::string::npos) << dump(r);
}

TEST(Trace, LatencyHistogramOfASleepingFunction) {
  const long k = 20;
  Result r = trace({"uprobe:trace_fixture:trace_sleep", "uretprobe:trace_fixture:trace_sleep"},
                   {kFixture, "sleepy", std::to_string(k)});
  ASSERT_EQ(r.status, 0) << dump(r);
  auto h = hits(r.report);
  EXPECT_EQ(h["uprobe:" + fixture() + ":trace_sleep"], k) << dump(r);
  EXPECT_EQ(h["uretprobe:" + fixture() + ":trace_sleep"], k) << dump(r);
  auto rows = hist(r.report, fixture() + ":trace_sleep");
  ASSERT_FALSE(rows.empty()) << dump(r);
  long total = 0;
  for (const auto& row : rows) total += row.count;
  EXPECT_EQ(total, k) << dump(r);
  // nanosleep(1 ms) takes at least 1 ms: the first bucket is [512K, 1M) or above.
  EXPECT_TRUE(rows.front().label == "[512K, 1M)" || rows.front().label.find("M,") != std::string::npos ||
              rows.front().label.find("M)") != std::string::npos)
      << rows.front().label << "\n" << r.report;
  EXPECT_EQ(rows.front().label.find("K, 512K"), std::string::npos);

  Result j = trace({"uprobe:trace_fixture:trace_sleep", "uretprobe:trace_fixture:trace_sleep"},
                   {kFixture, "sleepy", "3"}, {"--format", "json"});
  ASSERT_EQ(j.status, 0) << dump(j);
  EXPECT_NE(j.report.find("\"uprobe:" + fixture() + ":trace_sleep\": 3"), std::string::npos) << j.report;
  EXPECT_NE(j.report.find("\"latency_ns\": {\n    \"" + fixture() + ":trace_sleep\": [{\"min\": "),
            std::string::npos)
      << j.report;
}

TEST(Trace, ErrorsAndExitStatus) {
  Result bad_sym = run({kTrace, "-e", "uprobe:trace_fixture:no_such_fn", "--", kFixture, "basic", "1", "0"});
  EXPECT_EQ(bad_sym.status, 2);
  EXPECT_NE(bad_sym.err.find("no_such_fn"), std::string::npos) << bad_sym.err;
  EXPECT_EQ(bad_sym.out, "");  // refused before running the program

  Result bad_file = run({kTrace, "-e", "uprobe:/no/such/file:f", "--", kFixture, "basic", "1", "0"});
  EXPECT_EQ(bad_file.status, 2);
  EXPECT_NE(bad_file.err.find("/no/such/file"), std::string::npos) << bad_file.err;

  Result bad_spec = run({kTrace, "-e", "kprobe:foo", "--", kFixture, "basic", "1", "0"});
  EXPECT_EQ(bad_spec.status, 2);
  EXPECT_NE(bad_spec.err.find("unknown probe type"), std::string::npos) << bad_spec.err;

  Result bad_usdt = run({kTrace, "-e", "usdt:trace_fixture:tracefix:nope", "--", kFixture, "usdt", "1"});
  EXPECT_EQ(bad_usdt.status, 2);
  EXPECT_NE(bad_usdt.err.find("nope"), std::string::npos) << bad_usdt.err;

  // The program's exit status is uprobe-trace's.
  Result status = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "no-such-mode"});
  EXPECT_EQ(status.status, 2) << dump(status);
  EXPECT_EQ(hits(status.report)["uprobe:" + fixture() + ":trace_fn"], 0) << dump(status);
}

TEST(Trace, BadInputIsRefusedBeforeTheProgramRuns) {
  TempDir d;
  const std::string notelf = d.path() + "/out";  // TempDir removes out, err, report
  { std::ofstream(notelf) << "not an ELF file\n"; }
  chmod(notelf.c_str(), 0644);
  const std::string fn = "uprobe:trace_fixture:trace_fn";
  auto refused = [&](const std::vector<std::string>& args, int want_status, const std::string& want_msg) {
    std::vector<std::string> a{kTrace};
    a.insert(a.end(), args.begin(), args.end());
    Result r = run(a);
    EXPECT_EQ(r.status, want_status) << dump(r);
    EXPECT_NE(r.err.find(want_msg), std::string::npos) << "want: " << want_msg << "\n" << dump(r);
    EXPECT_EQ(r.out, "") << dump(r);  // the program did not run
    EXPECT_EQ(r.err.find("no process loaded the agent"), std::string::npos) << dump(r);
  };
  // Probe PATHs.
  refused({"-e", "uprobe:" + notelf + ":foo", "--", kFixture, "basic", "1", "0"}, 2, notelf + ": not an ELF file");
  refused({"-e", "uprobe:/etc/passwd:foo", "--", kFixture, "basic", "1", "0"}, 2, "/etc/passwd: not an ELF file");
  refused({"-e", "uprobe:" + d.path() + ":foo", "--", kFixture, "basic", "1", "0"}, 2,
          d.path() + ": is a directory, not a regular file");
  refused({"-e", "uprobe:/dev/null:foo", "--", kFixture, "basic", "1", "0"}, 2, "/dev/null: not a regular file");
  // An offset inside an instruction (trace_fn+1: every x86 function's first
  // instruction here is longer than one byte), as libuprobe says it.
  refused({"-e", "uprobe:" + kFixture + ":trace_fn+1", "--", kFixture, "basic", "1", "0"}, 2,
          "offset falls inside the ");
  // ... in a library the CLI itself has mapped (libc: planned there, not
  // registered), with the instruction named: malloc's first is 2 bytes or more.
  refused({"-e", "uprobe:libc:malloc+1", "--", kFixture, "basic", "1", "0"}, 2, "offset falls inside the ");
  refused({"-e", "uprobe:libc:malloc+1 { @ = count(); }", "-c", kFixture + " basic 1 0"}, 2,
          "offset falls inside the ");
  // A file it may not read: why, not "not an ELF file" (as another user: root reads it anyway).
  if (::geteuid() != 0) {
    const std::string priv = d.path() + "/err";
    { std::ofstream(priv) << "x"; }
    chmod(priv.c_str(), 0);
    refused({"-e", "uprobe:" + priv + ":foo", "--", kFixture, "basic", "1", "0"}, 2, priv + ": Permission denied");
  }
  // -o into a missing directory.
  refused({"-o", "/nonexistent-dir/report", "-e", fn, "--", kFixture, "basic", "1", "0"}, 2,
          "/nonexistent-dir/report: No such file or directory");
  // PROG a directory, not executable, missing.
  refused({"-e", fn, "--", d.path()}, 126, d.path() + ": is a directory");
  refused({"-e", fn, "--", notelf}, 126, notelf + ": not executable");
  refused({"-e", fn, "--", d.path() + "/no-such-prog"}, 127, "No such file or directory");
  refused({"-e", fn, "--", "no-such-prog-in-path"}, 127, "no-such-prog-in-path: command not found");

  // The program starts while the specs are checked, and waits at the agent's
  // start gate: a spec refused then ends it there, before its code runs,
  // and the trace's directory (under $TMPDIR) is removed. Both ways in.
  {
    TempDir tmp;
    for (const std::vector<std::string>& a :
         {std::vector<std::string>{kTrace, "-e", "uprobe:" + kFixture + ":trace_fn+1", "--", kFixture, "basic", "1",
                                   "0"},
          std::vector<std::string>{kTrace, "-e", "uprobe:" + kFixture + ":trace_fn+1 { @ = count(); }", "-c",
                                   kFixture + " basic 1 0"}}) {
      Result r = run(a, {"TMPDIR=" + tmp.path()});
      EXPECT_EQ(r.status, 2) << dump(r);
      EXPECT_NE(r.err.find("offset falls inside the "), std::string::npos) << dump(r);
      EXPECT_EQ(r.out, "") << dump(r);  // the program did not run
      std::vector<std::string> left;
      if (DIR* dir = opendir(tmp.path().c_str())) {
        while (dirent* e = readdir(dir))
          if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") left.push_back(e->d_name);
        closedir(dir);
      }
      EXPECT_TRUE(left.empty()) << left.size() << " entries left, first " << (left.empty() ? "" : left[0]);
    }
  }
  // A program no agent is loaded into (statically linked) cannot wait at the
  // gate: the specs are checked before it starts, so it does not run either
  // (a bpftrace program's missing function is skipped, as bpftrace skips
  // it: with none left, bpftrace's "No probes to attach", exit status 1).
  for (const std::vector<std::string>& a :
       {std::vector<std::string>{kTrace, "-e", "uprobe:libc:no_such_function_here", "--", TRACE_STATIC},
        std::vector<std::string>{kTrace, "-e", "uprobe:libc:no_such_function_here { @ = count(); }", "-c",
                                 TRACE_STATIC}}) {
    Result r = run(a);
    const bool bt = a[2].find('{') != std::string::npos;
    EXPECT_EQ(r.status, bt ? 1 : 2) << dump(r);
    EXPECT_NE(r.err.find("symbol `no_such_function_here' not found"), std::string::npos) << dump(r);
    EXPECT_EQ(r.out, bt ? "No probes to attach\n" : "") << dump(r);  // "static fixture ran" would be the program's
  }
  {  // (and it runs when the specs pass: nothing waits for a gate there)
    Result r = run({kTrace, "-e", "uprobe:libc:malloc", "--", TRACE_STATIC});
    EXPECT_EQ(r.status, 0) << dump(r);
    EXPECT_EQ(r.out, "static fixture ran\n") << dump(r);
  }

  // An offset at an instruction start is accepted.
  Result ok = run({kTrace, "-e", "uprobe:" + kFixture + ":trace_fn+0", "--", kFixture, "basic", "1", "0"});
  EXPECT_EQ(ok.status, 0) << dump(ok);

  // A report that cannot be written: a message and a non-zero status.
  if (access("/dev/full", W_OK) == 0) {
    Result full = run({kTrace, "-o", "/dev/full", "-e", fn, "--", kFixture, "basic", "1", "0"});
    EXPECT_EQ(full.status, 2) << dump(full);
    EXPECT_NE(full.err.find("/dev/full: cannot write the report: No space left on device"), std::string::npos)
        << dump(full);
  }
}

// ---------------------------------------------------------------- python3.11

class Python : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kPython.c_str(), X_OK) != 0) GTEST_SKIP() << kPython << " not installed";
    if (!has_usdt_notes(kPython)) GTEST_SKIP() << kPython << " has no USDT probes";
  }
  // python:function__entry (and other probes) of one run of fib.py.
  std::map<std::string, long> counts(const std::vector<std::string>& probes, const std::string& n,
                                     const std::string& throws) {
    std::vector<std::string> specs;
    for (const auto& p : probes) specs.push_back("usdt:" + kPython + ":python:" + p);
    Result r = trace(specs, {kPython, "-I", "-S", kFibPy, n, throws}, {}, {"PYTHONHASHSEED=0"});
    EXPECT_EQ(r.status, 0) << dump(r);
    EXPECT_EQ(r.err.find("WARNING"), std::string::npos) << r.err;
    std::map<std::string, long> out;
    for (const auto& [k, v] : hits(r.report)) out[k.substr(k.rfind(':') + 1)] = v;
    return out;
  }
};

// With line tracing on, python 3.11 reports every function entry: fib(15)
// adds 2*fib(16)-1 - 1 = 1972 calls to fib(0)'s run.
TEST_F(Python, FunctionEntryCountsEveryCallWhenLineIsOn) {
  auto base = counts({"function__entry", "line"}, "0", "0");
  auto fib = counts({"function__entry", "line"}, "15", "0");
  EXPECT_EQ(fib["function__entry"] - base["function__entry"], 1972);
  EXPECT_GT(fib["line"], base["line"]);
}

// Alone, 3.11's function__entry fires only where the eval loop is entered
// with throwflag (generator.throw()): 7 throws add exactly 7, fib adds none.
TEST_F(Python, FunctionEntryAloneFiresOnGeneratorThrow) {
  auto base = counts({"function__entry"}, "0", "0");
  auto more = counts({"function__entry"}, "15", "7");
  EXPECT_EQ(more["function__entry"] - base["function__entry"], 7);
  EXPECT_GT(base["function__entry"], 0);
}

// ---------------------------------------------------------------- PostgreSQL

TEST(Postgres, ListAndAttachUsdt) {
  if (access(kPostgres.c_str(), X_OK) != 0) GTEST_SKIP() << kPostgres << " not installed";
  if (!has_usdt_notes(kPostgres)) GTEST_SKIP() << kPostgres << " has no USDT probes";
  Result l = run({kTrace, "-l", kPostgres});
  ASSERT_EQ(l.status, 0) << dump(l);
  EXPECT_NE(l.out.find("usdt:" + real(kPostgres) + ":postgresql:transaction__start\n"), std::string::npos);
  EXPECT_NE(l.out.find("uprobe:" + real(kPostgres) + ":PostgresMain\n"), std::string::npos);

  Result r = trace({"usdt:" + kPostgres + ":postgresql:transaction__start"}, {kPostgres, "--version"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_NE(r.out.find("PostgreSQL"), std::string::npos) << dump(r);
  auto h = hits(r.report);
  const std::string key = "usdt:" + real(kPostgres) + ":postgresql:transaction__start";
  ASSERT_EQ(h.count(key), 1u) << dump(r);  // attached (0 hits: --version starts no transaction)
  EXPECT_EQ(h[key], 0);
  EXPECT_EQ(r.err.find("WARNING"), std::string::npos) << r.err;
}

}  // namespace
