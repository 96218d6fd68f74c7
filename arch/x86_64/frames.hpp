// SPDX-License-Identifier: MIT
#pragma once
/// @file frames.hpp
/// Part of the arch boundary (arch.hpp includes it): what the optimized
/// paths' machine code and the core share: the return trampoline's frame,
/// what call_preserving() saves, the jump and the optimized stub
/// (OptSite, opt_frame_enter/leave), the flags a handler may change, the
/// hijacked return address.

#include <signal.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "uprobe/regs.hpp"

extern "C" {
/// The return trampoline (ret_trampoline.S): the address a hijacked return
/// address points to. Not callable from C.
void uprobe_ret_trampoline();
/// The thunk an optimized function entry with a return probe continues
/// through (ret_trampoline.S, in the optimized path's section): with rsp at
/// the return slot holding the continuation, calls it through the slot, so
/// that the function returns to uprobe_ret_landing as predicted. Not callable
/// from C.
void uprobe_ret_thunk();
/// The return address the thunk's call pushes (ret_trampoline.S): the return
/// trampoline's work, left through `ret` to the real return address. Not
/// callable from C.
void uprobe_ret_landing();
/// Landing pad of the return trampoline's personality routine
/// (ret_trampoline.S): expects rax = the _Unwind_Exception. Not callable.
void uprobe_ret_unwind_landing();
/// The SIGTRAP handler to install (trap_entry.S): clears rflags.AC, which
/// the kernel leaves set in a handler when the interrupted code had it set,
/// then tail-calls uprobe_sigtrap_handler(). Async-signal-safe.
void uprobe_sigtrap_entry(int sig, siginfo_t* info, void* ucontext);
}

