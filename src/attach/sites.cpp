// SPDX-License-Identifier: MIT
#include "sites.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory_resource>
#include <unordered_map>

#include "arch.hpp"
#include "bytes.hpp"
#include "format.hpp"
#include "patch.hpp"
#include "raw_syscall.hpp"
#include "runtime.hpp"
#include "sanitize.hpp"
#include "thread_sample.hpp"
#include "xol.hpp"
#include "rcu.hpp"

/// The bounds of the optimized path's C code (UPROBE_OPT_PATH_TEXT, arch.hpp),
/// defined by the linker.
extern "C" {
extern const char __start_uprobe_opt_path[] __attribute__((visibility("hidden")));
extern const char __stop_uprobe_opt_path[] __attribute__((visibility("hidden")));
}

namespace uprobe::detail {

namespace {

bool g_sync_core = false;

/// Retired blocks from which reclaim_retired() tries at every call.
constexpr std::size_t kReclaimBatch = 64;

/// Serialises instruction fetch on every core running this process (the
/// kernel's text_poke_sync()).
void sync_cores() noexcept {
  arch::raw_syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0);  // not libc's syscall()
}

/// site address -> its stub's OptSite (stubs are kept and reused by their
/// site address until the site's probe is gone: retire_site_memory(); then
/// reclaim_retired() reuses them only once no thread can be inside).
/// Its nodes come from pooled chunks (see XolArea's maps).
std::pmr::unordered_map<std::uint64_t, std::uint64_t>& stubs() {
  static auto* pool = new std::pmr::unsynchronized_pool_resource;
  static auto* m = new std::pmr::unordered_map<std::uint64_t, std::uint64_t>(pool);
  return *m;
}

/// A stub's descriptor is about to be written (through the XOL alias mapping,
/// at another address than the one the stub reads it from): ThreadSanitizer
/// cannot see that a thread entering the stub reads what was written. Called
/// before the write, as a release store would be: a thread already inside a
/// stub that is rebuilt for the next probe at its site may read the new owner
/// at once, before the jump is patched in again. The stub entry acquires the
/// same address (uprobe_opt_entry). No-op otherwise.
void tsan_publish_stub(std::uint64_t stub) noexcept {
#if UPROBE_TSAN
  __tsan_release(reinterpret_cast<void*>(stub + arch::opt_stub_owner_offset()));
#else
  (void)stub;
#endif
}

/// Whether a consumer of `up` (its set as the registry sees it) has a
/// return side. Registry mutex held.
bool has_return_consumer(const Uprobe* up) noexcept {
  const ConsumerSet* cs = up->consumers.load(std::memory_order_relaxed);
  if (!cs) return false;
  for (const Registration* r : cs->regs)
    if (r->has_ret && !r->removed.load(std::memory_order_relaxed)) return true;
  return false;
}

/// Builds the stub of site `s` of `up` (its OptSite: where it continues, the
/// key, the owner) in XOL memory within reach of the site,
/// writes it and records it for the site address. Returns the stub, or 0
/// when there is no memory in reach or the write failed (the site stays
/// int3). Registry mutex held.
std::uint64_t write_stub(const Uprobe* up, const Site& s, const std::vector<Vma>& vmas, bool entry) {
  std::string why;
  // A punned site's stub is within reach of its hop, which jumps there.
  const std::uint64_t stub = s.hop ? xol_area().code_near(s.hop, arch::kOptStubSize, vmas, why, s.addr)
                                   : xol_area().code_near(s.addr, arch::kOptStubSize, vmas, why);
  if (!stub) return 0;
  std::uint8_t code[arch::kOptStubSize];
  arch::OptSite desc{};
  desc.site = s.addr;
  desc.resume = entry ? s.window_xol : s.addr + up->insn.len;
  desc.key[0] = up->key.dev;
  desc.key[1] = up->key.ino;
  desc.key[2] = up->key.offset;
  desc.owner = reinterpret_cast<std::uint64_t>(up);
  // The stub may resume through the red zone (arch::opt_frame_leave()) only
  // at a function's first instruction, and only a stub made while the probe
  // has a return consumer: an entry probe alone never writes below rsp (code
  // that jumps to a function's first instruction may keep data there).
  desc.at_entry = up->function_entry && has_return_consumer(up) ? 1 : 0;
  const std::size_t n = arch::build_opt_stub(stub, desc, code);
  tsan_publish_stub(stub);
  if (!xol_area().write_code(stub, code, n, why)) return 0;
  if (s.hop) {
    std::uint8_t hop[arch::kJumpLen];
    arch::encode_jump(s.hop, stub, hop);
    if (!xol_area().write_code(s.hop, hop, arch::kJumpLen, why)) return 0;
  }
  stubs()[s.addr] = stub;
  return stub;
}

/// The original bytes the jump replaces (the nop5, or the entry window).
const std::uint8_t* original_bytes(const Uprobe* up) noexcept {
  return up->tactic == arch::Tactic::nop5 ? up->insn.bytes : up->window.bytes;
}

/// The shape allows a jump at all: arch::plan() chose a nop5, a window or a
/// punned jump.
bool optimizable_shape(const Uprobe* up) noexcept {
  return up->tactic != arch::Tactic::int3;
}

/// Where the site's jump goes: its stub, or a punned site's hop.
std::uint64_t jump_target(const Site& s) noexcept { return s.hop ? s.hop : s.stub; }

/// The bytes after byte 0 that the jump changes (see arch::jump_tail_len()).
std::size_t tail_len(const Uprobe* up) noexcept {
  return up->tactic == arch::Tactic::nop5 ? arch::kJumpLen - 1 : arch::jump_tail_len(up->window);
}

/// The jump the site holds once optimized (a punned one after its Site::pad
/// prefixes) into out[0 .. kMaxJumpLen); returns its length.
std::size_t site_jump(const Site& s, std::uint8_t* out) noexcept {
  arch::encode_jump(s.addr, jump_target(s), out, s.pad);
  return s.pad + arch::kJumpLen;
}

/// The bytes from the site on that must be the file's before its jump is
/// written: the window, or the whole (padded) punned jump, whose bytes past
/// the instruction are kept.
std::size_t checked_len(const Uprobe* up, const Site& s) noexcept {
  return up->window.punned ? s.pad + arch::kJumpLen : up->window.len;
}

/// A punned jump's bytes past its instruction are the original ones (its
/// hop was placed by them); anything else would change bytes a thread may
/// run or branch to. Always true for the other tactics.
bool keeps_bytes_after(const Uprobe* up, const Site& s) noexcept {
  if (!up->window.punned) return true;
  std::uint8_t jmp[arch::kMaxJumpLen];
  const std::size_t n = site_jump(s, jmp);
  if (s.evict_hop) {
    // The successor's jump, then the bytes past it: those of the site's
    // jump past its instruction.
    std::uint8_t after[sizeof up->window.evict_bytes];
    std::memcpy(after, up->window.evict_bytes, sizeof after);
    arch::evict_jump(s.addr, up->window, s.evict_pad, s.evict_hop, after + up->window.len);
    return same_bytes(jmp + up->window.len, after + up->window.len, n - up->window.len);
  }
  return same_bytes(jmp + up->window.len, up->window.bytes + up->window.len, n - up->window.len);
}

/// An evicting site's successor (T2) holds its jump to its trampoline.
bool successor_evicted(const Uprobe* up, const Site& s) noexcept {
  if (!s.evict_hop) return false;
  std::uint8_t want[arch::kMaxJumpLen], cur[arch::kMaxJumpLen];
  const std::size_t n = arch::evict_jump(s.addr, up->window, s.evict_pad, s.evict_hop, want);
  return peek_text_checked(s.evict_addr, cur, n) && same_bytes(cur, want, n);
}

/// An evicting site's successor holds the file's bytes.
bool successor_original(const Uprobe* up, const Site& s) noexcept {
  std::uint8_t cur[arch::kMaxJumpLen];
  const std::size_t n = std::min<std::size_t>(s.evict_pad + arch::kJumpLen, up->window.evict.len);
  return peek_text_checked(s.evict_addr, cur, n) && same_bytes(cur, up->window.evict_bytes + up->window.len, n);
}

/// Writes `to` (n bytes) over `from` at `addr` with text_poke_bp()'s
/// protocol: int3, serialise, the tail, serialise, byte 0, serialise. A
/// thread meeting the int3 meanwhile is sent to the successor's trampoline
/// (on_sigtrap(): the probe table names the site's probe at the successor).
void poke_through_int3(std::uint64_t addr, const std::uint8_t* to, std::size_t n) noexcept {
  const std::uint8_t bp = arch::kBreakpoint;
  poke_text(addr, &bp, 1);
  sync_cores();
  if (n > 1) poke_text(addr + 1, to + 1, n - 1);
  sync_cores();
  poke_text(addr, to, 1);
  sync_cores();
}

/// Gives the successor of an evicting site its jump (before the site's own
/// jump, which keeps its bytes). Only the successor's own bytes change.
void evict_successor(const Uprobe* up, const Site& s) noexcept {
  if (successor_evicted(up, s)) return;
  std::uint8_t j[arch::kMaxJumpLen];
  const std::size_t n = arch::evict_jump(s.addr, up->window, s.evict_pad, s.evict_hop, j);
  g_hot.evicted_ever.store(true, std::memory_order_relaxed);
  poke_through_int3(s.evict_addr, j, n);
}

/// Puts the successor's own bytes back (after the site's jump is gone: no
/// jump's target depends on them any more). A thread in its trampoline
/// jumps back past it, as the original instruction would go on.
void restore_successor(const Uprobe* up, const Site& s) noexcept {
  if (!successor_evicted(up, s)) return;
  const std::size_t n = std::min<std::size_t>(s.evict_pad + arch::kJumpLen, up->window.evict.len);
  poke_through_int3(s.evict_addr, up->window.evict_bytes + up->window.len, n);
}

/// The successor's bytes an evicting site's successor takes: its jump
/// (`evict`) or the file's; n returned.
std::size_t successor_bytes(const Uprobe* up, const Site& s, bool evict, std::uint8_t* to) noexcept {
  if (evict) return arch::evict_jump(s.addr, up->window, s.evict_pad, s.evict_hop, to);
  const std::size_t n = std::min<std::size_t>(s.evict_pad + arch::kJumpLen, up->window.evict.len);
  std::memcpy(to, up->window.evict_bytes + up->window.len, n);
  return n;
}

/// evict_successor() (`evict`) or restore_successor() for every evicting
/// site `each` visits (each(f) calls f(up, site) for every site of the
/// batch), batch-wide: all int3s, one serialisation, all tails, one more,
/// all first bytes, one more (three in all instead of three per site).
template <class Each>
void poke_successors(Each&& each, bool evict) noexcept {
  const std::uint8_t bp = arch::kBreakpoint;
  bool any = false;
  each([&](const Uprobe* up, const Site& s) {
    if (!s.evict_hop || successor_evicted(up, s) == evict) return;
    if (evict) g_hot.evicted_ever.store(true, std::memory_order_relaxed);
    poke_text(s.evict_addr, &bp, 1);
    s.evict_poke = 1;
    any = true;
  });
  if (!any) return;
  sync_cores();
  each([&](const Uprobe* up, const Site& s) {
    if (!s.evict_poke) return;
    std::uint8_t to[arch::kMaxJumpLen];
    const std::size_t n = successor_bytes(up, s, evict, to);
    if (n > 1) poke_text(s.evict_addr + 1, to + 1, n - 1);
  });
  sync_cores();
  each([&](const Uprobe* up, const Site& s) {
    if (!s.evict_poke) return;
    std::uint8_t to[arch::kMaxJumpLen];
    successor_bytes(up, s, evict, to);
    poke_text(s.evict_addr, to, 1);
    s.evict_poke = 0;
  });
  sync_cores();
}

/// The bytes after byte 0 of a site about to be optimized are as its jump
/// needs them: the file's (an evicting site: its instruction's, then its
/// successor's either the file's or already its jump).
bool ready_bytes(const Uprobe* up, const Site& s, const std::uint8_t* cur, std::size_t len) noexcept {
  if (!s.evict_hop) return same_bytes(cur + 1, up->window.bytes + 1, len - 1);
  return same_bytes(cur + 1, up->window.bytes + 1, up->window.len - 1u) &&
         (successor_evicted(up, s) || successor_original(up, s));
}

}  // namespace

