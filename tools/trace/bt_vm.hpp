// SPDX-License-Identifier: MIT
#pragma once
/// @file bt_vm.hpp
/// The interpreter of a bpftrace program's compact form (bt_form.hpp), which
/// the agent runs at each probe hit and the CLI runs for BEGIN, END and
/// interval probes. Internal to uprobe-trace (CLI and agent of one build).
///
/// run_probe() is async-signal-safe: no allocation, no lock, and no call
/// into libc at all (under `uprobe:libc:*` each would be a probe hit inside
/// this one, which libuprobe does not run and reports as missed: the
/// program never made it): the vDSO's clock_gettime (vdso_clock(), found
/// at start-up), the prctl(PR_GET_NAME), getuid/getpid/gettid/getcpu system
/// calls made with the instruction itself (raw_syscall.hpp), libuprobe's
/// probe_read_user() and probe_read_user_str() (reads of the program's
/// memory that never fault: in process once the agent armed them, else
/// process_vm_readv), the thread pointer and, at a thread's first ustack,
/// openat/read/close of /proc/self/maps (StackBounds); its recursion is bounded by kMaxDepth, kMaxIfDepth and
/// kKeyStackWords (map reads in keys), all checked by the compiler; it
/// writes the calling thread's own area only.

#include <fcntl.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <uprobe/uprobe.hpp>

#include "bt_clock.hpp"
#include "raw_syscall.hpp"

#include "bt_form.hpp"
#include "bt_stack.hpp"

namespace uptrace::bt {

/// What a hit knows (filled by the caller).
struct HitContext {
  /// arg0..arg9 (nullptr: all 0): a uprobe's SysV argument registers (arg0..arg5;
  /// the compiler refuses more), or a USDT site's arguments as its note's
  /// specs give them (0 past the site's count).
  const std::uint64_t* args = nullptr;
  std::uint64_t sp = 0;                 ///< the stack pointer at the probe (sargN), 0: none (sargN gives 0)
  /// ustack: the instruction pointer (a uprobe's site, a uretprobe's return
  /// address) and frame pointer (rbp) at the probe; ip 0: no stack (the CLI).
  std::uint64_t ip = 0, fp = 0;
  /// ustack at a function entry whose frame is not set up yet (the site's
  /// instruction is `push %rbp`: entry_frame): the stack
  /// pointer, whose word is the caller's return address, which the frame
  /// pointer walk would skip (rbp is still the caller's); 0 elsewhere. The
  /// kernel's perf_callchain_user() reads it so (is_uprobe_at_func_entry()).
  std::uint64_t entry_sp = 0;
  std::uint64_t layout = 0;             ///< the image's layout id (image_word()), 0: the CLI
  StackBounds* stack = nullptr;         ///< the calling thread's (nullptr: every frame by uprobe::probe_read_user())
  std::uint64_t retval = 0;
  const char* func = "";   ///< NUL-terminated
  const char* probe = "";  ///< NUL-terminated
  std::uint64_t start_ns = 0;  ///< for `elapsed`
  std::uint64_t* area = nullptr;  ///< the thread's area (kAreaHeaderWords, ring, tables)
  volatile std::uint64_t* exit_flag = nullptr;  ///< exit() sets it to 1
  /// CLI only (BEGIN, END, interval): a map read (`@m[k]` in an expression)
  /// asks this for the map's value merged over every thread and process (as
  /// bpftrace's maps are one); false: the key is in no table (0). nullptr
  /// (the agent): the calling thread's own table. Not async-signal-safe.
  bool (*read_map)(void* ctx, std::uint32_t map, const std::uint64_t* key, std::int64_t& value) = nullptr;
  void* read_map_ctx = nullptr;
  /// CLI only: delete (kEvDelete, with the encoded key) in every table at
  /// once. nullptr (the agent): delete acts on the calling thread's table
  /// and sends an event for the others. (clear and zero are events in both:
  /// bpftrace applies them when its CLI reads them, in order with print().)
  /// Not async-signal-safe.
  void (*map_op)(void* ctx, std::uint32_t op, std::uint32_t map, const std::uint64_t* key) = nullptr;
  void* map_op_ctx = nullptr;
};

/// bpftrace's hist() bucket of a value.
inline unsigned hist_bucket(std::int64_t v) noexcept {
  if (v < 0) return 0;
  if (v == 0) return 1;
  return static_cast<unsigned>(63 - __builtin_clzll(static_cast<std::uint64_t>(v))) + 2;
}

/// lhist() bucket: 0 below min, 1 + (v - min) / step, the last one at or above max.
inline std::size_t lhist_bucket(const MapDesc& m, std::int64_t v) noexcept {
  if (v < m.lmin) return 0;
  if (v >= m.lmax) return m.value_words - 1;
  return 1 + static_cast<std::size_t>((v - m.lmin) / m.lstep);
}

inline std::uint64_t hash_words(const std::uint64_t* k, std::size_t n) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ k[i]) * 0x100000001b3ull, h ^= h >> 29;
  return h;
}

