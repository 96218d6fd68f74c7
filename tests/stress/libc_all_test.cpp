// SPDX-License-Identifier: MIT
// Probing all of libc (issue 7): an entry probe on every STT_FUNC and
// STT_GNU_IFUNC symbol of libc.so.6's .dynsym (one probe per code address:
// aliases share it), attached and detached while a workload in this process
// (qsort, snprintf, stdio file I/O, threads, fork, malloc/free) runs and checks its
// own results. libc functions that libuprobe's trap path runs are refused by
// design (Errc::forbidden_target); every refusal is listed and must be of that
// kind. A few rarely used functions are called exactly K times and their
// probes must count exactly K. After detaching all, libc's text equals the
// file byte for byte.

#include <dlfcn.h>
#include <elf.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "int_consumers.hpp"
#include "proc_text.hpp"
#include "uprobe/symbols.hpp"
#include "uprobe/uprobe.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

/// One code address of libc with every .dynsym name that points there.
struct LibcFunction {
  std::uint64_t offset = 0;
  std::vector<std::string> names;
  bool ifunc = false;
};

std::vector<LibcFunction> libc_functions(const std::string& path, std::size_t& symbols) {
  std::map<std::uint64_t, LibcFunction> by_offset;
  symbols = 0;
  for (const uprobe::Symbol& s : uprobe::read_symbols(path)) {
    if (!s.dynamic || (s.type != STT_FUNC && s.type != STT_GNU_IFUNC)) continue;
    ++symbols;
    EXPECT_TRUE(s.in_file && s.executable) << s.full_name() << " is not in libc's executable segment";
    if (!s.in_file || !s.executable) continue;
    LibcFunction& f = by_offset[s.offset];
    f.offset = s.offset;
    f.ifunc = f.ifunc || s.type == STT_GNU_IFUNC;
    if (std::find(f.names.begin(), f.names.end(), s.name) == f.names.end()) f.names.push_back(s.name);
  }
  std::vector<LibcFunction> out;
  for (auto& [off, f] : by_offset) out.push_back(std::move(f));
  return out;
}

/// The file of the object that holds `addr` (dladdr), or "?".
std::string dl_object_of(const void* addr) {
  Dl_info di;
  return addr && ::dladdr(addr, &di) && di.dli_fname ? di.dli_fname : "?";
}

// ---------------------------------------------------------------- workload --

/// What every workload iteration checks; the first failure is kept.
struct WorkloadState {
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> iterations{0}, errors{0};
  std::mutex mu;
  std::string first_error;
  std::vector<std::string> printf_expected;  // computed before any probe is attached

  void fail(const std::string& what) {
    if (errors.fetch_add(1) == 0) {
      std::lock_guard<std::mutex> l(mu);
      first_error = what;
    }
  }
};

constexpr int kPrintfCases = 64;

std::string format_case(int i) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%d|%s|%.3f|%08x|%ld|%-6s|%c", i, "probe", i * 0.5 - 3.25, i * 2654435761u,
                static_cast<long>(i) * i * 1000003L, i % 2 ? "odd" : "even", 'a' + i % 26);
  return buf;
}

int compare_ints(const void* a, const void* b) {
  const int x = *static_cast<const int*>(a), y = *static_cast<const int*>(b);
  return (x > y) - (x < y);
}

void* child_thread(void* arg) {
  const char* s = static_cast<const char*>(arg);
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(std::strlen(s) * 3));
}

