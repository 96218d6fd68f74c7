/* SPDX-License-Identifier: MIT
 * Probe fixtures of the process-life suite (tests/life): exact instruction
 * layout for the single-step (TF), pushf, vector-state, stack-alignment and
 * cancellation tests.
 *
 * Every function is .globl with .type/.size (the runtime's mid-instruction
 * check reads the symbol table). 5-byte nops are spelled with .byte so the
 * assembler cannot pick another encoding; a nop5 site is optimized (jmp rel32
 * into a stub) by default and stays int3 with Config::optimize = false.
 * `OFF fn, label, name` exports `name`, a .quad in .rodata holding
 * `label - fn`.
 */

#include "fixtures.inc"

        .macro TF_ON
        pushfq
        orq $0x100, (%rsp)
        popfq
        .endm

        .macro TF_OFF
        pushfq
        andq $~0x100, (%rsp)
        popfq
        .endm

/* ===================================================================== */
/* Plain probed functions                                                */
/* ===================================================================== */

/* a + b, nop5 at the entry (entry and return probes). */
FUNC lf_add
        NOP5
        lea (%rdi,%rsi), %rax
        ret
ENDF lf_add

/* a * b, nop5 at the entry. */
FUNC lf_mul
        NOP5
        mov %rdi, %rax
        imul %rsi, %rax
        ret
ENDF lf_mul

/* long lf_outer(long a): a nop5 entry that tail-jumps to the C++ body
 * lf_outer_body(a) (life_common.cpp, which runs the test's g_outer_body): a
 * return probe here hijacks the return address the body returns through, so
 * the body runs with a return in flight and an unwind out of it meets the
 * hijacked slot. */
FUNC lf_outer
        NOP5
        jmp lf_outer_body
ENDF lf_outer

/* A foreign trap: a raw int3 in the program's own code, then 0x77. */
FUNC lf_int3
        int3
        mov $0x77, %eax
        ret
ENDF lf_int3

/* ===================================================================== */
/* Single-stepping (TF)                                                  */
/* ===================================================================== */

/* (a + b) * 3 + callee: sets TF, runs a region with four probe sites
 * (a nop5, an out-of-line imul, an emulated push, a call to lf_step_callee
 * whose entry is a nop5), clears TF. Every instruction between the popfq that
 * sets TF and the one after the popfq that clears it raises one single-step
 * trap in the program's own SIGTRAP handler. */
FUNC lf_step_run
        pushfq
        orq $0x100, (%rsp)
.Lstep_on_popf:
        popfq
        nop
.Lstep_nop5:
        NOP5
        lea (%rdi,%rsi), %rax
.Lstep_xol:
        imul $3, %rax, %rax
.Lstep_push:
        push %rax
        pop %rax
        mov %rdi, %rdx
        call lf_step_callee
        add %rdx, %rax
        pushfq
        andq $~0x100, (%rsp)
.Lstep_off_popf:
        popfq
        ret
ENDF lf_step_run
OFF lf_step_run, .Lstep_on_popf, lf_step_on_popf_site
OFF lf_step_run, .Lstep_off_popf, lf_step_off_popf_site
OFF lf_step_run, .Lstep_nop5, lf_step_nop5_site
OFF lf_step_run, .Lstep_xol, lf_step_xol_site
OFF lf_step_run, .Lstep_push, lf_step_push_site

/* lf_step_ev(a, b) = a + b + 0x1234 (a, b below 2^31) with TF set: a
 * 1-byte site (xchg %eax, %ecx, which zero-extends both) that a branch
 * enters right after (b == 0: no window applies, a 1-byte instruction has
 * no padded form), then its successor add $0x1234, %rax (48 05 34 12 00
 * 00), which the branch lands on: with the page the site's punned jump
 * [48 05 34 12] selects taken, a probe at the site evicts the successor
 * (E9Patch's T2). Without a probe the program sees 8 steps (b != 0) or 7. */
FUNC lf_step_ev
        mov %rdi, %rax
        mov %rsi, %rcx
        TF_ON
        test %rsi, %rsi
        jz .Lstepev_succ
.Lstepev_site:
        .byte 0x91
.Lstepev_succ:
        .byte 0x48, 0x05, 0x34, 0x12, 0x00, 0x00
        add %rcx, %rax
        TF_OFF
        ret
ENDF lf_step_ev
OFF lf_step_ev, .Lstepev_site, lf_step_ev_site

/* rdx + 1 (called from lf_step_run with TF set; rax is live). */
FUNC lf_step_callee
        NOP5
        add $1, %rdx
        ret
ENDF lf_step_callee

/* lf_add(a, b) + 1 called with TF set: the step crosses lf_add's entry
 * probe and, with a return probe, its return through the trampoline. */
FUNC lf_step_ret
        TF_ON
        call lf_add
        add $1, %rax
        TF_OFF
        ret
ENDF lf_step_ret