inline std::uint64_t load(const std::uint64_t* w) noexcept { return __atomic_load_n(w, __ATOMIC_RELAXED); }
inline void store(std::uint64_t* w, std::uint64_t v) noexcept { __atomic_store_n(w, v, __ATOMIC_RELAXED); }

/// Whether n words at a and b are equal (a loop, not memcmp: the agent's
/// hit path calls no libc string function).
inline bool same_words(const std::uint64_t* a, const std::uint64_t* b, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

/// A probe block that is one update of a map without keys and nothing else
/// (`@ = count()`, `@h = hist(arg0)`, `@s = sum(retval)`; no predicate):
/// the common one-liners, which the agent runs without the interpreter
/// (Vm::run_fast(): the same update, the same slot). kind 0: any other block.
struct FastAgg {
  enum Value : std::uint8_t { kNone = 0, kConst, kArg, kRetval };
  std::uint8_t kind = 0;  ///< 1: a fast block
  Value value = kNone;    ///< the aggregated value: a constant (imm), argN (N = imm) or retval
  std::int64_t imm = 0;
  const MapDesc* map = nullptr;
};

/// Probe `pi` of `p` as a FastAgg (kind 0 when it is not one). `usdt`: its
/// argN come from a USDT note's specs (only a block that reads no argN is
/// fast there).
inline FastAgg fast_agg(const Program& p, std::uint32_t pi, bool usdt) noexcept {
  FastAgg f;
  if (!p.h || pi >= p.h->nprobes) return f;
  const ProbeDesc& pd = p.probes[pi];
  if (pd.pred >= 0 || pd.nbody != 1 || pd.nvars != 0 || pd.nsvars != 0) return f;
  const Stmt& s = p.stmts[p.lists[pd.body]];
  if (s.op != StmtOp::map_agg || s.c != 0) return f;
  const MapDesc& m = p.maps[s.a];
  if (m.nkeys != 0 || m.value_is_str) return f;
  if (s.d >= 0) {
    const Node& n = p.nodes[s.d];
    if (n.op == Op::num) f.value = FastAgg::kConst;
    else if (n.op == Op::arg && !usdt && n.imm >= 0 && n.imm < 10) f.value = FastAgg::kArg;
    else if (n.op == Op::retval) f.value = FastAgg::kRetval;
    else return f;
    f.imm = n.imm;
  }
  f.map = &m;
  f.kind = 1;
  return f;
}

/// The interpreter of one hit. Async-signal-safe (see the file comment).
class Vm {
 public:
  Vm(const Program& p, const HitContext& c) noexcept : p_(p), c_(c) {}

  /// Runs probe `pi` (its predicate, then its body).
  void run_probe(std::uint32_t pi) noexcept {
    const ProbeDesc& pd = p_.probes[pi];
    for (std::int32_t k = 0; k < pd.nvars; ++k) vars_[k] = 0;  // (only those it uses)
    for (std::int32_t k = 0; k < pd.nsvars; ++k) svars_[k][0] = 0;
    if (pd.pred >= 0) {
      Val v = eval(pd.pred);
      if (truth(v) == 0) return;
    }
    loop_budget_ = kMaxLoopIterations;
    exec(pd.body, pd.nbody);
  }

  /// Finds a map's table slot for a key in `area`. Without `insert`: the
  /// slot when the key is in the map (live or zeroed; nullptr: absent). With
  /// `insert` (the table's writer only): a live slot for the key, its value
  /// words zeroed when it was not live (a new key, a deleted or zeroed one);
  /// nullptr when the table is full. Also used by the CLI to read tables.
  static std::uint64_t* slot(const MapDesc& m, std::uint64_t* area, const std::uint64_t* key, bool insert) noexcept {
    std::uint64_t* table = area + m.offset;
    const std::uint32_t sw = m.slot_words();
    const std::uint64_t mask = m.nslots - 1;
    std::uint64_t i = hash_words(key, m.key_words) & mask;
    std::uint64_t* reuse = nullptr;  // the first deleted slot on the path
    for (std::uint32_t n = 0; n < m.nslots; ++n, i = (i + 1) & mask) {
      std::uint64_t* s = table + i * sw;
      const std::uint64_t st = __atomic_load_n(s, __ATOMIC_ACQUIRE);
      if (st == kSlotEmpty) {
        if (!insert) return nullptr;
        if (reuse) return take(m, reuse, key);
        for (std::uint32_t k = 0; k < m.key_words; ++k) store(s + 1 + k, key[k]);
        __atomic_store_n(s, kSlotLive, __ATOMIC_RELEASE);
        return s;
      }
      if (same_words(s + 1, key, m.key_words)) {
        if ((st & kSlotStateMask) == kSlotLive) return s;
        if (!insert) return (st & kSlotStateMask) == kSlotZeroed ? s : nullptr;
        return take(m, s, key);
      }
      if (insert && !reuse && (st & kSlotStateMask) == kSlotDeleted) reuse = s;
    }
    return insert && reuse ? take(m, reuse, key) : nullptr;
  }

  /// The value words of a slot slot() found: nullptr for a zeroed one (0).
  static const std::uint64_t* value_of(const MapDesc& m, const std::uint64_t* s) noexcept {
    return (__atomic_load_n(s, __ATOMIC_ACQUIRE) & kSlotStateMask) == kSlotLive ? s + 1 + m.key_words : nullptr;
  }

  /// The writer's clear (kSlotDeleted) or zero (kSlotZeroed) of its own table.
  void mark_all(const MapDesc& m, std::uint64_t to) noexcept {
    std::uint64_t* table = c_.area + m.offset;
    for (std::uint32_t i = 0; i < m.nslots; ++i) {
      std::uint64_t* s = table + std::uint64_t{i} * m.slot_words();
      const std::uint64_t st = __atomic_load_n(s, __ATOMIC_ACQUIRE);
      if ((st & kSlotStateMask) == kSlotLive || (st & kSlotStateMask) == kSlotZeroed)
        __atomic_store_n(s, (st & ~kSlotStateMask) | to, __ATOMIC_RELEASE);
    }
  }

  /// The writer's delete of a slot (its own table): deleted, key kept.
  static void mark_deleted(std::uint64_t* s) noexcept {
    const std::uint64_t st = __atomic_load_n(s, __ATOMIC_ACQUIRE);
    if ((st & kSlotStateMask) == kSlotLive || (st & kSlotStateMask) == kSlotZeroed)
      __atomic_store_n(s, (st & ~kSlotStateMask) | kSlotDeleted, __ATOMIC_RELEASE);
  }

  /// The CLI's change of a slot in any table, while its writer may run:
  /// live or zeroed -> `to` (kSlotDeleted or kSlotZeroed), by compare-and-
  /// swap of the state word it read (`seen`). An update the writer makes at
  /// once is ordered before the change (its value is not seen); the writer's
  /// next update of the key revives the slot from zero.
  static bool cli_mark(std::uint64_t* s, std::uint64_t seen, std::uint64_t to) noexcept {
    const std::uint64_t st = seen & kSlotStateMask;
    if (st != kSlotLive && st != kSlotZeroed) return false;
    if (to == kSlotZeroed && st == kSlotZeroed) return true;
    return __atomic_compare_exchange_n(s, &seen, (seen & ~kSlotStateMask) | to, false, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
  }

  /// One update of map `m`'s value words `v` with the value `x` (count
  /// ignores it): what `@m[...] = AGG(x)` does once its entry is found.
  static void apply(const MapDesc& m, std::uint64_t* v, std::int64_t x) noexcept {
    const auto ux = static_cast<std::uint64_t>(x);
    switch (m.agg) {
      case Agg::count: store(v, load(v) + 1); break;
      case Agg::sum: store(v, load(v) + ux); break;
      case Agg::avg:
      case Agg::stats: store(v + 1, load(v + 1) + ux), store(v, load(v) + 1); break;
      case Agg::min:
        if (!load(v + 1) || x < static_cast<std::int64_t>(load(v))) store(v, ux);
        store(v + 1, 1);
        break;
      case Agg::max:
        if (!load(v + 1) || x > static_cast<std::int64_t>(load(v))) store(v, ux);
        store(v + 1, 1);
        break;
      case Agg::hist: store(v + hist_bucket(x), load(v + hist_bucket(x)) + 1); break;
      case Agg::lhist: {
        const std::size_t b = lhist_bucket(m, x);
        store(v + b, load(v + b) + 1);
        break;
      }
      case Agg::assign: store(v, ux), store(v + 1, now_ns()); break;
    }
  }

  /// fast_agg()'s block at a hit, without the interpreter: true when done;
  /// false when the map's one slot is not live yet (its first update, or
  /// after a clear() or zero()), which the interpreter then makes.
  /// `args`: the hit's arg0..arg9; `retval` its return value (0 at an entry).
  static bool run_fast(const FastAgg& f, std::uint64_t* area, const std::uint64_t* args,
                       std::uint64_t retval) noexcept {
    std::uint64_t* sl = area + f.map->offset;
    if ((__atomic_load_n(sl, __ATOMIC_ACQUIRE) & kSlotStateMask) != kSlotLive) return false;
    const std::int64_t x = f.value == FastAgg::kArg      ? static_cast<std::int64_t>(args[f.imm])
                           : f.value == FastAgg::kRetval ? static_cast<std::int64_t>(retval)
                                                         : f.imm;
    apply(*f.map, sl + 1 + f.map->key_words, x);
    return true;
  }

 private:
  struct Val {
    std::int64_t i = 0;
    const char* s = nullptr;  ///< a string (up to kStrLen bytes, NUL-terminated or not)
  };

  static std::int64_t truth(const Val& v) noexcept { return v.s ? 1 : v.i; }

  // A slot for `key` taken by the writer: the key, zeroed value words, live
  // with the next generation.
  static std::uint64_t* take(const MapDesc& m, std::uint64_t* s, const std::uint64_t* key) noexcept {
    const std::uint64_t st = __atomic_load_n(s, __ATOMIC_ACQUIRE);
    for (std::uint32_t k = 0; k < m.key_words; ++k) store(s + 1 + k, key[k]);
    for (std::uint32_t k = 0; k < m.value_words; ++k) store(s + 1 + m.key_words + k, 0);
    __atomic_store_n(s, ((st & ~kSlotStateMask) + kSlotGen) | kSlotLive, __ATOMIC_RELEASE);
    return s;
  }

  // This process's ID for image words, kept in the thread's area (one
  // system call less per stack or usym value: the area belongs to this
  // process, a fork child makes its own).
  long self_pid() const noexcept {
    std::uint64_t pid = c_.area ? load(c_.area + kSelfPid) : 0;
    if (!pid) {
      pid = static_cast<std::uint64_t>(uprobe::arch::raw_syscall(SYS_getpid));
      if (c_.area) store(c_.area + kSelfPid, pid);
    }
    return static_cast<long>(pid);
  }

  // sargN: the word at sp + 8 * (N + 1) (0 when it cannot be read; never a fault).
  std::uint64_t stack_arg(std::int64_t n) const noexcept {
    if (!c_.sp) return 0;
    std::uint64_t w = 0;
    uprobe::probe_read_user(&w, 8, reinterpret_cast<const void*>(c_.sp + 8 * static_cast<std::uint64_t>(n + 1)));
    return w;  // (0 when it failed)
  }

  const char* literal(std::int32_t off) const noexcept { return p_.strtab + off; }

  const char* comm() noexcept {
    if (!comm_ok_) {
      std::memset(comm_, 0, sizeof comm_);
      uprobe::arch::raw_syscall(SYS_prctl, PR_GET_NAME, reinterpret_cast<long>(comm_));
      comm_ok_ = true;
    }
    return comm_;
  }

  // Copies the string at `addr` of this process (at most size - 1 bytes,
  // then NUL) as bpftrace's str() (bpf_probe_read_user_str()): a string a
  // byte of which cannot be read, up to its NUL or its size-th byte, gives
  // "" (an unmapped or unreadable address too); never a fault.
  static void read_string(std::uint64_t addr, char* out, std::size_t size) noexcept {
    if (uprobe::probe_read_user_str(out, static_cast<std::uint32_t>(size), reinterpret_cast<const void*>(addr)) < 0)
      out[0] = 0;  // (zeroed already)
  }

  static bool str_eq(const char* a, const char* b) noexcept {
    for (std::size_t i = 0; i < kStrLen; ++i) {
      if (a[i] != b[i]) return false;
      if (!a[i]) return true;
    }
    return true;
  }

  std::uint64_t image() const noexcept { return image_word(static_cast<std::uint64_t>(self_pid()), c_.layout); }

  // ustack: the return addresses as the kernel's user stack walker
  // (perf_callchain_user(), which bpftrace's ustack is) finds them: the
  // instruction pointer, at a function entry before its frame the return
  // address at the stack pointer (entry_sp), then for each frame pointer the word above it,
  // following the saved frame pointers, until a read fails, an address is 0
  // (where bpftrace stops printing) or `limit` frames. A frame on the
  // thread's stack above the stack pointer (StackBounds) is read with plain
  // loads, any other with uprobe::probe_read_user(): a bad frame pointer ends the
  // walk, never faults. Async-signal-safe, no allocation. Returns the frames
  // written to `out`.
  unsigned walk_stack(std::uint64_t* out, unsigned limit) const noexcept {
    unsigned n = 0;
    if (!c_.ip || !limit) return 0;
    out[n++] = c_.ip;
    std::uint64_t fp = c_.fp;
    // Frames between the stack pointer and the top of the thread's stack: plain loads.
    std::uint64_t lo = 0, hi = 0;
    if (c_.stack && c_.sp) {
      if (!c_.stack->known) find_stack(*c_.stack, c_.sp);
      if (c_.stack->lo <= c_.sp && c_.sp < c_.stack->hi) lo = c_.sp, hi = c_.stack->hi;
    }
    // At a function's entry, its caller first: the return address at the
    // stack pointer (the kernel's walker stores it whenever it can read it).
    std::uint64_t ra = 0;
    if (c_.entry_sp && n < limit && (!read_stack_words(c_.entry_sp, &ra, 1, lo, hi) || !ra)) limit = n;
    if (ra) out[n++] = ra;
    while (n < limit) {
      std::uint64_t frame[2];
      // (fp in page 0, never mapped but with vm.mmap_min_addr 0: where
      // chains end, rbp 0 or 1, without a system call)
      if (fp < 4096 && !(fp >= lo && fp < hi)) break;
      if (!read_stack_words(fp, frame, 2, lo, hi) || !frame[1]) break;
      out[n++] = frame[1];
      fp = frame[0];
    }
    fix_return_addresses(out, n);
    return n;
  }

  // A caller with a pending return probe has libuprobe's return address in
  // its slot (the return trampoline, or the landing of an optimized entry):
  // the real one instead, from the thread's return instances, as the
  // kernel's walker gives it (perf_callchain_user() since Linux 6.11).
  // (One call: the agent's hit code calls libuprobe directly, never through
  // a pointer; tests/trace/agent_gpr_check.py.) Async-signal-safe.
  __attribute__((noinline)) static void fix_return_addresses(std::uint64_t* out, unsigned n) noexcept {
    void* frames[kMaxFrames];
    for (unsigned k = 0; k < n; ++k) frames[k] = reinterpret_cast<void*>(out[k]);
    if (uprobe::fixup_backtrace(frames, static_cast<int>(n)) > 0)
      for (unsigned k = 0; k < n; ++k) out[k] = reinterpret_cast<std::uint64_t>(frames[k]);
  }

  // A ustack or usym value (node `ni`, vt kVtStack or kVtUsym) in key words
  // at `out` (ustack: the image word, then limit frames, zero-filled by the
  // caller; usym: the image word, the address). Returns the words used.
  unsigned put_special(const Node& n, std::uint64_t* out) noexcept {
    out[0] = image();
    if (n.vt == kVtStack) return 1 + walk_stack(out + 1, static_cast<unsigned>(n.imm));
    out[1] = static_cast<std::uint64_t>(eval(n.a).i);
    return 2;
  }

  // Encodes a key (list `l`, `n` components) on the key stack; the words
  // returned stay valid until the next encode_key() at this level (a map
  // read in a component encodes its own key above this one's).
  const std::uint64_t* encode_key(const MapDesc& m, std::int32_t l, std::int32_t n) noexcept {
    std::uint64_t* kb = key_ + key_top_;
    for (std::uint32_t w = 0; w < m.key_words; ++w) kb[w] = 0;
    key_top_ += m.key_words;
    char* out = reinterpret_cast<char*>(kb);
    for (std::int32_t k = 0; k < n; ++k) {
      if (m.key_is_str[k] == 3 || m.key_is_str[k] == 4) {
        std::uint64_t words[kMaxFrames + 1];  // (aligned: `out` may not be)
        std::memset(words, 0, sizeof words);
        put_special(p_.nodes[p_.lists[l + k]], words);
        const std::size_t nw = m.key_is_str[k] == 3 ? 1u + m.stack_limit : 2u;
        std::memcpy(out, words, 8 * nw);  // (frames past the last: 0)
        out += 8 * nw;
        continue;
      }
      Val v = eval(p_.lists[l + k]);
      if (m.key_is_str[k] == 1) {
        const char* s = v.s ? v.s : "";
        for (std::size_t j = 0; j < kStrLen - 1 && s[j]; ++j) out[j] = s[j];
        out += kStrLen;
      } else {
        std::memcpy(out, &v.i, 8);
        out += 8;
      }
    }
    key_top_ -= m.key_words;
    return kb;
  }

  Val eval(std::int32_t ni) noexcept {
    const Node& n = p_.nodes[ni];
    Val v;
    switch (n.op) {
      case Op::num: v.i = n.imm; break;
      case Op::str: v.s = literal(n.a); break;
      case Op::arg: v.i = c_.args ? static_cast<std::int64_t>(c_.args[n.imm]) : 0; break;
      case Op::sarg: v.i = static_cast<std::int64_t>(stack_arg(n.imm)); break;
      case Op::retval: v.i = static_cast<std::int64_t>(c_.retval); break;
      case Op::pid: v.i = uprobe::arch::raw_syscall(SYS_getpid); break;
      case Op::tid: v.i = uprobe::arch::raw_syscall(SYS_gettid); break;
      case Op::uid: v.i = uprobe::arch::raw_syscall(SYS_getuid); break;
      case Op::cpu: {
        unsigned cpu = 0;
        uprobe::arch::raw_syscall(SYS_getcpu, reinterpret_cast<long>(&cpu));
        v.i = cpu;
        break;
      }
      case Op::comm: v.s = comm(); break;
      case Op::str_read: {
        const auto addr = static_cast<std::uint64_t>(eval(n.a).i);
        std::size_t size = kStrDefault;
        if (n.b >= 0) {
          const std::int64_t l = eval(n.b).i;
          size = l <= 0 ? 1 : l < static_cast<std::int64_t>(kStrDefault) ? static_cast<std::size_t>(l) + 1 : kStrDefault;
        }
        char* buf = scratch_[next_scratch_++ % kStrSlots];
        read_string(addr, buf, size);
        v.s = buf;
        break;
      }
      case Op::ustack: break;  // (only as a key or printf argument: encode_key(), emit())
      case Op::usym:
      case Op::strftime_: v.i = eval(n.a).i; break;
      case Op::func: v.s = c_.func; break;
      case Op::probe: v.s = c_.probe; break;
      case Op::nsecs: v.i = static_cast<std::int64_t>(now_ns()); break;
      case Op::elapsed: v.i = static_cast<std::int64_t>(now_ns() - c_.start_ns); break;
      case Op::var:
        if (n.is_str) v.s = svars_[n.a];
        else v.i = vars_[n.a];
        break;
      case Op::map_read: {
        const MapDesc& m = p_.maps[n.a];
        const std::uint64_t* key = encode_key(m, n.b, n.c);
        if (m.value_is_str) {  // the string's bytes in the slot (kStrLen, NUL-padded); "" for a key not there
          const std::uint64_t* s = c_.read_map ? nullptr : slot(m, c_.area, key, false);
          const std::uint64_t* val = s ? value_of(m, s) : nullptr;
          v.s = val ? reinterpret_cast<const char*>(val) : "";
          break;
        }
        if (c_.read_map) {
          if (!c_.read_map(c_.read_map_ctx, static_cast<std::uint32_t>(n.a), key, v.i)) v.i = 0;
        } else if (const std::uint64_t* s = slot(m, c_.area, key, false)) {
          if (const std::uint64_t* val = value_of(m, s))
            v.i = static_cast<std::int64_t>(m.agg == Agg::avg ? (val[0] ? val[1] / val[0] : 0) : load(val));
        }
        break;
      }
      case Op::unary: {
        Val a = eval(n.a);
        v.i = n.sub == '-' ? static_cast<std::int64_t>(0 - static_cast<std::uint64_t>(a.i)) : n.sub == '!' ? !truth(a) : ~a.i;
        break;
      }
      case Op::land: v.i = truth(eval(n.a)) && truth(eval(n.b)); break;
      case Op::lor: v.i = truth(eval(n.a)) || truth(eval(n.b)); break;
      case Op::ternary: v = truth(eval(n.a)) ? eval(n.b) : eval(n.c); break;
      case Op::cast: {
        std::int64_t x = eval(n.a).i;
        switch (n.imm) {
          // (not `sub ? int32_t : uint32_t`: that ternary's type is uint32_t)
          case 8: x = n.sub ? std::int64_t{static_cast<std::int8_t>(x)} : std::int64_t{static_cast<std::uint8_t>(x)}; break;
          case 16: x = n.sub ? std::int64_t{static_cast<std::int16_t>(x)} : std::int64_t{static_cast<std::uint16_t>(x)}; break;
          case 32: x = n.sub ? std::int64_t{static_cast<std::int32_t>(x)} : std::int64_t{static_cast<std::uint32_t>(x)}; break;
          default: break;
        }
        v.i = x;
        break;
      }
      case Op::binary: {
        Val a = eval(n.a), b = eval(n.b);
        if (a.s || b.s) {  // strings: == and != only (the compiler checks)
          const bool eq = a.s && b.s && str_eq(a.s, b.s);
          v.i = n.sub == kEq ? eq : !eq;
          break;
        }
        const std::int64_t x = a.i, y = b.i;
        const auto ux = static_cast<std::uint64_t>(x), uy = static_cast<std::uint64_t>(y);
        const bool sgn = n.imm != 0;  // both operands signed (the compiler's)
        switch (n.sub) {
          case kAdd: v.i = static_cast<std::int64_t>(ux + uy); break;
          case kSub: v.i = static_cast<std::int64_t>(ux - uy); break;
          case kMul: v.i = static_cast<std::int64_t>(ux * uy); break;
          // (/ % >> are unsigned whatever the operands' types, as bpftrace 0.17's
          // udiv, urem and lshr; division by zero gives 0)
          case kDiv: v.i = uy == 0 ? 0 : static_cast<std::int64_t>(ux / uy); break;
          case kMod: v.i = uy == 0 ? 0 : static_cast<std::int64_t>(ux % uy); break;
          case kAnd: v.i = x & y; break;
          case kOr: v.i = x | y; break;
          case kXor: v.i = x ^ y; break;
          case kShl: v.i = static_cast<std::int64_t>(ux << (uy & 63)); break;
          case kShr: v.i = static_cast<std::int64_t>(ux >> (uy & 63)); break;
          case kEq: v.i = x == y; break;
          case kNe: v.i = x != y; break;
          case kLt: v.i = sgn ? x < y : ux < uy; break;
          case kLe: v.i = sgn ? x <= y : ux <= uy; break;
          case kGt: v.i = sgn ? x > y : ux > uy; break;
          case kGe: v.i = sgn ? x >= y : ux >= uy; break;
          default: break;
        }
        break;
      }
    }
    return v;
  }

  /// How a statement list ended: at its end, or at a break, a continue, a
  /// return (exit(), the loop budget spent).
  enum class Flow { next, brk, cont, ret };

  /// One more loop iteration of this run's kMaxLoopIterations; false (the
  /// run stops, counted in the area) when they are spent.
  bool loop_iteration() noexcept {
    if (loop_budget_ > 0) {
      --loop_budget_;
      return true;
    }
    if (c_.area) store(c_.area + kLoopStops, load(c_.area + kLoopStops) + 1);
    return false;
  }

  Flow exec(std::int32_t l, std::int32_t n) noexcept {
    for (std::int32_t k = 0; k < n; ++k) {
      if (c_.exit_flag && *c_.exit_flag) return Flow::ret;
      const Stmt& s = p_.stmts[p_.lists[l + k]];
      switch (s.op) {
        case StmtOp::set_var: {
          const Val x = eval(s.b);
          if (s.c) {  // (a copy: the value may be a str() scratch buffer, or this variable)
            char tmp[kStrLen];
            std::size_t j = 0;
            for (const char* src = x.s ? x.s : ""; j < kStrLen - 1 && src[j]; ++j) tmp[j] = src[j];
            tmp[j] = 0;
            std::memcpy(svars_[s.a], tmp, j + 1);
          } else {
            vars_[s.a] = x.i;
          }
          break;
        }
        case StmtOp::expr: eval(s.a); break;
        case StmtOp::exit_: if (c_.exit_flag) *c_.exit_flag = 1; return Flow::ret;
        case StmtOp::if_: {
          const Flow f = truth(eval(s.a)) ? exec(s.b, s.c) : s.e ? exec(s.d, s.e) : Flow::next;
          if (f != Flow::next) return f;
          break;
        }
        case StmtOp::while_:
          while (truth(eval(s.a))) {
            if (!loop_iteration()) return Flow::ret;
            const Flow f = exec(s.b, s.c);
            if (f == Flow::brk) break;
            if (f == Flow::ret) return f;
          }
          break;
        case StmtOp::unroll:
          for (std::int32_t i = 0; i < s.a; ++i) {
            if (!loop_iteration()) return Flow::ret;
            const Flow f = exec(s.b, s.c);  // (a break or continue is the enclosing while's)
            if (f != Flow::next) return f;
          }
          break;
        case StmtOp::jump: return s.a == kJumpBreak ? Flow::brk : s.a == kJumpContinue ? Flow::cont : Flow::ret;
        case StmtOp::map_agg: agg(s); break;
        case StmtOp::printf_: emit(s); break;
        case StmtOp::print_map: emit(s, kEvPrint); break;
        case StmtOp::time_: emit(s, kEvTime); break;
        case StmtOp::map_delete: del(s); break;
        case StmtOp::map_clear:
        case StmtOp::map_zero: {
          // The calling thread's table at once (the agent), then an event:
          // the CLI applies it to every other table when it reads it (in
          // the CLI, to all of them then: in order with print(), as
          // bpftrace's CLI applies its clear and zero events).
          if (!c_.map_op) mark_all(p_.maps[s.a], s.op == StmtOp::map_clear ? kSlotDeleted : kSlotZeroed);
          emit(s, s.op == StmtOp::map_clear ? kEvClear : kEvZero);
          break;
        }
      }
    }
    return Flow::next;
  }

  // The value words of the entry of map `m` that statement `s`'s key names
  // (made when new); nullptr, counted as a map drop, when the table is full.
  std::uint64_t* value_words(const Stmt& s, const MapDesc& m) noexcept {
    if (m.nkeys == 0) {  // `@x = ...`: the table's one slot, live after its first update (else slot() below)
      std::uint64_t* sl = c_.area + m.offset;
      if ((__atomic_load_n(sl, __ATOMIC_ACQUIRE) & kSlotStateMask) == kSlotLive) return sl + 1 + m.key_words;
    }
    const std::uint64_t* key = encode_key(m, s.b, s.c);
    std::uint64_t* sl = slot(m, c_.area, key, true);
    if (!sl) {
      store(c_.area + kMapDrops, load(c_.area + kMapDrops) + 1);
      return nullptr;
    }
    return sl + 1 + m.key_words;
  }

  void agg(const Stmt& s) noexcept {
    const MapDesc& m = p_.maps[s.a];
    if (m.value_is_str) return store_str(s, m);
    const std::int64_t x = s.d >= 0 ? eval(s.d).i : 0;
    if (std::uint64_t* v = value_words(s, m)) apply(m, v, x);
  }

  // @m[k] = STRING: the string's bytes (NUL-padded), then the store's time
  // (the last value word, as an integer store's).
  void store_str(const Stmt& s, const MapDesc& m) noexcept {
    char tmp[kStrLen];  // (a copy: the value may be a str() scratch buffer the key's encoding reuses)
    std::memset(tmp, 0, sizeof tmp);
    const Val x = eval(s.d);
    for (std::size_t j = 0; j < kStrLen - 1 && x.s && x.s[j]; ++j) tmp[j] = x.s[j];
    std::uint64_t* v = value_words(s, m);
    if (!v) return;
    for (std::size_t w = 0; w < kStrLen / 8; ++w) {
      std::uint64_t word;
      std::memcpy(&word, tmp + 8 * w, 8);
      store(v + w, word);
    }
    store(v + m.value_words - 1, now_ns());
  }

  // delete(@m[k]): from the calling thread's table at once; then, unless a
  // key component is `tid` (no other thread can have it), an event: the CLI
  // deletes the key from every other table when it reads it (a `@m[k] = x`
  // store made after the delete stays: the CLI compares the store's time).
  void del(const Stmt& s) noexcept {
    const MapDesc& m = p_.maps[s.a];
    const std::uint64_t* key = encode_key(m, s.b, s.c);
    if (c_.map_op) {
      c_.map_op(c_.map_op_ctx, kEvDelete, static_cast<std::uint32_t>(s.a), key);
      return;
    }
    if (std::uint64_t* sl = slot(m, c_.area, key, false)) mark_deleted(sl);
    if (!s.d) emit(s, kEvDelete, key);
  }

  void emit(const Stmt& s, std::uint32_t kind = kEvPrintf, const std::uint64_t* key = nullptr) noexcept {
    static constexpr FmtDesc kNoArgs{};
    const FmtDesc& f = kind == kEvPrintf ? p_.fmts[s.a] : kNoArgs;
    const std::uint32_t key_bytes = kind == kEvDelete ? p_.maps[s.a].key_words * 8 : 0;
    // Room for the longest strings is checked; the event takes what its
    // strings need (NUL-terminated, padded to 8 bytes).
    std::uint32_t bytes = sizeof(EventHeader) + key_bytes;
    for (std::uint32_t k = 0; k < f.nargs; ++k)
      bytes += f.arg_is_str[k] == 1 ? kStrLen : f.arg_is_str[k] == 2 ? 8 * (2 + f.arg_limit[k]) : f.arg_is_str[k] == 3 ? 16 : 8;
    std::uint64_t* area = c_.area;
    const std::uint64_t ring = p_.h->ring_bytes;
    auto* base = reinterpret_cast<unsigned char*>(area + kAreaHeaderWords);
    std::uint64_t head = load(area + kRingHead);
    const std::uint64_t tail = __atomic_load_n(area + kRingTail, __ATOMIC_ACQUIRE);
    std::uint64_t pos = head & (ring - 1);
    std::uint64_t need = bytes + ((ring - pos < bytes) ? ring - pos : 0);
    if (head + need - tail > ring) {
      store(area + kLostEvents, load(area + kLostEvents) + 1);
      return;
    }
    if (ring - pos < bytes) {  // no room before the end: a wrap marker, then from the start
      if (ring - pos >= sizeof(std::uint64_t)) {
        auto* w = reinterpret_cast<EventHeader*>(base + pos);
        w->bytes = static_cast<std::uint32_t>(ring - pos);
        w->kind = kEvWrap;
      }
      head += ring - pos;
      pos = 0;
    }
    auto* e = reinterpret_cast<EventHeader*>(base + pos);
    e->kind = kind;
    e->ts = now_ns();
    e->fmt = static_cast<std::uint32_t>(s.a);
    e->pad = 0;
    unsigned char* out = base + pos + sizeof(EventHeader);
    if (key_bytes && key) std::memcpy(out, key, key_bytes), out += key_bytes;
    for (std::uint32_t k = 0; k < f.nargs; ++k) {
      const std::int32_t ni = p_.lists[s.b + static_cast<std::int32_t>(k)];
      if (f.arg_is_str[k] == 2) {  // the image word, frames | perf << 32, the frames
        const Node& nd = p_.nodes[ni];
        std::uint64_t words[kMaxFrames + 2];
        words[0] = image();
        const unsigned nf = walk_stack(words + 2, f.arg_limit[k]);
        words[1] = nf | (std::uint64_t{nd.sub} << 32);
        std::memcpy(out, words, 8 * (2 + nf));
        out += 8 * (2 + nf);
        continue;
      }
      if (f.arg_is_str[k] == 4) {  // strftime(): the time; the CLI formats it
        const std::int64_t t = eval(ni).i;
        std::memcpy(out, &t, 8);
        out += 8;
        continue;
      }
      if (f.arg_is_str[k] == 3) {
        const std::uint64_t words[2] = {image(), static_cast<std::uint64_t>(eval(p_.nodes[ni].a).i)};
        std::memcpy(out, words, sizeof words);
        out += sizeof words;
        continue;
      }
      Val v = eval(ni);
      if (f.arg_is_str[k]) {
        const char* src = v.s ? v.s : "";
        std::size_t j = 0;
        for (; j < kStrLen - 1 && src[j]; ++j) out[j] = static_cast<unsigned char>(src[j]);
        do out[j++] = 0;
        while (j % 8);
        out += j;
      } else {
        std::memcpy(out, &v.i, 8);
        out += 8;
      }
    }
    const auto used = static_cast<std::uint32_t>(out - (base + pos));
    // The rest of a wrap's room: a marker the reader skips (never less than 8 bytes).
    e->bytes = used;
    __atomic_store_n(area + kRingHead, head + used, __ATOMIC_RELEASE);
  }

  const Program& p_;
  const HitContext& c_;
  // Not cleared as a whole at each hit: run_probe() clears the variables the
  // probe uses, encode_key() the key words of its map.
  std::int64_t vars_[kMaxVars];
  char svars_[kMaxStrVars][kStrLen];
  std::uint32_t loop_budget_ = kMaxLoopIterations;  ///< loop iterations this probe run may still take
  std::uint64_t key_[kKeyStackWords];
  unsigned key_top_ = 0;
  char comm_[17];
  bool comm_ok_ = false;
  char scratch_[kStrSlots][kStrDefault];
  unsigned next_scratch_ = 0;
};

}  // namespace uptrace::bt