void workload_iteration(WorkloadState& w, int worker, std::uint64_t it, const std::string& tmp_path) {
  const std::string tag = "worker " + std::to_string(worker) + " iteration " + std::to_string(it) + ": ";
  // malloc + qsort.
  const int n = 300 + static_cast<int>(it % 200);
  int* v = static_cast<int*>(std::malloc(sizeof(int) * static_cast<std::size_t>(n)));
  if (!v) return w.fail(tag + "malloc returned NULL");
  std::uint32_t x = static_cast<std::uint32_t>(it * 7919 + static_cast<std::uint64_t>(worker));
  long long sum = 0;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<int>(x >> 8) - (1 << 23);
    sum += v[i];
  }
  std::qsort(v, static_cast<std::size_t>(n), sizeof(int), compare_ints);
  long long sum2 = 0;
  for (int i = 0; i < n; ++i) {
    sum2 += v[i];
    if (i && v[i - 1] > v[i]) {
      std::free(v);
      return w.fail(tag + "qsort left the array unsorted at " + std::to_string(i));
    }
  }
  std::free(v);
  if (sum != sum2) return w.fail(tag + "qsort changed the elements");

  // snprintf into a buffer.
  const int pc = static_cast<int>(it % kPrintfCases);
  const std::string got = format_case(pc);
  if (got != w.printf_expected[static_cast<std::size_t>(pc)])
    return w.fail(tag + "snprintf gave \"" + got + "\", want \"" + w.printf_expected[static_cast<std::size_t>(pc)] +
                  "\"");

  // stdio file I/O on a temporary file.
  FILE* f = std::fopen(tmp_path.c_str(), "w+");
  if (!f) return w.fail(tag + "fopen " + tmp_path + ": " + std::strerror(errno));
  for (int i = 0; i < 20; ++i) std::fprintf(f, "line %d of %llu\n", i, static_cast<unsigned long long>(it));
  std::fflush(f);
  std::rewind(f);
  char line[64];
  int lines = 0;
  while (std::fgets(line, sizeof line, f)) {
    char want[64];
    std::snprintf(want, sizeof want, "line %d of %llu\n", lines, static_cast<unsigned long long>(it));
    if (std::strcmp(line, want) != 0) {
      std::fclose(f);
      return w.fail(tag + "read back \"" + line + "\", want \"" + want + "\"");
    }
    ++lines;
  }
  std::fclose(f);
  if (lines != 20) return w.fail(tag + "read back " + std::to_string(lines) + " lines, want 20");

  // A thread.
  pthread_t t;
  char msg[] = "thirteen char";
  if (int e = pthread_create(&t, nullptr, child_thread, msg)) return w.fail(tag + "pthread_create: " + std::strerror(e));
  void* ret = nullptr;
  pthread_join(t, &ret);
  if (reinterpret_cast<std::uintptr_t>(ret) != 39) return w.fail(tag + "the child thread returned a wrong value");

  // A child process (fork runs libc functions with liburcu-bp's signals blocked).
  const pid_t pid = ::fork();
  if (pid == 0) {
    char b[32];
    std::snprintf(b, sizeof b, "%d-%d", worker, 42);
    ::_exit(std::strcmp(b, worker ? "1-42" : "0-42") == 0 ? 7 : 8);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 7)
    return w.fail(tag + "the fork child failed: wait status " + std::to_string(status));

  // malloc/free of many sizes.
  void* blocks[32];
  for (int i = 0; i < 32; ++i) {
    const std::size_t sz = 1 + ((it * 31 + static_cast<std::uint64_t>(i) * 977) % 8192);
    blocks[i] = std::malloc(sz);
    if (!blocks[i]) return w.fail(tag + "malloc(" + std::to_string(sz) + ") returned NULL");
    std::memset(blocks[i], i, sz);
    if (static_cast<unsigned char*>(blocks[i])[sz - 1] != i) return w.fail(tag + "malloc'ed memory did not hold");
  }
  for (int i = 31; i >= 0; --i) std::free(blocks[i]);
}

void workload(WorkloadState& w, int worker, std::string tmp_path) {
  for (std::uint64_t it = 0; !w.stop.load(std::memory_order_relaxed); ++it) {
    workload_iteration(w, worker, it, tmp_path);
    w.iterations.fetch_add(1, std::memory_order_relaxed);
  }
  std::remove(tmp_path.c_str());
}

// ------------------------------------------------ functions with known counts --