void retire_site_memory(const Site& s) {
  if (site_is_optimized(s)) return;  // (not restored: the jump still leads there)
  stubs().erase(s.addr);
  xol_area().retire_site(s.addr);
  if (s.evict_addr) {
    // The successor's trampoline, unless its jump still leads there.
    std::uint8_t cur[arch::kMaxJumpLen];
    if (!peek_text_checked(s.evict_addr, cur, sizeof cur) ||
        arch::decode_jump(s.evict_addr, cur, sizeof cur) != s.evict_hop)
      xol_area().retire_site(s.evict_addr | kEvictKey);
  }
}

void reclaim_retired(std::size_t n) {
  XolArea& xol = xol_area();
  n = std::min(n, xol.retired_count());
  if (n == 0) return;
  // Not at every detach of a storm: observing running threads costs a
  // signal round trip each, and the grace period more. With few blocks
  // retired, at most one attempt per 10 ms; with more, attempts take at
  // most a fifth of the time (an attempt that took T waits 4 T after it),
  // unless thousands wait (attach/detach storms on spinning threads ran at
  // a third of their rate with an attempt at every detach).
  static std::int64_t last_ns = 0, last_cost = 0;
  const auto now_ns = [] {
    timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  };
  const std::int64_t now = now_ns();
  if (n < kReclaimBatch && now - last_ns < 10'000'000) return;
  if (n < 16 * kReclaimBatch && now - last_ns < 4 * last_cost) return;
  struct Cost {  // the attempt's cost, however it ends
    std::int64_t start;
    decltype(now_ns)& clock;
    ~Cost() {
      last_ns = clock();
      last_cost = last_ns - start;
    }
  } cost{now, now_ns};
  std::vector<AddrRange> ranges;
  ranges.reserve(2 * n + 1);
  for (std::size_t i = 0; i < n; ++i) {
    const auto [lo, hi] = xol.retired_range(i);
    ranges.emplace_back(lo - 1, hi);  // threads_outside() counts from the byte after `first`: a thread at `lo` is inside
    // No address is inside [site, site + 1) (open at its start): the range
    // only makes a thread in the SIGTRAP handler for the site count as inside
    // (it may still resume in the site's XOL or window slot).
    const std::uint64_t site = xol.retired_site(i);
    ranges.emplace_back(site, site + 1);
  }
  ranges.emplace_back(reinterpret_cast<std::uint64_t>(__start_uprobe_opt_path) - 1,
                      reinterpret_cast<std::uint64_t>(__stop_uprobe_opt_path));
  unsigned long done = 0;
  const unsigned long started = uprobe_rcu_registrations(&done);
  if (started != done) return;  // a thread is becoming a reader: not yet covered by a grace period
  std::string why;
  // (Without waiting for a running thread no sample signal observes: the next
  // detach asks again; this one costs a read of /proc per thread.)
  if (!threads_outside(ranges, why, nullptr, false)) return;
  uprobe_rcu_synchronize();
  if (!threads_outside(ranges, why, nullptr, false)) return;
  if (uprobe_rcu_registrations(&done) != started) return;
  xol.free_retired(n);
}