/* lf_step_rep(n): rep movsb of n & 63 bytes from lf_rep_buf to lf_rep_buf +
 * 64 with TF set; returns the bytes moved + (rcx after it << 12). Without a
 * probe the program sees a step after every iteration (at the rep movsb
 * itself, then after it). */
FUNC lf_step_rep
        mov %rdi, %rcx
        and $63, %ecx
        lea lf_rep_buf(%rip), %rsi
        lea 64+lf_rep_buf(%rip), %rdi
        mov %rdi, %rdx
        TF_ON
.Lsteprep_s:
        rep movsb
        TF_OFF
        mov %rdi, %rax
        sub %rdx, %rax
        shl $12, %rcx
        add %rcx, %rax
        ret
ENDF lf_step_rep
OFF lf_step_rep, .Lsteprep_s, lf_step_rep_site
        .pushsection .data
        .globl lf_rep_buf
        .type lf_rep_buf, @object
lf_rep_buf:
        .fill 128, 1, 0x5a
        .size lf_rep_buf, 128
        .popsection

/* a + b through a function with a real prologue (no nop5): an entry probe
 * here is optimized by displacing push, mov and add (a 7-byte window). */
FUNC lf_win
        push %rbx
        mov %rdi, %rax
        add %rsi, %rax
        pop %rbx
        ret
ENDF lf_win

/* lf_win(a, b) + 1 called with TF set. */
FUNC lf_step_win
        TF_ON
        call lf_win
        add $1, %rax
        TF_OFF
        ret
ENDF lf_step_win

/* rflags as `pushfq; pop %rax` reads them: a nop5 before (probe "before"),
 * then the pushfq (probe "on": int3 only, a 1-byte instruction). */
FUNC lf_pushf
        NOP5
.Lpushf_s:
        pushfq
        pop %rax
        ret
ENDF lf_pushf
OFF lf_pushf, .Lpushf_s, lf_pushf_site

/* lf_pushf() called with TF set (TF cleared again before returning). */
FUNC lf_step_pushf
        TF_ON
        call lf_pushf
        mov %rax, %rdx
        TF_OFF
        mov %rdx, %rax
        ret
ENDF lf_step_pushf

/* ===================================================================== */
/* Vector state and stack alignment                                      */
/* ===================================================================== */

/* double lf_vec_entry(double x): x * x + 1, nop5 at the entry while xmm0
 * holds the argument. */
FUNC lf_vec_entry
        NOP5
        mulsd %xmm0, %xmm0
        addsd .Lone(%rip), %xmm0
        ret
ENDF lf_vec_entry
        .pushsection .rodata
        .p2align 3
.Lone:  .double 1.0
        .popsection

/* lf_ymm_mid(src, dst): ymm0 = src[0..31]; a nop5 with ymm0 live; then
 * dst = ymm0. The site is reached with rsp misaligned by 3 (rsp % 16 == 5):
 * legal between instructions, a hard case for handlers with aligned locals. */
FUNC lf_ymm_mid
        vmovdqu (%rdi), %ymm0
        lea -3(%rsp), %rsp
.Lymm_mid_s:
        NOP5
        lea 3(%rsp), %rsp
        vmovdqu %ymm0, (%rsi)
        vzeroupper
        ret
ENDF lf_ymm_mid
OFF lf_ymm_mid, .Lymm_mid_s, lf_ymm_mid_site

/* lf_ymm_entry_call(src, dst): ymm0 = src[0..31]; call lf_ymm_callee (a nop5
 * entry, ymm0 live across the call); dst = ymm0. */
FUNC lf_ymm_entry_call
        vmovdqu (%rdi), %ymm0
        push %rsi
        call lf_ymm_callee
        pop %rsi
        vmovdqu %ymm0, (%rsi)
        vzeroupper
        ret
ENDF lf_ymm_entry_call

FUNC lf_ymm_callee
        NOP5
        ret
ENDF lf_ymm_callee

/* lf_xmm_pushed(src, dst): xmm0 = src[0..15]; push %rbx so the site runs
 * with rsp % 16 == 0 (the opposite of a function entry); an out-of-line
 * instruction (imul) at the site; dst = xmm0. Returns src[0] * 5. */
FUNC lf_xmm_pushed
        movdqu (%rdi), %xmm0
        push %rbx
.Lxmm_pushed_s:
        imul $5, (%rdi), %rax
        pop %rbx
        movdqu %xmm0, (%rsi)
        ret
ENDF lf_xmm_pushed
OFF lf_xmm_pushed, .Lxmm_pushed_s, lf_xmm_pushed_site

/* (rsp + 8) % 16 at entry: 0 when the caller's stack is aligned as the ABI
 * says (rsp % 16 == 0 at the call). */
FUNC lf_entry_misalign
        lea 8(%rsp), %rax
        and $15, %rax
        ret
ENDF lf_entry_misalign

        .section .note.GNU-stack,"",@progbits
