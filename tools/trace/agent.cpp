// SPDX-License-Identifier: MIT
// libuprobe-agent.so: the LD_PRELOAD half of uprobe-trace.
//
// Its constructor reads the probe specs from UPROBE_TRACE_SPECS (one per
// line), resolves them in this process (library names against the objects
// the dynamic linker loaded here, the program's own name to /proc/self/exe),
// registers one counting consumer per probe site and enables counting last,
// so that nothing the agent itself does while attaching is counted. Its
// destructor (and every exec*() call, through agent_exec.cpp) writes this
// process's counts: into a record file in UPROBE_TRACE_OUT (a directory the
// CLI reads), or as a report to stderr when that variable is not set.
//
// Handlers run in signal context (or in the return trampoline): they only
// touch fixed memory. Every thread counts in its own block (mmap'ed on its
// first hit, page-aligned, so no cache line is shared between threads);
// threads beyond kMaxBlocks share an overflow block with atomic adds.
// Latency of an entry+return pair: the entry writes CLOCK_MONOTONIC (vDSO)
// into the session cookie, the return adds log2(now - cookie) to the thread's
// histogram.

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <uprobe/symbols.hpp>
#include <uprobe/uprobe.hpp>
#include <uprobe/usdt.hpp>

#include "agent.hpp"
#include "record.hpp"
#include "spec.hpp"