bool init_core_sync() {
  if (!g_sync_core)
    g_sync_core = ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0) == 0;
  return g_sync_core;
}

void apply_sites(Uprobe* up, const SiteSet& ss) {
  for (std::size_t i = 0; i < ss.sites.size(); ++i) {
    const std::uint8_t bp = arch::kBreakpoint;
    if (int err = poke_text(ss.sites[i].addr, &bp, arch::kBreakpointLen)) {
      std::uint8_t byte;
      if (!peek_text_checked(ss.sites[i].addr, &byte, 1))
        continue;  // unmapped since the snapshot (a dlclose on another thread): no site there any more
      for (std::size_t j = 0; j < i; ++j) poke_text(ss.sites[j].addr, up->insn.bytes, arch::kBreakpointLen);
      throw Error(Errc::system, up->path, up->key.offset,
                  "writing the breakpoint at " + hex(ss.sites[i].addr) + " through /proc/self/mem failed: " +
                      std::strerror(err));
    }
  }
}

void deoptimize_sites(Uprobe* up, const SiteSet& ss) noexcept {
  for (const Site& s : ss.sites) {
    if (optimizable_shape(up) && site_is_optimized(s)) {
      const std::uint8_t bp = arch::kBreakpoint;
      poke_text(s.addr, &bp, 1);
      sync_cores();
      if (tail_len(up)) poke_text(s.addr + 1, original_bytes(up) + 1, tail_len(up));
      sync_cores();
      __atomic_store_n(&s.jumped, 0, __ATOMIC_RELEASE);
    }
    // Then an evicted successor: no jump's target depends on its bytes now.
    if (s.evict_hop) restore_successor(up, s);
  }
}

