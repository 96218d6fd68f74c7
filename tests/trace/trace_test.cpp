// SPDX-License-Identifier: MIT
// uprobe-trace end to end: the CLI runs tests/trace/fixture.c (and, when
// installed, python3.11 and postgres) with the agent preloaded; every count
// is checked exactly against what the program did.

#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

const std::string kTrace = UPROBE_TRACE_BIN;
const std::string kFixture = TRACE_FIXTURE;
const std::string kFibPy = TRACE_FIB_PY;
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
                   {"-p"});
  ASSERT_EQ(r.status, 0) << dump(r);
  const std::string key = "uprobe:" + fixture() + ":trace_fn";
  EXPECT_EQ(hits(r.report)[key], threads * each) << dump(r);
  auto pt = per_thread(r.report, key);
  ASSERT_EQ(pt.thread_counts.size(), static_cast<std::size_t>(threads)) << dump(r);
  for (long c : pt.thread_counts) EXPECT_EQ(c, each);
}

TEST(Trace, ForkedChildCountsSeparately) {
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "fork", "100"}, {"-p"});
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

TEST(Trace, UnderscoreExitLosesTheCountsAndSaysSo) {
  // _exit() skips the destructor and is not interposed (it must stay
  // async-signal-safe): the child's counts are lost and the child is named.
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "lost", "10"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn"], 10) << dump(r);  // the child's 10 are lost
  EXPECT_NE(r.err.find("ended without reporting its counts (_exit()"), std::string::npos) << dump(r);

  // The program itself: its exit status passes through, and it is named.
  Result q = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "quickexit", "7"});
  EXPECT_EQ(q.status, 3) << dump(q);
  EXPECT_NE(q.err.find("WARNING: " + kFixture + " (pid "), std::string::npos) << dump(q);

  // _exit() from a SIGALRM handler that interrupts free() in a multi-threaded
  // program: the program ends (the agent allocates nothing on that path).
  Result s = trace({"uprobe:libc:getppid"}, {kFixture, "sigexit"});
  EXPECT_EQ(s.status, 3) << dump(s);
}

TEST(Trace, ProcessesThatSkipExitAreNamed) {
  // A child that leaves through the exit system call: its counts are lost, and named.
  Result r = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "rawlost", "10"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn"], 10) << dump(r);
  EXPECT_NE(r.err.find("ended without reporting its counts"), std::string::npos) << dump(r);

  // The program itself, in text and json: named on stderr (json also lists it).
  for (const char* format : {"text", "json"}) {
    Result m = trace({"uprobe:trace_fixture:trace_fn"}, {kFixture, "rawexit", "4"}, {"--format", format});
    EXPECT_EQ(m.status, 3) << dump(m);
    EXPECT_NE(m.err.find("WARNING: " + kFixture + " (pid "), std::string::npos) << format << dump(m);
    EXPECT_NE(m.err.find(") ended without reporting its counts"), std::string::npos) << format << dump(m);
    EXPECT_EQ(m.err.find("no process loaded the agent"), std::string::npos) << dump(m);
  }
}

// The agent's own work while probes are attached (setting up, writing records
// at exec, fork and exit, its exec wrappers, libuprobe's
// thread_local destructors) is not counted: libc functions the program never
// calls count 0, as bpftrace shows.
TEST(Trace, AgentOwnLibcCallsAreNotCounted) {
  const std::vector<std::string> fns{"getppid", "open", "close", "rename", "clock_gettime", "free", "malloc",
                                     "unlink"};
  std::vector<std::string> specs;
  for (const auto& f : fns) specs.push_back("uprobe:libc:" + f);
  const std::vector<std::vector<std::string>> progs{
      {kFixture, "wild"},             // the constructor's end, exit()
      {kFixture, "execfail", "0"},    // the record written at exec
      {kFixture, "execfail", "5"},    // ... and taken back 5 times (failed execs)
      {kFixture, "rawlost", "2"},     // fork: the child's start file
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

// A probe hit by int3 in a thread that blocks every signal: the kernel would
// force SIGTRAP and kill the program, so libuprobe keeps SIGTRAP out of the
// masks the program sets (issue 14). trace_fn+5 is its `ret`: never an
// optimized site (-v names the mode).
TEST(Trace, ProbeHitWithSignalsBlocked) {
  Result r = trace({"uprobe:trace_fixture:trace_fn+5"}, {kFixture, "blocked", "5"}, {"-v"});
  ASSERT_EQ(r.status, 0) << dump(r);
  EXPECT_EQ(hits(r.report)["uprobe:" + fixture() + ":trace_fn+5"], 5) << dump(r);
  EXPECT_NE(r.err.find("sites int3 1"), std::string::npos) << dump(r);
}

// The issue's command: liblzma starts xz's worker threads with every signal
// blocked, and libc's memcpy (the implementation this CPU selected) is an
// int3 site. It exited 133 (SIGTRAP) before.
TEST(Trace, XzWorkersBlockEverySignalAndCallInt3ProbedMemcpy) {
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
  // -o into a missing directory.
  refused({"-o", "/nonexistent-dir/report", "-e", fn, "--", kFixture, "basic", "1", "0"}, 2,
          "/nonexistent-dir/report: No such file or directory");
  // PROG a directory, not executable, missing.
  refused({"-e", fn, "--", d.path()}, 126, d.path() + ": is a directory");
  refused({"-e", fn, "--", notelf}, 126, notelf + ": not executable");
  refused({"-e", fn, "--", d.path() + "/no-such-prog"}, 127, "No such file or directory");
  refused({"-e", fn, "--", "no-such-prog-in-path"}, 127, "no-such-prog-in-path: command not found");

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
