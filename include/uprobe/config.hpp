// SPDX-License-Identifier: MIT
#pragma once
/// @file config.hpp
/// Runtime switches and statistics. Some switches select the designs that
/// the seed patches replaced (their enums are in lab.hpp), so that
/// uprobe-bench can draw before/after curves; the defaults are the scalable
/// designs.

#include <cstdint>
#include <string>

#include "uprobe/lab.hpp"

namespace uprobe {

/// What the optimized paths (jump-to-stub probes, the return trampoline)
/// preserve around consumers that did not declare
/// Consumer::set_vector_state_unused(): the kernel's signal frame does it
/// on the int3 path, and nothing does it for these unless libuprobe does.
enum class SiteState : std::uint8_t {
  /// What the site makes live, by the SysV ABI (default): at the entry of a
  /// function the symbol table sizes, xmm/ymm/zmm0-15 at the width in use
  /// (beyond the argument registers xmm0-7, which is all the ABI keeps live,
  /// because a caller in the same translation unit may keep values in
  /// caller-saved registers across a call to a function whose code it sees,
  /// as GCC's -fipa-ra does at -O2), the MXCSR (status flags included) and
  /// the x87 control word; at a return the same plus st0/st1 (a long double
  /// return value); at any other site everything, the x87 state included
  /// when it is in use. Not kept at entries and returns: the x87 status word
  /// (the ABI does not keep it across a call), zmm16-31 and k0-7 (only code
  /// built for AVX-512 uses them, and keeps a value there across a call only
  /// with -fipa-ra and a seventeenth vector value or a mask).
  abi,
  /// Everything at every site: for functions entered or left outside the
  /// ABI (hand-written code with a convention of its own that keeps x87
  /// values or the x87 status word live across a call) and for AVX-512
  /// callers that keep values in zmm16-31 or k0-7 across a call.
  full,
};

/// Process-wide runtime configuration.
struct Config {
  LookupMode lookup = LookupMode::speculative;
  XolMode xol = XolMode::jump_back;
  SignalMask signal_mask = SignalMask::nodefer;
  /// Emulate the instructions arch/ can emulate (nop, push of a register,
  /// ret, ret imm16, jmp, call, Jcc, loop/jrcxz, indirect jmp and call) in
  /// the int3 handler instead of running them out of line. Default true. With false,
  /// every instruction that can run out of line does; those that cannot (a
  /// direct jmp, call, Jcc or loop, an indirect call, a rip-relative indirect
  /// jmp: the copy would branch from the slot) are still emulated. It does
  /// not affect optimized (jump) sites.
  bool emulate = true;
  RiPool ri_pool = RiPool::objpool;
  RiLock ri_lock = RiLock::none;
  /// Convert eligible probe sites (nop5, safe function entries) into jumps to
  /// trampolines (seed 003). Default true; false keeps every probe on int3.
  /// Applies to attached probes too: turning it on converts them (those whose
  /// every site holds its int3 all together, one run of the conversion
  /// protocol, as a batch attach does), turning it off converts them back.
  /// Attaching many probes with it off and turning it on afterwards makes the
  /// probes live sooner (the int3s only) and moves the conversion out of the
  /// attach; uprobe-bench --attach-libc N --no-optimize times both.
  bool optimize = true;
  /// With optimize: also convert function entries whose first instructions
  /// can be displaced and relocated (beyond the kernel, which optimizes only
  /// nop5 sites). Converting one needs every other thread observed outside
  /// the displaced bytes, read from /proc/self/task/<tid>/syscall while it is
  /// blocked in the kernel (no signal is sent); while another thread keeps
  /// running the entry stays int3 and the conversion is retried at the next
  /// attach or mapping change. Default true; false keeps entries on int3.
  bool optimize_entries = true;
  /// With optimize: also convert sites inside a function (any instruction
  /// start past its entry: mid-function offsets, USDT sites compiled as a
  /// 1-byte nop) whose instructions from the site on can be displaced, as
  /// the kernel's kprobes optimizer does (can_optimize() in
  /// arch/x86/kernel/kprobes/opt.c): every displaced instruction relocatable,
  /// no call before the last, no direct branch in the function or its
  /// neighbours into the window past its first byte, no jump-table entry or
  /// code address stored in the file's data there, no exception landing pads
  /// in the function. The displaced bytes run in a window slot, as an
  /// entry's do; consumers see the full register state (SaveMode::full).
  /// The same thread observation as optimize_entries. Default true; false
  /// keeps such sites on int3 (ProbeMode::int3) as before.
  bool optimize_windows = true;
  /// With optimize: also convert a site whose instruction is shorter than
  /// the jump and where no window applies (a branch target right after it,
  /// the function's end, no known bounds, exception landing pads) with a
  /// punned jump (ProbeMode::optimized_punned: E9Patch's tactic B2), placed
  /// by the bytes after the instruction, which it keeps (padded, T1, where they aim at taken pages). Under
  /// optimize_entries / optimize_windows as the site is an entry or not.
  /// Default true; false keeps such sites on int3.
  bool optimize_punned = true;
  /// With optimize_punned: where no punned or padded form of a site's jump
  /// finds a free page, evict the instruction after it (E9Patch's tactic T2,
  /// ProbeMode::optimized_evicted): that successor first gets a jump of its
  /// own to a trampoline running its relocated copy (so a branch to it still
  /// runs it), and the site's punned jump keeps the successor's new bytes,
  /// which select other targets. Detach restores the site, then the
  /// successor. A program single-stepping itself (TF) through an evicted
  /// successor sees the steps it would see without the probe (the
  /// trampoline is a silent region of the step path). Read when a probe is
  /// created. Default true; false keeps such sites on int3.
  bool optimize_evicted = true;
  /// Before libuprobe first writes into a page of a file's code, replace
  /// the page by an anonymous copy of itself (one mremap(2): no thread ever
  /// sees it missing), out of the reach of the kernel's own uprobes: they
  /// reach only file-backed mappings (kernel/events/uprobes.c valid_vma()).
  /// Without it, a system-wide kernel uprobe (bpftrace or perf without a
  /// pid, as root) on a function this process optimized writes its int3
  /// over the first byte of our jump and, on unregister, the file's byte
  /// back, leaving a torn jump: the program dies (SIGSEGV/SIGILL). With it,
  /// a kernel breakpoint already in the page is left out of the copy (the
  /// file's bytes put back), and the kernel's uprobes miss this process's
  /// copied pages from then on. The cost: /proc/PID/maps shows each copied
  /// page as anonymous memory ("r-xp 00000000 00:00 0", one mapping per
  /// page), which tools reading it to symbolize (perf, a profiler, gdb's
  /// `info proc mappings`) no longer name as the file; libuprobe's own
  /// model still does (a later probe in the page resolves). A page stays
  /// a copy until unmapped. Needs Linux >= 6.11 (PROCMAP_QUERY); a page
  /// that cannot be copied (copies take at most a quarter of the process's
  /// vm.max_map_count, two mappings each) is written in place.
  /// Read before each text write. Default true (no probe may kill its
  /// program); false keeps every page the file's mapping, for a process
  /// profiled by perf or probed by the kernel's uprobes too.
  bool detach_patched_pages = true;
  /// How a probe past a function's entry is planned (lab.hpp): the default
  /// tries a window first; SiteTactics::instruction_only takes E9Patch's B1/B2
  /// only (the test suites run every class of instruction through punned
  /// jumps with it; SiteTactics::instruction_padded: padded ones, T1). Read when a probe is created.
  SiteTactics site_tactics = SiteTactics::windows;
  /// How a thread that keeps running is observed before an entry is
  /// converted. 0 (default): it is not; the conversion waits for the next
  /// attach. A real-time signal number (SIGRTMIN..SIGRTMAX, e.g. SIGRTMAX):
  /// libuprobe installs its own handler for it and sends it to each running
  /// thread once per conversion; the handler records where the thread was and
  /// consumes the signal. The program must not use that signal (configure()
  /// refuses one that already has a handler). Like any signal it interrupts a
  /// blocking call the thread enters at that moment (SA_RESTART; calls such
  /// as nanosleep() or poll() return EINTR).
  int sample_signal = 0;
  /// Return probes per thread before further invocations are not tracked
  /// (the kernel's MAX_URETPROBE_DEPTH). 1..4096.
  unsigned max_uretprobe_depth = 64;
  /// What the optimized paths preserve around consumers that may use vector
  /// or x87 registers (see SiteState). Default SiteState::abi.
  SiteState site_state = SiteState::abi;
};

/// Sets the configuration. Takes effect for hits that start after the call;
/// signal_mask re-installs the SIGTRAP handler; optimize converts attached
/// probes. Thread-safety: any thread, not from a handler. Not
/// async-signal-safe.
/// @throws std::invalid_argument when max_uretprobe_depth is outside 1..4096
/// (nothing changed then).
void configure(const Config& config);

/// The current configuration. Thread-safety: any thread, not from a handler
/// (takes the registry lock, as configure() does). Not async-signal-safe.
Config configuration();

/// Returns "": libuprobe's instruction decoder (Capstone's x86 part) is
/// linked into libuprobe, so there is nothing to load and nothing can fail.
/// Kept for programs written when libuprobe loaded `libcapstone.so.4` itself
/// (0.1 before 2026-12: then this loaded it early, and
/// `uprobe_decoder_on_demand`, now ignored, deferred it to the first
/// analysis). Thread-safety: any thread. Async-signal-safe: no (returns a
/// std::string).
std::string load_decoder();

/// Counters summed over all threads (each thread counts in its own cache line;
/// reading sums them, so a read is approximate while hits run).
struct Stats {
  std::uint64_t hits = 0;              ///< hits at a registered probe site: traps handled, and `optimized`
  std::uint64_t recursion_misses = 0;  ///< hits inside a handler: consumers not run
  std::uint64_t emulated = 0;          ///< continued by emulation
  std::uint64_t out_of_line = 0;       ///< continued by running the relocated copy
  std::uint64_t redirected = 0;        ///< a handler changed rip
  std::uint64_t restarts = 0;          ///< raced with unregister: instruction restarted
  std::uint64_t locked_lookups = 0;    ///< speculative lookup fell back to the lock
  std::uint64_t foreign_traps = 0;     ///< SIGTRAPs that were not ours, passed on
  std::uint64_t return_hits = 0;       ///< invocations whose return ran ret_handlers
  std::uint64_t return_misses = 0;     ///< returns not tracked: depth limit or no free return instance
  std::uint64_t return_dropped = 0;    ///< stale return instances dropped (longjmp, exceptions, thread exit)
  std::uint64_t optimized = 0;         ///< hits that came through an optimized site's jump (no signal)
};

/// What the counters did between two snapshots of stats(): `after - before`,
/// field by field (every counter). Pure; async-signal-safe.
inline Stats operator-(const Stats& after, const Stats& before) noexcept {
  Stats d;
  d.hits = after.hits - before.hits;
  d.recursion_misses = after.recursion_misses - before.recursion_misses;
  d.emulated = after.emulated - before.emulated;
  d.out_of_line = after.out_of_line - before.out_of_line;
  d.redirected = after.redirected - before.redirected;
  d.restarts = after.restarts - before.restarts;
  d.locked_lookups = after.locked_lookups - before.locked_lookups;
  d.foreign_traps = after.foreign_traps - before.foreign_traps;
  d.return_hits = after.return_hits - before.return_hits;
  d.return_misses = after.return_misses - before.return_misses;
  d.return_dropped = after.return_dropped - before.return_dropped;
  d.optimized = after.optimized - before.optimized;
  return d;
}

/// Sums the per-thread counters. Thread-safety: any thread. Async-signal-safe.
Stats stats() noexcept;

/// True while the calling thread runs a libuprobe handler.
/// Async-signal-safe.
bool in_handler() noexcept;

class Uprobe;

/// What libuprobe calls for a hit whose consumers it does not run because
/// its thread is inside another hit (each counted in
/// Stats::recursion_misses): a consumer that calls a probed function, or a
/// signal handler of the program that interrupted a hit and reached a
/// probe. The kernel's uprobes never see the second kind (their handlers
/// run in the kernel), so a tool that reports counts can say how many hits
/// are missing from them. `probe`: the probe hit, nullptr for a return (its
/// return instance names no probe). Runs in the hit, on its thread, in
/// signal context at an int3 site: it must be async-signal-safe, allocate
/// nothing and reach no probed code.
using RecursionMissHook = void (*)(const Uprobe* probe) noexcept;

/// Sets the RecursionMissHook (nullptr: none, the default). Thread-safety:
/// any thread; a hit calls the one it reads, the old or the new.
/// Async-signal-safe.
void set_recursion_miss_hook(RecursionMissHook hook) noexcept;

}  // namespace uprobe