void restore_sites(Uprobe* up, const SiteSet& ss) noexcept {
  deoptimize_sites(up, ss);  // optimized sites go back through int3: no thread ever runs a torn jump
  for (const Site& s : ss.sites) {
    std::uint8_t cur;
    if (!peek_text_checked(s.addr, &cur, 1)) continue;  // unmapped meanwhile: nothing to write there
    if (cur == arch::kBreakpoint) poke_text(s.addr, up->insn.bytes, arch::kBreakpointLen);
  }
}

void restore_sites_batch(std::span<Uprobe* const> ups) noexcept {
  // jmp -> int3 at every optimized site (jumped = 2 marks the site for the
  // tail), one serialisation; the original tails, one more; then the first
  // bytes, as restore_sites() does.
  bool any = false;
  const std::uint8_t bp = arch::kBreakpoint;
  for (Uprobe* up : ups) {
    if (!optimizable_shape(up)) continue;
    for (const Site& s : up->sites.load(std::memory_order_relaxed)->sites) {
      if (!site_is_optimized(s)) continue;
      poke_text(s.addr, &bp, 1);
      __atomic_store_n(&s.jumped, 2, __ATOMIC_RELEASE);
      any = true;
    }
  }
  if (any) {
    sync_cores();
    for (Uprobe* up : ups) {
      if (!optimizable_shape(up)) continue;
      for (const Site& s : up->sites.load(std::memory_order_relaxed)->sites)
        if (__atomic_load_n(&s.jumped, __ATOMIC_ACQUIRE) == 2)
          if (tail_len(up)) poke_text(s.addr + 1, original_bytes(up) + 1, tail_len(up));
    }
    sync_cores();
    for (Uprobe* up : ups) {
      if (!optimizable_shape(up)) continue;
      for (const Site& s : up->sites.load(std::memory_order_relaxed)->sites)
        if (__atomic_load_n(&s.jumped, __ATOMIC_ACQUIRE) == 2) __atomic_store_n(&s.jumped, 0, __ATOMIC_RELEASE);
    }
  }
  // Evicted successors, once no site's jump keeps their bytes: batch-wide.
  poke_successors(
      [&](auto&& f) {
        for (Uprobe* up : ups)
          for (const Site& s : up->sites.load(std::memory_order_relaxed)->sites) f(up, s);
      },
      false);
  for (Uprobe* up : ups) {
    for (const Site& s : up->sites.load(std::memory_order_relaxed)->sites) {
      std::uint8_t cur;
      if (!peek_text_checked(s.addr, &cur, 1)) continue;  // unmapped meanwhile: nothing to write there
      if (cur == arch::kBreakpoint) poke_text(s.addr, up->insn.bytes, arch::kBreakpointLen);
    }
  }
}

