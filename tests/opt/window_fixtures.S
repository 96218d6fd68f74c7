/* SPDX-License-Identifier: MIT
 * Fixtures of the mid-function window tests (window_test.cpp): sites inside
 * a function whose instructions from the site on the 5-byte jump displaces
 * (Config::optimize_windows), one per kind of relocation, and sites that must
 * stay int3, one per reason: a branch, a PIC jump-table entry, a label
 * address stored in data, a call before the window's end, exception landing
 * pads, a neighbour's branch. Every function has .type/.size.
 */

#include "fixtures.inc"

        .section .rodata
        .p2align 3
win_data:
        .quad 0x5000
        .text

/* (3a + b) ^ 5; site at the add: add(3) + xor(4) = 7 bytes displaced */
FUNC win_mid
        mov %rdi, %rax
        lea (%rax,%rax,2), %rax
1:      add %rsi, %rax
        xor $5, %rax
        ret
ENDF win_mid
        SITE win_mid, 1b

/* a + b + 0x5000 with a rip-relative load: the whole window (7 bytes) */
FUNC win_rip
        lea (%rdi,%rsi), %rax
1:      mov win_data(%rip), %rcx
        add %rcx, %rax
        ret
ENDF win_rip
        SITE win_rip, 1b

/* a ? a + b : 77, site at the test: test(3) + je rel8(2) relocated as rel32 */
FUNC win_jcc
        mov %rsi, %rdx
1:      test %rdi, %rdi
        je 2f
        lea (%rdi,%rdx), %rax
        ret
2:      mov $77, %eax
        ret
ENDF win_jcc
        SITE win_jcc, 1b

/* 2 * (a + 1) + b: the window is a call (the last displaced instruction),
 * which pushes the original return address */
FUNC win_call_last
        push %rbx
        mov %rsi, %rbx
1:      call win_helper
        lea (%rax,%rbx), %rax
        pop %rbx
        ret
ENDF win_call_last
        SITE win_call_last, 1b

FUNC win_helper
        lea 1(%rdi), %rax
        add %rax, %rax
        ret
ENDF win_helper

/* Returns its own return address (what an indirect call pushed). */
FUNC win_retaddr
        mov (%rsp), %rax
        ret
ENDF win_retaddr

/* An indirect call through a register as the window's last instruction:
 * add(3) + call *%rdx(2). a + b when the callee saw the original return
 * address (label 2, right after the call), anything else otherwise. */
FUNC win_icall_reg
        push %rbx
        lea win_retaddr(%rip), %rdx
        mov %rsi, %rbx
1:      add %rdi, %rbx
        call *%rdx
2:      lea 2b(%rip), %rcx
        sub %rcx, %rax
        add %rbx, %rax
        pop %rbx
        ret
ENDF win_icall_reg
        SITE win_icall_reg, 1b

/* call *win_icall_ptr(%rip) (6 bytes, through a pointer in data as a GOT
 * call is): a window of its own. a when the return address is right. */
FUNC win_icall_rip
        push %rbx
        mov %rdi, %rbx
1:      call *win_icall_ptr(%rip)
2:      lea 2b(%rip), %rcx
        sub %rcx, %rax
        add %rbx, %rax
        pop %rbx
        ret
ENDF win_icall_rip
        SITE win_icall_rip, 1b
        .section .data.rel.ro,"aw"
        .p2align 3
win_icall_ptr:
        .quad win_retaddr
        .text

/* call *8(%rsp) (4 bytes, no window: a punned jump), the operand based on
 * rsp (read before the push). a + b when the return address is right. */
FUNC win_icall_rsp
        lea win_retaddr(%rip), %rax
        push %rax
        push %rdi
1:      call *8(%rsp)
2:      lea 2b(%rip), %rcx
        sub %rcx, %rax
        pop %rdi
        add %rdi, %rax
        pop %rcx
        add %rsi, %rax
        ret
ENDF win_icall_rsp
        SITE win_icall_rsp, 1b

/* Refused: an indirect call in the window (xor(2) + call *%rdx(2) + ...):
 * 2 * (a + 1) */
