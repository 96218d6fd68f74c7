/* SPDX-License-Identifier: MIT
 * Fixtures of the adversarial optimized-entry tests (entry_break_test.cpp):
 * functions whose displaced window a thread can be inside of, or that code
 * outside the function branches into. Every function has .type/.size: the
 * window is planned from the symbol.
 */

#include "fixtures.inc"

/* push %rbp (1); mov (%rdi),%rax (3); nop; pop %rbp; ret: returns *a. The
 * load at +1 is inside the 5-byte window; a SIGSEGV there is handled with
 * the thread's user context inside the window. */
FUNC brk_load
        push %rbp
        mov (%rdi), %rax
        nop
        pop %rbp
        ret
ENDF brk_load
        .globl brk_load_fault
        .set brk_load_fault, brk_load + 1

/* a + b. Window: mov %rdi,%rax (3) + add %rsi,%rax (3) = 6 bytes. The
 * function itself never branches into its window (C-04 passes), but
 * brk_plus1000 below enters at +3, like glibc's __mempcpy_*_unaligned does
 * with L(start) of __memmove_*_unaligned (memmove-vec-unaligned-erms.S). */
FUNC brk_add
        mov %rdi, %rax
        .globl brk_add_mid
brk_add_mid:
        add %rsi, %rax
        ret
ENDF brk_add

/* a + b + 1000, by a tail jump into brk_add at +3. */
FUNC brk_plus1000
        lea 1000(%rdi), %rax
        jmp brk_add_mid
ENDF brk_plus1000

/* a * b, with the loop's back edge in a separate "cold" function (as GCC's
 * foo.cold parts): brk_mul: xor %eax,%eax (2); L: add %rdi,%rax (3) at +2:
 * window 5 = xor + add, and brk_mul_cold jumps back to +2. b >= 1. */
FUNC brk_mul
        xor %eax, %eax
        .globl brk_mul_loop
brk_mul_loop:
        add %rdi, %rax
        dec %rsi
        jnz brk_mul_cold
        ret
ENDF brk_mul

FUNC brk_mul_cold
        jmp brk_mul_loop
ENDF brk_mul_cold

/* a + b through an indirect jump (no direct branch targets the window):
 * xor %eax,%eax (2); L: add %rdi,%rax (3) at +2 ... loops b times via
 * `jmp *%rcx` with rcx = L. The linear sweep cannot see the target. b >= 1. */
FUNC brk_indloop
        xor %eax, %eax
1:      add %rdi, %rax
        lea 1b(%rip), %rcx
        dec %rsi
        jz 2f
        jmp *%rcx
2:      ret
ENDF brk_indloop

/* push %rbp; mov %rsp,%rbp; lea (%rdi,%rsi),%rax; pop %rbp; ret: a + b
 * (window 4 = push + mov, then lea: 8). Probed at entry and at +1 / +4. */
FUNC brk_frame
        push %rbp
        mov %rsp, %rbp
        lea (%rdi,%rsi), %rax
        pop %rbp
        ret
ENDF brk_frame

/* Recursion: brk_fib(n) = n < 2 ? n : brk_fib(n-1) + brk_fib(n-2).
 * push %rbx (1); push %rbp (1); mov %rdi,%rbx (3): window 5. */
FUNC brk_fib
        push %rbx
        push %rbp
        mov %rdi, %rbx
        cmp $2, %rdi
        jb 1f
        lea -1(%rbx), %rdi
        call brk_fib
        mov %rax, %rbp
        lea -2(%rbx), %rdi
        call brk_fib
        add %rbp, %rax
        pop %rbp
        pop %rbx
        ret
1:      mov %rbx, %rax
        pop %rbp
        pop %rbx
        ret
ENDF brk_fib

/* push %rbx (1); call brk_thrower (5): window 6, the call last (relocated
 * as push of the original return address + jmp). With CFI, so that a C++
 * exception thrown by brk_thrower unwinds through this frame. Returns
 * brk_thrower(a) (which throws for odd a). */
FUNC brk_callthrow
        .cfi_startproc
        push %rbx
        .cfi_def_cfa_offset 16
        .cfi_offset %rbx, -16
        call brk_thrower
        pop %rbx
        .cfi_def_cfa_offset 8
        ret
        .cfi_endproc
ENDF brk_callthrow

        .section .note.GNU-stack,"",@progbits
