// SPDX-License-Identifier: MIT
#pragma once
/// @file insn.hpp
/// Part of the arch boundary (arch.hpp includes it): an analyzed
/// instruction (Insn), how it continues after a hit (XolOps: emulation, the
/// out-of-line copy, single-step plans), the optimized stub's building.

#include <signal.h>
#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "frames.hpp"

namespace uprobe::arch {

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

}  // namespace uprobe::arch
