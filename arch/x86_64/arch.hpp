// SPDX-License-Identifier: MIT
#pragma once
/// @file arch.hpp
/// The narrow arch boundary (as the kernel's arch_uprobe_* hooks,
/// arch/x86/kernel/uprobes.c): analyze an instruction at register time,
/// emulate it or build its out-of-line (XOL) copy, map ucontext <-> Regs.
/// The core in src/ calls only what is declared here; a second architecture
/// provides its own arch/<name>/arch.hpp with the same names.

#include <signal.h>
#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <unwind.h>

#include "uprobe/regs.hpp"

extern "C" {
/// The return trampoline (ret_trampoline.S): the address a hijacked return
/// address points to. Not callable from C.
void uprobe_ret_trampoline();
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
  std::uint64_t reserved;         ///< 0 (what the consumers need saved is the core's: ConsumerSet)
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
/// rsp then stays. Async-signal-safe.
inline void opt_frame_leave(std::uint64_t* frame, Regs& regs, const OptSite& site,
                            const OptFrameSaved& saved) noexcept {
  regs.rflags = merge_handler_flags(saved.rflags, regs.rflags);
  const bool redirected = regs.rip != site.site;
  std::uint64_t slot = saved.own_slot;
  if (__builtin_expect(regs.rsp != saved.own_slot + 136, 0)) {
    slot = regs.rsp - 136;
    const auto lo_frame = reinterpret_cast<std::uint64_t>(frame), hi_frame = lo_frame + 19 * 8;
    if (slot + 8 > lo_frame && slot < hi_frame) slot = saved.own_slot;
  }
  if (__builtin_expect(redirected || slot != saved.own_slot, 0)) {
    const std::uint64_t target = redirected ? regs.rip : site.resume;
    __builtin_memcpy(reinterpret_cast<void*>(slot), &target, 8);  // one move; the slot may be misaligned
  }
  regs.rsp = slot;
}

/// The address of the return trampoline.
inline std::uint64_t return_trampoline_address() noexcept {
  return reinterpret_cast<std::uint64_t>(&uprobe_ret_trampoline);
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

/// The breakpoint instruction (int3) and its length.
inline constexpr std::uint8_t kBreakpoint = 0xCC;
inline constexpr std::size_t kBreakpointLen = 1;
/// Length of the signal-return trampoline libc installs as every handler's
/// sa_restorer (glibc's __restore_rt: `mov $15,%rax`, 7 bytes, then
/// `syscall`, 2): the bytes a handler's return runs before rt_sigreturn.
inline constexpr std::size_t kSignalReturnTrampolineLen = 9;
/// Longest x86 instruction.
inline constexpr std::size_t kMaxInsnLen = 15;
/// Size of one XOL slot (relocated instruction + jump back), bytes.
inline constexpr std::size_t kXolSlotSize = 32;

/// How a probed instruction continues after the consumers ran.
enum class InsnClass : std::uint8_t {
  nop,        ///< any nop form, endbr64/endbr32: rip += len
  push_reg,   ///< push r64: rsp -= 8, *rsp = reg
  jmp_rel,    ///< jmp rel8/rel32
  call_rel,   ///< call rel32
  jcc_rel,    ///< Jcc rel8/rel32
  loop_rel,   ///< loop/loope/loopne/jrcxz/jecxz rel8
  ret,        ///< ret, rep ret, bnd ret
  ret_imm,    ///< ret imm16
  jmp_ind,    ///< jmp *reg / jmp *mem (no segment override)
  call_ind,   ///< call *reg / call *mem (no segment override)
  xol,        ///< everything else: run a relocated copy out of line
};

/// Register numbers used in Insn (index into the Regs field order
/// rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8..r15 = 0..15; kNoReg = none;
/// kRipReg = rip-relative base).
inline constexpr std::uint8_t kNoReg = 0xFF;
inline constexpr std::uint8_t kRipReg = 0xFE;

struct XolOps;
/// The operations of an instruction that runs out of line with nothing to
/// fix up (the default of an Insn not made by analyze()).
extern const XolOps kDefaultXolOps;

/// The result of analyzing one instruction, computed once at register time
/// from the file's bytes and kept with the uprobe. Position independent: the
/// same Insn serves every mapping of the file (targets are relative to the
/// end of the instruction).
struct Insn {  // (96 bytes: traps sits in the padding after mem_scale)
  std::uint8_t bytes[16] = {};   ///< original bytes
  std::uint8_t len = 0;          ///< instruction length
  InsnClass cls = InsnClass::xol;
  std::uint8_t reg = kNoReg;     ///< push_reg / *_ind by register: the register
  std::uint8_t cond = 0;         ///< jcc_rel: condition code 0..15 (the low nibble of 0x7X); loop_rel: 0 loop, 1 loope, 2 loopne, 3 jrcxz, 4 jecxz, 5 loop/6 loope/7 loopne counting in ecx (67 prefix)
  std::uint16_t imm = 0;         ///< ret_imm: bytes popped after the return address
  std::int64_t rel = 0;          ///< *_rel: target = ip + len + rel
  // Memory operand of jmp_ind/call_ind (reg == kNoReg): base/index/scale/disp.
  std::uint8_t mem_base = kNoReg;   ///< register or kRipReg
  std::uint8_t mem_index = kNoReg;
  std::uint8_t mem_scale = 1;
  bool traps = false;            ///< syscall, sysenter, int n, ud*, hlt: enters the kernel or faults on purpose
  std::int64_t mem_disp = 0;
  // XOL: rip-relative displacement, when present.
  bool rip_relative = false;     ///< instruction has a rip-relative memory operand
  std::uint8_t disp_offset = 0;  ///< byte offset of the disp32 in bytes[]
  std::int32_t disp = 0;         ///< the original disp32
  std::string text;              ///< disassembly, e.g. "movsd xmm0, qword ptr [rip + 0x2f0e]"
  /// How a hit continues past this instruction (XolOps), chosen once by
  /// analyze() from its class (the kernel's auprobe->ops, set by
  /// arch_uprobe_analyze_insn()). Points at a static table: copies share it.
  const XolOps* ops = &kDefaultXolOps;
};

/// Decodes and classifies the instruction at `code` (up to `avail` bytes).
/// Refuses, with a reason in `why`: undecodable bytes, int3 (an existing
/// breakpoint), and instructions that can neither be emulated nor run out of
/// line (e.g. a rip-relative form we cannot relocate, segment-relative
/// indirect branches, int/syscall-style traps are allowed). Accepted
/// analyses are kept per thread by instruction bytes (up to 4096; the result
/// depends on nothing else), so the same instruction is decoded once.
/// Not async-signal-safe (uses Capstone). Thread-safe.
bool analyze(const std::uint8_t* code, std::size_t avail, Insn& out, std::string& why);

/// Linear sweep: the start offsets of the instructions in
/// [code, code + size), stopping at the first undecodable byte. Used to
/// check that a probe offset is an instruction start inside a known function.
std::vector<std::size_t> instruction_starts(const std::uint8_t* code, std::size_t size);

/// Loads the decoder (Capstone) now if it is not loaded yet (capstone_lib.hpp);
/// "" or why it cannot be loaded. Thread-safe (once; concurrent callers
/// wait); not async-signal-safe (dlopen).
const std::string& load_decoder() noexcept;

/// One-line disassembly of the instruction at `code` as if at `address`,
/// with its length in `len` (0 if undecodable).
std::string disassemble(const std::uint8_t* code, std::size_t avail, std::uint64_t address,
                        std::size_t& len);

/// True if `insn` is continued by emulation rather than out of line.
bool is_emulated(const Insn& insn) noexcept;

/// True if the XOL copy of `insn` behaves exactly as the original: every
/// class except relative branches and calls (whose targets and pushed return
/// addresses would be counted from the slot). Those are always emulated, even
/// when emulation is switched off. Async-signal-safe.
bool xol_safe(const Insn& insn) noexcept;

/// Emulates `insn` located at address `ip` on `regs` (registers as at the
/// probe: regs.rip == ip). On success updates regs (rip, rsp, stack memory for
/// push/call) and returns true; returns false when the class is not emulated.
/// Hot path: async-signal-safe, no allocation, no syscall.
bool emulate(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept;

/// The absolute address a rip-relative operand of `insn` at `ip` refers to
/// (valid when insn.rip_relative).
std::uint64_t rip_target(const Insn& insn, std::uint64_t ip) noexcept;

/// Builds the XOL copy of `insn` (original address `ip`) to run at address
/// `slot`: the relocated instruction (rip-relative displacement re-aimed at
/// the same absolute target) followed by an absolute jump back to ip + len
/// (`jmp *pad(%rip)`, int3 padding, the 8-byte address, 8-byte aligned when
/// `slot` is: the copy may run with rflags.AC set). Writes at most kXolSlotSize bytes to `out`; returns the length, or 0 with
/// `why` set when the target is out of the disp32 reach of `slot`.
/// Not hot (called at register time).
std::size_t build_xol(const Insn& insn, std::uint64_t ip, std::uint64_t slot, std::uint8_t* out,
                      std::string& why);

/// Where the single-step trap of an out-of-line copy run under TF arrives
/// (XolMode::single_step, a probed popf, or a program single-stepping
/// itself), by what the instruction does to rip: the kernel's
/// arch_uprobe_post_xol() fix-ups (arch/x86/kernel/uprobes.c), decided at the hit.
enum class StepEndKind : std::uint8_t {
  next,    ///< the trap comes at the end of the copy (slot + len): continue at ip + len
  branch,  ///< ret, ret imm16, jmp *reg, jmp *mem: the trap comes at the branch target, with rsp = StepPlan::sp
  rep,     ///< a rep-prefixed string instruction: a trap at the slot after every iteration but the last
  kernel,  ///< syscall, int n: the return from the kernel swallows the step, whose trap comes after the
           ///< jump back (at ip + len); at slot + len on a kernel that keeps it
};

/// What the hit expects of the step trap of the copy it starts. Copied into
/// the thread's state: valid after the probe is gone.
struct StepPlan {
  std::uint64_t ip = 0;    ///< probe address
  std::uint64_t slot = 0;  ///< the copy's XOL slot
  std::uint64_t sp = 0;    ///< StepEndKind::branch: rsp after the instruction
  std::uint8_t len = 0;    ///< instruction length
  StepEndKind kind = StepEndKind::next;
};

/// The plan for single-stepping the copy of `insn` (at `ip`) in `slot`, with
/// `regs` as the copy starts with them (after the handlers). Async-signal-safe.
StepPlan plan_single_step(const Insn& insn, std::uint64_t ip, std::uint64_t slot, const Regs& regs) noexcept;

/// What a single-step trap at `trap_ip` with stack pointer `trap_sp` means
/// for the copy started with `plan`.
enum class StepEnd : std::uint8_t {
  foreign,  ///< not the copy's step trap
  again,    ///< a rep string instruction stopped between iterations: it goes on, still stepped
  done,     ///< the instruction completed: the program continues at `resume`
};
/// Async-signal-safe. `resume` is set when done: ip + len after the copy's
/// end, the target itself after a branch.
StepEnd single_step_end(const StepPlan& plan, std::uint64_t trap_ip, std::uint64_t trap_sp,
                        std::uint64_t& resume) noexcept;

/// What a single-stepped out-of-line copy leaves to its step trap, from
/// XolOps::pre_xol to XolOps::post_xol (the kernel's struct arch_uprobe_task
/// and its UPROBE_FIX_* flags). Copied into the thread's state: valid after
/// the probe is gone.
struct XolStep {
  StepPlan plan;             ///< where the step trap arrives
  const XolOps* ops = nullptr;  ///< the instruction's operations (post_xol reads the trap)
  bool program_tf = false;   ///< the program had TF set itself at the probe: the step trap is also its own
  bool fix_pushf = false;    ///< a pushf run under our TF: clear TF in the flags word it stored
  bool keep_tf = false;      ///< a popf: TF after it is what it loaded (the kernel's UPROBE_FIX_SETF)
};

/// The per-instruction operations of a hit (the kernel's struct
/// uprobe_xol_ops: branch_xol_ops, push_xol_ops, default_xol_ops), chosen by
/// analyze() and called by the core's int3 path (src/hit/trap.cpp) without
/// it looking at the instruction's class. The optimized path never uses
/// them. There is no `abort`: the kernel's undoes a step the task leaves
/// (a fatal signal, the XOL slot going away); here the step is the thread's
/// own and resumes after any signal handler's sigreturn, and slots are never
/// freed.
struct XolOps {
  /// Runs the instruction at `ip` on `regs` (as at the probe) and returns
  /// true, with rip, rsp and the stack as after it (the kernel's
  /// ops->emulate, arch_uprobe_skip_sstep()); nullptr for an instruction that
  /// only runs out of line. Async-signal-safe, no allocation, no syscall.
  bool (*emulate)(const Insn& insn, std::uint64_t ip, Regs& regs) noexcept;
  /// The out-of-line copy would not do what the original does (a relative
  /// branch or call counted from the slot, a return address pushed from it):
  /// always emulated, whatever Config::emulate says (!xol_safe()).
  bool emulate_only;
  /// The copy is single-stepped even when its jump back would do: a popf,
  /// after which TF is what it loaded, not ours (loads_flags()).
  bool step_always;
  /// The copy of `insn` (at `ip`) is about to run from `slot` single-stepped
  /// (the kernel's ops->pre_xol, arch_uprobe_pre_xol()): sets TF in `regs`
  /// (as the copy starts: rip = slot) and fills `step`; `program_tf` when the
  /// program had TF set itself. Async-signal-safe.
  void (*pre_xol)(const Insn& insn, std::uint64_t ip, std::uint64_t slot, Regs& regs, bool program_tf,
                  XolStep& step) noexcept;
  /// A single-step trap arrived (`uc`) while `step` was in flight: what it
  /// means (the kernel's ops->post_xol, arch_uprobe_post_xol()). On done,
  /// `uc` continues where the instruction took the thread and, unless the
  /// program's own TF was set, TF and a stored flags word are the program's
  /// again. Async-signal-safe.
  StepEnd (*post_xol)(const XolStep& step, ucontext_t* uc) noexcept;
};

/// The operations table analyze() stores in Insn::ops, by the instruction's
/// class (and for jmp_ind its rip-relative form, for xol pushf and popf).
/// Pure, async-signal-safe.
const XolOps& xol_ops_for(const Insn& insn) noexcept;

/// The program's own TF in a SIGTRAP's ucontext: it is single-stepping
/// itself (or a debugger steps it). Async-signal-safe.
bool ucontext_single_stepping(const ucontext_t* uc) noexcept;

/// True for an instruction that stores rflags to memory (pushf): run out of
/// line under our own TF it would store TF = 1. Async-signal-safe.
bool stores_flags(const Insn& insn) noexcept;

/// True for an instruction that loads rflags, TF included (popf): after it,
/// TF is what it loaded, not what it found (the kernel's UPROBE_FIX_SETF).
/// Async-signal-safe.
bool loads_flags(const Insn& insn) noexcept;

/// True for a 5-byte nop (0f 1f 44 00 00 and the other 5-byte nop forms): a
/// site that can become a jmp rel32 with no instruction displaced.
bool is_nop5(const Insn& insn) noexcept;

/// Builds the stub for an optimized probe placed at `stub`: moves rsp below
/// the red zone, saves the GPRs and rflags, calls uprobe_opt_entry(frame,
/// &OptSite) (the core saves the vector state its consumers need, with
/// call_preserving(); a ThreadSanitizer build saves all of it there, before
/// any instrumented code runs), restores everything and
/// continues at the address uprobe_opt_entry chose (OptSite::resume, or a
/// handler's new rip) with `ret $128`. `desc` is copied behind the code.
/// Returns the length (<= kOptStubSize). No signal, no syscall at run time.
std::size_t build_opt_stub(std::uint64_t stub, const OptSite& desc, std::uint8_t* out) noexcept;

/// Bytes opt_stub_desc() needs to see at a candidate stub entry.
std::size_t opt_stub_probe_len() noexcept;

/// When `code` (opt_stub_probe_len() bytes read at address `ip`) is the entry
/// of an optimized-probe stub built by build_opt_stub(), the address of its
/// OptSite descriptor; else 0. Used when a program single-stepping itself
/// (TF) takes a site's jmp: the trap arrives at the stub entry.
/// Async-signal-safe.
std::uint64_t opt_stub_desc(std::uint64_t ip, const std::uint8_t* code) noexcept;

/// Longest displaced window of an optimized function entry: instructions
/// covering at least the 5 bytes of the jump, the last one starting at byte 4.
inline constexpr std::size_t kMaxWindowLen = kJumpLen - 1 + kMaxInsnLen;
/// Bytes of one window slot: the relocated window and the jump back.
inline constexpr std::size_t kWindowSlotSize = 64;

/// The instructions an optimized function-entry probe displaces: the first
/// instructions of the function, covering >= kJumpLen bytes, all of which
/// run correctly from another address (the window slot). Computed once at
/// register time from the file's bytes; position independent.
struct EntryWindow {
  std::vector<Insn> insns;                ///< the displaced instructions, in order
  std::uint8_t len = 0;                   ///< bytes covered (0 = no window)
  std::uint8_t bytes[kMaxWindowLen] = {};  ///< the original bytes [0, max(len, kJumpLen))
  /// A punned jump (E9Patch's tactic B2, plan_punned()): the window is one
  /// instruction shorter than the jump (len < kJumpLen), and the jump's
  /// bytes [len, kJumpLen) are the original bytes after it, unchanged, so its
  /// target is fixed by them up to the free low bytes (punned_jump_range()).
  bool punned = false;
  /// A punned jump may be padded (E9Patch's tactic T1): `pad` prefixes
  /// (kJumpPadPrefix) before its opcode, for any pad in [min_pad, max_pad],
  /// each choosing other bytes for its rel32 (those at [pad + 1, pad + 5),
  /// the ones past the instruction fixed) and so another range of targets,
  /// tried in order when the previous range has no free page (a site's pad
  /// is chosen at attach: Site::pad). max_pad < len (the opcode stays inside
  /// the instruction, whose bytes alone change) and the bytes up to
  /// max_pad + kJumpLen exist in the file (bytes holds them). min_pad 0: B2
  /// first; else min_pad .. max_pad, then B2. Position independent, as the
  /// rest of the plan.
  std::uint8_t min_pad = 0;
  std::uint8_t max_pad = 0;
  /// Successor eviction (E9Patch's tactic T2, plan_evict()), for a punned
  /// window whose own forms may find no free page: the instruction right
  /// after it (`evict`, at +len, evict.len bytes; 0 = none planned) first
  /// gets a jump of its own (after 0..evict_max_pad prefixes: B1 when it
  /// fits the instruction, else punned over the bytes after it, which stay),
  /// to a trampoline holding its relocated copy and a jump back; the site's
  /// punned jump then keeps the successor's new bytes, whose free rel32
  /// bytes select other targets (solve_evicted()). A branch to the successor
  /// takes its jump; only the two instructions' own bytes change.
  Insn evict;
  std::uint8_t evict_max_pad = 0;
  /// Place the site by eviction before looking for a free page of its own
  /// punned or padded forms (the core's SiteTactics::instruction_evicted,
  /// for the test suites); false: eviction only where none has one.
  bool evict_first = false;
  /// The original bytes from the site on: [0, len + max(evict.len, kJumpLen
  /// + evict_max_pad)), when evict.len.
  std::uint8_t evict_bytes[kMaxInsnLen + 4 + kMaxJumpLen] = {};
};

/// Bytes from the site on that successor eviction (EntryWindow::evict) may
/// rewrite or keep: the site's instruction, then the successor's jump over
/// its whole instruction (or its longest padded punned form). 0 when no
/// eviction is planned. Pure.
inline std::size_t evict_extent(const EntryWindow& w) noexcept {
  if (!w.evict.len) return 0;
  const std::size_t sj = kJumpLen + w.evict_max_pad;
  return w.len + (w.evict.len > sj ? w.evict.len : sj);
}

/// Plans successor eviction (EntryWindow::evict) for the punned window `w`
/// (plan_punned()'s result) from the file's bytes `code` [0, avail) at the
/// site: the successor at +w.len must be displaceable as a window's last
/// instruction (no trap or system call, no loop; a call or return is fine:
/// nothing of the window follows it) and its bytes and the kJumpLen +
/// evict_max_pad after its start must exist. False with `why` (w unchanged)
/// otherwise. Thread-safe.
bool plan_evict(const std::uint8_t* code, std::size_t avail, EntryWindow& w, std::string& why);

/// One solution of successor eviction: the site's jump after `pad`
/// prefixes to `target`, the successor's after `evict_pad` prefixes to
/// `evict_target`, consistent byte for byte (the site's rel32 bytes past
/// its instruction are the successor's jump's).
struct EvictChoice {
  std::uint8_t pad = 0, evict_pad = 0;
  std::uint64_t target = 0, evict_target = 0;
};

/// Searches the jumps of successor eviction for the site at `site` with the
/// planned window `w` (w.evict.len != 0): for each pair of pads, the free
/// bytes of both rel32s (the site's bytes after its opcode, the
/// successor's rel32 bytes inside the successor; the others are fixed: a
/// prefix, the successor's opcode, a byte past the successor), asking
/// `maybe_free(addr, len)` (cheap: false when that memory is known to be
/// taken) before `place_evict(addr)` (reserves the successor's trampoline
/// at exactly addr, true when done) and `place_site(addr)` (the site's hop
/// at exactly addr). `mapped(lo, hi)` (cheap, no question counted): true
/// when every address of [lo, hi) is known to be mapped (none can hold a
/// trampoline); the search skips the successor's pads, and the values of
/// its free bytes, whose every target is, and asks again after each failed
/// place_evict() (which may teach the caller's memory that the address is
/// mapped after all: a snapshot older than the heap's growth). At most
/// `budget` maybe_free() questions. True with `out` when both were placed;
/// false with `why`: "every trampoline address its bytes allow is mapped
/// (SPANS)" when it is so for every successor's pad (eviction is
/// impossible in this address space), else that the search gave up after
/// `budget` questions ("... (the search gave up)"), or found no free pair
/// among those it tries. Not hot; thread-safe as its callbacks are.
bool solve_evicted(std::uint64_t site, const EntryWindow& w, bool (*maybe_free)(void*, std::uint64_t, std::size_t),
                   bool (*mapped)(void*, std::uint64_t, std::uint64_t), bool (*place_evict)(void*, std::uint64_t),
                   bool (*place_site)(void*, std::uint64_t), void* ctx, EvictChoice& out, std::string& why,
                   std::size_t budget = 20000);

/// The successor's bytes once evicted: its jump (after `evict_pad`
/// prefixes) to `evict_target`, written over the successor's own bytes
/// only (a punned jump's bytes past it are the original ones): out[0 ..
/// n), n = min(evict_pad + kJumpLen, evict.len) returned. Pure.
std::size_t evict_jump(std::uint64_t site, const EntryWindow& w, std::size_t evict_pad, std::uint64_t evict_target,
                       std::uint8_t* out) noexcept;

/// The mark after an evicted successor's trampoline (its relocated copy,
/// then its jump back; never executed: ud2, 'E', 'V'), followed by the
/// successor's address relative to the trampoline's entry (int32, little
/// endian): kEvictMarkLen bytes. The step path finds the successor of a
/// trampoline a self-stepping program entered with find_evict_mark().
inline constexpr std::uint8_t kEvictMark[4] = {0x0f, 0x0b, 'E', 'V'};
inline constexpr std::size_t kEvictMarkLen = 8;

/// Appends the mark (kEvictMark, then successor - entry) at code[n]:
/// returns n + kEvictMarkLen. `entry` is the trampoline's address,
/// `successor` the evicted instruction's (within rel32 reach of it: the
/// trampoline's jump back reaches it). Pure.
std::size_t append_evict_mark(std::uint8_t* code, std::size_t n, std::uint64_t entry, std::uint64_t successor) noexcept;

/// Looks in `code` [0, n) (the bytes at `entry` on) for a trampoline's
/// mark after `from` bytes: the first kEvictMark at offset k >= from whose
/// claimed successor is in user space. True with the successor's address
/// and k (the trampoline's code length). The caller checks the successor's
/// jump aims at `entry` (and calls again with from = k + 1 if not). Pure;
/// async-signal-safe.
bool find_evict_mark(const std::uint8_t* code, std::size_t n, std::uint64_t entry, std::size_t from,
                     std::uint64_t& successor, std::size_t& len) noexcept;

/// Bytes from the site on that a window's jump may cover and whose values it
/// needs unchanged, without successor eviction: its window, or for a
/// punned jump its longest padded form (max_pad + kJumpLen; a probe inside
/// them would change the jump's target). Pure.
inline std::size_t own_jump_extent(const EntryWindow& w) noexcept {
  return w.punned ? kJumpLen + w.max_pad : w.len;
}

/// own_jump_extent(), or evict_extent() when longer: the bytes a site
/// that evicts its successor needs unchanged. Pure.
inline std::size_t jump_extent(const EntryWindow& w) noexcept {
  const std::size_t own = own_jump_extent(w);
  const std::size_t ev = evict_extent(w);
  return ev > own ? ev : own;
}

/// Bytes of the jump a window's site holds once optimized that differ from
/// the original ones after byte 0 (the tail written before byte 0, and
/// restored before it): kJumpLen - 1, or len - 1 for a punned jump, whose
/// other bytes stay the original ones. Pure.
inline std::size_t jump_tail_len(const EntryWindow& w) noexcept {
  return w.punned ? static_cast<std::size_t>(w.len) - 1 : kJumpLen - 1;
}

/// Plans a punned jump at the instruction `insn` (analyze()'s result, at
/// `code`, with at least kJumpLen bytes there): a window of that one
/// instruction when it is shorter than the jump and may run displaced as a
/// window's last instruction. Only the instruction's own bytes change (no
/// thread can be inside an instruction, nothing branches into one), so none
/// of plan_window()'s function checks apply. With more bytes available
/// (`avail` up to kMaxJumpLen), padded forms too (EntryWindow::max_pad:
/// min(len - 1, avail - kJumpLen, kMaxJumpPad)); min_pad is left 0. False
/// with `why` otherwise. Thread-safe.
bool plan_punned(const std::uint8_t* code, std::size_t avail, const Insn& insn, EntryWindow& out, std::string& why);

/// The targets [lo, hi) a punned `jmp rel32` at `site`, after `pad`
/// prefixes (<= w.max_pad), may take: its rel32 is the bytes
/// [pad + 1, pad + 5); those past the window (w.bytes[w.len ..)) are fixed,
/// the ones before free (none when pad = w.len - 1: a single target). False
/// when the range lies outside user space or pad is not planned. Pure.
bool punned_jump_range(std::uint64_t site, const EntryWindow& w, std::uint64_t& lo, std::uint64_t& hi,
                       std::size_t pad = 0) noexcept;

/// Plans the window of a function entry from the function's bytes
/// [func, func + size) (size from the symbol table). Refuses, with the reason
/// in `why`: a function shorter than the jump; an instruction in the window
/// that cannot be relocated (a return, a system call or trap, a call (direct
/// or indirect) or indirect jump before the last instruction of the window;
/// direct jumps and Jcc anywhere are re-encoded); and a direct branch anywhere
/// in the function whose target lies inside the window past its first byte
/// (it would land in the middle of the jump: case C-04), or a rip-relative
/// operand anywhere in the function that takes an address there (a computed
/// goto: an indirect jump may land in the middle of the jump). Jump tables
/// (indirect jmp through a register) are not followed: compilers aim them at
/// case labels after the dispatch, never into a function's first bytes.
/// Branches are found by a scan of every byte as a possible opcode (so for
/// any instruction boundaries); only where one could aim into the window,
/// the linear sweep from the entry (Capstone's instruction lengths: from the
/// sweep's table for the common encodings, sweep.cpp) decides, and it
/// refuses when it cannot decode up to there.
/// `first`, when given, is analyze()'s result for the instruction at func[0]
/// (the probed one, analyzed already), so it is not decoded again.
/// A return (ret, ret imm16) may be the last displaced instruction, as a
/// `jmp *` may. `padding` (func holds size + padding bytes) is the count of
/// filler bytes after the function (nops or int3 up to the next function's
/// start, which nothing executes or branches to): a function whose last
/// instruction never falls through (ret, jmp) before 5 bytes lets the window
/// cover just enough of them (a 3-byte `xor %eax,%eax; ret` takes the jump).
/// Not async-signal-safe (Capstone). Thread-safe.
bool plan_entry_window(const std::uint8_t* func, std::size_t size, EntryWindow& out, std::string& why,
                       const Insn* first = nullptr, std::size_t padding = 0);

/// plan_entry_window() for a window at any instruction start `at` inside
/// the function [func, func + size) (at == 0: the entry), `padding` filler
/// bytes after the function as there (a site whose last instructions never
/// fall through, `nop; ret`, may cover them). The same refusals, each
/// reason's offsets relative to the function. What the
/// function's bytes alone cannot show is the caller's to check: branches from
/// neighbours (check_neighbour_branches()), jump tables in data
/// (rip_data_refs()), code addresses stored in data, exception landing pads.
/// `first`, when given, is analyze()'s result for func[at]. Not
/// async-signal-safe (Capstone). Thread-safe.
bool plan_window(const std::uint8_t* func, std::size_t size, std::size_t at, EntryWindow& out, std::string& why,
                 const Insn* first = nullptr, std::size_t padding = 0);

/// The addresses outside the function [func, func + size) that a `lea
/// disp32(%rip)` inside it takes, relative to func, sorted and unique: the
/// candidates for the jump tables of its switch statements (a compiler's PIC
/// table is an array of 32-bit offsets from its own start, which the
/// function's indirect jump adds to that start). Linear sweep from the entry;
/// false with the reason in `why` when it cannot decode to the end. Not hot;
/// thread-safe.
bool rip_data_refs(const std::uint8_t* func, std::size_t size, std::vector<std::int64_t>& refs, std::string& why);

/// True for the relocation type whose target is the load base plus its
/// addend, with no symbol (R_X86_64_RELATIVE): how a position-independent
/// file stores the address of its own code (a computed goto's label table, a
/// jump table of absolute addresses). Pure.
constexpr bool is_relative_reloc(std::uint32_t type) noexcept { return type == 8; }

/// Refuses (false, the reason in `why`) when the function `code` [0, size),
/// a neighbour of a planned window and swept from its own first byte, holds
/// a direct branch (jmp, Jcc, call, jrcxz/loop, xbegin) or a `lea
/// disp32(%rip)` whose target lies inside the window past its first byte:
/// (win, win + len), `win` the window's entry relative to `code` (past the
/// end for a function before it, negative for one after it). Hand-written
/// assembly shares labels across functions (glibc's __mempcpy_*_erms jumps
/// to the second instruction of __memmove_*_erms), which the window's own
/// function cannot show. Also refuses when the sweep meets undecodable bytes
/// before the last possible such branch. Not hot; thread-safe (one Capstone
/// handle per thread, for what the sweep's table does not know).
bool check_neighbour_branches(const std::uint8_t* code, std::size_t size, std::int64_t win, std::size_t len,
                              std::string& why);

/// The targets of the function `f` [0, size), swept from its first byte as
/// check_neighbour_branches() sweeps it: of every direct branch and every
/// `lea disp32(%rip)`, relative to `f` (a target beyond the int32 range kept
/// at its bound), appended to `targets`, those appended sorted. Returns
/// false when the sweep cannot reach the end (undecodable bytes: then
/// check_neighbour_branches() may refuse a window for that reason alone).
/// With true and no target in (win, win + len), check_neighbour_branches()
/// on the same bytes accepts that window: an index that clears a neighbour
/// for every window of a batch after one sweep (a window it does not clear is
/// checked exactly). Not async-signal-safe (Capstone, for the encodings the
/// sweep's table does not know: sweep.cpp); thread-safe.
bool neighbour_branch_targets(const std::uint8_t* f, std::size_t size, std::vector<std::int32_t>& targets);

/// Builds the relocated copy of `w` (original address `ip`) to run at
/// `slot`: every instruction with its rip-relative displacement re-aimed, a
/// final direct branch re-encoded with a rel32 from the slot (a call pushes
/// the original return address, ip + w.len; an indirect call pushes its
/// operand, then that return address, and jumps through the stack, leaving
/// the target in the dead quadword below the callee's rsp), then a jump back
/// to ip + w.len.
/// Writes at most kWindowSlotSize bytes; returns the length, or 0 with `why`
/// set when a target is out of rel32 reach of the slot. Not hot.
std::size_t build_window_xol(const EntryWindow& w, std::uint64_t ip, std::uint64_t slot, std::uint8_t* out,
                             std::string& why);

/// True when the `n` bytes at `b` are only filler: nops and int3 (the
/// alignment between two functions, which nothing runs or branches to).
/// Not async-signal-safe (Capstone). Thread-safe.
bool is_filler(const std::uint8_t* b, std::size_t n);

/// How a probe site is patched: the tactic plan() chooses.
enum class Tactic : std::uint8_t {
  int3,    ///< the breakpoint only: every hit traps (emulated or out of line)
  nop5,    ///< a 5-byte nop (is_nop5()) becomes a jmp rel32 to a stub; nothing is displaced
  window,  ///< a jmp rel32 over >= kJumpLen bytes of whole instructions, which run relocated from a
           ///< window slot (at a function's entry: the core's "entry window"; E9Patch's B1 when one instruction)
  punned,  ///< a jmp rel32 over one shorter instruction whose rel32's high bytes are the original bytes
           ///< after it (E9Patch's B2): it lands on a hop, placed in punned_jump_range(), that jumps to the stub
};

/// What plan() asks the core about a site's surroundings: the facts of the
/// file (function bounds, neighbours, data, exception tables) that the bytes
/// at the site cannot show. Implemented by src/attach/validate.cpp at attach
/// time. Not hot.
class PlanContext {
 public:
  /// The bytes of the function enclosing the site, from its entry.
  struct Function {
    const std::uint8_t* code = nullptr;  ///< the function's bytes, then `padding` filler bytes
    std::size_t size = 0;                ///< the function's size
    std::size_t at = 0;                  ///< the site, relative to code
    std::size_t padding = 0;             ///< filler after the function (is_filler()) that a window may cover
  };
  /// Whether the site is the entry of a function of known bounds.
  virtual bool at_function_entry() const = 0;
  /// The enclosing function for a window inside it; `tail`: when fewer bytes
  /// than that follow the site in the function, the filler after it is
  /// appended (Function::padding). False, with the reason in `why`, when no
  /// function of known bounds holds the site, when its sweep from the entry
  /// does not reach the site as an instruction start, or when the function
  /// may be resumed where its bytes cannot show (exception landing pads).
  virtual bool function(std::size_t tail, Function& out, std::string& why) = 0;
  /// Whether nothing outside the function's own bytes may enter the window
  /// (site, site + len): no neighbouring function's direct branch
  /// (check_neighbour_branches()), no jump-table entry (rip_data_refs()) or
  /// stored code address in the file's data. False with the reason in `why`.
  virtual bool no_outside_entry(std::size_t len, std::string& why) = 0;
  /// The file's `n` bytes at the site; false when fewer exist there.
  virtual bool site_bytes(std::uint8_t* out, std::size_t n) = 0;
  /// Whether successor eviction (EntryWindow::evict) is to be planned.
  virtual bool evict_wanted() const { return false; }
  /// Whether the byte `off` bytes past the site is known to be code of the
  /// site's function (a function of known bounds, disassembled from its
  /// entry up to the site, holds it): after a jump or a return, only then is
  /// what follows evicted (it may be another function's data otherwise).
  virtual bool code_at(std::size_t off) const {
    (void)off;
    return false;
  }

 protected:
  ~PlanContext() = default;
};

/// A probe site's patch plan (position independent: the same for every
/// mapping of the file). What each site of it is built from, per mapping
/// (src/attach/sites.cpp, xol.cpp): an XOL slot (kXolSlotSize, build_xol(),
/// within disp32 reach of a rip-relative operand's target), a window slot
/// when window.len (kWindowSlotSize, build_window_xol(), within rel32 reach
/// of the site) and, for every tactic but int3, a stub (kOptStubSize,
/// build_opt_stub(), within rel32 reach of the site; for punned, of a hop
/// placed inside punned_jump_range()).
struct PatchPlan {
  Tactic tactic = Tactic::int3;
  /// The displaced instructions and the original bytes the jump covers
  /// (len 0: none). Planned for a nop5 too: its int3 hits run the window slot
  /// while a conversion is under way.
  EntryWindow window;
  /// Why no window (nor punned jump) was planned; "" when one was.
  std::string why_no_window;
  /// For a punned window: why no successor eviction (EntryWindow::evict)
  /// was planned; "" when one was (or no punned jump).
  std::string why_no_evict;
};

/// The kernel has no counterpart (its uprobes always trap; kprobes'
/// can_optimize() is the nearest): plans how the probe at the instruction
/// `insn` (analyze()'s result for the site) is patched. In order: an
/// instruction as long as the jump, off a function's entry, is a window of
/// its own; else a window inside the enclosing function (plan_window(),
/// then ctx.no_outside_entry()); else, for an instruction shorter than the
/// jump, a punned jump (plan_punned() on ctx.site_bytes()). The tactic is
/// nop5 for a 5-byte nop whatever the window, else punned, window or int3.
/// Not async-signal-safe (Capstone). Thread-safe.
PatchPlan plan(const Insn& insn, PlanContext& ctx);

/// Offset of OptSite::owner inside a stub block.
std::size_t opt_stub_owner_offset() noexcept;

/// Encodes `jmp rel32` at `from` to `to` into out[0 .. pad + kJumpLen):
/// `pad` (<= kMaxJumpPad) prefixes of kJumpPadPrefix first (a padded punned
/// jump, E9Patch's T1), the rel32 counted from from + pad + kJumpLen. Pure,
/// async-signal-safe.
void encode_jump(std::uint64_t from, std::uint64_t to, std::uint8_t* out, std::size_t pad = 0) noexcept;

/// The length of the (possibly padded) `jmp rel32` that `code` (n bytes)
/// starts with, as encode_jump() writes it: pad + kJumpLen when code holds
/// up to kMaxJumpPad bytes of kJumpPadPrefix (in any order) and then the
/// opcode, else 0. Reads at most kMaxJumpPad + 1 bytes (a caller that read
/// kJumpLen bytes learns how many it needs). Pure, async-signal-safe.
std::size_t jump_len(const std::uint8_t* code, std::size_t n) noexcept;

/// The target of the (possibly padded, jump_len()) `jmp rel32` in `code`
/// (n bytes read at `from`), 0 when they are not one or are too few (a
/// punned site's hop is one, to the site's stub). Async-signal-safe.
std::uint64_t decode_jump(std::uint64_t from, const std::uint8_t* code, std::size_t n = kJumpLen) noexcept;

/// Copies the user registers out of / into a signal ucontext.
/// Async-signal-safe. regs_to_ucontext only writes the fields a handler may
/// change (GPRs, rip, rsp, arithmetic/direction/trap flags of rflags).
void regs_from_ucontext(const ucontext_t* uc, Regs& regs) noexcept;
void regs_to_ucontext(const Regs& regs, ucontext_t* uc) noexcept;

/// The frame the return trampoline would build (xmm0, xmm1, the GPRs and
/// rflags in regs; regs.rip, regs.rsp and ret_slot left 0) from a signal
/// ucontext, and back: the GPRs, the arithmetic/direction/trap flags,
/// xmm0/xmm1 and rip = ret_slot (the continuation the dispatch chose). For
/// a program single-stepping itself into the trampoline (the SIGTRAP handler
/// runs the return there instead). Async-signal-safe.
void ret_frame_from_ucontext(const ucontext_t* uc, RetFrame& f) noexcept;
void ret_frame_to_ucontext(const RetFrame& f, ucontext_t* uc) noexcept;

/// After an out-of-line pushf single-stepped under our own TF (stores_flags()):
/// clears TF in the flags word it stored at the ucontext's stack pointer, so
/// the program reads its own TF (clear). Async-signal-safe.
void clear_stored_trap_flag(const ucontext_t* uc) noexcept;

/// The instruction pointer in a ucontext, and setting it.
std::uint64_t ucontext_ip(const ucontext_t* uc) noexcept;
void set_ucontext_ip(ucontext_t* uc, std::uint64_t ip) noexcept;
std::uint64_t ucontext_flags(const ucontext_t* uc) noexcept;
std::uint64_t ucontext_sp(const ucontext_t* uc) noexcept;
void set_ucontext_flags(ucontext_t* uc, std::uint64_t flags) noexcept;

/// Copies n bytes at `src` of this process to `dst` with loads that may
/// fault (user_copy.S): the SIGSEGV/SIGBUS handler resumes a faulting one
/// through user_copy_fixup(). Returns n, or the bytes copied before the first
/// one that cannot be read (those are in dst). Call only where such a fault
/// reaches user_copy_fixup(): the signal unblocked and libuprobe's handler
/// installed. Async-signal-safe; no stack beyond the call, no system call.
std::size_t copy_user(void* dst, const void* src, std::size_t n) noexcept;

/// The string at `src` (its bytes up to and including the first NUL, at most
/// `size` bytes read) copied to `dst`, as copy_user(): returns the NUL's
/// index (the string's length), `size` when the first `size` bytes hold no
/// NUL (all copied, no NUL written), -1 when a byte up to there cannot be
/// read. The kernel's do_strncpy_from_user() with its byte-at-a-time
/// fallback (lib/strncpy_from_user.c). Same conditions as copy_user().
long copy_user_str(char* dst, const void* src, std::size_t size) noexcept;

/// The exception-table lookup of a SIGSEGV or SIGBUS (the kernel's
/// fixup_exception(), arch/x86/mm/extable.c): when the fault (si_code > 0:
/// raised by the kernel for the instruction, not sent) is at one of the
/// loads of copy_user() or copy_user_str(), points the ucontext at the
/// routine's fixup, which returns what was copied, and returns true. False
/// for any other signal: it is not ours. Async-signal-safe.
bool user_copy_fixup(const siginfo_t* info, ucontext_t* uc) noexcept;

/// The address of the probed instruction given the ucontext of its SIGTRAP
/// (the kernel's uprobe_get_swbp_addr(): ip - 1 after int3).
inline std::uint64_t breakpoint_address(const ucontext_t* uc) noexcept {
  return ucontext_ip(uc) - kBreakpointLen;
}

}  // namespace uprobe::arch

/// Places a function in the section `uprobe_opt_path`: the code a thread
/// runs between an optimized-probe stub's call and its continuation while it
/// is not inside an RCU read-side section (the stub's C entry, uprobe_opt_hit()
/// with what it inlines, the read-side section's own entry and exit, the
/// one-time claim of a thread's counters, and every stub's way out,
/// uprobe_opt_stub_exit in opt_stub.S). The registry reuses a retired stub
/// only after two observations of every thread, a grace period apart, saw no
/// thread's instruction pointer in the stub, its slots or this section
/// (reclaim_retired(), src/attach/sites.cpp; the linker's
/// __start_uprobe_opt_path/__stop_uprobe_opt_path bound it). src/hit/rcu_read.c
/// (C) spells the same attribute out.
#define UPROBE_OPT_PATH_TEXT __attribute__((section("uprobe_opt_path")))

/// The core's callbacks: the functions src/ defines (extern "C", hidden)
/// that the code under arch/ calls or names. Each is declared here only.
extern "C" {
/// The SIGTRAP handler proper (src/hit/trap.cpp), tail-called by
/// uprobe_sigtrap_entry (trap_entry.S). Async-signal-safe.
void uprobe_sigtrap_handler(int sig, siginfo_t* info, void* ucontext) noexcept;
/// The C entry of an optimized hit (src/hit/dispatch.cpp), called or
/// tail-called by uprobe_opt_entry() (opt_entry.cpp): `frame` is the Regs
/// the stub pushed; runs the hit and sets the stub's continuation.
/// Async-signal-safe, allocation-free, no system call.
void uprobe_opt_hit(std::uint64_t* frame, const uprobe::arch::OptSite* site) noexcept;
/// The core's side of a return (src/hit/uretprobe.cpp), called by the return
/// trampoline (ret_trampoline.S, through opt_entry.cpp): pops the returning
/// instance(s), runs the ret_handlers on f->regs, sets f->ret_slot.
/// Async-signal-safe.
void uprobe_ret_dispatch(uprobe::arch::RetFrame* f) noexcept;
/// The return trampoline's landing pad helper (src/interpose/unwind_glue.cpp,
/// called by ret_trampoline.S): pops the return instances an exception
/// unwinds past `sp` and returns the real return address.
std::uint64_t uprobe_ret_unwind_pop(std::uint64_t sp) noexcept;
/// The personality routine of the return trampoline's CFI
/// (src/interpose/unwind_glue.cpp, named by ret_trampoline.S's
/// .cfi_personality): lands in uprobe_ret_unwind_landing in the cleanup phase.
_Unwind_Reason_Code uprobe_ret_personality(int version, _Unwind_Action actions, _Unwind_Exception_Class cls,
                                           struct _Unwind_Exception* exc, struct _Unwind_Context* ctx);
/// The calling thread's SIGTRAP bit as the program sees its own mask: 1 when
/// the program asked for SIGTRAP blocked (it never is for real)
/// (src/interpose/masks.cpp). Initial-exec TLS, read by
/// arch/x86_64/interpose/context.S (getcontext(), __sigsetjmp()) and by the
/// SIGTRAP handler. Written only by its own thread.
extern __thread unsigned char uprobe_view_blocked __attribute__((tls_model("initial-exec")));
}