FUNC win_call_inside
        push %rbx
        lea win_helper(%rip), %rdx
1:      xor %ebx, %ebx
        call *%rdx
        add %rbx, %rax
        pop %rbx
        ret
ENDF win_call_inside
        SITE win_call_inside, 1b

/* Refused: sum 1..a with a loop whose backward branch lands 3 bytes into the
 * window at the site (mov(3) + the loop head) */
FUNC win_loop
        xor %eax, %eax
1:      mov %rdi, %rcx
2:      add %rcx, %rax
        dec %rcx
        jnz 2b
        ret
ENDF win_loop
        SITE win_loop, 1b
        OFF win_loop, 2b, win_loop_target

/* Refused: a switch through a PIC jump table (32-bit offsets from the
 * table, as GCC emits); case 1's label is 2 bytes into the window at case
 * 0's `jmp` (jmp(2) + lea(3)). Nothing else branches there.
 * a == 0: a + b; a == 1: a + 1 + b; else 0 */
FUNC win_table
        cmp $1, %rdi
        ja 9f
        lea 5f(%rip), %rdx
        movslq (%rdx,%rdi,4), %rax
        add %rdx, %rax
        jmp *%rax
3:      mov %rdi, %rax
1:      jmp 8f
4:      lea 1(%rdi), %rax
8:      add %rsi, %rax
        ret
9:      xor %eax, %eax
        ret
ENDF win_table
        SITE win_table, 1b
        OFF win_table, 4b, win_table_case1
        .section .rodata
        .p2align 2
5:      .long 3b - 5b
        .long 4b - 5b
        .text

/* Refused: a computed goto through a table of label addresses in data
 * (R_X86_64_RELATIVE in this PIE); label 1 is 2 bytes into the window at
 * label 0's `jmp`. a == 0: a + b; a == 1: a + 1 + b */
FUNC win_goto
        lea win_goto_labels(%rip), %rdx
        jmp *(%rdx,%rdi,8)
3:      mov %rdi, %rax
1:      jmp 8f
4:      lea 1(%rdi), %rax
8:      add %rsi, %rax
        ret
ENDF win_goto
        SITE win_goto, 1b
        OFF win_goto, 4b, win_goto_label1
        .section .data.rel.ro,"aw"
        .p2align 3
win_goto_labels:
        .quad 3b
        .quad 4b
        .text

/* Refused at 1b: a function with exception landing pads (its FDE points
 * to an LSDA); ((3a + b) ^ 5) + 0x1000. Optimized at 2b: a 6-byte
 * instruction is a window of its own (E9Patch's B1), whatever the function */
        .text
        .globl win_lsda
        .type win_lsda, @function
        .p2align 4
win_lsda:
        .cfi_startproc
        .cfi_lsda 0x1b, .Lwin_lsda_table
        mov %rdi, %rax
        lea (%rax,%rax,2), %rax
1:      add %rsi, %rax
        xor $5, %rax
2:      add $0x1000, %rax
        ret
        .cfi_endproc
ENDF win_lsda
        SITE win_lsda, 1b
        OFF win_lsda, 2b, win_lsda_b1
        .section .gcc_except_table,"a",@progbits
.Lwin_lsda_table:
        .byte 0xff, 0xff, 0x01, 0x00  /* LPStart omit, TType omit, uleb128 call sites, 0 bytes */
        .text

/* Refused: a neighbour (win_neigh_b) jumps 3 bytes into the window at
 * win_neigh_a's site (mov(3) + add(3)). a: 2a + b; b: a + b + 1 */
FUNC win_neigh_a
        mov %rdi, %rax
1:      mov %rsi, %rcx
.Lwin_neigh_a_2:
        add %rdi, %rax
        add %rcx, %rax
        ret
ENDF win_neigh_a
        SITE win_neigh_a, 1b

FUNC win_neigh_b
        lea 1(%rsi), %rcx
        xor %eax, %eax
        jmp .Lwin_neigh_a_2
ENDF win_neigh_b
        .section .note.GNU-stack,"",@progbits