/// Called through volatile pointers: the compiler cannot turn them into
/// builtins or drop them.
int (*volatile p_strverscmp)(const char*, const char*) = strverscmp;
int (*volatile p_ffsll)(long long) = ffsll;
long (*volatile p_a64l)(const char*) = a64l;
void (*volatile p_swab)(const void*, void*, ssize_t) = swab;

struct KnownCount {
  const char* name;
  unsigned calls;
};
constexpr KnownCount kKnown[] = {{"strverscmp", 37}, {"ffsll", 41}, {"a64l", 43}, {"swab", 29}};

/// Makes exactly the calls kKnown lists and checks their results.
void call_known(std::string& error) {
  for (unsigned i = 0; i < 37; ++i) {
    const int r = p_strverscmp(i % 2 ? "file9" : "file10", "file10");
    if (i % 2 ? r >= 0 : r != 0) error = "strverscmp gave a wrong order";
  }
  for (unsigned i = 0; i < 41; ++i)
    if (p_ffsll(1ll << (i % 63)) != static_cast<int>(i % 63) + 1) error = "ffsll gave a wrong bit";
  for (unsigned i = 0; i < 43; ++i)
    if (p_a64l("./") != 64) error = "a64l(\"./\") is not 64";
  for (unsigned i = 0; i < 29; ++i) {
    char in[4] = {'a', 'b', 'c', 'd'}, out[4] = {};
    p_swab(in, out, 4);
    if (std::memcmp(out, "badc", 4) != 0) error = "swab did not swap";
  }
}

