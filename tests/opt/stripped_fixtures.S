/* SPDX-License-Identifier: MIT
 * Fixtures of opt_stripped (stripped_test.cpp), linked with -s: no .symtab,
 * and these functions are not exported, so their only bounds are their
 * .eh_frame FDEs (.cfi_startproc .. .cfi_endproc). The *_end labels are
 * resolved at link time, so the test knows each function's length without
 * a symbol table.
 */

        .text
        .globl strip_mix, strip_mix_end, strip_leaf, strip_leaf_end
        .hidden strip_mix, strip_mix_end, strip_leaf, strip_leaf_end

/* 3a + b, through a frame: push %rbp; mov %rsp,%rbp (window 4 + 1?) */
        .p2align 4
strip_mix:
        .cfi_startproc
        push %rbp
        .cfi_def_cfa_offset 16
        .cfi_offset %rbp, -16
        mov %rsp, %rbp
        .cfi_def_cfa_register %rbp
        lea (%rdi,%rdi,2), %rax
        add %rsi, %rax
        pop %rbp
        .cfi_def_cfa %rsp, 8
        ret
        .cfi_endproc
strip_mix_end:

/* a ^ b, a leaf (window: mov 3 + xor 3 = 6) */
        .p2align 4
strip_leaf:
        .cfi_startproc
        mov %rdi, %rax
        xor %rsi, %rax
        ret
        .cfi_endproc
strip_leaf_end:

        .section .note.GNU-stack,"",@progbits
