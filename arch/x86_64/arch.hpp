// SPDX-License-Identifier: MIT
#pragma once
/// @file arch.hpp
/// The narrow arch boundary (as the kernel's arch_uprobe_* hooks,
/// arch/x86/kernel/uprobes.c): analyze an instruction at register time,
/// emulate it or build its out-of-line (XOL) copy, map ucontext <-> Regs.
/// The core in src/ calls only what is declared here and in the headers it
/// includes (frames.hpp: the optimized paths' frames and stubs; insn.hpp: an
/// analyzed instruction and its continuation; plan.hpp: the tactics); a
/// second architecture provides its own arch/<name>/arch.hpp with the same
/// names.

#include <signal.h>
#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <unwind.h>

#include "uprobe/regs.hpp"

#include "frames.hpp"
#include "preserve_sse.hpp"
#include "insn.hpp"
#include "plan.hpp"

namespace uprobe::arch {

/// Offset of OptSite::owner inside a stub block.
std::size_t opt_stub_owner_offset() noexcept;

/// Takes the kernel's own uprobes out of `mem`, a copy of `n` bytes of code
/// whose file holds `file` there: each int3 where the file has another byte
/// (kernel/events/uprobes.c install_breakpoint(): UPROBE_SWBP_INSN), and
/// each call over a 5-byte nop (arch/x86/kernel/uprobes.c, an optimized
/// uprobe: `call` to the [uprobes] trampoline) gets the file's bytes back.
/// Returns the number of places changed. Pure, async-signal-safe.
std::size_t take_out_kernel_uprobes(std::uint8_t* mem, const std::uint8_t* file, std::size_t n) noexcept;

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
/// The stack pointer a longjmp to `env` resumes with: glibc's saved rsp
/// (__jmpbuf[JB_RSP], 6), demangled (PTR_MANGLE on x86-64: xor with the
/// thread's pointer guard at %fs:0x30, then rol 0x11). Async-signal-safe.
std::uint64_t jmpbuf_sp(const void* env) noexcept;
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

/// The register of the SysV x86-64 n-th integer argument (n in 0..5: rdi,
/// rsi, rdx, rcx, r8, r9; Regs::arg()'s) in `r`; nullptr for n > 5.
inline std::uint64_t* arg_register(Regs& r, unsigned n) noexcept {
  switch (n) {
    case 0: return &r.rdi;
    case 1: return &r.rsi;
    case 2: return &r.rdx;
    case 3: return &r.rcx;
    case 4: return &r.r8;
    case 5: return &r.r9;
    default: return nullptr;
  }
}

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
/// one-time claim of a thread's counters, every stub's way out,
/// uprobe_opt_stub_exit in opt_stub.S, and uprobe_ret_thunk in
/// ret_trampoline.S, which calls an entry stub's continuation: its window
/// slot). The registry reuses a retired stub
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
