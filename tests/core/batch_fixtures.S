/* SPDX-License-Identifier: MIT
 * 4096 distinct probe sites for the batch API tests: batch_fx_N(a) returns
 * a + N. Even N start with a nop (emulated), odd N with the lea itself (run
 * out of line), so a batch holds both kinds. batch_fx[] is the table of their
 * addresses.
 */
        .altmacro

        .macro BFX n
        .text
        .p2align 4
        .globl batch_fx_\n
        .type batch_fx_\n, @function
batch_fx_\n:
        .cfi_startproc
        .if (\n % 2) == 0
        nop
        .endif
        lea \n(%rdi), %rax
        ret
        .cfi_endproc
        .size batch_fx_\n, . - batch_fx_\n
        .endm

        .macro BFX_ADDR n
        .quad batch_fx_\n
        .endm

        .set i, 0
        .rept 4096
        BFX %i
        .set i, i+1
        .endr

        .section .data.rel.ro,"aw"
        .p2align 3
        .globl batch_fx
        .type batch_fx, @object
batch_fx:
        .set i, 0
        .rept 4096
        BFX_ADDR %i
        .set i, i+1
        .endr
        .size batch_fx, . - batch_fx

        /* A USDT-style semaphore (16-bit, file-backed .data). */
        .data
        .p2align 1
        .globl batch_sem
        .type batch_sem, @object
batch_sem:
        .short 0
        .size batch_sem, 2

        .section .note.GNU-stack,"",@progbits