namespace uprobe::arch {

/// Layout of the frame the return trampoline saves, passed to
/// uprobe_ret_entry(): xmm0/xmm1 (return_xmm()), then the registers as a
/// uprobe::Regs in place (the ret_handlers get this one, no copy): its rip
/// and rsp are left for the dispatch to fill in (the continuation, the stack
/// pointer after the return), then the slot the final `ret` takes its target
/// from.
struct RetFrame {
  std::uint8_t xmm0[16];
  std::uint8_t xmm1[16];
  Regs regs;
  std::uint64_t ret_slot;  ///< sp after return = &ret_slot + 1
};
static_assert(sizeof(RetFrame) == 184 && __builtin_offsetof(RetFrame, regs) == 32 &&
              __builtin_offsetof(RetFrame, ret_slot) == 176);

/// What libuprobe preserves around callbacks that may use vector and x87
/// registers (consumers that did not declare set_vector_state_unused()) on
/// the paths where the kernel saves nothing (optimized hits, the return
/// trampoline; the int3 path has the kernel's signal frame). Beyond the
/// general registers and rflags, which every path saves:
enum class SaveMode : std::uint8_t {
  none = 0,  ///< nothing: every consumer declared it uses no vector or x87 state
  /// A function entry: xmm/ymm/zmm0-15 (at the width in use), the MXCSR and
  /// the x87 control word. By the SysV ABI only xmm0-7 (the arguments) and
  /// the control bits are live there, but a caller in the same translation
  /// unit that sees the callee's code may keep values in caller-saved
  /// registers across the call (GCC's -fipa-ra, on at -O2; GCC 12 keeps a
  /// double in xmm0/xmm1 across a call to a static leaf), and the sixteen
  /// cost a few ticks more than the eight. Not zmm16-31 and k0-7 (13 ticks
  /// more here, a third of the save): a compiler reaches them only in
  /// AVX-512 code, for a seventeenth vector value or a mask, and keeps one
  /// across a call only with -fipa-ra: Config::site_state = SiteState::full
  /// covers such callers. The x87 stack is empty at a call (no compiler
  /// keeps a value there across one).
  entry = 1,
  /// A return (the return trampoline): the same, plus st0/st1 (a long double
  /// or complex long double return value), set aside so that the callbacks
  /// find the empty x87 stack the ABI promises them.
  ret = 2,
  /// Any other site: everything, the x87 state included when it is in use.
  full = 3,
};

/// How call_preserving() chooses the width of its moves.
enum class PreserveStrategy : std::uint8_t {
  /// The width the CPU says is in use (XINUSE, xgetbv(1)): no 512-bit
  /// instruction while no zmm state is in use, vzeroupper when the upper
  /// halves were clean. The default where xgetbv(1) exists, but on AMD.
  in_use,
  /// The widest registers the CPU has, without asking (xgetbv(1) costs more
  /// than moving all 32 zmm registers on AMD Zen 4, which has no AVX-512
  /// clock penalty and no SSE/AVX transition). The default on AMD.
  wide,
};

/// Runs fn(ctx) with the state `mode` names preserved (restored exactly as
/// it was before the call, whatever fn does with it), fn starting with the
/// default floating-point controls (MXCSR control bits 0x1f80, its status
/// flags as they were; x87 control word 0x37f) and, at a return, an empty
/// x87 stack. Must be called before
/// anything touched a vector or x87 register (its callers are compiled with
/// -mgeneral-regs-only). Uses about 2.7 KiB of stack besides fn's.
/// Async-signal-safe: no system call, no allocation, no lock.
void call_preserving(SaveMode mode, void (*fn)(void*), void* ctx) noexcept;

/// What a consumer's code can change of the vector state, read from its
/// instructions (analyze_clobbers()).
struct Clobbers {
  /// The code was followed to its end and touches no vector state but the
  /// low 128 bits of xmm0 .. xmm(xmm - 1) (legacy SSE instructions, which
  /// leave the upper halves of ymm/zmm alone) and the MXCSR's status flags:
  /// no VEX/EVEX instruction, x87, MMX, k register, control-word load or
  /// state restore, and no code it could not read (an indirect jump or call).
  bool known = false;
  std::uint8_t xmm = 0;  ///< how many xmm registers from xmm0 (0..16) it may write
};

/// Reads up to `n` bytes of code at `addr` into `out` without faulting;
/// returns how many were readable (0: none).
using CodeReader = std::function<std::size_t(std::uint64_t addr, std::uint8_t* out, std::size_t n)>;

/// What the code reachable from `entries` (a consumer's handler, ret_handler:
/// every path, direct callees included) can clobber (Clobbers). Decodes with
/// Capstone; unknown (known false) for anything it does not follow, or more
/// than 16,384 instructions or 256 functions. Thread-safe; not
/// async-signal-safe (allocates): registration time only. No exception.
/// `read_ranges`, when given, receives the byte ranges [start, end) of every
/// instruction read, merged and sorted: the answer holds as long as those
/// bytes are the same (a cache checks them instead of reading the code again).
Clobbers analyze_clobbers(const std::vector<const void*>& entries, const CodeReader& read,
                          std::vector<std::pair<std::uint64_t, std::uint64_t>>* read_ranges = nullptr) noexcept;

/// True when the function at `code` is `return true;` and nothing more
/// (`mov $1, %eax` or `mov $1, %al`, then `ret`; an endbr64 first): it
/// touches no vector or x87 register. Reads only the bytes it matches, so
/// never past the end of a function that matches. Thread-safe.
bool returns_true_only(const void* code) noexcept;

/// The strategy call_preserving() uses. Thread-safe.
PreserveStrategy preserve_strategy() noexcept;
/// For tests (both strategies on one machine): sets it; false (unchanged)
/// for in_use on a CPU without xgetbv(1). Thread-safe; takes effect for the
/// next call_preserving().
bool set_preserve_strategy(PreserveStrategy s) noexcept;

/// jmp rel32, the optimized form of a probe site.
inline constexpr std::uint8_t kJumpOpcode = 0xE9;
inline constexpr std::size_t kJumpLen = 5;
/// Most redundant prefixes a padded punned jump (E9Patch's tactic T1) puts
/// before its opcode: one less than the longest instruction a punned jump
/// replaces (4 bytes), since the opcode must stay inside the instruction.
inline constexpr std::size_t kMaxJumpPad = 3;
/// The prefixes of a padded jump, the first `pad` of them in this order:
/// segment overrides (ES, SS, DS), which a `jmp rel32` ignores in 64-bit
/// mode (no memory operand; DS is a branch hint only on Jcc and `notrack`
/// only on an indirect branch). Not 0x66, which an AMD CPU honours on a
/// near jump (rel16, rip truncated to 16 bits); not REX, which must be last.
/// E9Patch pads with segment overrides and REX.W. tests/arch checks that
/// this CPU runs each padded form as the plain jump.
inline constexpr std::uint8_t kJumpPadPrefix[kMaxJumpPad] = {0x26, 0x36, 0x3e};
/// Longest jump a site holds: kMaxJumpPad prefixes, then `jmp rel32`.
inline constexpr std::size_t kMaxJumpLen = kJumpLen + kMaxJumpPad;
/// Bytes of one optimized-probe stub (code + its OptSite descriptor).
inline constexpr std::size_t kOptStubSize = 192;

/// The descriptor an optimized-probe stub passes to uprobe_opt_entry(),
/// stored right after the stub's code (read-only to the stub; the registry
/// rewrites owner through the XOL alias when the probe goes away).
struct OptSite {
  std::uint64_t site;             ///< probe address
  std::uint64_t resume;           ///< where to continue when no handler moved rip (site + len for a nop5)
  std::uint64_t key[3];           ///< the core's probe key (dev, ino, offset)
  /// Nonzero at a function's first instruction when the stub was made while
  /// the probe had a return consumer: the stub's resume point jumps through
  /// the red zone, where opt_frame_leave() writes uprobe_ret_thunk when a hit
  /// arms a return probe (a hit that does not returns through the stub's own
  /// slot, the red zone untouched) (opt_stub.S). Read by build_opt_stub()
  /// and opt_frame_leave().
  std::uint64_t at_entry;
  /// The core's probe object this stub dispatches to, 0 when none: read under
  /// the RCU read lock by an optimized hit (saves the lookup by key), cleared
  /// by the registry before the object's grace period. Read with an acquire
  /// load; 0 means "look the key up".
  std::uint64_t owner;
};

/// Adds 1 to a counter that only the calling thread writes, in one
/// instruction (`addq $1, mem`, no lock prefix: no bus lock, no shared cache
/// line taken): a signal handler that interrupts this thread and increments
/// the same counter sees it before or after, never between a read and its
/// write-back, so no increment is lost. Other threads may read it with
/// relaxed atomic loads. Async-signal-safe.
inline void thread_counter_increment(std::uint64_t* c) noexcept { asm volatile("addq $1, %0" : "+m"(*c)); }

/// Compare-and-swap of a word that only the calling thread writes (and the
/// signal handlers that interrupt it), in one instruction (`cmpxchg`
/// without the lock prefix: no bus lock, no shared cache line): a handler
/// runs before or after it, never between its read and its write. Stores
/// `desired` and returns true when *p held `expected`. Async-signal-safe.
inline bool thread_compare_exchange(std::uint64_t* p, std::uint64_t expected, std::uint64_t desired) noexcept {
  bool ok;
  asm volatile("cmpxchgq %3, %1" : "=@ccz"(ok), "+m"(*p), "+a"(expected) : "r"(desired) : "memory");
  return ok;
}

/// The spin-wait hint (`pause`): a spinning reader or writer tells the CPU
/// it waits, which saves power and frees the core's sibling. Async-signal-safe.
inline void cpu_relax() noexcept { __builtin_ia32_pause(); }

/// Atomic 16-byte compare-and-exchange (`lock cmpxchg16b`) of the 16-byte
/// aligned pair {lo, hi} at `addr`: stores {new_lo, new_hi} when it holds
/// {exp_lo, exp_hi} and returns true; otherwise loads the current pair into
/// exp_lo/exp_hi (one atomic 16-byte read) and returns false. A full
/// barrier. Lock-free, async-signal-safe. ThreadSanitizer does not see it:
/// the caller annotates.
inline bool compare_exchange_16(void* addr, std::uint64_t& exp_lo, std::uint64_t& exp_hi, std::uint64_t new_lo,
                                std::uint64_t new_hi) noexcept {
  bool ok;
  struct Pair {
    std::uint64_t lo, hi;
  };
  asm volatile("lock cmpxchg16b %1"
               : "=@ccz"(ok), "+m"(*static_cast<Pair*>(addr)), "+a"(exp_lo), "+d"(exp_hi)
               : "b"(new_lo), "c"(new_hi)
               : "memory");
  return ok;
}

/// rflags trap flag (TF).
inline constexpr std::uint64_t kTrapFlag = 0x100;

/// The rflags bits a consumer's handler may change (CF PF AF ZF SF TF DF OF,
/// 0xdd5): what every path writes back from a Regs (the int3 path's
/// ucontext, the optimized stub's frame, the return trampoline's frame).
/// The others (IF, AC, the system bits) stay the interrupted code's.
inline constexpr std::uint64_t kHandlerFlags = 0x0cd5 | kTrapFlag;

/// rflags as the program continues with them: `orig`'s bits outside
/// kHandlerFlags, the handlers' (`handled`) inside. Pure, async-signal-safe.
inline constexpr std::uint64_t merge_handler_flags(std::uint64_t orig, std::uint64_t handled) noexcept {
  return (orig & ~kHandlerFlags) | (handled & kHandlerFlags);
}

/// Hides `v`'s value from the optimizer (an empty asm with `v` as a register
/// operand): a byte or word loop around it is not turned into a memcpy() or
/// memcmp() call (libc's, which may be probed or use vector registers) nor
/// folded away. Costs nothing at run time. Async-signal-safe.
template <class T>
inline void opaque(T& v) noexcept {
  asm("" : "+r"(v));
}

/// Copies `words` 8-byte words from `from` to `to`, either side possibly
/// misaligned, with general-register moves only (no libc call, no vector
/// register): for frames on the paths that run before the vector state is
/// saved. Async-signal-safe.
inline void copy_words(void* to, const void* from, std::size_t words) noexcept {
  for (std::size_t i = 0; i < words; ++i) {
    std::uint64_t w;
    __builtin_memcpy(&w, static_cast<const unsigned char*>(from) + 8 * i, 8);
    opaque(w);
    __builtin_memcpy(static_cast<unsigned char*>(to) + 8 * i, &w, 8);
  }
}

/// What an optimized hit keeps from the stub's frame while the handlers run.
struct OptFrameSaved {
  std::uint64_t rflags;    ///< rflags at the site
  std::uint64_t own_slot;  ///< the target slot the stub reserved (site rsp - 136)
};

/// Turns the frame an optimized stub pushed (a Regs, opt_stub.S) into the
/// site's registers for the handlers: rip = the site, rsp = the site's.
/// Async-signal-safe.
inline OptFrameSaved opt_frame_enter(Regs& regs, const OptSite& site) noexcept {
  const OptFrameSaved saved{regs.rflags, regs.rsp};
  regs.rip = site.site;
  regs.rsp = saved.own_slot + 136;  // the red zone and the target slot
  return saved;
}

/// After the handlers: keeps their changes to the arithmetic flags, DF and TF
/// only, and points the stub's `pop %rsp; ret $128` at the continuation, 136
/// bytes below the stack pointer to continue with: with rip and rsp as the
/// site's, the stub's own slot, which holds its resume point already (its
/// call pushed it: a predicted return, then OptSite::resume); else a
/// handler's new rip (or OptSite::resume) written into the slot below the
/// handler's rsp. A slot that would fall inside this frame (a handler lowering
/// rsp by less than the frame) cannot be written before the frame is popped:
/// rsp then stays.
///
/// At a function entry whose stub was made while the probe had a return
/// consumer (OptSite::at_entry) the resume point jumps through the red zone,
/// 16 bytes below the site's rsp, which is written only when `hijacked` (the
/// hit armed a return probe: hijack_return_address() put the return
/// trampoline into the return slot at the site's rsp, the function's real
/// return address is in the return instance) and rip and rsp are the site's:
/// to uprobe_ret_thunk, with the continuation in the return slot instead
/// (else the stub's slot gets OptSite::resume, the red zone stays as it is): the thunk calls it from there, and the function's return to
/// uprobe_ret_landing is one the return stack buffer predicts (a return to
/// the trampoline, where no call pushed, is not). Async-signal-safe.
inline void opt_frame_leave(std::uint64_t* frame, Regs& regs, const OptSite& site, const OptFrameSaved& saved,
                            bool hijacked = false) noexcept {
  regs.rflags = merge_handler_flags(saved.rflags, regs.rflags);
  const bool redirected = regs.rip != site.site;
  const std::uint64_t site_sp = saved.own_slot + 136;
  std::uint64_t slot = saved.own_slot;
  const bool moved = regs.rsp != site_sp;
  if (__builtin_expect(moved, 0)) {
    slot = regs.rsp - 136;
    const auto lo_frame = reinterpret_cast<std::uint64_t>(frame), hi_frame = lo_frame + 19 * 8;
    if (slot + 8 > lo_frame && slot < hi_frame) slot = saved.own_slot;
  }
  if (__builtin_expect(redirected || slot != saved.own_slot, 0)) {
    const std::uint64_t target = redirected ? regs.rip : site.resume;
    __builtin_memcpy(reinterpret_cast<void*>(slot), &target, 8);  // one move; the slot may be misaligned
  } else if (site.at_entry) {
    if (hijacked && !moved) {
      const auto thunk = reinterpret_cast<std::uint64_t>(&uprobe_ret_thunk);
      __builtin_memcpy(reinterpret_cast<void*>(site_sp), &site.resume, 8);
      __builtin_memcpy(reinterpret_cast<void*>(site_sp - 16), &thunk, 8);  // (either may be misaligned)
    } else {
      // No return armed: the red zone stays untouched (code that jumps to a
      // function's first instruction may keep data there); the stub returns
      // to the continuation itself (a return the CPU mispredicts: only at a
      // stub made while the probe had a return consumer, which it has no more).
      __builtin_memcpy(reinterpret_cast<void*>(slot), &site.resume, 8);
    }
  }
  regs.rsp = slot;
}

/// The address of the return trampoline: what hijack_return_address()
/// writes.
inline std::uint64_t return_trampoline_address() noexcept {
  return reinterpret_cast<std::uint64_t>(&uprobe_ret_trampoline);
}

/// Whether `addr` is one of libuprobe's return addresses: the return
/// trampoline, or the landing an optimized entry's function returns to
/// (opt_frame_leave()). Every place that meets a hijacked return address
/// (a chained entry, the unwinders, backtraces, a single-stepped return) asks
/// this. Pure, async-signal-safe.
inline bool is_return_trampoline(std::uint64_t addr) noexcept {
  return addr == reinterpret_cast<std::uint64_t>(&uprobe_ret_trampoline) ||
         addr == reinterpret_cast<std::uint64_t>(&uprobe_ret_landing);
}

/// Where the return address of the function entered with `regs` (at its
/// first instruction) is kept: the stack slot at rsp. Its address also names
/// the frame (a return instance is stale once rsp is above it). Pure.
/// (The kernel's arch_uretprobe_hijack_return_addr() reads it.)
inline std::uint64_t return_address_slot(const Regs& regs) noexcept { return regs.rsp; }

/// The return address in the slot return_address_slot() named.
/// Async-signal-safe.
inline std::uint64_t read_return_address(std::uint64_t slot) noexcept {
  return *reinterpret_cast<const std::uint64_t*>(slot);
}

/// Makes the function whose return address is at `slot` return to `to`
/// (the return trampoline): the kernel's arch_uretprobe_hijack_return_addr()
/// write. Async-signal-safe.
inline void hijack_return_address(std::uint64_t slot, std::uint64_t to) noexcept {
  *reinterpret_cast<std::uint64_t*>(slot) = to;
}

/// The stack pointer after the return the trampoline's frame `f` stands for
/// (just above its ret_slot). Pure.
inline std::uint64_t ret_frame_sp(const RetFrame* f) noexcept {
  return reinterpret_cast<std::uint64_t>(f) + __builtin_offsetof(RetFrame, ret_slot) + 8;
}

}  // namespace uprobe::arch
