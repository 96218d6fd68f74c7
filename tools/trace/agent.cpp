// SPDX-License-Identifier: MIT
// libuprobe-agent.so: the LD_PRELOAD half of uprobe-trace.
//
// It is the first object whose initializer runs (linked with -z initfirst:
// DF_1_INITFIRST puts it ahead of every other initializer, the program's
// DT_PREINIT_ARRAY included). That initializer first brings up what the
// agent itself needs (libc's initializers, run with the real argc, argv and
// envp, then the agent's other dependencies through dlopen of itself), and
// its constructor then reads the probe specs from UPROBE_TRACE_SPECS (one
// per line), resolves them in this process (library names against the
// objects the dynamic linker loaded here, the program's own name to
// /proc/self/exe), registers one counting consumer per probe site and
// enables counting last, so that nothing the agent itself does while
// attaching is counted -- and every other object's initializer is.
//
// Counting never stops. With the CLI (UPROBE_TRACE_OUT set), every thread
// counts in its own block of the counts file the CLI created (counts.hpp),
// mapped shared, so the counts are the CLI's however the process ends --
// exit() through the last destructor, _exit(), exec, a fatal signal,
// SIGKILL -- and nothing is written at exit or exec. What the image attached
// is written to its record file (record.hpp) once, at attach. Without the
// CLI, blocks are private and the agent's destructor prints this process's
// report to stderr.
//
// Handlers run in signal context (or in the return trampoline): they only
// touch fixed memory. A thread's block is made on its first hit (page-
// aligned, so no cache line is shared between threads); threads beyond
// kMaxBlocks share an overflow block with atomic adds. A fork child is a new
// process: a MADV_WIPEONFORK page tells its first hit (even before the
// atfork handlers run, or in a child of the raw clone system call) that the
// blocks it sees are its parent's, and it starts from zero in blocks of its
// own. Latency of an entry+return pair: the entry writes CLOCK_MONOTONIC
// (vDSO) into the session cookie, the return adds log2(now - cookie) to the
// thread's histogram.

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
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
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <uprobe/batch.hpp>
#include <uprobe/config.hpp>
#include <uprobe/symbols.hpp>
#include <uprobe/uprobe.hpp>
#include <uprobe/usdt.hpp>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "counts.hpp"
#include "record.hpp"
#include "spec.hpp"

// The bpftrace interpreter (bt_vm.hpp) and run_bt() below, which run at hits:
// general registers only, string operations inline, no loop made into a
// libc call. The rest of the hit path (the consumers, the thread's block) is
// ordinary code that uses no vector register either (counting, a few
// atomics). So the consumers declare set_vector_state_unused() and
// libuprobe saves nothing for them at an optimized site;
// tests/trace/agent_gpr_check.py checks the built library: no vector or x87
// register in any function a hit reaches, no call but to the libc system
// call wrappers and libuprobe's reads.
#pragma GCC push_options
#pragma GCC target("general-regs-only,inline-all-stringops")
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#include "bt_vm.hpp"
#pragma GCC pop_options

// libuprobe loads its decoder (Capstone) at the first analysis rather than
// with itself (arch/x86_64/capstone_lib.hpp): a child none of whose probes
// is in its own files never pays for it. On this thread, not on a helper
// thread overlapping the spec resolution (as before): glibc marks a process
// multi-threaded for good at its first pthread_create() (malloc and stdio
// take their locks from then on), the helper held the dynamic linker's lock
// the resolution needs, and a registration's thread check could not sample
// it (every signal blocked) and waited 10 ms for it in half the runs.
extern "C" __attribute__((visibility("default"))) const int uprobe_decoder_on_demand = 1;

