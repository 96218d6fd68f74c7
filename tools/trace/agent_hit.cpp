// SPDX-License-Identifier: MIT
// libuprobe-agent.so: what runs at a hit (agent.hpp). Handlers run in signal
// context (or in the return trampoline): they only touch fixed memory. A
// thread's block is made on its first hit (page-aligned, so no cache line is
// shared between threads); threads beyond kMaxBlocks share an overflow block
// with atomic adds. A fork child is a new process: a MADV_WIPEONFORK page
// tells its first hit (even before the atfork handlers run, or in a child of
// the raw clone system call) that the blocks it sees are its parent's, and
// it starts from zero in blocks of its own. Latency of an entry+return pair:
// the entry writes CLOCK_MONOTONIC (vDSO) into the session cookie, the
// return adds log2(now - cookie) to the thread's histogram.
//
// The bpftrace interpreter (bt_vm.hpp) and run_bt() below: general
// registers only, string operations inline, no loop made into a libc call.
// The rest of the hit path (the consumers, the thread's block) is ordinary
// code that uses no vector register either (counting, a few atomics). So the
// consumers declare set_vector_state_unused() and libuprobe saves nothing
// for them at an optimized site; tests/trace/agent_gpr_check.py checks the
// built library: no vector or x87 register in any function a hit reaches, no
// call but to the libc system call wrappers and libuprobe's reads.

#include "agent.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace uptrace::agent {

using counts::kHeaderWords;

Counters* g = nullptr;

__attribute__((tls_model("initial-exec"))) thread_local int tls_in_agent = 0;
__attribute__((tls_model("initial-exec"))) thread_local bool tls_exit_dtors = false;

namespace {

__attribute__((tls_model("initial-exec"))) thread_local std::uint64_t* tls_block = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local std::uint64_t tls_epoch = 0;
// The thread's stack for ustack (bt::StackBounds: looked up at its first walk).
__attribute__((tls_model("initial-exec"))) thread_local bt::StackBounds tls_stack;
// run_bt()'s context, filled at each hit (a local would be zeroed first, with
// a `rep stos` at each hit: string operations are inline there). Hits do not
// nest on a thread (libuprobe runs no consumer inside another's).
__attribute__((tls_model("initial-exec"))) constinit thread_local bt::HitContext tls_ctx;

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

}  // namespace

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

namespace {

/// The process's overflow block (made once; several threads may race).
std::uint64_t* overflow_block() noexcept {
  if (std::uint64_t* ov = g->overflow.load(std::memory_order_acquire)) return ov;
  std::uint64_t* nb = alloc_block(-1, true);
  if (!nb) return nullptr;
  std::uint64_t* expected = nullptr;
  if (g->overflow.compare_exchange_strong(expected, nb, std::memory_order_acq_rel)) return nb;
  return expected;  // another thread's won; ours stays empty
}

}  // namespace

// The first hit (or atfork handler) of a process whose Counters are its
// parent's (a fork child): from now on this is a process of its own, with no
// block yet. Once per process (a thread that finds another one doing it gets
// 0 and its hit is unrecorded).
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

