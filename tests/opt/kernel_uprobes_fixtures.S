# SPDX-License-Identifier: MIT
# Fixtures of kernel_uprobes_test.cpp: each function alone in its page, so
# that each test finds its page as the file maps it (no other test of the
# binary has written there).
        .text

        .p2align 12
        .globl kup_entry_a
        .type kup_entry_a,@function
kup_entry_a:                    # an entry the jump displaces: push, mov, lea
        push %rbp
        mov %rsp, %rbp
        lea 1(%rdi), %rax
        pop %rbp
        ret
        .size kup_entry_a, .-kup_entry_a

        .p2align 4
        .globl kup_nop5_a
        .type kup_nop5_a,@function
kup_nop5_a:                     # a nop5 in the same page
        .byte 0x0f, 0x1f, 0x44, 0x00, 0x00
        lea 2(%rdi), %rax
        ret
        .size kup_nop5_a, .-kup_nop5_a

        .p2align 12
        .globl kup_entry_b
        .type kup_entry_b,@function
kup_entry_b:
        push %rbp
        mov %rsp, %rbp
        lea 3(%rdi), %rax
        pop %rbp
        ret
        .size kup_entry_b, .-kup_entry_b

        .p2align 12
        .globl kup_entry_c
        .type kup_entry_c,@function
kup_entry_c:
        push %rbp
        mov %rsp, %rbp
        lea 5(%rdi), %rax
        pop %rbp
        ret
        .size kup_entry_c, .-kup_entry_c

        .p2align 12
        .globl kup_entry_d
        .type kup_entry_d,@function
kup_entry_d:
        push %rbp
        mov %rsp, %rbp
        lea 7(%rdi), %rax
        pop %rbp
        ret
        .size kup_entry_d, .-kup_entry_d

        .p2align 12
        .globl kup_entry_e
        .type kup_entry_e,@function
kup_entry_e:
        push %rbp
        mov %rsp, %rbp
        lea 9(%rdi), %rax
        pop %rbp
        ret
        .size kup_entry_e, .-kup_entry_e

        .p2align 12
        .globl kup_entry_f
        .type kup_entry_f,@function
kup_entry_f:
        push %rbp
        mov %rsp, %rbp
        lea 11(%rdi), %rax
        pop %rbp
        ret
        .size kup_entry_f, .-kup_entry_f

        .p2align 4
        .globl kup_nop5_f
        .type kup_nop5_f,@function
kup_nop5_f:
        .byte 0x0f, 0x1f, 0x44, 0x00, 0x00
        lea 13(%rdi), %rax
        ret
        .size kup_nop5_f, .-kup_nop5_f

        .p2align 12
        .globl kup_page_end
kup_page_end:
        ret

        .section .note.GNU-stack,"",@progbits
