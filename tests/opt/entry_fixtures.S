/* SPDX-License-Identifier: MIT
 * Fixtures of the optimized function-entry tests (entry_test.cpp): functions
 * whose first instructions the 5-byte jump displaces, one per kind of
 * relocation, and functions that must stay int3 (with the reason why).
 * Every function has .type/.size: the window is planned from the symbol.
 */

#include "fixtures.inc"

        .section .rodata
        .p2align 3
        .globl ent_data
ent_data:
        .quad 0x1234567
        .section .data.rel.ro,"aw"
        .p2align 3
ent_ptr:
        .quad ent_tail_target
        .text

/* Data live below rsp at a function's first instruction: ent_rz_hot stores
 * a and b in its red zone and jumps to ent_rz_cold (window 5: its first
 * load), which adds them: hand-written, as no compiler enters a function so.
 * An entry probe on ent_rz_cold must leave them as they are: a + b */
FUNC ent_rz_hot
        mov %rdi, -16(%rsp)
        mov %rsi, -8(%rsp)
        jmp ent_rz_cold
ENDF ent_rz_hot

FUNC ent_rz_cold
        mov -16(%rsp), %rax
        add -8(%rsp), %rax
        ret
ENDF ent_rz_cold

/* endbr64; push %rbp; mov %rsp,%rbp (window 5 = endbr64 + push): a + 2b */
FUNC ent_frame
        endbr64
        push %rbp
        mov %rsp, %rbp
        lea (%rdi,%rsi,2), %rax
        pop %rbp
        ret
ENDF ent_frame

/* sub $0x18,%rsp; mov %rdi,(%rsp) (window 8): a + b */
FUNC ent_sub
        sub $0x18, %rsp
        mov %rdi, (%rsp)
        mov (%rsp), %rax
        add %rsi, %rax
        add $0x18, %rsp
        ret
ENDF ent_sub

/* mov ent_data(%rip),%rax (window 7, rip-relative): 0x1234567 + a */
FUNC ent_riprel
        mov ent_data(%rip), %rax
        add %rdi, %rax
        ret
ENDF ent_riprel

/* test %rdi,%rdi; je (window 5, Jcc last): a ? a + 1 : 77 */
FUNC ent_jcc
        test %rdi, %rdi
        je 1f
        lea 1(%rdi), %rax
        ret
1:      mov $77, %eax
        ret
ENDF ent_jcc

/* test %edi,%edi; je; mov %rdi,%rax (window 7, Jcc in the middle): a ? a + b : 99 */
FUNC ent_jcc_mid
        test %edi, %edi
        je 1f
        mov %rdi, %rax
        add %rsi, %rax
        ret
1:      mov $99, %eax
        ret
ENDF ent_jcc_mid

/* mov %rdi,%rax; call ent_helper (window 8, call last): 3a + b; the helper
 * records the return address it was given in ent_seen_ret. */
FUNC ent_call
        mov %rdi, %rax
        call ent_helper
        .globl ent_call_ret
ent_call_ret:
        add %rsi, %rax
        ret
ENDF ent_call

FUNC ent_helper
        mov (%rsp), %rcx
        mov %rcx, ent_seen_ret(%rip)
        lea (%rax,%rax,2), %rax
        ret
ENDF ent_helper

/* jmp rel32 (window 5: the function's own jump): a + b via ent_tail_target */
FUNC ent_jmp
        .byte 0xe9                      /* jmp rel32 (the assembler would pick rel8) */
        .long ent_tail_target - . - 4
ENDF ent_jmp

/* jmp *ent_ptr(%rip) (window 6): a + b via ent_tail_target */
FUNC ent_jmp_ind
        jmp *ent_ptr(%rip)
ENDF ent_jmp_ind

FUNC ent_tail_target
        lea (%rdi,%rsi), %rax
        ret
ENDF ent_tail_target

/* Stays int3: its neighbour ent_neigh_pcpy jumps to its second instruction,
 * inside the window, as glibc's __mempcpy_*_erms jumps to
 * __memmove_*_erms+3. ent_neigh_cpy(a, b) = a + b, ent_neigh_pcpy(a, b) =
 * 2a + b. */
FUNC ent_neigh_pcpy
        mov %rdi, %rax
        add %rdi, %rax
        jmp .Lent_neigh_start
ENDF ent_neigh_pcpy

FUNC ent_neigh_cpy
        mov %rdi, %rax
.Lent_neigh_start:
        add %rsi, %rax
        ret
ENDF ent_neigh_cpy

/* Optimized (window 6): its neighbour ent_neigh_tail jumps to its entry
 * (a tail call), never past it. ent_neigh_target(a, b) = a + b,
 * ent_neigh_tail(a, b) = a + 1 + b. */
FUNC ent_neigh_tail
        add $1, %rdi
        jmp ent_neigh_target
ENDF ent_neigh_tail

FUNC ent_neigh_target
        mov %rdi, %rax
        add %rsi, %rax
        ret
ENDF ent_neigh_target

