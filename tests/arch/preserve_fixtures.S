/* SPDX-License-Identifier: MIT
 * preserve_run_<L>(mode, fn, ctx) (preserve_test.cpp): loads preserve_in
 * into the registers (L 0: xmm0-15, 1: ymm0-15, 2: zmm0-31 and k0-k7; the
 * MXCSR; the x87 control word, PE raised when asked, `depth` x87 values),
 * calls uprobe::arch::call_preserving(mode, fn, ctx) and stores what it
 * finds after it to preserve_out; XINUSE (xgetbv(1), when the CPU has it)
 * right before and after the call goes to preserve_xinuse[0..1].
 *
 * Layout as state_fixtures.S (tests/opt): vec 0, k 2048, mxcsr 2112,
 * fcw 2116, fsw 2118 (out), depth 2120, flags 2124 (bit 0: raise x87 PE;
 * bit 1: put the x87 state in its initial configuration first, xrstor of
 * an all-zero header; bit 2: vzeroupper first), st 2128, fx 2176 (out).
 */
        .set VEC, 0
        .set KREG, 2048
        .set MXCSR, 2112
        .set FCW, 2116
        .set FSW, 2118
        .set DEPTH, 2120
        .set FLAGS, 2124
        .set ST, 2128
        .set FX, 2176
        .set SIZE, 2688

        .bss
        .p2align 6
        .globl preserve_in, preserve_out, preserve_xinuse, preserve_has_xgetbv1
preserve_in:    .zero SIZE
preserve_out:   .zero SIZE
preserve_xinuse: .zero 8
preserve_has_xgetbv1: .zero 4
        .p2align 6
xrstor_zero:    .zero 576

        .macro LOADV level
        .if \level == 0
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movdqu VEC+64*\n(%rax), %xmm\n
        .endr
        .elseif \level == 1
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        vmovdqu VEC+64*\n(%rax), %ymm\n
        .endr
        .else
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        vmovdqu64 VEC+64*\n(%rax), %zmm\n
        .endr
        .irp n, 0,1,2,3,4,5,6,7
        kmovq KREG+8*\n(%rax), %k\n
        .endr
        .endif
        .endm

        .macro STOREALL level
        .if \level == 0
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movdqu %xmm\n, preserve_out+VEC+64*\n(%rip)
        .endr
        .elseif \level == 1
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        vmovdqu %ymm\n, preserve_out+VEC+64*\n(%rip)
        .endr
        .else
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        vmovdqu64 %zmm\n, preserve_out+VEC+64*\n(%rip)
        .endr
        .irp n, 0,1,2,3,4,5,6,7
        kmovq %k\n, preserve_out+KREG+8*\n(%rip)
        .endr
        .endif
        stmxcsr preserve_out+MXCSR(%rip)
        fnstcw preserve_out+FCW(%rip)
        fnstsw preserve_out+FSW(%rip)
        fxsave64 preserve_out+FX(%rip)
        .endm

        .macro XINUSE_TO reg
        xor \reg, \reg
        cmpl $0, preserve_has_xgetbv1(%rip)
        je 9f
        mov $1, %ecx
        xgetbv
        mov %eax, \reg
9:
        .endm

        .macro RUN level
        .text
        .globl preserve_run_\level
        .type preserve_run_\level, @function
        .p2align 4
preserve_run_\level:
        push %rbx
        push %rbp
        push %r12
        push %r13
        push %r14
        push %r15
        sub $8, %rsp
        fnstcw 0(%rsp)
        stmxcsr 4(%rsp)
        mov %edi, %r12d
        mov %rsi, %r13
        mov %rdx, %r14
        fninit
        lea preserve_in(%rip), %rbx
        testl $2, FLAGS(%rbx)
        jz 1f
        mov $1, %eax                    /* RFBM = x87; XSTATE_BV 0: initial configuration */
        xor %edx, %edx
        xrstor xrstor_zero(%rip)
1:      testl $4, FLAGS(%rbx)
        jz 2f
        vzeroupper
2:      mov %rbx, %rax
        LOADV \level
        ldmxcsr MXCSR(%rbx)
        testl $2, FLAGS(%rbx)           /* initial configuration: no x87 instruction at all */
        jnz 5f
        fldcw FCW(%rbx)
        testl $1, FLAGS(%rbx)
        jz 3f
        fldpi
        fld1
        fdivp
        fstp %st(0)
3:      mov DEPTH(%rbx), %ecx
4:      test %ecx, %ecx
        jz 5f
        dec %ecx
        mov %ecx, %edx
        shl $4, %edx
        fldt ST(%rbx,%rdx)
        jmp 4b
5:      XINUSE_TO %r15d
        mov %r12d, %edi
        mov %r13, %rsi
        mov %r14, %rdx
        call _ZN6uprobe4arch15call_preservingENS0_8SaveModeEPFvPvES2_
        XINUSE_TO %ebx
        STOREALL \level
        mov %r15d, preserve_xinuse(%rip)
        mov %ebx, preserve_xinuse+4(%rip)
        fninit
        ldmxcsr 4(%rsp)
        fldcw 0(%rsp)
        add $8, %rsp
        pop %r15
        pop %r14
        pop %r13
        pop %r12
        pop %rbp
        pop %rbx
        .if \level > 0
        vzeroupper
        .endif
        ret
        .size preserve_run_\level, . - preserve_run_\level
        .endm

        RUN 0
        RUN 1
        RUN 2

        .section .note.GNU-stack,"",@progbits