__attribute__((noinline)) std::uint64_t* new_block() noexcept {
  // (its own libc calls, inside the hit, are not the program's: their hits,
  // which libuprobe does not run, are not counted as missed)
  struct InAgent {
    InAgent() noexcept { ++tls_in_agent; }
    ~InAgent() { --tls_in_agent; }
  } in_agent;
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

namespace {

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

using bt::now_ns;  // (the vDSO's, called directly: no libc function, which could be probed)

inline bool counting() noexcept {
  return tls_in_agent == 0 && !tls_exit_dtors && g->enabled.load(std::memory_order_acquire);
}

/// No more hits for a program: none, or exit() ran. (Outside run_bt()'s
/// general-registers-only code: std::atomic's members are always_inline.)
bool bt_stopped() noexcept { return !g->header || g->header->bt_exit.load(std::memory_order_relaxed); }


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
            const uprobe::usdt::ArgSpec* usdt = nullptr, bool entry_frame = false) noexcept {
  if (nhits == 0 || bt_stopped()) return;
  std::uint64_t* b = my_block();
  if (!b || b[counts::kBlockShared]) return unrecorded(nhits);
  std::uint64_t args[kBtArgs];  // (a USDT site's: read when a block needs them; a fast one never does)
  if (!usdt) {
    args[0] = regs.rdi, args[1] = regs.rsi, args[2] = regs.rdx, args[3] = regs.rcx, args[4] = regs.r8,
    args[5] = regs.r9;
    for (unsigned i = 6; i < kBtArgs; ++i) args[i] = 0;
  }
  std::uint64_t* area = b + g->bt_area;
  const std::uint64_t retval = ret ? regs.rax : 0;
  bool ctx_set = false;
  for (std::size_t i = 0; i < nhits; ++i) {
    // (An exit() of an earlier block of this hit stops the rest, as the
    // interpreter checks before each statement.)
    if (hits[i].fast.kind && (i == 0 || !bt_stopped()) && bt::Vm::run_fast(hits[i].fast, area, args, retval))
      continue;
    if (i > 0 && bt_stopped()) return;
    bt::HitContext& ctx = tls_ctx;  // (read_map and map_op stay null: the CLI's)
    if (!ctx_set) {
      ctx_set = true;
      for (unsigned k = 0; usdt && k < kBtArgs; ++k)
        if (k >= usdt->count() || !usdt->read(k, regs, args[k])) args[k] = 0;
      ctx.args = args;
      ctx.sp = regs.rsp;  // (sargN: uprobes only, the compiler checks)
      ctx.ip = regs.rip;  // (ustack: a uretprobe's is the return address, as the kernel's)
      ctx.fp = regs.rbp;
      ctx.entry_sp = entry_frame && !ret ? regs.rsp : 0;
      ctx.layout = g->layout;
      ctx.stack = &tls_stack;
      ctx.retval = retval;
      ctx.start_ns = g->header->bt_start_ns;
      ctx.area = area;
      ctx.exit_flag = reinterpret_cast<volatile std::uint64_t*>(&g->header->bt_exit);
    }
    ctx.func = hits[i].func;
    ctx.probe = hits[i].probe_name;
    bt::Vm vm(g->bt, ctx);
    vm.run_probe(hits[i].probe);
  }
}
#pragma GCC pop_options

}  // namespace

FnConsumer::FnConsumer(uprobe::Callbacks cb, std::vector<long> entries, std::vector<long> rets, long hist,
                       std::vector<BtHit> bt_entries, std::vector<BtHit> bt_rets, bool entry_frame)
    : uprobe::Consumer(cb), entries_(std::move(entries)), rets_(std::move(rets)), hist_(hist),
      bt_entries_(std::move(bt_entries)), bt_rets_(std::move(bt_rets)), entry_frame_(entry_frame) {
  set_vector_state_unused();  // (the hit path uses general registers only: this file's header)
}

uprobe::Action FnConsumer::handler(uprobe::Regs& regs) {
  if (!counting()) {
    setup_hit();
    return rets_.empty() && hist_ < 0 && bt_rets_.empty() ? uprobe::Action::keep : uprobe::Action::ignore;
  }
  run_bt(bt_entries_.data(), bt_entries_.size(), regs, false, nullptr, entry_frame_);
  if (entries_.empty()) {
  } else if (std::uint64_t* b = my_block()) {
    for (long e : entries_) bump(b, kHeaderWords + static_cast<std::size_t>(e));
  } else {
    unrecorded(entries_.size());
  }
  if (hist_ >= 0) uprobe::session_cookie() = now_ns();
  return uprobe::Action::keep;
}

void FnConsumer::ret_handler(uprobe::Regs& regs, std::uint64_t) {
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

void missed_hit(const uprobe::Uprobe*) noexcept {
  if (counting() && g->header) g->header->missed.fetch_add(1, std::memory_order_relaxed);
}

CountConsumer::CountConsumer(long key, std::vector<BtHit> bt, const uprobe::usdt::ArgSpec& args)
    : key_(key), bt_(std::move(bt)), args_(args) {
  set_vector_state_unused();  // as FnConsumer
}

uprobe::Action CountConsumer::handler(uprobe::Regs& regs) {
  if (!counting()) return uprobe::Action::keep;
  run_bt(bt_.data(), bt_.size(), regs, false, &args_);
  if (key_ < 0) return uprobe::Action::keep;
  if (std::uint64_t* b = my_block()) bump(b, kHeaderWords + static_cast<std::size_t>(key_));
  else unrecorded(1);
  return uprobe::Action::keep;
}

}  // namespace uptrace::agent