namespace {

/// libc's own getenv(), unsetenv() and setenv(). A program may define its own (bash
/// defines getenv, setenv, unsetenv, putenv), which the agent's calls would
/// reach; bash's, before its main() set up its variables, leave `environ` as
/// it is, and bash then passed UPROBE_TRACE_GATE on to every command it ran
/// (each exited 125 at a gate already read). libc's change the array main()
/// is given, in place. RTLD_NEXT from the agent (preloaded after the program)
/// finds libc's.
const char* libc_getenv(const char* name) {
  static const auto f = reinterpret_cast<char* (*)(const char*)>(dlsym(RTLD_NEXT, "getenv"));
  return f ? f(name) : getenv(name);
}
int libc_unsetenv(const char* name) {
  static const auto f = reinterpret_cast<int (*)(const char*)>(dlsym(RTLD_NEXT, "unsetenv"));
  return f ? f(name) : unsetenv(name);
}
int libc_setenv(const char* name, const char* value, int overwrite) {
  static const auto f = reinterpret_cast<int (*)(const char*, const char*, int)>(dlsym(RTLD_NEXT, "setenv"));
  return f ? f(name, value, overwrite) : setenv(name, value, overwrite);
}


using namespace uptrace;
using counts::kHeaderWords;

constexpr unsigned kMaxBlocks = 4096;  // per process; more threads share its overflow block
constexpr std::uint64_t kEpochBusy = ~std::uint64_t{0};

// ---------------------------------------------------------------- handler-side state

/// This process's own page (MADV_WIPEONFORK: a fork child sees 0).
struct alignas(counts::kPage) ProcessLocal {
  /// Nonzero while the process state in Counters (pid, blocks, overflow)
  /// is this process's; a thread whose tls_epoch differs has no block here.
  std::atomic<std::uint64_t> epoch{0};
};

struct Counters {
  std::atomic<bool> enabled{false};
  std::size_t nkeys = 0, nhists = 0;
  std::size_t hist_base = 0;    // first histogram word
  std::size_t block_words = 0;  // header + counts + histograms
  std::size_t block_bytes = 0;  // rounded up to pages
  // The counts file (nullptr without the CLI: private blocks).
  counts::Header* header = nullptr;
  char path[PATH_MAX] = {};
  std::uint64_t layout = 0;
  bool wipe_on_fork = false;  // MADV_WIPEONFORK took on `local`
  ProcessLocal* local = nullptr;
  // This process's (reset in a fork child, see reinit_process).
  pid_t pid = 0;
  std::uint64_t last_epoch = 0;
  std::atomic<unsigned> nblocks{0};
  std::atomic<std::uint64_t*> blocks[kMaxBlocks];  // without the CLI: what the report reads
  std::atomic<std::uint64_t*> overflow{nullptr};   // shared by threads past kMaxBlocks: atomic adds
  // A bpftrace program (bt_vm.hpp): its area in each block starts at word bt_area (0: no program).
  bt::Program bt;
  std::size_t bt_area = 0;
};

Counters* g = nullptr;  // published before counting is enabled; never freed

__attribute__((tls_model("initial-exec"))) thread_local std::uint64_t* tls_block = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local std::uint64_t tls_epoch = 0;

// The agent's own work while probes are attached (setting up, making a
// block, a fork child's set-up) runs with this thread's depth raised: nothing
// it calls (getppid, open, malloc, free, ...) is counted. tls_exit_dtors
// covers libuprobe's thread_local destructors at exit() (see ExitDtorGuard).
__attribute__((tls_model("initial-exec"))) thread_local int tls_in_agent = 0;
__attribute__((tls_model("initial-exec"))) thread_local bool tls_exit_dtors = false;
// The thread's stack for ustack (bt::StackBounds: looked up at its first walk).
__attribute__((tls_model("initial-exec"))) thread_local bt::StackBounds tls_stack;
// run_bt()'s context, filled at each hit (a local would be zeroed first, with
// a `rep stos` at each hit: string operations are inline there). Hits do not
// nest on a thread (libuprobe runs no consumer inside another's).
__attribute__((tls_model("initial-exec"))) constinit thread_local bt::HitContext tls_ctx;

/// Marks the calling thread as running the agent's own code (nestable).
struct Scope {
  Scope() noexcept { ++tls_in_agent; }
  ~Scope() { --tls_in_agent; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

/// Hits no block could take: the CLI reports how many (async-signal-safe).
void unrecorded(std::uint64_t n) noexcept {
  if (g->header && n) g->header->unrecorded.fetch_add(n, std::memory_order_relaxed);
}

/// Extends the counts file to `end` without ever shrinking it (filesystems
/// without fallocate): one byte written at end - 1.
bool extend(int fd, off_t end) noexcept {
  const char zero = 0;
  return pwrite(fd, &zero, 1, end - 1) == 1;
}

/// Reserves the storage of the counts file's page that holds header byte
/// `at` before this process first writes there (the header's tables are
/// sparse): on a full filesystem the write would be a SIGBUS in the program.
/// False when the filesystem has no room; true when it cannot reserve
/// (EOPNOTSUPP: as before, a write allocates). Async-signal-safe.
bool reserve_header_page(int fd, const void* at) noexcept {
  const auto off = static_cast<off_t>(reinterpret_cast<const char*>(at) - reinterpret_cast<const char*>(g->header));
  const off_t page = off & ~static_cast<off_t>(counts::kPage - 1);
  return fallocate(fd, 0, page, static_cast<off_t>(counts::kPage)) == 0 || errno == EOPNOTSUPP || errno == ENOSYS;
}

/// A new block, its header written; nullptr when none can be made.
/// Async-signal-safe (open, fallocate, mmap, close, atomics).
std::uint64_t* alloc_block(std::int64_t tid, bool shared) noexcept {
  void* m = MAP_FAILED;
  std::uint64_t slot = 0, first = 0;
  const std::uint64_t pages = g->block_bytes / counts::kPage;
  if (g->header) {
    slot = g->header->nslots.fetch_add(1, std::memory_order_relaxed);
    if (slot >= counts::kMaxSlots) return nullptr;
    first = g->header->next_page.fetch_add(pages, std::memory_order_relaxed);
    const int fd = open(g->path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return nullptr;
    const off_t off = static_cast<off_t>(first * counts::kPage), len = static_cast<off_t>(g->block_bytes);
    // Storage is reserved now: a write to a hole of a full filesystem through
    // a shared mapping would be a SIGBUS in the program (the block's pages,
    // and the header page of its slot word).
    if (!reserve_header_page(fd, &g->header->slots[slot])) {
      close(fd);
      return nullptr;
    }
    if (fallocate(fd, 0, off, len) == 0 || ((errno == EOPNOTSUPP || errno == ENOSYS) && extend(fd, off + len)))
      m = mmap(nullptr, g->block_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);
    close(fd);
  } else {
    m = mmap(nullptr, g->block_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (m == MAP_FAILED) return nullptr;
  auto* b = static_cast<std::uint64_t*>(m);
  b[counts::kBlockPid] = static_cast<std::uint64_t>(g->pid);
  b[counts::kBlockTid] = static_cast<std::uint64_t>(tid);
  b[counts::kBlockLayout] = g->layout;
  b[counts::kBlockWords] = g->block_words;
  b[counts::kBlockShared] = shared ? 1 : 0;
  b[counts::kBlockBt] = g->bt_area;
  __atomic_store_n(&b[counts::kBlockMagicWord], counts::kBlockMagic, __ATOMIC_RELEASE);
  if (g->header) g->header->slots[slot].store(counts::slot_word(first, pages), std::memory_order_release);
  return b;
}

void register_process(pid_t pid, pid_t ppid) noexcept {
  if (!g->header) return;
  const std::uint64_t i = g->header->nprocs.fetch_add(1, std::memory_order_relaxed);
  if (i >= counts::kMaxProcs) return;  // the CLI still finds its blocks
  counts::Proc& p = g->header->procs[i];
  const int fd = open(g->path, O_RDWR | O_CLOEXEC);
  const bool room = fd >= 0 && reserve_header_page(fd, &p) &&
                    reserve_header_page(fd, reinterpret_cast<const char*>(&p) + sizeof p - 1);
  if (fd >= 0) close(fd);
  if (!room) return;  // (unlisted: the CLI still finds its blocks)
  p.pid = pid, p.ppid = ppid, p.layout = g->layout;
  p.ready.store(1, std::memory_order_release);
}

/// The process's overflow block (made once; several threads may race).
std::uint64_t* overflow_block() noexcept {
  if (std::uint64_t* ov = g->overflow.load(std::memory_order_acquire)) return ov;
  std::uint64_t* nb = alloc_block(-1, true);
  if (!nb) return nullptr;
  std::uint64_t* expected = nullptr;
  if (g->overflow.compare_exchange_strong(expected, nb, std::memory_order_acq_rel)) return nb;
  return expected;  // another thread's won; ours stays empty
}

/// The first hit (or atfork handler) of a process whose Counters are its
/// parent's (a fork child): from now on this is a process of its own, with
/// no block yet. Async-signal-safe; once per process (a thread that finds
/// another one doing it gets 0 and its hit is unrecorded).
std::uint64_t reinit_process() noexcept {
  std::uint64_t expected = 0;
  if (!g->local->epoch.compare_exchange_strong(expected, kEpochBusy, std::memory_order_acq_rel))
    return expected == kEpochBusy ? 0 : expected;
  g->pid = static_cast<pid_t>(syscall(SYS_getpid));
  const unsigned n = std::min(g->nblocks.load(std::memory_order_relaxed), kMaxBlocks);
  for (unsigned i = 0; i < n; ++i) {  // private copies of the parent's blocks (no CLI): not ours
    std::uint64_t* b = g->blocks[i].exchange(nullptr, std::memory_order_relaxed);
    if (b && !g->header) munmap(b, g->block_bytes);
  }
  g->nblocks.store(0, std::memory_order_relaxed);
  if (std::uint64_t* ov = g->overflow.exchange(nullptr, std::memory_order_relaxed); ov && !g->header)
    munmap(ov, g->block_bytes);
  register_process(g->pid, static_cast<pid_t>(syscall(SYS_getppid)));
  const std::uint64_t e = ++g->last_epoch;
  g->local->epoch.store(e, std::memory_order_release);
  return e;
}

/// The calling thread's block when it has none in this process yet.
__attribute__((noinline)) std::uint64_t* new_block() noexcept {
  const int saved_errno = errno;
  std::uint64_t* b = nullptr;
  std::uint64_t epoch = g->local->epoch.load(std::memory_order_acquire);
  if (epoch == 0) epoch = reinit_process();
  if (epoch != 0 && epoch != kEpochBusy) {
    const unsigned i = g->nblocks.fetch_add(1, std::memory_order_relaxed);
    if (i < kMaxBlocks) {
      b = alloc_block(static_cast<std::int64_t>(syscall(SYS_gettid)), false);
      if (b && !g->header) g->blocks[i].store(b, std::memory_order_release);
    }
    if (!b) b = overflow_block();
    if (b) tls_block = b, tls_epoch = epoch;
  }
  errno = saved_errno;
  return b;
}

inline std::uint64_t* my_block() noexcept {
  std::uint64_t* b = tls_block;
  if (__builtin_expect(b != nullptr && tls_epoch == g->local->epoch.load(std::memory_order_relaxed), 1)) return b;
  return new_block();
}

inline void bump(std::uint64_t* b, std::size_t word, std::uint64_t n = 1) noexcept {
  if (__builtin_expect(b[counts::kBlockShared] != 0, 0)) {
    __atomic_fetch_add(&b[word], n, __ATOMIC_RELAXED);
  } else {  // only this thread writes here; a reader tolerates a stale value
    __atomic_store_n(&b[word], __atomic_load_n(&b[word], __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
  }
}

inline std::uint64_t now_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no system call
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

inline bool counting() noexcept {
  return tls_in_agent == 0 && !tls_exit_dtors && g->enabled.load(std::memory_order_acquire);
}

/// No more hits for a program: none, or exit() ran. (Outside run_bt()'s
/// general-registers-only code: std::atomic's members are always_inline.)
bool bt_stopped() noexcept { return !g->header || g->header->bt_exit.load(std::memory_order_relaxed); }

/// One probe block of a bpftrace program at one site: its index and the
/// `probe` and `func` strings of the site (never freed).
struct BtHit {
  std::uint32_t probe;
  const char* probe_name;
  const char* func;
};

/// argN of the bpftrace language: arg0..arg9 (bt::HitContext::args).
constexpr unsigned kBtArgs = 10;

/// Runs the program's probe blocks `hits` for one hit. `usdt`: the site's
/// argument specs (argN as its note says), else argN are the SysV argument
/// registers. Async-signal-safe: the interpreter (bt_vm.hpp) writes the
/// thread's own block only; a USDT memory operand is read without faulting
/// (ArgSpec::read(): an unreadable one gives 0).
#pragma GCC push_options
#pragma GCC target("general-regs-only,inline-all-stringops")
#pragma GCC optimize("no-tree-loop-distribute-patterns")
void run_bt(const BtHit* hits, std::size_t nhits, const uprobe::Regs& regs, bool ret,
            const uprobe::usdt::ArgSpec* usdt = nullptr) noexcept {
  if (nhits == 0 || bt_stopped()) return;
  std::uint64_t* b = my_block();
  if (!b || b[counts::kBlockShared]) return unrecorded(nhits);
  std::uint64_t args[kBtArgs];
  if (usdt) {
    for (unsigned i = 0; i < kBtArgs; ++i)
      if (i >= usdt->count() || !usdt->read(i, regs, args[i])) args[i] = 0;
  } else {
    args[0] = regs.rdi, args[1] = regs.rsi, args[2] = regs.rdx, args[3] = regs.rcx, args[4] = regs.r8,
    args[5] = regs.r9;
    for (unsigned i = 6; i < kBtArgs; ++i) args[i] = 0;
  }
  bt::HitContext& ctx = tls_ctx;  // (read_map and map_op stay null: the CLI's)
  ctx.args = args;
  ctx.sp = regs.rsp;  // (sargN: uprobes only, the compiler checks)
  ctx.ip = regs.rip;  // (ustack: a uretprobe's is the return address, as the kernel's)
  ctx.fp = regs.rbp;
  ctx.layout = g->layout;
  ctx.stack = &tls_stack;
  ctx.retval = ret ? regs.rax : 0;
  ctx.start_ns = g->header->bt_start_ns;
  ctx.area = b + g->bt_area;
  ctx.exit_flag = reinterpret_cast<volatile std::uint64_t*>(&g->header->bt_exit);
  for (std::size_t i = 0; i < nhits; ++i) {
    ctx.func = hits[i].func;
    ctx.probe = hits[i].probe_name;
    bt::Vm vm(g->bt, ctx);
    vm.run_probe(hits[i].probe);
  }
}
#pragma GCC pop_options

/// A function site: entry counts, return counts, a latency histogram (any of
/// them), the probe blocks of a bpftrace program. Several specs may name one site (aliases, a glob and a name): each
/// has its own key, all counted.
class FnConsumer final : public uprobe::Consumer {
 public:
  FnConsumer(uprobe::Callbacks cb, std::vector<long> entries, std::vector<long> rets, long hist,
             std::vector<BtHit> bt_entries, std::vector<BtHit> bt_rets)
      : uprobe::Consumer(cb), entries_(std::move(entries)), rets_(std::move(rets)), hist_(hist),
        bt_entries_(std::move(bt_entries)), bt_rets_(std::move(bt_rets)) {
    set_vector_state_unused();  // (the hit path uses general registers only: see the pragma above)
  }

  uprobe::Action handler(uprobe::Regs& regs) override {
    if (!counting()) {
      setup_hit();
      return rets_.empty() && hist_ < 0 && bt_rets_.empty() ? uprobe::Action::keep : uprobe::Action::ignore;
    }
    run_bt(bt_entries_.data(), bt_entries_.size(), regs, false);
    if (entries_.empty()) {
    } else if (std::uint64_t* b = my_block()) {
      for (long e : entries_) bump(b, kHeaderWords + static_cast<std::size_t>(e));
    } else {
      unrecorded(entries_.size());
    }
    if (hist_ >= 0) uprobe::session_cookie() = now_ns();
    return uprobe::Action::keep;
  }

  void ret_handler(uprobe::Regs& regs, std::uint64_t) override {
    if (!counting()) return setup_hit();
    run_bt(bt_rets_.data(), bt_rets_.size(), regs, true);
    if (rets_.empty() && hist_ < 0) return;
    std::uint64_t* b = my_block();
    if (!b) return unrecorded(rets_.size());
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
  const std::vector<BtHit> bt_entries_, bt_rets_;
  std::atomic<unsigned> setup_hits_{0};
};

/// A USDT site: a count (the key is its probe's, shared by its sites), the
/// probe blocks of a bpftrace program with the site's arguments.
class CountConsumer final : public uprobe::Consumer {
 public:
  CountConsumer(long key, std::vector<BtHit> bt, const uprobe::usdt::ArgSpec& args)
      : key_(key), bt_(std::move(bt)), args_(args) {
    set_vector_state_unused();  // as FnConsumer
  }
  uprobe::Action handler(uprobe::Regs& regs) override {
    if (!counting()) return uprobe::Action::keep;
    run_bt(bt_.data(), bt_.size(), regs, false, &args_);
    if (key_ < 0) return uprobe::Action::keep;
    if (std::uint64_t* b = my_block()) bump(b, kHeaderWords + static_cast<std::size_t>(key_));
    else unrecorded(1);
    return uprobe::Action::keep;
  }

 private:
  long key_;
  const std::vector<BtHit> bt_;
  const uprobe::usdt::ArgSpec args_;  // the site's (fixed size: no heap)
};

// ---------------------------------------------------------------- set-up (not signal context)

struct Meta {
  std::string out_dir;   // "" : report to stderr
  std::string format = "text";
  bool per_thread = false;
  std::vector<std::string> keys, hist_keys;
  std::vector<SpecStatus> specs;
  std::map<std::string, unsigned> modes;  // probe_info().mode at attach -> sites
  std::vector<std::string> notes;
};
Meta* meta = nullptr;  // never freed: other threads may still hit probes while the process exits

// The bpftrace program (UPROBE_TRACE_PROGRAM: the CLI's compiled blob), read once; never freed.
std::vector<unsigned char>* g_bt_blob = nullptr;
bt::Program g_bt;

void load_bt_program(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  auto* blob = new std::vector<unsigned char>;
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    blob->resize(static_cast<std::size_t>(st.st_size));
    if (pread(fd, blob->data(), blob->size(), 0) != static_cast<ssize_t>(blob->size())) blob->clear();
  }
  close(fd);
  if (!blob->empty() && g_bt.load(blob->data(), blob->size())) g_bt_blob = blob;
}

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
  std::string name;  // the first spec's name of the site (SYM, SYM+OFF, +FILEOFF)
  std::string path;
  std::uint64_t offset = 0;
  std::set<std::string> entry_keys, ret_keys;
  std::string hist_key;
  std::set<std::size_t> specs;  // indexes into meta->specs
  std::set<std::size_t> ret_specs;  // those of uretprobe specs
  std::vector<BtHit> bt_entries, bt_rets;
};

struct UsdtPlan {
  std::string key;
  std::vector<uprobe::usdt::Probe> sites;
  std::set<std::size_t> specs;  // indexes into meta->specs
  std::vector<BtHit> bt;
  bool count = true;  // a count key (not with a bpftrace program)
};

void add_message(SpecStatus& s, const std::string& m) {
  if (s.message.empty()) s.message = m;
}

// A libc function that libuprobe itself runs where a probe cannot fire: its
// SIGTRAP handler reads errno before its recursion guard is up (a probe on
// __errno_location recurses until the stack overflows). Refused here rather
// than crashing the traced program; every alias at that offset is covered.
// (libuprobe refuses the others of its kind itself, with the reason.)
std::string refused_site(const std::string& path, std::uint64_t offset) {
  static auto* cache = new std::map<std::string, std::map<std::uint64_t, std::string>>;
  auto [it, fresh] = cache->try_emplace(path);
  if (fresh && base_name(path).rfind("libc.so", 0) == 0) {
    for (const char* name : {"__errno_location"}) {
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
      // The site resolve_symbol() gives the name: its symbol's offset (the
      // path is resolve_location()'s, canonical already), or for a GNU
      // IFUNC the implementation bound to it.
      try {
        const uprobe::Symbol sym = uprobe::find_symbol(path, name);
        if (sym.in_file && sym.executable)  // (what resolve_symbol() refuses is no site)
          it->second[sym.type == STT_GNU_IFUNC ? uprobe::resolve_symbol(path, name).offset : sym.offset] = rank;
      } catch (const uprobe::Error&) {
      }
      ++rank;
    }
  }
  auto hit = it->second.find(offset);
  return hit == it->second.end() ? 0 : hit->second;
}

/// Sites attached per mode (ProbeMode's values), counted while the probes
/// are in: no string, no map (their libc calls would be probed, some int3).
/// Named into meta->modes afterwards.
unsigned mode_sites[static_cast<std::size_t>(uprobe::ProbeMode::optimized_evicted) + 1] = {};

void note_mode(uprobe::ProbeMode mode) {
  const auto m = static_cast<std::size_t>(mode);
  if (m < std::size(mode_sites)) mode_sites[m]++;
}

void name_modes() {
  for (std::size_t m = 0; m < std::size(mode_sites); ++m)
    if (mode_sites[m]) meta->modes[uprobe::to_string(static_cast<uprobe::ProbeMode>(m))] += mode_sites[m];
}

// The handler-side state for meta's keys (published before any probe is
// registered; counting stays off until setup_counting() is done).
void make_counters() {
  auto* c = new Counters;
  c->nkeys = meta->keys.size();
  c->nhists = meta->hist_keys.size();
  c->hist_base = kHeaderWords + c->nkeys;
  c->block_words = block_words(c->nkeys, c->nhists);
  if (g_bt_blob) {  // the program's area after the counters, cache-line aligned
    c->bt = g_bt;
    c->bt_area = (c->block_words + 7) & ~std::size_t{7};
    c->block_words = c->bt_area + g_bt.h->area_words;
  }
  c->block_bytes = (c->block_words * sizeof(std::uint64_t) + counts::kPage - 1) / counts::kPage * counts::kPage;
  for (auto& b : c->blocks) b.store(nullptr, std::memory_order_relaxed);
  g = c;
}

/// Int3 sites in code glibc runs with every signal blocked by a system call
/// of its own (probe_info().signals_blocked): a hit there kills the program,
/// and no signal mask libuprobe could change helps. Per spec, "NAME (where)".
std::map<std::size_t, std::vector<std::string>>* fatal_sites = nullptr;

void note_fatal_site(const uprobe::ProbeInfo& info, const std::string& name, const std::set<std::size_t>& specs) {
  if (info.mode != uprobe::ProbeMode::int3 || info.signals_blocked.empty()) return;
  if (!fatal_sites) fatal_sites = new std::map<std::size_t, std::vector<std::string>>;
  for (std::size_t s : specs) (*fatal_sites)[s].push_back(name + " (" + info.signals_blocked + ")");
}

/// The site's mode (its RegisterResult's) and, for an int3 function site, its
/// fatal-site warning: probe_info() of the registry's state only
/// (ProbeDetail::state; the symbol and IFUNC bindings would read the ELF
/// image and ask the dynamic linker, through libc functions that are probed
/// now), and only there: a few sites, not thousands.
void note_site(const uprobe::RegisterResult& r, const std::string* name, const std::set<std::size_t>* specs) {
  note_mode(r.mode);
  if (!name || r.mode != uprobe::ProbeMode::int3) return;
  try {
    note_fatal_site(uprobe::probe_info(r.probe, uprobe::ProbeDetail::state), *name, *specs);
  } catch (...) {
  }
}

/// The warning of each spec with such sites, added to its message.
void warn_fatal_sites() {
  if (!fatal_sites) return;
  for (const auto& [si, sites] : *fatal_sites) {
    SpecStatus& st = meta->specs[si];
    std::string w;
    if (sites.size() == 1) {
      w = sites[0] + ": int3 site in code glibc runs with every signal blocked: a hit there kills the program";
    } else {
      w = std::to_string(sites.size()) +
          " int3 sites in code glibc runs with every signal blocked, where a hit kills the program:";
      for (std::size_t i = 0; i < sites.size() && i < 5; ++i) w += (i ? ", " : " ") + sites[i];
      if (sites.size() > 5) w += ", ...";
    }
    st.message += (st.message.empty() ? "" : "; ") + w;
  }
}

void prepare_record_lines();

void attach(const std::vector<std::string>& texts) {
  std::map<std::pair<std::string, std::uint64_t>, FnPlan> fns;
  std::map<std::string, UsdtPlan> usdts;
  for (const std::string& line : texts) {
    // "PROBE\tSPEC[\tSHOWN]": an attach point of the bpftrace program's probe
    // block PROBE; SHOWN: the PATH its `probe` strings name (bpftrace's).
    long bt_probe = -1;
    std::string text = line, shown;
    if (const auto tab = line.find('\t'); tab != std::string::npos) {
      bt_probe = std::strtol(line.c_str(), nullptr, 10);
      text = line.substr(tab + 1);
      if (const auto t2 = text.find('\t'); t2 != std::string::npos) shown = text.substr(t2 + 1), text.resize(t2);
      if (!g_bt_blob || bt_probe < 0 || static_cast<std::uint64_t>(bt_probe) >= g_bt.h->nprobes) continue;
    }
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
        std::set<std::string> bt_done;
        for (auto& p : uprobe::usdt::find(path + ":" + spec->what)) {
          std::string key = "usdt:" + p.path + ":" + p.provider + ":" + p.name;
          auto [it, fresh] = usdts.try_emplace(key);
          if (fresh) it->second.key = key, mine.insert(key), it->second.count = bt_probe < 0;
          if (bt_probe < 0) it->second.count = true;
          else if (bt_done.insert(key).second)
            it->second.bt.push_back({static_cast<std::uint32_t>(bt_probe),
                                     strdup(shown.empty() ? key.c_str()
                                                          : ("usdt:" + shown + ":" + p.provider + ":" + p.name).c_str()),
                                     strdup(p.name.c_str())});
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
          if (f.name.empty()) f.name = what;
          f.specs.insert(si);
          if (spec->kind == Kind::uretprobe) f.ret_specs.insert(si);
          if (bt_probe >= 0) {
            const std::string probe_name =
                std::string(kind_name(spec->kind)) + ":" + (shown.empty() ? loc.path : shown) + ":" + what;
            (spec->kind == Kind::uprobe ? f.bt_entries : f.bt_rets)
                .push_back({static_cast<std::uint32_t>(bt_probe), strdup(probe_name.c_str()),
                            strdup(display_symbol(loc.symbol).c_str())});
            continue;
          }
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
    unsigned rank = 0;  // registration_rank() of its site
  };
  std::vector<PendingFn> pf;
  for (auto& [k, f] : fns) {
    PendingFn p{&f, {}, {}, -1, 0};
    for (const auto& key : f.entry_keys) p.entries.push_back(index_of(key));
    for (const auto& key : f.ret_keys) p.rets.push_back(index_of(key));
    if (!p.entries.empty() && !p.rets.empty()) {
      p.hist = static_cast<long>(meta->hist_keys.size());
      meta->hist_keys.push_back(f.hist_key);
    }
    pf.push_back(std::move(p));
  }
  std::vector<std::pair<UsdtPlan*, long>> pu;
  for (auto& [k, u] : usdts) pu.emplace_back(&u, u.count ? index_of(u.key) : -1);

  make_counters();
  prepare_record_lines();

  // Register, every site in one transaction (register_uprobes(): one read of
  // the address space, one ELF read per file, one publication, the
  // breakpoints written last). Keys whose registration failed everywhere are
  // dropped from the record (they were never attached); their counters just
  // stay 0.
  std::vector<bool> attached(meta->keys.size(), false);
  std::vector<bool> hist_attached(meta->hist_keys.size(), false);
  // What the transaction does after the breakpoints are in (its optimized
  // jumps, the USDT semaphores, its bookkeeping) runs libc code (malloc,
  // free, locks, ...): a site there that is already armed traps then. The
  // breakpoints are written in request order, so those sites come last, the
  // most used last. (Taking such a site out and re-arming it is not an
  // option: libuprobe and liburcu-bp call libc with every signal blocked
  // while they unregister or unapply, and a trap there is fatal.)
  // (Ranked once per site, not per comparison; a single site needs no order,
  // nor the ~50 symbol lookups of the ranks.)
  if (pf.size() > 1) {
    for (PendingFn& p : pf) p.rank = registration_rank(p.plan->path, p.plan->offset);
    std::stable_sort(pf.begin(), pf.end(), [](const PendingFn& a, const PendingFn& b) { return a.rank < b.rank; });
  }
  using CB = uprobe::Callbacks;
  std::vector<uprobe::ProbeRequest> requests;
  std::vector<FnConsumer*> fn_consumers;  // request i < pf.size(): pf[i]'s
  for (auto& p : pf) {
    const bool entry = !p.entries.empty() || !p.plan->bt_entries.empty();
    const bool ret = !p.rets.empty() || !p.plan->bt_rets.empty();
    CB cb = !entry ? CB::ret : !ret ? CB::entry : CB::entry_and_ret;
    auto* c = new FnConsumer(cb, p.entries, p.rets, p.hist, p.plan->bt_entries,
                             p.plan->bt_rets);  // never freed (see Meta)
    fn_consumers.push_back(c);
    requests.push_back(uprobe::ProbeRequest::at(p.plan->path, p.plan->offset, *c));
  }
  for (auto& [u, idx] : pu) {
    for (const auto& site : u->sites) {
      // One per site: each has its own argument specs (a site whose specs did
      // not parse gives 0 for every argN, as none).
      auto* c = new CountConsumer(idx, u->bt, site.args_error.empty() ? site.args : uprobe::usdt::ArgSpec{});  // never freed (see Meta)
      requests.push_back(uprobe::ProbeRequest::at(site.path, site.offset, *c, site.semaphore_offset));
    }
  }
  const std::vector<uprobe::RegisterResult> results = uprobe::register_uprobes(requests);

  // A site refused for its return probe alone (vfork returns twice: a
  // return probe there is refused, an entry probe is fine) keeps its entry
  // probes, registered again without the return side: the kernel registers
  // an entry and a return consumer apart, so one's refusal leaves the other.
  std::vector<PendingFn> entry_pf;  // (complete before Armed points into it)
  std::vector<std::set<std::size_t>> entry_specs;
  std::vector<std::size_t> entry_of;  // entry_pf[k] is pf[entry_of[k]]'s entry side
  std::vector<uprobe::ProbeRequest> entry_requests;
  std::vector<FnConsumer*> entry_consumers;
  for (std::size_t i = 0; i < pf.size(); ++i) {
    const PendingFn& p = pf[i];
    if (results[i] || fn_consumers[i]->callbacks() != CB::entry_and_ret) continue;
    std::set<std::size_t> mine;
    for (std::size_t s : p.plan->specs)
      if (!p.plan->ret_specs.count(s)) mine.insert(s);
    if (mine.empty()) continue;
    entry_of.push_back(i);
    entry_specs.push_back(std::move(mine));
    entry_pf.push_back({p.plan, p.entries, {}, -1, p.rank});
    auto* c = new FnConsumer(CB::entry, p.entries, {}, -1, p.plan->bt_entries, {});  // never freed (see Meta)
    entry_consumers.push_back(c);
    entry_requests.push_back(uprobe::ProbeRequest::at(p.plan->path, p.plan->offset, *c));
  }
  const std::vector<uprobe::RegisterResult> entry_results =
      entry_requests.empty() ? std::vector<uprobe::RegisterResult>{} : uprobe::register_uprobes(entry_requests);
  std::vector<const std::set<std::size_t>*> entry_only(pf.size(), nullptr);  // the specs its entry side holds

  struct Armed {
    PendingFn* p;
    FnConsumer* c;
    const uprobe::RegisterResult* r;
    const std::set<std::size_t>* specs;  // the specs it attaches
  };
  std::vector<Armed> armed;
  armed.reserve(pf.size());
  for (std::size_t k = 0; k < entry_pf.size(); ++k)
    if (entry_results[k]) {
      armed.push_back({&entry_pf[k], entry_consumers[k], &entry_results[k], &entry_specs[k]});
      entry_only[entry_of[k]] = &entry_specs[k];
    }
  for (std::size_t i = 0; i < pf.size(); ++i) {
    if (results[i]) {
      armed.push_back({&pf[i], fn_consumers[i], &results[i], &pf[i].plan->specs});
      continue;
    }
    for (std::size_t s : pf[i].plan->specs) {
      if (entry_only[i] && entry_only[i]->count(s)) continue;  // attached by its entry side
      add_message(meta->specs[s], results[i].error->what());
      meta->specs[s].failed++;
    }
  }
  if (libc_getenv("UPROBE_TRACE_DEBUG"))
    for (const Armed& a : armed)
      if (a.c->setup_hits())
        std::fprintf(stderr, "uprobe-trace agent: %u hits while attaching: %s+%#llx\n", a.c->setup_hits(),
                     a.p->plan->path.c_str(), static_cast<unsigned long long>(a.p->plan->offset));
  for (const Armed& a : armed) {
    note_site(*a.r, &a.p->plan->name, a.specs);
    for (std::size_t s : *a.specs) meta->specs[s].attached++;
    for (long e : a.p->entries) attached[static_cast<std::size_t>(e)] = true;
    for (long r : a.p->rets) attached[static_cast<std::size_t>(r)] = true;
    if (a.p->hist >= 0) hist_attached[static_cast<std::size_t>(a.p->hist)] = true;
  }
  std::size_t i = pf.size();
  for (auto& [u, idx] : pu) {
    for (std::size_t k = 0; k < u->sites.size(); ++k, ++i) {
      if (results[i]) {
        note_site(results[i], nullptr, nullptr);
        for (std::size_t s : u->specs) meta->specs[s].attached++;
        if (idx >= 0) attached[static_cast<std::size_t>(idx)] = true;
        continue;
      }
      for (std::size_t s : u->specs) {
        add_message(meta->specs[s], results[i].error->what());
        meta->specs[s].failed++;
      }
    }
  }
  for (auto& sp : meta->specs)
    if (sp.failed && sp.attached)
      sp.message = std::to_string(sp.failed) + " of " + std::to_string(sp.failed + sp.attached) +
                   " sites not probed; first: " + sp.message;
  name_modes();
  warn_fatal_sites();
  // Keep only attached keys in the record (indexes stay as allocated).
  for (std::size_t i = 0; i < attached.size(); ++i)
    if (!attached[i]) meta->keys[i].clear();
  for (std::size_t i = 0; i < hist_attached.size(); ++i)
    if (!hist_attached[i]) meta->hist_keys[i].clear();
}

// ---------------------------------------------------------------- results

std::string env_or(const char* name, const char* def) {
  const char* v = libc_getenv(name);
  return v ? v : def;
}

ImageRecord image_record(bool with_keys = true) {
  ImageRecord r;
  r.layout = g ? g->layout : 0;
  r.pid = getpid();
  r.ppid = getppid();
  r.exe = self_exe();
  r.nkeys = g ? g->nkeys : 0;
  r.nhists = g ? g->nhists : 0;
  r.specs = meta->specs;
  r.modes = meta->modes;
  r.notes = meta->notes;
  if (!with_keys) return r;
  for (std::size_t i = 0; i < meta->keys.size() && i < r.nkeys; ++i)
    if (!meta->keys[i].empty()) r.keys.emplace_back(meta->keys[i], i);
  for (std::size_t i = 0; i < meta->hist_keys.size() && i < r.nhists; ++i)
    if (!meta->hist_keys[i].empty()) r.hists.emplace_back(meta->hist_keys[i], i);
  return r;
}

/// The record's key and hist lines (serialize_entry()), one per index, made
/// before the probes are in: the record is written after, and copying
/// thousands of strings then would call libc's memcpy() (probed, and int3:
/// a trap per key) for each. Null when attach() did not get that far.
struct RecordLines {
  std::vector<std::string> keys, hists;
};
RecordLines* record_lines = nullptr;  // never freed (see Meta)

void prepare_record_lines() {
  auto* l = new RecordLines;
  l->keys.reserve(meta->keys.size());
  l->hists.reserve(meta->hist_keys.size());
  for (std::size_t i = 0; i < meta->keys.size(); ++i) l->keys.push_back(serialize_entry("key", meta->keys[i], i));
  for (std::size_t i = 0; i < meta->hist_keys.size(); ++i)
    l->hists.push_back(serialize_entry("hist", meta->hist_keys[i], i));
  record_lines = l;
}

/// Appends `s` to `out`, whose capacity holds it, without libc's memcpy().
void append_plain(std::string& out, const std::string& s) {
  const std::size_t at = out.size();
  out.resize(at + s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    asm("" : "+r"(c));  // (not turned back into a memcpy() call)
    out[at + i] = c;
  }
}

/// The record file's text: serialize(), with the key and hist lines made
/// beforehand (record_lines) when there are some.
std::string record_text() {
  if (!record_lines) return serialize(image_record());
  const ImageRecord r = image_record(false);
  std::string text = serialize(r, false);
  std::size_t total = text.size() + 4;
  for (std::size_t i = 0; i < meta->keys.size() && i < r.nkeys && i < record_lines->keys.size(); ++i)
    if (!meta->keys[i].empty()) total += record_lines->keys[i].size();
  for (std::size_t i = 0; i < meta->hist_keys.size() && i < r.nhists && i < record_lines->hists.size(); ++i)
    if (!meta->hist_keys[i].empty()) total += record_lines->hists[i].size();
  text.reserve(total);
  for (std::size_t i = 0; i < meta->keys.size() && i < r.nkeys && i < record_lines->keys.size(); ++i)
    if (!meta->keys[i].empty()) append_plain(text, record_lines->keys[i]);
  for (std::size_t i = 0; i < meta->hist_keys.size() && i < r.nhists && i < record_lines->hists.size(); ++i)
    if (!meta->hist_keys[i].empty()) append_plain(text, record_lines->hists[i]);
  text += "end\n";
  return text;
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

// DIR/PID.LAYOUT.rec: what this image attached (written once, at attach).
void write_image_record() {
  const std::string base =
      meta->out_dir + "/" + std::to_string(getpid()) + "." + std::to_string(g ? g->layout : 0);
  const std::string tmp = base + ".tmp", final_path = base + ".rec";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return;
  bool ok = write_all(fd, record_text());
  close(fd);
  if (!ok || rename(tmp.c_str(), final_path.c_str()) != 0) unlink(tmp.c_str());
  // DIR/PID.LAYOUT.maps: the image's mappings (/proc/self/maps as it is
  // now), which the CLI symbolizes its ustack and usym addresses with, after
  // the process is gone too (bt_vm.hpp image_word()).
  if (!g_bt.h) return;
  const std::string maps_tmp = base + ".maps.tmp";
  int in = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  int out = in < 0 ? -1 : open(maps_tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ok = out >= 0;
  char buf[8192];
  for (ssize_t n; ok && (n = read(in, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0 && write_all(out, std::string(buf, static_cast<std::size_t>(n)));
  }
  if (in >= 0) close(in);
  if (out >= 0) close(out);
  if (out >= 0 && (!ok || rename(maps_tmp.c_str(), (base + ".maps").c_str()) != 0)) unlink(maps_tmp.c_str());
}

// Without the CLI: this process's report from its private blocks.
void report_to_stderr() {
  const ImageRecord img = image_record();
  ProcessRecord r = process_of(img, img.pid, img.ppid);
  if (g && g->local->epoch.load() == g->last_epoch) {  // (a fork child that never hit has its parent's)
    const unsigned n = std::min(g->nblocks.load(std::memory_order_acquire), kMaxBlocks);
    for (unsigned i = 0; i < n; ++i)
      if (const std::uint64_t* b = g->blocks[i].load(std::memory_order_acquire)) add_block(r, img, b, g->block_words);
    if (const std::uint64_t* ov = g->overflow.load(std::memory_order_acquire)) add_block(r, img, ov, g->block_words);
  }
  Report rep;
  rep.add(r);
  std::string text = meta->format == "json" ? format_json(rep, meta->per_thread) : format_text(rep, meta->per_thread);
  for (const auto& m : rep.messages) text += "uprobe-trace: " + (m.spec.empty() ? "" : m.spec + ": ") + m.text + "\n";
  write_all(STDERR_FILENO, "\n" + text);
}

// The counting memory: this process's wipe-on-fork page, the counts file's
// header (with the CLI), this image's record, the attaching thread's block.
void setup_counting() {
  static ProcessLocal fallback_local;  // no page: a fork child is then told by the atfork handler only
  void* lp = mmap(nullptr, sizeof(ProcessLocal), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  g->local = lp == MAP_FAILED ? &fallback_local : new (lp) ProcessLocal;
  g->wipe_on_fork = lp != MAP_FAILED && madvise(lp, sizeof(ProcessLocal), MADV_WIPEONFORK) == 0;
  g->pid = getpid();
  if (!meta->out_dir.empty()) {
    const std::string path = meta->out_dir + "/" + counts::kFileName;
    std::string why;
    int fd = path.size() < sizeof g->path ? open(path.c_str(), O_RDWR | O_CLOEXEC) : -1;
    void* h = MAP_FAILED;
    if (fd < 0) {
      why = path.size() < sizeof g->path ? std::strerror(errno) : "path too long";
    } else {
      h = mmap(nullptr, counts::kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (h == MAP_FAILED) why = std::strerror(errno);
      close(fd);
    }
    if (h != MAP_FAILED && static_cast<counts::Header*>(h)->magic != counts::kMagic) {
      munmap(h, counts::kHeaderBytes);
      h = MAP_FAILED;
      why = "not a counts file of this uprobe-trace";
    }
    if (h == MAP_FAILED) {
      if (!meta->specs.empty())
        add_message(meta->specs.front(), "agent: " + path + ": " + why + ": this process's counts are not recorded");
    } else {
      g->header = static_cast<counts::Header*>(h);
      std::memcpy(g->path, path.c_str(), path.size() + 1);
      g->layout = g->header->nlayouts.fetch_add(1, std::memory_order_relaxed) + 1;
    }
    write_image_record();
    register_process(g->pid, getppid());
  }
  g->last_epoch = 1;
  g->local->epoch.store(1, std::memory_order_release);
  new_block();  // the attaching thread's, now rather than in its first hit
}

// fork(): libuprobe's atfork handlers (registered when it starts, inside
// attach()) take its locks and, in the child, re-register with liburcu-bp,
// privatize the XOL area, ... : the agent's work, not the program's. So the
// agent registers handlers twice, before attach() (inner) and after it
// (outer), and the calling thread runs everything between them as the
// agent's. glibc runs prepare handlers last-registered first and the others
// first-registered first:
//   outer.prepare  libuprobe's  inner.prepare  (glibc's fork, _Fork)  inner.child  libuprobe's  outer.child
// The program's own calls in glibc's fork and in its own atfork handlers
// stay counted. inner.child is also the child's first point: a process of
// its own from here (reinit_process()), unless a hit in the child got there
// first.
void fork_outer_prepare() { ++tls_in_agent; }
void fork_outer_after() { --tls_in_agent; }
void fork_inner_prepare() { --tls_in_agent; }
void fork_inner_parent() { ++tls_in_agent; }
void fork_inner_child() {
  ++tls_in_agent;
  if (!g || !g->local) return;
  if (!g->wipe_on_fork) g->local->epoch.store(0, std::memory_order_release);
  reinit_process();  // (or already done by a hit between the fork and here)
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

// ---------------------------------------------------------------- the first initializer

using InitFn = void (*)(int, char**, char**);

struct LibcDynamic {
  ElfW(Addr) base = 0;
  const ElfW(Dyn)* dyn = nullptr;
};

int find_libc(struct dl_phdr_info* info, std::size_t, void* data) {
  const char* name = info->dlpi_name;
  const char* slash = name ? std::strrchr(name, '/') : nullptr;
  const char* base = slash ? slash + 1 : name;
  if (!base || std::strncmp(base, "libc.so.", 8) != 0) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
      auto* out = static_cast<LibcDynamic*>(data);
      out->base = info->dlpi_addr;
      out->dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
      return 1;
    }
  return 0;
}

// libc's DT_INIT and DT_INIT_ARRAY, as the dynamic linker's call_init runs
// them: they set libc's argc, argv, environ and program_invocation_name
// (glibc 2.36: _init_first, and the stdio vtable check), all idempotent.
bool run_libc_initializers(int argc, char** argv, char** envp) {
  LibcDynamic libc;
  if (!dl_iterate_phdr(find_libc, &libc) || !libc.dyn) return false;
  ElfW(Addr) init = 0, array = 0, arraysz = 0;
  for (const ElfW(Dyn)* d = libc.dyn; d->d_tag != DT_NULL; ++d) {
    if (d->d_tag == DT_INIT) init = d->d_un.d_ptr;
    else if (d->d_tag == DT_INIT_ARRAY) array = d->d_un.d_ptr;
    else if (d->d_tag == DT_INIT_ARRAYSZ) arraysz = d->d_un.d_val;
  }
  if (init) reinterpret_cast<InitFn>(libc.base + init)(argc, argv, envp);
  const auto* fns = reinterpret_cast<const ElfW(Addr)*>(libc.base + array);
  for (std::size_t i = 0; array && i < arraysz / sizeof(ElfW(Addr)); ++i)
    reinterpret_cast<InitFn>(fns[i])(argc, argv, envp);
  return true;
}

bool g_dependencies_ready = false;  // agent_init_first() brought them up

// Objects loaded after the agent that are DF_1_INITFIRST too: the dynamic
// linker runs only the last loaded one first, and a program's libraries load
// after LD_PRELOAD's. Their initializers ran before the probes were attached.
struct RivalSearch {
  std::string self;  // the agent's path, as the dynamic linker names it
  bool after = false;
  std::vector<std::string> rivals;
};

int find_initfirst_rivals(struct dl_phdr_info* info, std::size_t, void* data) {
  auto* st = static_cast<RivalSearch*>(data);
  const std::string name = info->dlpi_name ? info->dlpi_name : "";
  if (!st->after) {
    st->after = name == st->self;
    return 0;
  }
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
    const auto* d = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    for (; d->d_tag != DT_NULL; ++d)
      if (d->d_tag == DT_FLAGS_1 && (d->d_un.d_val & DF_1_INITFIRST)) st->rivals.push_back(name);
  }
  return 0;
}

void note_initfirst_rivals() {
  Dl_info self{};
  if (!dladdr(reinterpret_cast<void*>(&find_initfirst_rivals), &self) || !self.dli_fname) return;
  RivalSearch st{self.dli_fname, false, {}};
  dl_iterate_phdr(find_initfirst_rivals, &st);
  for (const auto& path : st.rivals)
    meta->notes.push_back(path + " is DF_1_INITFIRST too: the dynamic linker ran its initializer before the "
                                 "agent's, and what that initializer called is not counted");
}

// The agent is DF_1_INITFIRST: the dynamic linker calls this before any
// other initializer (the program's preinit array included), with nothing
// else initialized -- not even libc, whose environ is still NULL. The
// agent's dependencies (libc, libstdc++, libuprobe, liburcu-bp, capstone,
// ...) must be up before it attaches: dlopen() of the agent itself runs the
// initializers of every dependency not run yet, in dependency order, and
// marks them done (the dynamic linker will not run them again). It passes
// them libc's argc, argv and environ, which libc's own initializer sets: so
// that one runs first, here, with the real values (it will run again inside
// dlopen with the same ones). libc's dlopen, not libuprobe's (RTLD_NEXT from
// here; libuprobe is preloaded ahead of the agent): libuprobe's wrapper is
// not initialized yet. If another object wins DF_1_INITFIRST, libc is up
// already and this only makes sure the dependencies are.
__attribute__((constructor(101))) void agent_init_first(int argc, char** argv, char** envp) {
  if (environ == nullptr && (program_invocation_name == nullptr || *program_invocation_name == '\0') &&
      !run_libc_initializers(argc, argv, envp))
    environ = envp;  // (no libc.so.*: dlopen then passes it at least the environment)
  Dl_info self{};
  auto real_dlopen = reinterpret_cast<void* (*)(const char*, int)>(dlsym(RTLD_NEXT, "dlopen"));
  // (a reference never dropped)
  g_dependencies_ready = dladdr(reinterpret_cast<void*>(&agent_init_first), &self) && self.dli_fname &&
                         real_dlopen && real_dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (!g_dependencies_ready) {
    static const char kWhy[] = "uprobe-trace agent: cannot initialize its dependencies (dlopen of itself): "
                               "not attaching\n";
    if (write(STDERR_FILENO, kWhy, sizeof kWhy - 1) < 0) {
    }
  }
}

/// uprobe-trace's start gate (launch.hpp, StartGate; kEnvGate): once this
/// process attached, wait for the CLI's checks of the specs before any code
/// of the program runs; end-of-file (the CLI refused a spec, or died) ends
/// the process here (125). The descriptor is closed and the variable
/// unset: the program, its children and what it execs see neither.
void pass_start_gate() {
  const char* v = libc_getenv(kEnvGate);
  if (!v) return;
  const int fd = std::atoi(v);
  libc_unsetenv(kEnvGate);
  // (System calls, not libc's read/close: probes on those count the program's calls only.)
  char c = 0;
  long n;
  do n = syscall(SYS_read, fd, &c, 1);
  while (n < 0 && errno == EINTR);
  syscall(SYS_close, fd);
  if (n != 1 || c != '1') _exit(125);
}

__attribute__((constructor)) void agent_init() {
  Scope scope;  // also covers this function's locals, freed after counting is on
  struct AtReturn {
    ~AtReturn() { pass_start_gate(); }
  } gate;  // (whichever way this returns; inside the scope)
  const char* specs = libc_getenv(kEnvSpecs);
  if (!specs || !g_dependencies_ready) return;
  const std::vector<std::string> texts = split(specs, '\n');
  meta = new Meta;
  if (const char* prog = libc_getenv(kEnvProgram)) load_bt_program(prog);
  // str(), sargN and ustack read the program's memory at hits: in process
  // (faults taken by libuprobe's SIGSEGV/SIGBUS handler), not by a system call each.
  if (g_bt_blob) uprobe::enable_fault_safe_reads();
  meta->out_dir = env_or(kEnvOut, "");
  meta->format = env_or(kEnvFormat, "text");
  meta->per_thread = env_or(kEnvPerThread, "0") == "1";
  if (env_or("UPROBE_TRACE_NO_OPTIMIZE", "0") == "1") {
    // Every probe on int3 (Config::optimize off), as the kernel's: for comparisons.
    uprobe::Config c = uprobe::configuration();
    c.optimize = false;
    uprobe::configure(c);
  }
  if (env_or(kEnvFollow, "1") == "0") {
    // --no-follow: whatever this program execs runs without the agent.
    std::string orig = env_or(kEnvOrigPreload, "-");
    if (orig == "-") libc_unsetenv("LD_PRELOAD");
    else libc_setenv("LD_PRELOAD", orig.c_str(), 1);
    for (const char* v : {kEnvSpecs, kEnvOut, kEnvFormat, kEnvFollow, kEnvOrigPreload, kEnvPerThread, kEnvProgram})
      libc_unsetenv(v);
  }
  pthread_atfork(fork_inner_prepare, fork_inner_parent, fork_inner_child);
  try {
    attach(texts);
  } catch (const std::exception& e) {
    if (!meta->specs.empty()) add_message(meta->specs.front(), std::string("agent: ") + e.what());
  }
  pthread_atfork(fork_outer_prepare, fork_outer_after, fork_outer_after);
  note_initfirst_rivals();
  try {
    if (!g) make_counters();  // (attach failed before it made them: the record still says why)
    setup_counting();
  } catch (const std::exception& e) {
    if (!meta->specs.empty()) add_message(meta->specs.front(), std::string("agent: ") + e.what());
    return;  // counting stays off
  }
  arm_exit_dtor_guard();
  g->enabled.store(true, std::memory_order_seq_cst);
}

// Without the CLI, the report is printed here (counts of later destructors
// and of a process that skips exit() are not in it); with the CLI there is
// nothing to do: the counts are in the counts file, and counting goes on.
__attribute__((destructor)) void agent_fini() {
  if (!meta || !meta->out_dir.empty() || !g) return;
  Scope scope;
  g->enabled.store(false, std::memory_order_seq_cst);
  try {
    report_to_stderr();
  } catch (...) {
  }
}

}  // namespace
