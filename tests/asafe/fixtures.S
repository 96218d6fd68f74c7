/* SPDX-License-Identifier: MIT
 * Probe fixtures of the async-signal-safety audit (tests/asafe): one function
 * per hot path. Each is `uint64_t fn(uint64_t a, uint64_t b)` returning a + b
 * (asafe_remove_*: a + 1), .globl with .type/.size (the runtime's
 * mid-instruction check reads the symbol table); the probe goes on the entry.
 */

#include "fixtures.inc"
/* push %rbp at the entry: an emulated instruction (int3 path). */
FUNC asafe_emulated
        push    %rbp
        mov     %rsp, %rbp
        lea     (%rdi,%rsi), %rax
        pop     %rbp
        ret
ENDF asafe_emulated

/* lea at the entry: run out of line from its XOL slot (int3 path). */
FUNC asafe_xol
        lea     (%rdi,%rsi), %rax
        ret
ENDF asafe_xol

/* A 5-byte nop at the entry: an optimized site (jmp rel32 to a stub). */
FUNC asafe_nop5
        .byte   0x0f, 0x1f, 0x44, 0x00, 0x00    /* nopl 0x0(%rax,%rax,1) */
        lea     (%rdi,%rsi), %rax
        ret
ENDF asafe_nop5

/* Action::remove on an int3 site and on an optimized site. */
FUNC asafe_remove_int3
        push    %rbp
        lea     1(%rdi), %rax
        pop     %rbp
        ret
ENDF asafe_remove_int3

FUNC asafe_remove_nop5
        .byte   0x0f, 0x1f, 0x44, 0x00, 0x00
        lea     1(%rdi), %rax
        ret
ENDF asafe_remove_nop5

        .section .note.GNU-stack,"",@progbits