bool optimizable(const Uprobe* up) noexcept {
  if (!g_hot.optimize.load(std::memory_order_relaxed)) return false;
  if (up->tactic != arch::Tactic::nop5 &&
      (!up->window.len || !window_switch_on(up->function_entry) ||
       (up->window.punned && !g_hot.optimize_punned.load(std::memory_order_relaxed)) ||
       up->window_blocker.load(std::memory_order_relaxed) != 0))
    return false;
  return g_sync_core;
}

std::string why_not_optimizable(const Uprobe* up) {
  if (optimizable(up)) return "";
  if (!g_hot.optimize.load(std::memory_order_relaxed)) return "optimization is switched off (Config::optimize)";
  if (up->tactic != arch::Tactic::nop5) {
    const std::string not_nop5 = "the instruction `" + up->insn.text + "` is not a 5-byte nop, and ";
    if (!up->window.len) return not_nop5 + up->window_why;
    if (!window_switch_on(up->function_entry))
      return not_nop5 + (up->function_entry ? "entry optimization is switched off (Config::optimize_entries)"
                                            : "window optimization is switched off (Config::optimize_windows)");
    if (up->window.punned && !g_hot.optimize_punned.load(std::memory_order_relaxed))
      return not_nop5 + up->window_why + "; a punned jump is switched off (Config::optimize_punned)";
    if (const std::uint64_t inner = up->window_blocker.load(std::memory_order_relaxed))
      return not_nop5 + "another probe, at +" + std::to_string(inner - up->key.offset) + ", lies inside the " +
             std::to_string(up->window.len) + " bytes " + (up->function_entry ? "an entry" : "the") +
             " jump would displace";
  }
  if (!g_sync_core) return "membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE) is not available";
  return "";
}

