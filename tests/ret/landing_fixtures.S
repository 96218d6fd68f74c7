/* SPDX-License-Identifier: MIT
 * Fixtures of landing_test.cpp: functions whose first instruction is a nop5
 * (an optimized entry at a function's first byte: a return probe there
 * returns through the landing, arch::opt_frame_leave()). Each records the
 * return address it sees in its slot (ld_seen_ret) and the slot's address
 * (ld_seen_slot) where noted.
 */

#include "fixtures.inc"

        .data
        .p2align 3
        .globl ld_seen_ret
        .type ld_seen_ret, @object
ld_seen_ret:
        .quad 0
        .size ld_seen_ret, 8
        .globl ld_seen_slot
        .type ld_seen_slot, @object
ld_seen_slot:
        .quad 0
        .size ld_seen_slot, 8

        .section .rodata
        .p2align 3
ld_one:
        .double 1.0

/* ld_regs(a, b): rax = a + b, rdx = a ^ b, xmm0 = (double)a,
 * xmm1 = (double)b + 1, rcx r8 r9 r10 r11 = fixed values, CF set; records
 * its return slot and what it holds. */
FUNC ld_regs
        NOP5
        mov %rsp, ld_seen_slot(%rip)
        mov (%rsp), %rax
        mov %rax, ld_seen_ret(%rip)
        cvtsi2sd %rdi, %xmm0
        cvtsi2sd %rsi, %xmm1
        addsd ld_one(%rip), %xmm1
        lea (%rdi,%rsi), %rax
        mov %rdi, %rdx
        xor %rsi, %rdx
        movabs $0x1c1c1c1c1c1c1c1c, %rcx
        movabs $0x0808080808080808, %r8
        movabs $0x0909090909090909, %r9
        movabs $0x1010101010101010, %r10
        movabs $0x1111111111111111, %r11
        stc
        ret
ENDF ld_regs

/* ld_alt(a, b) = 777 (a handler's new rip) */
FUNC ld_alt
        mov $777, %eax
        ret
ENDF ld_alt

/* void ld_drive(fn, a, b, out): sets rbx rbp r12-r15 to fixed values, calls
 * fn(a, b), then stores every general register but rsp, xmm0, xmm1, rflags
 * and (rsp after the return) - (rsp before the call) into out[0..20]:
 * rax rdx rcx rsi rdi r8 r9 r10 r11 rbx rbp r12 r13 r14 r15, xmm0 (2 words),
 * xmm1 (2 words), rflags, rsp delta. */
FUNC ld_drive
        .cfi_startproc
        push %rbx
        .cfi_adjust_cfa_offset 8
        push %rbp
        .cfi_adjust_cfa_offset 8
        push %r12
        .cfi_adjust_cfa_offset 8
        push %r13
        .cfi_adjust_cfa_offset 8
        push %r14
        .cfi_adjust_cfa_offset 8
        push %r15
        .cfi_adjust_cfa_offset 8
        push %rcx                       /* out (and the alignment for the call) */
        .cfi_adjust_cfa_offset 8
        mov %rdi, %rax
        mov %rsi, %rdi
        mov %rdx, %rsi
        movabs $0x0b0b0b0b0b0b0b0b, %rbx
        movabs $0x0e0e0e0e0e0e0e0e, %rbp
        movabs $0x1212121212121212, %r12
        movabs $0x1313131313131313, %r13
        movabs $0x1414141414141414, %r14
        movabs $0x1515151515151515, %r15
        mov %rsp, ld_drive_sp(%rip)
        call *%rax
        pushfq
        .cfi_adjust_cfa_offset 8
        push %rax
        .cfi_adjust_cfa_offset 8
        mov 16(%rsp), %rax              /* out */
        pop 0(%rax)                     /* rax */
        .cfi_adjust_cfa_offset -8
        pop 152(%rax)                   /* rflags */
        .cfi_adjust_cfa_offset -8
        mov %rdx, 8(%rax)
        mov %rcx, 16(%rax)
        mov %rsi, 24(%rax)
        mov %rdi, 32(%rax)
        mov %r8, 40(%rax)
        mov %r9, 48(%rax)
        mov %r10, 56(%rax)
        mov %r11, 64(%rax)
        mov %rbx, 72(%rax)
        mov %rbp, 80(%rax)
        mov %r12, 88(%rax)
        mov %r13, 96(%rax)
        mov %r14, 104(%rax)
        mov %r15, 112(%rax)
        movdqu %xmm0, 120(%rax)
        movdqu %xmm1, 136(%rax)
        mov %rsp, %rdx
        sub ld_drive_sp(%rip), %rdx
        mov %rdx, 160(%rax)
        pop %rcx
        .cfi_adjust_cfa_offset -8
        pop %r15
        .cfi_adjust_cfa_offset -8
        pop %r14
        .cfi_adjust_cfa_offset -8
        pop %r13
        .cfi_adjust_cfa_offset -8
        pop %r12
        .cfi_adjust_cfa_offset -8
        pop %rbp
        .cfi_adjust_cfa_offset -8
        pop %rbx
        .cfi_adjust_cfa_offset -8
        ret
        .cfi_endproc
ENDF ld_drive

        .bss
        .p2align 3
ld_drive_sp:
        .zero 8

/* long double ld_x87(long long a) = a + 1, in st0 */
FUNC ld_x87
        NOP5
        push %rdi
        fildq (%rsp)
        pop %rdi
        fld1
        faddp
        ret
ENDF ld_x87

/* ld_tail_a(x) = ld_tail_b(x + 1) (a tail call); ld_tail_b(x) = 2 * x */
FUNC ld_tail_b
        NOP5
        lea (%rdi,%rdi), %rax
        ret
ENDF ld_tail_b

FUNC ld_tail_a
        NOP5
        lea 1(%rdi), %rdi
        jmp ld_tail_b
ENDF ld_tail_a

/* ld_fact(n) = n <= 1 ? 1 : n * ld_fact(n - 1) */
FUNC ld_fact
        NOP5
        cmp $1, %rdi
        jbe 1f
        push %rdi
        dec %rdi
        call ld_fact
        pop %rdi
        imul %rdi, %rax
        ret
1:      mov $1, %eax
        ret
ENDF ld_fact

/* long ld_cb(long (*fn)(long), long arg) = fn(arg) + 1, with unwind
 * information (C++ exceptions and forced unwinds pass through it); records
 * its return slot and what it holds. */
FUNC ld_cb
        .cfi_startproc
        NOP5
        mov %rsp, ld_seen_slot(%rip)
        mov (%rsp), %rax
        mov %rax, ld_seen_ret(%rip)
        push %rbx
        .cfi_adjust_cfa_offset 8
        .cfi_rel_offset rbx, 0
        mov %rdi, %rax
        mov %rsi, %rdi
        call *%rax
        add $1, %rax
        pop %rbx
        .cfi_adjust_cfa_offset -8
        .cfi_restore rbx
        ret
        .cfi_endproc
ENDF ld_cb

        .section .note.GNU-stack,"",@progbits
