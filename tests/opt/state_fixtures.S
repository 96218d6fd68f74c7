/* SPDX-License-Identifier: MIT
 * Fixtures of the vector/x87 state suite (state_test.cpp): live values in
 * every vector register, k0-k7, the MXCSR, the x87 control and status words
 * and the x87 stack, at the three kinds of site libuprobe preserves
 * differently (arch::SaveMode): a function entry, a return, a mid-function
 * nop5. Each comes in three widths (LEVEL 0: xmm0-15, 1: ymm0-15, 2:
 * zmm0-31 and k0-k7).
 *
 * struct AbiState (state_test.cpp), 64-byte aligned:
 *   0    vec[32][64]   the vector registers (the level's width of each)
 *   2048 k[8]
 *   2112 mxcsr (32)  2116 fcw (16)  2118 fsw (16, out: fnstsw)
 *   2120 depth (32, in: x87 values to push)  2124 flags (32, in: bit 0 = raise
 *        x87 PE first: fldpi, fld1, fdivp, fstp)
 *   2128 st[3][16]     in: the x87 values, st0 = st[0] once pushed
 *   2176 fx[512]       out: fxsave64 (tags, TOP, the st registers)
 * state_in is what the fixtures load; state_seen what a probed function saw
 * in its body; state_after the caller's view after the call (or after the
 * mid-function site).
 */

#include "fixtures.inc"

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
        .globl state_in, state_seen, state_after
state_in:       .zero SIZE
state_seen:     .zero SIZE
state_after:    .zero SIZE

/* Loads the level's vector registers (and k0-k7 at level 2) from (%rax). */
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

/* Stores everything to `dest`: vectors, k, mxcsr, fcw, fsw, fxsave64. */
        .macro STOREALL level, dest
        .if \level == 0
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movdqu %xmm\n, \dest+VEC+64*\n(%rip)
        .endr
        .elseif \level == 1
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        vmovdqu %ymm\n, \dest+VEC+64*\n(%rip)
        .endr
        .else
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        vmovdqu64 %zmm\n, \dest+VEC+64*\n(%rip)
        .endr
        .irp n, 0,1,2,3,4,5,6,7
        kmovq %k\n, \dest+KREG+8*\n(%rip)
        .endr
        .endif
        stmxcsr \dest+MXCSR(%rip)
        fnstcw \dest+FCW(%rip)
        fnstsw \dest+FSW(%rip)
        fxsave64 \dest+FX(%rip)
        .endm

/* The x87 part of state_in at (%rax): control word, PE raised when asked,
 * then depth values pushed (st0 = st[0]). Clobbers rcx, rdx. */
        .macro LOADX87
        fldcw FCW(%rax)
        testl $1, FLAGS(%rax)
        jz 1f
        fldpi
        fld1
        fdivp                   /* 1/pi: inexact */
        fstp %st(0)
1:      mov DEPTH(%rax), %ecx
2:      test %ecx, %ecx
        jz 3f
        dec %ecx
        mov %ecx, %edx
        shl $4, %edx
        fldt ST(%rax,%rdx)
        jmp 2b
3:
        .endm

/* The caller-side frame of the drivers: callee-saved GPRs, the caller's
 * MXCSR and x87 control word, a clean x87 state. */
        .macro ENTER_DRIVER
        push %rbx
        push %rbp
        push %r12
        push %r13
        push %r14
        push %r15
        sub $8, %rsp
        fnstcw 0(%rsp)
        stmxcsr 4(%rsp)
        fninit
        .endm

        .macro LEAVE_DRIVER level
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
        .endm

/* ---- A function entry: state_entry_fn_L records what it sees (its body
 * after a frame-pointer prologue the optimized entry displaces);
 * state_call_entry_L loads state_in (x87 values too: site_state=full), calls
 * it and records the caller's view after the return. */
        .macro ENTRY_FIX level
FUNC state_entry_fn_\level
        push %rbp
        mov %rsp, %rbp
        xor %eax, %eax
        STOREALL \level, state_seen
        pop %rbp
        ret
ENDF state_entry_fn_\level

FUNC state_call_entry_\level
        ENTER_DRIVER
        lea state_in(%rip), %rax
        LOADV \level
        ldmxcsr MXCSR(%rax)
        LOADX87
        call state_entry_fn_\level
        STOREALL \level, state_after
        LEAVE_DRIVER \level
ENDF state_call_entry_\level
        .endm

        ENTRY_FIX 0
        ENTRY_FIX 1
        ENTRY_FIX 2

/* ---- A return: state_ret_fn_L leaves state_in in every register (the
 * return values in xmm0/xmm1, ymm0, zmm0, st0/st1 among them) and returns;
 * state_call_ret_L calls it and records what it got back. */
        .macro RET_FIX level
FUNC state_ret_fn_\level
        push %rbp
        mov %rsp, %rbp
        xor %eax, %eax
        lea state_in(%rip), %rax
        LOADV \level
        ldmxcsr MXCSR(%rax)
        LOADX87
        pop %rbp
        ret
ENDF state_ret_fn_\level

FUNC state_call_ret_\level
        ENTER_DRIVER
        call state_ret_fn_\level
        STOREALL \level, state_after
        LEAVE_DRIVER \level
ENDF state_call_ret_\level
        .endm

        RET_FIX 0
        RET_FIX 1
        RET_FIX 2

/* ---- A mid-function nop5 (a USDT-like site): everything live across it. */
        .macro MID_FIX level
FUNC state_mid_\level
        ENTER_DRIVER
        lea state_in(%rip), %rax
        LOADV \level
        ldmxcsr MXCSR(%rax)
        LOADX87
.Lmid\@:
        .byte 0x0f, 0x1f, 0x44, 0x00, 0x00
        STOREALL \level, state_after
        LEAVE_DRIVER \level
ENDF state_mid_\level
OFF state_mid_\level, .Lmid\@, state_mid_\level\()_site
        .endm

        MID_FIX 0
        MID_FIX 1
        MID_FIX 2

        .section .note.GNU-stack,"",@progbits