namespace {

using namespace uptrace;

constexpr unsigned kMaxBlocks = 4096;
constexpr std::size_t kHeaderWords = 8;  // word 0: tid; one cache line

// ---------------------------------------------------------------- handler-side state

struct Counters {
  std::atomic<bool> enabled{false};
  std::size_t nkeys = 0, nhists = 0;
  std::size_t hist_base = 0;    // first histogram word
  std::size_t block_words = 0;  // header + counts + histograms
  std::size_t block_bytes = 0;  // rounded up to pages
  std::atomic<unsigned> nblocks{0};
  std::atomic<std::uint64_t*> blocks[kMaxBlocks];
  std::uint64_t* overflow = nullptr;  // shared by threads past kMaxBlocks: atomic adds
};

Counters* g = nullptr;  // published before counting is enabled; never freed
std::atomic<pid_t> g_pid{0};

__attribute__((tls_model("initial-exec"))) thread_local std::uint64_t* tls_block = nullptr;

std::uint64_t* new_block() noexcept {
  const int saved_errno = errno;
  std::uint64_t* b = nullptr;
  unsigned i = g->nblocks.fetch_add(1, std::memory_order_relaxed);
  if (i < kMaxBlocks) {
    void* m = mmap(nullptr, g->block_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      b = static_cast<std::uint64_t*>(m);
      b[0] = static_cast<std::uint64_t>(syscall(SYS_gettid));
      g->blocks[i].store(b, std::memory_order_release);
    }
  }
  if (b == nullptr) b = g->overflow;
  tls_block = b;
  errno = saved_errno;
  return b;
}

inline std::uint64_t* my_block() noexcept {
  std::uint64_t* b = tls_block;
  return __builtin_expect(b != nullptr, 1) ? b : new_block();
}

inline void bump(std::uint64_t* b, std::size_t word, std::uint64_t n = 1) noexcept {
  if (__builtin_expect(b == g->overflow, 0)) {
    __atomic_fetch_add(&b[word], n, __ATOMIC_RELAXED);
  } else {  // only this thread writes here; the exit-time reader tolerates a stale value
    __atomic_store_n(&b[word], __atomic_load_n(&b[word], __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
  }
}

inline std::uint64_t now_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no system call
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// The agent's own work while probes are attached (writing records at exec,
// fork, exit; setting up; its exec*() wrappers) runs with this
// thread's depth raised: nothing it calls (getppid, open, malloc, free, ...)
// is counted. tls_exit_dtors covers libuprobe's thread_local destructors at
// exit() (see ExitDtorGuard).
__attribute__((tls_model("initial-exec"))) thread_local int tls_in_agent = 0;
__attribute__((tls_model("initial-exec"))) thread_local bool tls_exit_dtors = false;

using uptrace::agent::Scope;

inline bool counting() noexcept {
  return tls_in_agent == 0 && !tls_exit_dtors && g->enabled.load(std::memory_order_acquire);
}


/// A function site: entry counts, return counts, a latency histogram (any of
/// them). Several specs may name one site (aliases, a glob and a name): each
/// has its own key, all counted.
class FnConsumer final : public uprobe::Consumer {
 public:
  FnConsumer(uprobe::Callbacks cb, std::vector<long> entries, std::vector<long> rets, long hist)
      : uprobe::Consumer(cb), entries_(std::move(entries)), rets_(std::move(rets)), hist_(hist) {}

  uprobe::Action handler(uprobe::Regs&) override {
    if (!counting()) {
      setup_hit();
      return rets_.empty() && hist_ < 0 ? uprobe::Action::keep : uprobe::Action::ignore;
    }
    std::uint64_t* b = my_block();
    for (long e : entries_) bump(b, kHeaderWords + static_cast<std::size_t>(e));
    if (hist_ >= 0) uprobe::session_cookie() = now_ns();
    return uprobe::Action::keep;
  }

  void ret_handler(uprobe::Regs&, std::uint64_t) override {
    if (!counting()) return setup_hit();
    std::uint64_t* b = my_block();
    for (long r : rets_) bump(b, kHeaderWords + static_cast<std::size_t>(r));
    if (hist_ >= 0) {
      const std::uint64_t t0 = uprobe::session_cookie();
      const std::uint64_t t1 = now_ns();
      if (t0 != 0 && t1 >= t0)
        bump(b, g->hist_base + static_cast<std::size_t>(hist_) * kBuckets + hist_index(t1 - t0));
    }
  }

  /// Hits taken while the agent was attaching (the site is on the path of
  /// registration itself): shown with UPROBE_TRACE_DEBUG=1.
  unsigned setup_hits() const noexcept { return setup_hits_.load(std::memory_order_relaxed); }

 private:
  void setup_hit() noexcept { setup_hits_.fetch_add(1, std::memory_order_relaxed); }

  const std::vector<long> entries_, rets_;  // read-only once registered
  const long hist_;
  std::atomic<unsigned> setup_hits_{0};
};

/// A USDT probe (all its sites): a count.
class CountConsumer final : public uprobe::Consumer {
 public:
  explicit CountConsumer(long key) : key_(key) {}
  uprobe::Action handler(uprobe::Regs&) override {
    if (counting()) bump(my_block(), kHeaderWords + static_cast<std::size_t>(key_));
    return uprobe::Action::keep;
  }

 private:
  long key_;
};

// ---------------------------------------------------------------- set-up (not signal context)

struct Meta {
  std::string out_dir;   // "" : report to stderr
  std::string format = "text";
  bool per_thread = false;
  std::vector<std::string> keys, hist_keys;
  std::vector<SpecStatus> specs;
  std::map<std::string, unsigned> modes;  // probe_info().mode at attach -> sites
};
Meta* meta = nullptr;  // never freed: other threads may still hit probes while the process exits

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  buf[n] = 0;
  return buf;
}

std::string base_name(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

// "malloc@@GLIBC_2.2.5" -> "malloc": the default version is what users write.
std::string display_symbol(const std::string& s) {
  auto at = s.find("@@");
  return at == std::string::npos ? s : s.substr(0, at);
}

bool is_loaded(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  for (const auto& o : uprobe::loaded_objects())
    if (o.path == path || (o.dev == st.st_dev && o.ino == st.st_ino)) return true;
  return false;
}

// A shared library (ET_DYN, not a program): worth a pending registration
// when not loaded yet (libuprobe installs it when a dlopen() maps it).
bool is_shared_library(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  Elf64_Ehdr eh;
  bool ok = pread(fd, &eh, sizeof eh, 0) == static_cast<ssize_t>(sizeof eh);
  close(fd);
  return ok && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_type == ET_DYN &&
         base_name(path).find(".so") != std::string::npos;
}

enum class Where { here, pending, absent, error };

// Resolves a spec's PATH in this process.
Where resolve_binary(const std::string& name, std::string& path, std::string& why) {
  if (name.find('/') != std::string::npos) {
    char buf[PATH_MAX];
    if (!realpath(name.c_str(), buf)) {
      why = name + ": " + std::strerror(errno);
      return Where::error;
    }
    path = buf;
  } else {
    const std::string exe = self_exe();
    if (name == base_name(exe) || name == program_invocation_short_name) {
      path = exe;
      return Where::here;
    }
    try {
      path = uprobe::resolve_library(name);
      return Where::here;
    } catch (const uprobe::Error& e) {
      if (e.code() != uprobe::Errc::file_not_found) {
        why = e.what();
        return Where::error;
      }
      why = e.what();
      try {
        path = uprobe::resolve_library(name, uprobe::LibrarySearch::search_path);
      } catch (const uprobe::Error&) {
        return Where::absent;
      }
    }
  }
  if (is_loaded(path)) return Where::here;
  if (is_shared_library(path)) return Where::pending;
  why = path + " is not loaded in this process";
  return Where::absent;
}

struct FnPlan {
  std::string path;
  std::uint64_t offset = 0;
  std::set<std::string> entry_keys, ret_keys;
  std::string hist_key;
  std::set<std::size_t> specs;  // indexes into meta->specs
};

struct UsdtPlan {
  std::string key;
  std::vector<uprobe::usdt::Probe> sites;
  std::set<std::size_t> specs;  // indexes into meta->specs
};

void add_message(SpecStatus& s, const std::string& m) {
  if (s.message.empty()) s.message = m;
}

// libc functions that libuprobe itself runs where a probe cannot fire: its
// SIGTRAP handler reads errno before its recursion guard is up (a probe on
// __errno_location recurses until the stack overflows), and it registers with
// signals blocked through pthread_sigmask (a probe there is a trap while
// SIGTRAP is blocked: the kernel kills the process). Refused here rather than
// crashing the traced program; every alias at those offsets is covered.
std::string refused_site(const std::string& path, std::uint64_t offset) {
  static auto* cache = new std::map<std::string, std::map<std::uint64_t, std::string>>;
  auto [it, fresh] = cache->try_emplace(path);
  if (fresh && base_name(path).rfind("libc.so", 0) == 0) {
    for (const char* name : {"__errno_location", "pthread_sigmask"}) {
      try {
        it->second[uprobe::resolve_symbol(path, name).offset] = name;
      } catch (const uprobe::Error&) {
      }
    }
  }
  auto hit = it->second.find(offset);
  if (hit == it->second.end()) return {};
  return "not probed: libuprobe's own trap/registration path calls " + hit->second +
         " (a probe there would recurse or be fatal)";
}

// 0 for most sites; 1 + i for the i-th libc function of the list below,
// which is what libuprobe's registration path calls, least used first
// (measured with UPROBE_TRACE_DEBUG=1 on `uprobe:libc:*`; a site missing here
// only makes attaching slower).
unsigned registration_rank(const std::string& path, std::uint64_t offset) {
  static const char* const kRegistrationPath[] = {
      "getenv", "memfd_create", "ftruncate", "fprintf", "write", "_IO_file_write", "_IO_file_xsputn",
      "_IO_do_write", "_IO_file_overflow", "brk", "sbrk", "__default_morecore", "vsnprintf", "munmap", "mmap",
      "getpagesize", "fstat", "fstat64", "pwrite", "pwrite64", "pread", "pread64", "sysconf", "getpid",
      "_IO_default_xsputn", "sigfillset", "close", "open", "open64", "read", "dladdr", "pthread_mutex_unlock",
      "pthread_mutex_lock", "stat", "stat64", "fstatat", "fstatat64", "_IO_str_underflow", "_IO_default_uflow",
      "__uflow", "_IO_setb", "__isoc99_sscanf", "free", "malloc", "__strtoul_internal", "_IO_sputbackc"};
  static auto* cache = new std::map<std::string, std::map<std::uint64_t, unsigned>>;
  auto [it, fresh] = cache->try_emplace(path);
  if (fresh && base_name(path).rfind("libc.so", 0) == 0) {
    unsigned rank = 1;
    for (const char* name : kRegistrationPath) {
      try {
        it->second[uprobe::resolve_symbol(path, name).offset] = rank;
      } catch (const uprobe::Error&) {
      }
      ++rank;
    }
  }
  auto hit = it->second.find(offset);
  return hit == it->second.end() ? 0 : hit->second;
}

void note_mode(const uprobe::Uprobe* p) {
  try {
    meta->modes[uprobe::probe_info(p).mode]++;
  } catch (...) {
  }
}

void attach(const std::vector<std::string>& texts) {
  std::map<std::pair<std::string, std::uint64_t>, FnPlan> fns;
  std::map<std::string, UsdtPlan> usdts;
  for (const std::string& text : texts) {
    meta->specs.push_back({text, 0, ""});
    const std::size_t si = meta->specs.size() - 1;
    SpecStatus& st = meta->specs.back();
    std::string err;
    auto spec = parse_spec(text, err);
    if (!spec) {
      st.message = err;
      continue;
    }
    std::string path, why;
    Where w = resolve_binary(spec->binary, path, why);
    if (w == Where::absent || w == Where::error) {
      st.message = (w == Where::absent ? "not loaded here: " : "") + why;
      continue;
    }
    try {
      if (spec->kind == Kind::usdt) {
        std::set<std::string> mine;  // keys this spec created (a probe has several sites)
        for (auto& p : uprobe::usdt::find(path + ":" + spec->what)) {
          std::string key = "usdt:" + p.path + ":" + p.provider + ":" + p.name;
          auto [it, fresh] = usdts.try_emplace(key);
          if (fresh) it->second.key = key, mine.insert(key);
          it->second.specs.insert(si);
          if (mine.count(key)) it->second.sites.push_back(std::move(p));
        }
      } else {
        // (A GNU IFUNC such as strlen resolves to the implementation the
        // dynamic linker bound it to here: what calls run.)
        for (auto loc : uprobe::resolve_location(path + ":" + spec->what)) {
          std::string what = loc.symbol.empty() ? "+" + std::to_string(loc.offset) : display_symbol(loc.symbol);
          if (!loc.symbol.empty() && loc.symbol_offset) what += "+" + std::to_string(loc.symbol_offset);
          if (std::string why_not = refused_site(loc.path, loc.offset); !why_not.empty()) {
            add_message(st, display_symbol(loc.symbol) + ": " + why_not);
            st.failed++;
            continue;
          }
          FnPlan& f = fns[{loc.path, loc.offset}];
          f.path = loc.path, f.offset = loc.offset;
          f.specs.insert(si);
          (spec->kind == Kind::uprobe ? f.entry_keys : f.ret_keys)
              .insert(std::string(kind_name(spec->kind)) + ":" + loc.path + ":" + what);
          if (spec->kind == Kind::uretprobe || f.hist_key.empty()) f.hist_key = loc.path + ":" + what;
        }
      }
    } catch (const uprobe::Error& e) {
      st.message = e.what();
    }
  }

  // Counter layout.
  std::map<std::string, long> key_index;
  auto index_of = [&](const std::string& k) -> long {
    if (k.empty()) return -1;
    auto [it, fresh] = key_index.try_emplace(k, static_cast<long>(meta->keys.size()));
    if (fresh) meta->keys.push_back(k);
    return it->second;
  };
  struct PendingFn {
    FnPlan* plan;
    std::vector<long> entries, rets;
    long hist;
  };
  std::vector<PendingFn> pf;
  for (auto& [k, f] : fns) {
    PendingFn p{&f, {}, {}, -1};
    for (const auto& key : f.entry_keys) p.entries.push_back(index_of(key));
    for (const auto& key : f.ret_keys) p.rets.push_back(index_of(key));
    if (!p.entries.empty() && !p.rets.empty()) {
      p.hist = static_cast<long>(meta->hist_keys.size());
      meta->hist_keys.push_back(f.hist_key);
    }
    pf.push_back(std::move(p));
  }
  std::vector<std::pair<UsdtPlan*, long>> pu;
  for (auto& [k, u] : usdts) pu.emplace_back(&u, index_of(u.key));

  g = new Counters;
  g->nkeys = meta->keys.size();
  g->nhists = meta->hist_keys.size();
  g->hist_base = kHeaderWords + g->nkeys;
  g->block_words = g->hist_base + g->nhists * kBuckets;
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  g->block_bytes = (g->block_words * sizeof(std::uint64_t) + page - 1) / page * page;
  for (auto& b : g->blocks) b.store(nullptr, std::memory_order_relaxed);
  void* ov = mmap(nullptr, g->block_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ov == MAP_FAILED) throw std::bad_alloc();
  g->overflow = static_cast<std::uint64_t*>(ov);
  g->overflow[0] = static_cast<std::uint64_t>(-1);

  // Register. Keys whose registration failed everywhere are dropped from the
  // record (they were never attached); their counters just stay 0.
  std::vector<bool> attached(meta->keys.size(), false);
  std::vector<bool> hist_attached(meta->hist_keys.size(), false);
  // Registering runs libc code (sscanf over /proc/self/maps, malloc, stat,
  // open/read/close, locks, ...): a site there that is already armed traps on
  // every later registration, which made `uprobe:libc:*` (2200 sites) take ~4
  // million traps (10 s). Those sites are armed last, the most used last.
  // (Taking such a site out and re-arming it is not an option: libuprobe and
  // liburcu-bp call libc with every signal blocked while they unregister or
  // unapply, and a trap there is fatal.)
  std::stable_sort(pf.begin(), pf.end(), [](const PendingFn& a, const PendingFn& b) {
    return registration_rank(a.plan->path, a.plan->offset) < registration_rank(b.plan->path, b.plan->offset);
  });
  struct Armed {
    PendingFn* p;
    FnConsumer* c;
    uprobe::Uprobe* probe;
  };
  std::vector<Armed> armed;
  using CB = uprobe::Callbacks;
  for (auto& p : pf) {
    CB cb = p.entries.empty() ? CB::ret : p.rets.empty() ? CB::entry : CB::entry_and_ret;
    auto* c = new FnConsumer(cb, p.entries, p.rets, p.hist);  // never freed (see Meta)
    try {
      armed.push_back({&p, c, uprobe::register_uprobe(p.plan->path, p.plan->offset, *c)});
    } catch (const uprobe::Error& e) {
      for (std::size_t s : p.plan->specs) {
        add_message(meta->specs[s], e.what());
        meta->specs[s].failed++;
      }
    }
  }
  if (getenv("UPROBE_TRACE_DEBUG"))
    for (const Armed& a : armed)
      if (a.c->setup_hits())
        std::fprintf(stderr, "uprobe-trace agent: %u hits while attaching: %s+%#llx\n", a.c->setup_hits(),
                     a.p->plan->path.c_str(), static_cast<unsigned long long>(a.p->plan->offset));
  for (const Armed& a : armed) {
    note_mode(a.probe);
    for (std::size_t s : a.p->plan->specs) meta->specs[s].attached++;
    for (long e : a.p->entries) attached[static_cast<std::size_t>(e)] = true;
    for (long r : a.p->rets) attached[static_cast<std::size_t>(r)] = true;
    if (a.p->hist >= 0) hist_attached[static_cast<std::size_t>(a.p->hist)] = true;
  }
  for (auto& [u, idx] : pu) {
    auto* c = new CountConsumer(idx);
    for (const auto& site : u->sites) {
      try {
        note_mode(uprobe::register_uprobe(site.path, site.offset, site.semaphore_offset, *c));
        for (std::size_t s : u->specs) meta->specs[s].attached++;
        attached[static_cast<std::size_t>(idx)] = true;
      } catch (const uprobe::Error& e) {
        for (std::size_t s : u->specs) {
          add_message(meta->specs[s], e.what());
          meta->specs[s].failed++;
        }
      }
    }
  }
  for (auto& sp : meta->specs)
    if (sp.failed && sp.attached)
      sp.message = std::to_string(sp.failed) + " of " + std::to_string(sp.failed + sp.attached) +
                   " sites not probed; first: " + sp.message;
  // Keep only attached keys in the record (indexes stay as allocated).
  for (std::size_t i = 0; i < attached.size(); ++i)
    if (!attached[i]) meta->keys[i].clear();
  for (std::size_t i = 0; i < hist_attached.size(); ++i)
    if (!hist_attached[i]) meta->hist_keys[i].clear();
}

// ---------------------------------------------------------------- results

ProcessRecord snapshot() {
  ProcessRecord r;
  r.pid = getpid();
  r.ppid = getppid();
  r.exe = self_exe();
  r.specs = meta->specs;
  r.modes = meta->modes;
  for (const auto& k : meta->keys)
    if (!k.empty()) r.keys.push_back(k);
  for (const auto& k : meta->hist_keys)
    if (!k.empty()) r.hist_keys.push_back(k);
  if (!g) return r;
  auto take = [&](const std::uint64_t* b) {
    const long tid = static_cast<long>(static_cast<std::int64_t>(b[0]));
    for (std::size_t i = 0; i < g->nkeys; ++i) {
      std::uint64_t n = __atomic_load_n(&b[kHeaderWords + i], __ATOMIC_RELAXED);
      if (n && !meta->keys[i].empty()) r.counts.push_back({meta->keys[i], tid, n});
    }
    for (std::size_t h = 0; h < g->nhists; ++h)
      for (unsigned k = 0; k < kBuckets; ++k) {
        std::uint64_t n = __atomic_load_n(&b[g->hist_base + h * kBuckets + k], __ATOMIC_RELAXED);
        if (n && !meta->hist_keys[h].empty()) r.buckets.push_back({meta->hist_keys[h], tid, k, n});
      }
  };
  unsigned n = std::min(g->nblocks.load(std::memory_order_acquire), kMaxBlocks);
  for (unsigned i = 0; i < n; ++i)
    if (const std::uint64_t* b = g->blocks[i].load(std::memory_order_acquire)) take(b);
  take(g->overflow);
  return r;
}

bool write_all(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    ssize_t w = write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<std::size_t>(w);
  }
  return true;
}

// Writes the record (or the stderr report); returns the record file's path.
std::string write_results() {
  ProcessRecord r = snapshot();
  if (meta->out_dir.empty()) {
    Report rep;
    rep.add(r);
    std::string text = meta->format == "json" ? format_json(rep, meta->per_thread)
                                              : format_text(rep, meta->per_thread);
    for (const auto& m : rep.messages) text += "uprobe-trace: " + m.spec + ": " + m.text + "\n";
    write_all(STDERR_FILENO, "\n" + text);
    return {};
  }
  const std::string base = meta->out_dir + "/" + std::to_string(r.pid) + "." + std::to_string(now_ns());
  const std::string tmp = base + ".tmp", final_path = base + ".rec";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return {};
  bool ok = write_all(fd, serialize(r));
  close(fd);
  if (!ok || rename(tmp.c_str(), final_path.c_str()) != 0) {
    unlink(tmp.c_str());
    return {};
  }
  return final_path;
}

// DIR/PID.start exists while this process counts and has not reported: the
// CLI names processes that ended without reporting (_exit(), a fatal signal).
// Written with a stack buffer only (also from the fork child handler).
void start_file_path(char* buf, std::size_t n, pid_t pid) {
  std::snprintf(buf, n, "%s/%ld.start", meta->out_dir.c_str(), static_cast<long>(pid));
}

void create_start_file() {
  if (meta->out_dir.empty()) return;
  char path[PATH_MAX], line[64];
  start_file_path(path, sizeof path, getpid());
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  int n = std::snprintf(line, sizeof line, "%ld\n", static_cast<long>(getppid()));
  if (write(fd, line, static_cast<std::size_t>(n)) < 0) {
  }
  close(fd);
}

void remove_start_file() {
  if (meta->out_dir.empty()) return;
  char path[PATH_MAX];
  start_file_path(path, sizeof path, getpid());
  unlink(path);
}

std::atomic<bool> finished{false};

void finish() noexcept {
  Scope scope;
  if (!meta || finished.exchange(true)) return;
  if (g) g->enabled.store(false, std::memory_order_seq_cst);
  try {
    if (!write_results().empty()) remove_start_file();
  } catch (...) {
  }
}

void atfork_child() {
  Scope scope;
  g_pid.store(getpid(), std::memory_order_relaxed);
  create_start_file();
  if (!g) return;
  // The child starts from zero: the parent reports what it counted.
  auto clear = [](std::uint64_t* b) {
    std::memset(b + 1, 0, (g->block_words - 1) * sizeof(std::uint64_t));
    b[0] = 0;
  };
  unsigned n = std::min(g->nblocks.load(std::memory_order_acquire), kMaxBlocks);
  for (unsigned i = 0; i < n; ++i)
    if (std::uint64_t* b = g->blocks[i].load(std::memory_order_acquire)) clear(b);
  clear(g->overflow);
  g->overflow[0] = static_cast<std::uint64_t>(-1);
  if (tls_block && tls_block != g->overflow) tls_block[0] = static_cast<std::uint64_t>(syscall(SYS_gettid));
}

std::string env_or(const char* name, const char* def) {
  const char* v = getenv(name);
  return v ? v : def;
}

void leave_exit_dtors() { tls_exit_dtors = false; }

// exit() runs the thread_local destructors first (the last constructed
// first), then the atexit list. libuprobe's (capstone handles, decoder
// caches) were constructed while attaching, before this guard: its
// destructor marks the rest of them as the agent's, and registers (now, so
// first in line) the atexit handler that ends the mark before the program's
// own atexit handlers and static destructors run, which are counted.
struct ExitDtorGuard {
  ExitDtorGuard() = default;
  ExitDtorGuard(const ExitDtorGuard&) = delete;
  ExitDtorGuard& operator=(const ExitDtorGuard&) = delete;
  ~ExitDtorGuard() {
    tls_exit_dtors = true;
    Scope scope;
    std::atexit(leave_exit_dtors);
  }
};

void arm_exit_dtor_guard() {
  thread_local ExitDtorGuard guard;
  static_cast<void>(guard);
}

__attribute__((constructor)) void agent_init() {
  Scope scope;  // also covers this function's locals, freed after counting is on
  const char* specs = getenv(kEnvSpecs);
  if (!specs) return;
  const std::vector<std::string> texts = split(specs, '\n');
  meta = new Meta;
  meta->out_dir = env_or(kEnvOut, "");
  meta->format = env_or(kEnvFormat, "text");
  meta->per_thread = env_or(kEnvPerThread, "0") == "1";
  g_pid.store(getpid(), std::memory_order_relaxed);
  if (env_or(kEnvFollow, "1") == "0") {
    // --no-follow: whatever this program execs runs without the agent.
    std::string orig = env_or(kEnvOrigPreload, "-");
    if (orig == "-") unsetenv("LD_PRELOAD");
    else setenv("LD_PRELOAD", orig.c_str(), 1);
    for (const char* v : {kEnvSpecs, kEnvOut, kEnvFormat, kEnvFollow, kEnvOrigPreload, kEnvPerThread}) unsetenv(v);
  }
  try {
    attach(texts);
  } catch (const std::exception& e) {
    if (!meta->specs.empty()) add_message(meta->specs.front(), std::string("agent: ") + e.what());
  }
  pthread_atfork(nullptr, nullptr, atfork_child);
  create_start_file();
  arm_exit_dtor_guard();
  if (g) g->enabled.store(true, std::memory_order_seq_cst);
}

__attribute__((destructor)) void agent_fini() { finish(); }

// ---------------------------------------------------------------- for agent_exec.cpp

}  // namespace

namespace uptrace::agent {

void enter() noexcept { ++tls_in_agent; }
void leave() noexcept { --tls_in_agent; }

std::string write_before_exec() noexcept {
  Scope scope;
  if (!meta || finished.load() || getpid() != g_pid.load(std::memory_order_relaxed)) return {};
  try {
    std::string file = write_results();
    if (!file.empty()) remove_start_file();
    return file;
  } catch (...) {
    return {};
  }
}

void exec_failed(const std::string& file) noexcept {
  Scope scope;
  unlink(file.c_str());
  create_start_file();
}

}  // namespace uptrace::agent