TEST(LibcAll, EntryProbeOnEveryDynsymFunction) {
  const std::string libc = uprobe::resolve_library("libc.so.6");
  std::size_t nsyms = 0;
  const std::vector<LibcFunction> fns = libc_functions(libc, nsyms);
  ASSERT_GT(fns.size(), 1000u) << libc;
  {
    const auto before = uprobe_test::compare_text_with_files([&](const uprobe_test::MapLine& m) { return m.path == libc; });
    ASSERT_GT(before.bytes, 0u) << "libc's text is not mapped from " << libc;
    ASSERT_EQ(before.differing, 0u) << before.diffs[0];
  }

  WorkloadState w;
  for (int i = 0; i < kPrintfCases; ++i) w.printf_expected.push_back(format_case(i));
  std::vector<std::thread> workers;
  const std::string tmp = std::string(::testing::TempDir()) + "uprobe_libc_all_" + std::to_string(::getpid());
  for (int i = 0; i < 2; ++i) workers.emplace_back(workload, std::ref(w), i, tmp + "_" + std::to_string(i));

  // Attach everything while the workload runs.
  std::vector<std::unique_ptr<opttest::IntCounter>> counters(fns.size());
  std::vector<uprobe::Uprobe*> probes(fns.size(), nullptr);
  struct Refusal {
    std::string names;
    uprobe::Errc code;
    std::string what;
  };
  std::vector<Refusal> refused;
  const auto t_attach = Clock::now();
  for (std::size_t i = 0; i < fns.size(); ++i) {
    counters[i] = std::make_unique<opttest::IntCounter>();
    try {
      probes[i] = uprobe::register_uprobe(libc, fns[i].offset, *counters[i]);
    } catch (const uprobe::Error& e) {
      std::string names;
      for (const auto& n : fns[i].names) names += (names.empty() ? "" : "/") + n;
      refused.push_back({names, e.code(), e.what()});
    }
  }
  const double attach_ms = ms_since(t_attach);

  // Modes, while attached.
  std::map<std::string, unsigned> modes;
  for (uprobe::Uprobe* p : probes)
    if (p) ++modes[uprobe::to_string(uprobe::probe_info(p).mode)];

  // Let the workload run with every probe in place, then the known counts.
  const std::uint64_t it0 = w.iterations.load();
  const auto t_run = Clock::now();
  while (w.iterations.load() < it0 + 20 && ms_since(t_run) < 20000) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::uint64_t attached_iterations = w.iterations.load() - it0;
  std::string known_error;
  call_known(known_error);

  const auto t_detach = Clock::now();
  for (std::size_t i = 0; i < fns.size(); ++i)
    if (probes[i]) uprobe::unregister_uprobe(probes[i], *counters[i]);
  const double detach_ms = ms_since(t_detach);
  w.stop.store(true);
  for (auto& t : workers) t.join();

  std::uint64_t total_hits = 0, functions_hit = 0;
  std::map<std::string, std::uint64_t> hits_by_name;
  for (std::size_t i = 0; i < fns.size(); ++i) {
    const std::uint64_t h = counters[i]->hits.load();
    total_hits += h;
    functions_hit += h != 0;
    for (const auto& n : fns[i].names) hits_by_name[n] = h;
  }
  std::printf("[ info ] %s: %zu .dynsym FUNC/IFUNC symbols at %zu addresses; attached %zu, refused %zu\n",
              libc.c_str(), nsyms, fns.size(), fns.size() - refused.size(), refused.size());
  for (const auto& r : refused) std::printf("[ info ]   refused %s: %s\n", r.names.c_str(), r.what.c_str());
  std::string mode_line;
  for (const auto& [m, n] : modes) mode_line += " " + m + " " + std::to_string(n);
  std::printf("[ info ] modes:%s; attach-all %.0f ms, detach-all %.0f ms\n", mode_line.c_str(), attach_ms, detach_ms);
  std::printf("[ info ] workload: %llu iterations (%llu with every probe attached); %llu hits on %llu functions\n",
              static_cast<unsigned long long>(w.iterations.load()), static_cast<unsigned long long>(attached_iterations),
              static_cast<unsigned long long>(total_hits), static_cast<unsigned long long>(functions_hit));

  std::vector<std::pair<std::uint64_t, std::size_t>> top;
  for (std::size_t i = 0; i < fns.size(); ++i) top.emplace_back(counters[i]->hits.load(), i);
  std::sort(top.rbegin(), top.rend());
  std::string top_line;
  for (std::size_t k = 0; k < 10 && k < top.size(); ++k)
    top_line += " " + fns[top[k].second].names[0] + " " + std::to_string(top[k].first);
  std::printf("[ info ] most hit:%s\n", top_line.c_str());

  EXPECT_EQ(w.errors.load(), 0u) << w.first_error;
  EXPECT_EQ(known_error, "");
  EXPECT_GE(attached_iterations, 20u) << "the workload made no progress with every probe attached";
  // Refusals: only libc functions that libuprobe's trap path runs.
  for (const auto& r : refused) {
    EXPECT_EQ(static_cast<int>(r.code), static_cast<int>(uprobe::Errc::forbidden_target)) << r.names << ": " << r.what;
    EXPECT_TRUE(r.what.find("runs on libuprobe's trap path") != std::string::npos ||
                r.what.find("runs with SIGTRAP blocked") != std::string::npos)
        << r.names << ": " << r.what;
  }
  EXPECT_LE(refused.size(), 32u);
  // Exact counts.
  for (const KnownCount& k : kKnown) {
    ASSERT_EQ(hits_by_name.count(k.name), 1u) << k.name << " is not a probed .dynsym function";
    EXPECT_EQ(hits_by_name[k.name], k.calls) << k.name;
  }
  // The workload's functions were hit: those the program reaches in libc. An
  // interposer that the global scope finds first may not call libc's entry
  // (ASan's malloc and free are its own allocator; its snprintf interceptor
  // calls vsnprintf, its qsort interceptor not libc's qsort entry): not
  // counted when dlsym() finds the name outside libc.
  void* const libc_h = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(libc_h, nullptr);
  unsigned checked = 0;
  for (const char* name : {"malloc", "free", "qsort", "fopen", "fgets", "pthread_create", "snprintf", "_Fork"}) {
    if (::dlsym(RTLD_DEFAULT, name) != ::dlsym(libc_h, name)) {
      std::printf("[ info ] %s is interposed (%s): its libc entry is not required to be hit\n", name,
                  dl_object_of(::dlsym(RTLD_DEFAULT, name)).c_str());
      continue;
    }
    ++checked;
    EXPECT_GT(hits_by_name[name], 0u) << name;
  }
  ::dlclose(libc_h);
  EXPECT_GE(checked, 1u);
  for (const auto& [m, n] : modes) EXPECT_TRUE(m == "int3" || m.rfind("optimized", 0) == 0) << m << " " << n;

  // Every byte of libc's text is the file's again; nothing is writable and executable.
  const auto after = uprobe_test::compare_text_with_files([&](const uprobe_test::MapLine& m) { return m.path == libc; });
  EXPECT_GT(after.bytes, 0u);
  EXPECT_EQ(after.differing, 0u) << (after.diffs.empty() ? "" : after.diffs[0]);
  const auto rwx = uprobe_test::rwx_mappings();
  EXPECT_TRUE(rwx.empty()) << rwx[0];
}