std::string why_not_optimized(const Uprobe* up) {
  std::string why = why_not_optimizable(up);
  return why.empty() ? up->opt_failure : why;
}

bool site_is_optimized(const Site& s) noexcept {
  // Our jump, not the program's own (a function may start with a jmp rel32):
  // it targets this site's stub, which lives in our memory only.
  if (!s.stub) return false;
  std::uint8_t b[arch::kMaxJumpLen], want[arch::kMaxJumpLen];
  const std::size_t n = site_jump(s, want);
  if (!peek_text_checked(s.addr, b, n)) return false;  // unmapped meanwhile
  return same_bytes(b, want, n);  // (runs after breakpoints are in: not libc's memcmp)
}

std::uint64_t stub_of(std::uint64_t addr) {
  auto it = stubs().find(addr);
  return it == stubs().end() ? 0 : it->second;
}

void optimize_sites(Uprobe* up, const SiteSet& ss, const std::vector<Vma>& vmas) {
  if (!optimizable(up)) return;
  const bool entry = up->tactic != arch::Tactic::nop5;
  std::vector<const Site*> todo;
  std::vector<AddrRange> windows;
  for (const Site& s : ss.sites) {
    std::uint8_t cur[arch::kMaxWindowLen];
    const std::size_t len = entry ? checked_len(up, s) : arch::kJumpLen;
    if (!peek_text_checked(s.addr, cur, len)) continue;  // unmapped meanwhile: nothing to write there
    if (cur[0] != arch::kBreakpoint) continue;  // already optimized, or not ours
    if (entry) {
      // Only over the file's own bytes, and with the window's slot in place.
      if (!s.window_xol || !ready_bytes(up, s, cur, len)) continue;
      if (up->window.punned) {
        // Only the instruction's own bytes change: no thread can be inside.
        if (!s.hop || !keeps_bytes_after(up, s)) continue;
      } else {
        windows.emplace_back(s.addr, s.addr + len);
        // The first instruction's own XOL slot jumps back into the window (the
        // int3 path runs it when the window is blocked or entry optimization is
        // off): a thread in that slot is inside too, from its first byte.
        if (s.xol) windows.emplace_back(s.xol - 1, s.xol + arch::kXolSlotSize);
      }
    }
    todo.push_back(&s);
  }
  if (todo.empty()) return;
  if (!windows.empty()) {
    // Every core sees the int3 (so no thread enters a window from its start
    // any more); then no thread may still be inside one.
    sync_cores();
    std::string why;
    if (!threads_outside(windows, why)) {
      up->opt_failure = "not yet optimized: " + why + "; retried at the next attach or mapping change";
      return;
    }
    up->opt_failure.clear();
  }
  for (const Site* sp : todo) {
    const Site& s = *sp;
    const std::uint64_t stub = write_stub(up, s, vmas, entry);
    if (!stub) continue;  // stays int3
    if (s.evict_hop) evict_successor(up, s);  // first: the site's jump keeps its bytes
    s.stub = stub;
    __atomic_store_n(&s.jumped, 1, __ATOMIC_RELEASE);
    std::uint8_t jmp[arch::kMaxJumpLen];
    site_jump(s, jmp);
    if (tail_len(up)) poke_text(s.addr + 1, jmp + 1, tail_len(up));
    sync_cores();
    poke_text(s.addr, jmp, 1);
    sync_cores();
  }
}