/* Stays int3: 3 bytes long, and the next function starts right after it
 * (no filler bytes the window could cover). Returns 0. */
FUNC ent_short
        xor %eax, %eax
        ret
ENDF ent_short
        .globl ent_short_next
        .type ent_short_next, @function
ent_short_next:
        mov %rdi, %rax
        ret
ENDF ent_short_next

/* Optimized (window 5): 3 bytes long, but its ret is followed by the nop
 * filler up to the next function (.p2align), which the window covers.
 * Returns a + 1. */
FUNC ent_pad_ret
        lea 1(%rdi), %eax
        ret
ENDF ent_pad_ret

/* Optimized (window 5): a 2-byte tail jump followed by filler: a + b via
 * ent_tail_target. */
FUNC ent_pad_jmp
        jmp ent_pad_jmp_target
ENDF ent_pad_jmp

FUNC ent_pad_jmp_target
        lea (%rdi,%rsi), %rax
        ret
ENDF ent_pad_jmp_target

/* Optimized (window 5): `mov 8(%rdi), %rax; ret`, the ret as the last
 * displaced instruction. Returns p[1]. */
FUNC ent_ret_last
        mov 8(%rdi), %eax
        nop
        ret
ENDF ent_ret_last

/* Stays int3: the loop branches to +2, inside the window (C-04). a * b */
FUNC ent_c04
        xor %eax, %eax
1:      add %rdi, %rax
        dec %rsi
        jnz 1b
        ret
ENDF ent_c04

/* Stays int3: a system call inside the window. Returns getpid(). */
FUNC ent_syscall
        xor %eax, %eax
        mov $39, %al
        syscall
        ret
ENDF ent_syscall

/* Stays int3: returns within the first 5 bytes. Returns a. */
FUNC ent_ret
        mov %rdi, %rax
        ret
        int3
        int3
ENDF ent_ret

/* push %rbp; mov %rsp,%rbp; nop (window 5); leaves every register but rbp's
 * saved copy alone: the register driver's callee. */
FUNC ent_leaf
        push %rbp
        mov %rsp, %rbp
        nop
        pop %rbp
        ret
ENDF ent_leaf

/* push %rbp; mov (%rdi),%rax (window 5): returns *a. The userfaultfd test
 * stops a thread on the load at +1, inside the window. */
FUNC ent_load
        push %rbp
        mov (%rdi), %rax
        nop
        pop %rbp
        ret
ENDF ent_load
        .globl ent_load_fault
        .set ent_load_fault, ent_load + 1

/* double ent_fadd(double a, double b) = a + b; window push/mov/addsd (8). */
FUNC ent_fadd
        push %rbp
        mov %rsp, %rbp
        addsd %xmm1, %xmm0
        pop %rbp
        ret
ENDF ent_fadd

/* void ent_regs_driver(const uint64_t in[17], uint64_t out[17]): loads
 * rax rcx rdx rbx rbp rsi rdi r8..r15 (15 values, in[] order below) and
 * rflags = in[16] (arithmetic flags only), calls ent_leaf, stores the same
 * registers and rflags into out[]. in/out order: rax rcx rdx rbx rbp rsi
 * rdi r8 r9 r10 r11 r12 r13 r14 r15, (unused), rflags. */
FUNC ent_regs_driver
        push %rbx
        push %rbp
        push %r12
        push %r13
        push %r14
        push %r15
        push %rsi                       /* out */
        mov %rdi, %r15                  /* in */
        pushq 128(%r15)
        popfq
        mov 0(%r15), %rax
        mov 8(%r15), %rcx
        mov 16(%r15), %rdx
        mov 24(%r15), %rbx
        mov 32(%r15), %rbp
        mov 40(%r15), %rsi
        mov 48(%r15), %rdi
        mov 56(%r15), %r8
        mov 64(%r15), %r9
        mov 72(%r15), %r10
        mov 80(%r15), %r11
        mov 88(%r15), %r12
        mov 96(%r15), %r13
        mov 104(%r15), %r14
        mov 112(%r15), %r15
        call ent_leaf
        push %r15
        mov 8(%rsp), %r15               /* out */
        pop 112(%r15)
        mov %rax, 0(%r15)
        mov %rcx, 8(%r15)
        mov %rdx, 16(%r15)
        mov %rbx, 24(%r15)
        mov %rbp, 32(%r15)
        mov %rsi, 40(%r15)
        mov %rdi, 48(%r15)
        mov %r8, 56(%r15)
        mov %r9, 64(%r15)
        mov %r10, 72(%r15)
        mov %r11, 80(%r15)
        mov %r12, 88(%r15)
        mov %r13, 96(%r15)
        mov %r14, 104(%r15)
        pushfq
        pop 128(%r15)
        pop %rsi
        pop %r15
        pop %r14
        pop %r13
        pop %r12
        pop %rbp
        pop %rbx
        ret
ENDF ent_regs_driver

        .bss
        .globl ent_seen_ret
        .p2align 3
ent_seen_ret:
        .quad 0
        .section .note.GNU-stack,"",@progbits