// The reductions of what probing all of libc found: libc functions that run
// with every signal blocked (glibc's thread start and exit, liburcu-bp's reader
// registration on a thread's first hit and its grace period on unregister) or
// on the trap path itself. A probe on one of them must be refused
// (Errc::forbidden_target) or be harmless; before they were refused, each of
// these scenarios died of SIGTRAP (an int3 hit with SIGTRAP blocked is fatal).
extern "C" __attribute__((noipa)) long libc_all_target(long x) {
  asm volatile("");
  return x + 1;
}

/// Counts hits on libc_all_target; while `hold` is set, a hit stays in the
/// handler (an active RCU reader) until it is cleared.
struct HoldingCounter : uprobe::Consumer {
  std::atomic<long> hits{0};
  std::atomic<bool> hold{false}, holding{false};
  uprobe::Action handler(uprobe::Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    if (hold.load()) {
      holding.store(true);
      while (hold.load()) __builtin_ia32_pause();
    }
    return uprobe::Action::keep;
  }
};

constexpr int kReaderThreads = 20;
pthread_barrier_t g_barrier;

void* first_hit_thread(void*) {
  const long r = libc_all_target(41);  // this thread's first hit: liburcu-bp registers it as a reader
  pthread_barrier_wait(&g_barrier);    // all alive at once: liburcu-bp's reader registry grows
  return reinterpret_cast<void*>(r);
}

void* holding_thread(void*) { return reinterpret_cast<void*>(libc_all_target(1)); }

/// In a child process: an entry probe on libc's `name`, then thread starts and
/// exits, 20 new threads' first hits (reader registrations, registry growth)
/// and an unregister while a reader is inside a handler (a grace period that
/// waits). Exit status 0: survived with exact counts; 3: refused with
/// forbidden_target; anything else is a failure.
[[noreturn]] void probe_and_exercise(const char* name) {
  struct : uprobe::Consumer {
  } on_libc;
  HoldingCounter on_target;
  uprobe::Uprobe* p = nullptr;
  try {
    const std::string libc = uprobe::resolve_library("libc.so.6");
    p = uprobe::register_uprobe(libc, uprobe::find_symbol(libc, name).offset, on_libc);
  } catch (const uprobe::Error& e) {
    ::_exit(e.code() == uprobe::Errc::forbidden_target ? 3 : 4);
  }
  uprobe::Uprobe* t = uprobe::register_uprobe(reinterpret_cast<const void*>(&libc_all_target), on_target);
  pthread_barrier_init(&g_barrier, nullptr, kReaderThreads + 1);
  pthread_t th[kReaderThreads];
  for (pthread_t& x : th)
    if (pthread_create(&x, nullptr, first_hit_thread, nullptr) != 0) ::_exit(5);
  pthread_barrier_wait(&g_barrier);
  for (pthread_t& x : th) {
    void* r = nullptr;
    pthread_join(x, &r);
    if (reinterpret_cast<long>(r) != 42) ::_exit(6);
  }
  on_target.hold.store(true);
  pthread_t holder;
  if (pthread_create(&holder, nullptr, holding_thread, nullptr) != 0) ::_exit(5);
  while (!on_target.holding.load()) ::usleep(1000);
  std::thread release([&] {
    ::usleep(50 * 1000);
    on_target.hold.store(false);
  });
  uprobe::unregister_uprobe(t, on_target);  // waits for the holding reader
  release.join();
  pthread_join(holder, nullptr);
  uprobe::unregister_uprobe(p, on_libc);
  ::_exit(on_target.hits.load() == kReaderThreads + 1 ? 0 : 7);
}