void prepare_optimize_batch(const std::vector<Uprobe*>& ups, const std::vector<Vma>& vmas, OptBatch& b) {
  // One rehash, not one per doubling; never a smaller table (reserve() may
  // rehash to fit, a cost per call that grows with every stub ever built).
  const std::size_t want = stubs().size() + ups.size();
  if (want > stubs().bucket_count() * stubs().max_load_factor()) stubs().reserve(want);
  for (Uprobe* up : ups) {
    if (!optimizable(up)) continue;
    const bool entry = up->tactic != arch::Tactic::nop5;
    for (const Site& s : up->sites.load(std::memory_order_relaxed)->sites) {
      if (entry && (!s.window_xol || (up->window.punned && (!s.hop || !keeps_bytes_after(up, s))))) continue;
      const std::uint64_t stub = write_stub(up, s, vmas, entry);  // unused until the jump is written
      if (!stub) continue;                                               // stays int3
      b.items.push_back(OptBatch::Item{up, &s, entry, stub});
    }
  }
  b.windows.reserve(2 * b.items.size());
  b.text.reserve(b.items.size());
}

void finish_optimize_batch(OptBatch& b) {
  std::size_t kept = 0;
  // The entry windows, each with the item it belongs to (an item may have two:
  // its window and its first instruction's XOL slot).
  std::vector<std::pair<std::size_t, AddrRange>> wins;
  for (const OptBatch::Item& it : b.items) {
    std::uint8_t cur[arch::kMaxWindowLen];
    const std::size_t len = it.entry ? checked_len(it.up, *it.site) : arch::kJumpLen;
    peek_text(it.site->addr, cur, len);
    if (cur[0] != arch::kBreakpoint) continue;  // already optimized, or not ours
    if (it.entry) {
      if (!ready_bytes(it.up, *it.site, cur, len)) continue;
      if (!it.up->window.punned) {  // (a punned jump changes one instruction's bytes only)
        wins.emplace_back(kept, AddrRange(it.site->addr, it.site->addr + len));
        // The first instruction's XOL slot jumps back into the window (see optimize_sites()).
        if (it.site->xol) wins.emplace_back(kept, AddrRange(it.site->xol - 1, it.site->xol + arch::kXolSlotSize));
      }
    }
    b.items[kept++] = it;
  }
  b.items.resize(kept);
  if (b.items.empty()) return;
  if (!wins.empty()) {
    // Every core sees the int3s; then no thread may still be inside a window.
    // A thread seen at a known address inside one defers only the entries
    // whose windows hold it: they are dropped and the others asked about
    // again (a few times; a thread that cannot be placed defers them all).
    sync_cores();
    std::vector<bool> dropped(b.items.size(), false);
    std::string why;
    bool outside = false;
    for (int round = 0; round < 8; ++round) {
      b.windows.clear();
      for (const auto& [item, r] : wins)
        if (!dropped[item]) b.windows.push_back(r);
      if (b.windows.empty()) break;
      std::uint64_t culprit = 0;
      outside = threads_outside(b.windows, why, &culprit);
      if (outside || !culprit) break;
      bool any = false;
      for (const auto& [item, r] : wins)
        if (!dropped[item] && culprit > r.first && culprit < r.second) {
          dropped[item] = true;
          b.items[item].up->opt_failure = "not yet optimized: " + why + "; retried at the next attach or mapping change";
          any = true;
        }
      if (!any) break;
    }
    std::size_t k = 0;
    for (std::size_t i = 0; i < b.items.size(); ++i) {
      const OptBatch::Item& it = b.items[i];
      const bool checked = it.entry && !it.up->window.punned;  // it had windows in the thread check
      if (checked && !dropped[i]) {
        if (outside) it.up->opt_failure.clear();
        else it.up->opt_failure = "not yet optimized: " + why + "; retried at the next attach or mapping change";
      }
      if (!checked || (outside && !dropped[i])) b.items[k++] = it;
    }
    b.items.resize(k);
  }
  // Evicting sites' successors first, batch-wide (a thread meeting an int3
  // there goes to the trampoline).
  poke_successors(
      [&](auto&& f) {
        for (const OptBatch::Item& it : b.items) f(it.up, *it.site);
      },
      true);
  // The tails, one serialisation, the first bytes, one more: each step's
  // writes in runs per page (TextBatch).
  const auto step = [&](bool tails) {
    b.text.clear();
    for (std::size_t i = 0; i < b.items.size(); ++i) {
      const OptBatch::Item& it = b.items[i];
      std::uint8_t jmp[arch::kMaxJumpLen];
      site_jump(*it.site, jmp);
      const std::size_t tail = tail_len(it.up);
      if (tails && !tail) continue;
      const std::uint64_t at = tails ? it.site->addr + 1 : it.site->addr;
      const std::uint8_t* bytes = tails ? jmp + 1 : jmp;
      if (!b.text.add(at, bytes, tails ? tail : 1, static_cast<std::uint32_t>(i))) poke_text(at, bytes, tails ? tail : 1);
    }
    b.text.write(b.joinable ? b.joinable : [](std::uint64_t, std::uint64_t, const void*) { return false; }, b.join_ctx);
  };
  for (const OptBatch::Item& it : b.items) {
    it.site->stub = it.stub;
    __atomic_store_n(&it.site->jumped, 1, __ATOMIC_RELEASE);
  }
  step(true);
  sync_cores();
  step(false);
  sync_cores();
}