TEST(LibcAll, FunctionsRunWithSigtrapBlockedAreRefusedOrSafe) {
  for (const char* name : {"__ctype_init", "_setjmp", "__sigsetjmp", "madvise", "getpagesize", "pthread_mutex_lock",
                           "pthread_mutex_unlock", "pthread_self", "poll", "mremap", "sigfillset", "pthread_sigmask",
                           "sched_getcpu", "syscall", "strverscmp"}) {
    const bool control = std::strcmp(name, "strverscmp") == 0;  // probed and survives: exit status 0 only
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) probe_and_exercise(name);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || (!control && WEXITSTATUS(status) == 3)))
        << name << ": " << (WIFSIGNALED(status) ? std::string("killed by ") + strsignal(WTERMSIG(status))
                                                : "exit status " + std::to_string(WEXITSTATUS(status)));
  }
}

// fork() runs libc functions between the atfork prepare and parent/child
// handlers, where liburcu-bp's fork handler (called by libuprobe's) blocks
// every signal: probes there were fatal before libuprobe let SIGTRAP in again.
struct CountingConsumer : uprobe::Consumer {
  std::atomic<long> hits{0};
  uprobe::Action handler(uprobe::Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

/// In a child process: probes on what fork() runs with liburcu-bp's signals
/// blocked, a second thread alive (fork's multi-threaded path), one fork. Exit
/// status 0 when parent and child counted exactly; 3 when a probe was refused.
[[noreturn]] void probe_fork_internals() {
  const char* const names[] = {"_IO_list_lock", "_IO_list_unlock", "_IO_list_resetlock", "_Fork"};
  CountingConsumer c[4];
  uprobe::Uprobe* p[4];
  const std::string libc = uprobe::resolve_library("libc.so.6");
  for (int i = 0; i < 4; ++i) {
    try {
      p[i] = uprobe::register_uprobe(libc, uprobe::find_symbol(libc, names[i]).offset, c[i]);
    } catch (const uprobe::Error& e) {
      ::_exit(e.code() == uprobe::Errc::forbidden_target ? 3 : 4);
    }
  }
  std::atomic<bool> done{false};
  std::thread other([&] {
    while (!done.load()) ::usleep(1000);
  });
  const pid_t pid = ::fork();
  if (pid == 0) {
    // This process's copies: lock and _Fork before the fork, resetlock after it, no unlock.
    ::_exit(c[0].hits == 1 && c[1].hits == 0 && c[2].hits == 1 && c[3].hits == 1 ? 0 : 8);
  }
  int status = 0;
  const bool child_ok = pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  done.store(true);
  other.join();
  for (int i = 0; i < 4; ++i) uprobe::unregister_uprobe(p[i], c[i]);
  ::_exit(!child_ok ? 9 : c[0].hits == 1 && c[1].hits == 1 && c[2].hits == 0 && c[3].hits == 1 ? 0 : 7);
}

TEST(LibcAll, ProbesOnWhatForkRunsWithSignalsBlocked) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) probe_fork_internals();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3))
      << (WIFSIGNALED(status) ? std::string("killed by ") + strsignal(WTERMSIG(status))
                              : "exit status " + std::to_string(WEXITSTATUS(status)));
}

}  // namespace