const void* trivial_filter(const Consumer& c) noexcept {
  const void* f = filter_code(c);
  return arch::returns_true_only(f) ? f : nullptr;
}

void save_modes(const Uprobe* up, ConsumerSet& cs) noexcept {
  cs.entry_save = cs.ret_save = arch::SaveMode::none;
  cs.entry_sse = cs.ret_sse = kSseUnknown;
  cs.nsse_codes = 0;
  cs.sole_entry = nullptr;
  if (UPROBE_TSAN) return;  // saved before any instrumented code runs (opt_entry.cpp)
  // Where every consumer that needs a save runs code read as legacy SSE only
  // (make_registration()): the xmm registers the most demanding of them may
  // write, for both sides (a handler found at a hit among sse_codes is
  // covered whichever side it was read for).
  bool entry_sse = true, ret_sse = true;
  unsigned nxmm = 0;
  auto analyzed = [&](const void* code, const arch::Clobbers& k) {
    if (!k.known || !code) return false;
    if (!cs.sse_code(code)) {
      if (cs.nsse_codes >= kMaxSseCodes) return false;
      cs.sse_codes[cs.nsse_codes++] = code;
    }
    nxmm = std::max<unsigned>(nxmm, k.xmm);
    return true;
  };
  for (const Registration* r : cs.regs) {
    if (r->consumer->vector_state_unused()) continue;
    if (r->has_entry || !r->trivial_filter) {  // some code of the consumer's runs at the entry (see run_consumers())
      cs.entry_save = up->function_entry ? arch::SaveMode::entry : arch::SaveMode::full;
      // (A filter of its own is not read: the save mode's preservation.)
      if (!r->trivial_filter || (r->has_entry && !analyzed(r->handler_code, r->handler_clobbers))) entry_sse = false;
    }
    if (r->has_ret) {
      cs.ret_save = arch::SaveMode::ret;
      if (!analyzed(r->ret_code, r->ret_clobbers)) ret_sse = false;
    }
  }
  if (cs.entry_save != arch::SaveMode::none && entry_sse) cs.entry_sse = static_cast<std::uint8_t>(nxmm);
  if (cs.ret_save != arch::SaveMode::none && ret_sse) cs.ret_sse = static_cast<std::uint8_t>(nxmm);
  if (cs.regs.size() == 1) {
    Registration* r = cs.regs.front();
    if (!up->faults_fatal && r->has_entry && !r->has_ret && r->trivial_filter &&
        (cs.entry_save == arch::SaveMode::none || cs.entry_sse != kSseUnknown))
      cs.sole_entry = r;
  }
}

void forget_stub_owner_at(const Uprobe* up, std::uint64_t addr) {
  auto it = stubs().find(addr);
  if (it == stubs().end()) return;
  const std::uint64_t field = it->second + arch::opt_stub_owner_offset();
  std::uint64_t owner = 0;
  std::memcpy(&owner, reinterpret_cast<const void*>(field), sizeof owner);
  if (owner != reinterpret_cast<std::uint64_t>(up)) return;  // rebuilt for another probe since
  const std::uint64_t zero = 0;
  std::string why;
  xol_area().write_code(field, reinterpret_cast<const std::uint8_t*>(&zero), sizeof zero, why);
}

void forget_references(const Uprobe* up) {
  if (const SiteSet* ss = up->sites.load(std::memory_order_relaxed))
    for (const Site& s : ss->sites) forget_stub_owner_at(up, s.addr);
  up->handle->up.store(nullptr, std::memory_order_release);
}

}  // namespace uprobe::detail
