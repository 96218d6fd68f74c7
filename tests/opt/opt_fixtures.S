/* SPDX-License-Identifier: MIT
 * Probe fixtures of the optimized-probe suite (tests/opt).
 *
 * Every function is .globl with .type/.size (the runtime's mid-instruction
 * check reads the symbol table). 5-byte nops are spelled with .byte so the
 * assembler cannot pick another encoding. `OFF fn, label, name` exports
 * `name`, a .quad in .rodata holding `label - fn`.
 *
 * Unless noted a fixture is `uint64_t fn(uint64_t a /rdi/, uint64_t b /rsi/)`.
 */

#include "fixtures.inc"

/* ===================================================================== */
/* Basic sites                                                           */
/* ===================================================================== */

/* nop5 at the entry: a + 2b */
FUNC opt_entry5
        NOP5
        lea (%rdi,%rsi,2), %rax
        ret
ENDF opt_entry5

/* nop5 between real instructions (USDT-like): a*b - b */
FUNC opt_mid5
        mov %rdi, %rax
        imul %rsi, %rax
.Lmid5_s:
        NOP5
        sub %rsi, %rax
        ret
ENDF opt_mid5
OFF opt_mid5, .Lmid5_s, opt_mid5_site

/* nop5 reached with alignment checking on (rflags.AC): a + (rflags.AC after
 * the site); AC cleared before returning. */
FUNC opt_ac5
        pushfq
        orl $0x40000, (%rsp)
        popfq
.Lac5_s:
        NOP5
        pushfq
        pop %rax
        and $0x40000, %eax
        add %rdi, %rax
        pushfq
        andl $~0x40000, (%rsp)
        popfq
        ret
ENDF opt_ac5
OFF opt_ac5, .Lac5_s, opt_ac5_site

/* nop5 reached with rflags = a (its status flags and DF; every other bit as
 * the caller's): returns rflags after the site; DF cleared before returning. */
FUNC opt_flags5
        pushfq
        andl $~0xcd5, (%rsp)
        and $0xcd5, %edi
        or %rdi, (%rsp)
        popfq
.Lflags5_s:
        NOP5
        pushfq
        pop %rax
        cld
        ret
ENDF opt_flags5
OFF opt_flags5, .Lflags5_s, opt_flags5_site

/* Nop encodings at the entry, each followed by lea K(%rdi),%rax; ret (a + K). */
        .macro NOPFN name, k, bytes:vararg
FUNC \name
        .byte \bytes
        lea \k(%rdi), %rax
        ret
ENDF \name
        .endm

        NOPFN opt_nop_0f1f440000, 11, 0x0f, 0x1f, 0x44, 0x00, 0x00   /* nopl 0x0(%rax,%rax,1) (canonical) */
        NOPFN opt_nop_660f1f0400, 12, 0x66, 0x0f, 0x1f, 0x04, 0x00   /* nopw (%rax,%rax,1) */
        NOPFN opt_nop_0f1f440012, 13, 0x0f, 0x1f, 0x44, 0x00, 0x12   /* nopl 0x12(%rax,%rax,1) */
        NOPFN opt_nop_660f1f4012, 14, 0x66, 0x0f, 0x1f, 0x40, 0x12   /* nopw 0x12(%rax) */
        NOPFN opt_nop_2e0f1f4012, 15, 0x2e, 0x0f, 0x1f, 0x40, 0x12   /* cs nopl 0x12(%rax) */
        NOPFN opt_nop_6666666690, 16, 0x66, 0x66, 0x66, 0x66, 0x90   /* data16 x3 xchg %ax,%ax */
        NOPFN opt_nop_660f1f440000, 17, 0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00   /* 6 bytes: nopw 0x0(%rax,%rax,1) */
        NOPFN opt_nop_0f1f4000, 18, 0x0f, 0x1f, 0x40, 0x00                   /* 4 bytes: nopl 0x0(%rax) */
        NOPFN opt_nop_0f1f8000000000, 19, 0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00  /* 7 bytes */

/* Red zone: a at -8(%rsp), b at -128(%rsp), a^b at -64(%rsp); site;
 * returns the sum of the three markers as read back after the site. */
FUNC opt_redzone
        mov %rdi, -8(%rsp)
        mov %rsi, -128(%rsp)
        mov %rdi, %rax
        xor %rsi, %rax
        mov %rax, -64(%rsp)
        xor %eax, %eax
.Lrz_s:
        NOP5
        mov -8(%rsp), %rax
        add -128(%rsp), %rax
        add -64(%rsp), %rax
        ret
ENDF opt_redzone
OFF opt_redzone, .Lrz_s, opt_redzone_site

/* Handler writes: rax = a + b; site; return 2*rax + rdi. */
FUNC opt_hw
        lea (%rdi,%rsi), %rax
.Lhw_s:
        NOP5
        add %rax, %rax
        add %rdi, %rax
        ret
ENDF opt_hw
OFF opt_hw, .Lhw_s, opt_hw_site

/* rip redirect: rax = a; site; a + 1. The alternative label: a + 1000. */
FUNC opt_redir
        mov %rdi, %rax
.Lredir_s:
        NOP5
        add $1, %rax
        ret
.Lredir_alt:
        add $1000, %rax
        ret
ENDF opt_redir
OFF opt_redir, .Lredir_s, opt_redir_site
OFF opt_redir, .Lredir_alt, opt_redir_alt

/* rsp write: pushes a, then b; site; returns the word at (%rsp) (b, or a
 * when a handler moved rsp up by 8); rbp keeps the frame. */
FUNC opt_rspw
        push %rbp
        mov %rsp, %rbp
        push %rdi
        push %rsi
.Lrspw_s:
        NOP5
        mov (%rsp), %rax
        mov %rbp, %rsp
        pop %rbp
        ret
ENDF opt_rspw
OFF opt_rspw, .Lrspw_s, opt_rspw_site

/* Recursive factorial with a nop5 as its first instruction. */
FUNC opt_fact
        NOP5
        cmp $1, %rdi
        jbe 1f
        push %rdi
        dec %rdi
        call opt_fact
        pop %rdi
        imul %rdi, %rax
        ret
1:      mov $1, %eax
        ret
ENDF opt_fact

/* opt_fargs(double a0..a7): nop5 at the entry, then stores xmm0..xmm7
 * (16 bytes each) to opt_fargs_out and returns a0 + a7 (in xmm0). */
FUNC opt_fargs
        NOP5
        movdqu %xmm0, opt_fargs_out+0(%rip)
        movdqu %xmm1, opt_fargs_out+16(%rip)
        movdqu %xmm2, opt_fargs_out+32(%rip)
        movdqu %xmm3, opt_fargs_out+48(%rip)
        movdqu %xmm4, opt_fargs_out+64(%rip)
        movdqu %xmm5, opt_fargs_out+80(%rip)
        movdqu %xmm6, opt_fargs_out+96(%rip)
        movdqu %xmm7, opt_fargs_out+112(%rip)
        addsd %xmm7, %xmm0
        ret
ENDF opt_fargs

/* Threads target: 7a + 3 with a nop5 at the entry. */
FUNC opt_conc
        NOP5
        lea (,%rdi,8), %rax
        sub %rdi, %rax
        add $3, %rax
        ret
ENDF opt_conc

/* seccomp target: a + 5 */
FUNC opt_secc
        NOP5
        lea 5(%rdi), %rax
        ret
ENDF opt_secc

/* Action::remove target: 3a + 1 */
FUNC opt_remove
        NOP5
        lea 1(%rdi,%rdi,2), %rax
        ret
ENDF opt_remove

/* ===================================================================== */
/* C-04: a branch lands inside the bytes an optimized probe would cover  */
/* ===================================================================== */

/* (a) conditional rel32 branch at offset 3.
 * x > 0: 3x; x == 0: 7; x < 0: -2x (x as int64). */
FUNC opt_c04a
        test %rdi, %rdi                         /* 0: 48 85 ff */
.Lc04a_j:
        .byte 0x0f, 0x8e                        /* 3: jle rel32 */
        .long .Lc04a_le - (. + 4)
        lea (%rdi,%rdi,2), %rax                 /* 9 */
        ret
.Lc04a_le:
        .byte 0x0f, 0x84                        /* je rel32 */
        .long .Lc04a_z - (. + 4)
        mov %rdi, %rax
        neg %rax
        add %rax, %rax
        ret
.Lc04a_z:
        mov $7, %eax
        ret
ENDF opt_c04a
OFF opt_c04a, .Lc04a_j, opt_c04a_branch

/* (b) loop whose backward branch targets offset 2.
 * rax = 0; while (x != 0) { rax += x; x -= sign(x); }  -> x(x+1)/2, 0, -|x|(|x|+1)/2 */
FUNC opt_c04b
        xor %eax, %eax                          /* 0: 31 c0 */
.Lc04b_top:
        test %rdi, %rdi                         /* 2 */
        jz 1f
        add %rdi, %rax
        mov %rdi, %rcx
        sar $63, %rcx
        or $1, %rcx
        sub %rcx, %rdi
        .byte 0xe9                              /* jmp rel32 back to offset 2 */
        .long .Lc04b_top - (. + 4)
1:      ret
ENDF opt_c04b
OFF opt_c04b, .Lc04b_top, opt_c04b_target

/* (c) conditional rel32 backward branch targeting offset 3.
 * rax = x; do rax >>= 1 (arithmetic) while rax not in {0, -1}; return x + rax
 * -> x for x >= 0, x - 1 for x < 0. */
FUNC opt_c04c
        mov %rdi, %rax                          /* 0: 48 89 f8 */
.Lc04c_top:
        sar $1, %rax                            /* 3 */
        lea 1(%rax), %rcx
        cmp $1, %rcx
        .byte 0x0f, 0x87                        /* ja rel32 back to offset 3 */
        .long .Lc04c_top - (. + 4)
        add %rdi, %rax
        ret
ENDF opt_c04c
OFF opt_c04c, .Lc04c_top, opt_c04c_target

/* ===================================================================== */
/* Every register: GPRs, flags, mxcsr, x87 cw, xmm/ymm/zmm, k            */
/* ===================================================================== */

/* OptState (see opt_common.hpp): gpr[16] @0 (rax rcx rdx rbx rsp rbp rsi rdi
 * r8..r15), rflags @128, mxcsr @136, fcw @140, k[8] @192, vec[32][64] @256.
 * opt_state_<level>() loads opt_state_in (level sse: xmm0-15; avx: ymm0-15;
 * avx512: zmm0-31 and k0-k7), sets CF PF AF ZF SF DF OF, records rsp in
 * opt_rsp_at_site, runs the nop5, stores everything to opt_state_out,
 * restores the callee-saved state (GPRs, mxcsr, x87 cw, DF) and returns 0. */
        .set FLAGS_IN, 0xcd7

        .macro LOADVEC level
        .if \level == 0
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movdqu 256+64*\n(%rax), %xmm\n
        .endr
        .elseif \level == 1
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        vmovdqu 256+64*\n(%rax), %ymm\n
        .endr
        .else
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        vmovdqu64 256+64*\n(%rax), %zmm\n
        .endr
        .irp n, 0,1,2,3,4,5,6,7
        kmovq 192+8*\n(%rax), %k\n
        .endr
        .endif
        .endm

        .macro STOREVEC level
        .if \level == 0
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movdqu %xmm\n, opt_state_out+256+64*\n(%rip)
        .endr
        .elseif \level == 1
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        vmovdqu %ymm\n, opt_state_out+256+64*\n(%rip)
        .endr
        .else
        .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        vmovdqu64 %zmm\n, opt_state_out+256+64*\n(%rip)
        .endr
        .irp n, 0,1,2,3,4,5,6,7
        kmovq %k\n, opt_state_out+192+8*\n(%rip)
        .endr
        .endif
        .endm

        .macro ALLSTATE name, level
FUNC \name
        push %rbx
        push %rbp
        push %r12
        push %r13
        push %r14
        push %r15
        sub $8, %rsp
        fnstcw 0(%rsp)
        stmxcsr 4(%rsp)
        lea opt_state_in(%rip), %rax
        LOADVEC \level
        ldmxcsr 136(%rax)
        fldcw 140(%rax)
        mov 8(%rax), %rcx
        mov 16(%rax), %rdx
        mov 24(%rax), %rbx
        mov 40(%rax), %rbp
        mov 48(%rax), %rsi
        mov 56(%rax), %rdi
        mov 64(%rax), %r8
        mov 72(%rax), %r9
        mov 80(%rax), %r10
        mov 88(%rax), %r11
        mov 96(%rax), %r12
        mov 104(%rax), %r13
        mov 112(%rax), %r14
        mov 120(%rax), %r15
        mov 0(%rax), %rax
        pushq $FLAGS_IN
        popfq
        mov %rsp, opt_rsp_at_site(%rip)
.Ls\@:
        NOP5
        pushfq
        popq opt_state_out+128(%rip)
        cld
        mov %rax, opt_state_out+0(%rip)
        mov %rcx, opt_state_out+8(%rip)
        mov %rdx, opt_state_out+16(%rip)
        mov %rbx, opt_state_out+24(%rip)
        mov %rsp, opt_state_out+32(%rip)
        mov %rbp, opt_state_out+40(%rip)
        mov %rsi, opt_state_out+48(%rip)
        mov %rdi, opt_state_out+56(%rip)
        mov %r8, opt_state_out+64(%rip)
        mov %r9, opt_state_out+72(%rip)
        mov %r10, opt_state_out+80(%rip)
        mov %r11, opt_state_out+88(%rip)
        mov %r12, opt_state_out+96(%rip)
        mov %r13, opt_state_out+104(%rip)
        mov %r14, opt_state_out+112(%rip)
        mov %r15, opt_state_out+120(%rip)
        stmxcsr opt_state_out+136(%rip)
        fnstcw opt_state_out+140(%rip)
        STOREVEC \level
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
        xor %eax, %eax
        ret
ENDF \name
OFF \name, .Ls\@, \name\()_site
        .endm

        ALLSTATE opt_state_sse, 0
        ALLSTATE opt_state_avx, 1
        ALLSTATE opt_state_avx512, 2

/* ===================================================================== */
/* C-10: 16 small functions on one page                                  */
/* ===================================================================== */

/* Each storm function is uint64_t f(uint64_t x); its model is in
 * storm_test.cpp. `opt_storm_sites` lists, per function, up to 7 probe
 * offsets (instruction starts), -1 terminated: .long offsets[8] per function. */
        .macro SFUNC name
        .globl \name
        .type \name, @function
        .p2align 4
\name:
        .endm

        .section .text.opt_storm, "ax", @progbits
        .p2align 12
        .globl opt_storm_page
opt_storm_page:

SFUNC opt_s0                    /* x + 1 */
.Ls0_0: NOP5
.Ls0_1: lea 1(%rdi), %rax
.Ls0_2: ret
ENDF opt_s0

SFUNC opt_s1                    /* x + 2 */
.Ls1_0: mov %rdi, %rax
.Ls1_1: NOP5
.Ls1_2: add $2, %rax
.Ls1_3: ret
ENDF opt_s1

SFUNC opt_s2                    /* 3x */
.Ls2_0: lea (%rdi,%rdi,2), %rax
.Ls2_1: ret
ENDF opt_s2

SFUNC opt_s3                    /* x ^ 0xcccccccce9e9e9e9: patch bytes inside an immediate */
.Ls3_0: NOP5
.Ls3_1: movabs $0xcccccccce9e9e9e9, %rax
.Ls3_2: xor %rdi, %rax
.Ls3_3: ret
ENDF opt_s3

SFUNC opt_s4                    /* x + 4: starts with jmp rel32 (e9 00 00 00 00) */
.Ls4_0: .byte 0xe9, 0x00, 0x00, 0x00, 0x00
.Ls4_1: lea 4(%rdi), %rax
.Ls4_2: ret
ENDF opt_s4

SFUNC opt_s5                    /* x + 0xcc */
.Ls5_0: NOP5
.Ls5_1: mov $0xcc, %eax
.Ls5_2: add %rdi, %rax
.Ls5_3: ret
ENDF opt_s5

SFUNC opt_s6                    /* 3x by a loop */
.Ls6_0: xor %eax, %eax
.Ls6_1: mov $3, %ecx
.Ls6_2: add %rdi, %rax
.Ls6_3: dec %ecx
.Ls6_4: jnz .Ls6_2
.Ls6_5: ret
ENDF opt_s6

SFUNC opt_s7                    /* x + 7: two adjacent nop5 */
.Ls7_0: NOP5
.Ls7_1: NOP5
.Ls7_2: lea 7(%rdi), %rax
.Ls7_3: ret
ENDF opt_s7

SFUNC opt_s8                    /* x + 8, frame pointer */
.Ls8_0: push %rbp
.Ls8_1: mov %rsp, %rbp
.Ls8_2: NOP5
.Ls8_3: lea 8(%rdi), %rax
.Ls8_4: pop %rbp
.Ls8_5: ret
ENDF opt_s8

SFUNC opt_s9                    /* (int64)x < 0 ? 9 : x + 9 */
.Ls9_0: test %rdi, %rdi
.Ls9_1: js .Ls9_4
.Ls9_2: lea 9(%rdi), %rax
.Ls9_3: ret
.Ls9_4: mov $9, %eax
.Ls9_5: ret
ENDF opt_s9

SFUNC opt_s10                   /* 10x */
.Ls10_0: imul $10, %rdi, %rax
.Ls10_1: NOP5
.Ls10_2: ret
ENDF opt_s10

SFUNC opt_s11                   /* x + 11 through an internal call */
.Ls11_0: NOP5
.Ls11_1: lea 11(%rdi), %rdi
.Ls11_2: call .Ls11_4
.Ls11_3: ret
.Ls11_4: mov %rdi, %rax
.Ls11_5: ret
ENDF opt_s11

SFUNC opt_s12                   /* x, rep ret */
.Ls12_0: mov %rdi, %rax
.Ls12_1: NOP5
.Ls12_2: rep ret
ENDF opt_s12

SFUNC opt_s13                   /* x + 0xe9: b8 e9 00 00 00 */
.Ls13_0: mov $0xe9, %eax
.Ls13_1: add %rdi, %rax
.Ls13_2: NOP5
.Ls13_3: ret
ENDF opt_s13

SFUNC opt_s14                   /* x - 14 */
.Ls14_0: NOP5
.Ls14_1: mov %rdi, %rax
.Ls14_2: sub $14, %rax
.Ls14_3: ret
ENDF opt_s14

SFUNC opt_s15                   /* x + 0x0000441f0fe9cc00: nop5 and patch bytes inside an immediate */
.Ls15_0: movabs $0x0000441f0fe9cc00, %rax
.Ls15_1: add %rdi, %rax
.Ls15_2: ret
ENDF opt_s15

        .globl opt_storm_page_end
opt_storm_page_end:

        .macro SITES fn, n, labels:vararg
        .irp l, \labels
        .long \l - \fn
        .endr
        .rept 8 - \n
        .long -1
        .endr
        .endm

        .section .data.rel.ro, "aw"
        .p2align 3
        .globl opt_storm_fns, opt_storm_sites
        .type opt_storm_fns, @object
opt_storm_fns:
        .quad opt_s0, opt_s1, opt_s2, opt_s3, opt_s4, opt_s5, opt_s6, opt_s7
        .quad opt_s8, opt_s9, opt_s10, opt_s11, opt_s12, opt_s13, opt_s14, opt_s15
        .size opt_storm_fns, 128
        .section .rodata
        .p2align 3
        .type opt_storm_sites, @object
opt_storm_sites:
        SITES opt_s0, 3, .Ls0_0, .Ls0_1, .Ls0_2
        SITES opt_s1, 4, .Ls1_0, .Ls1_1, .Ls1_2, .Ls1_3
        SITES opt_s2, 2, .Ls2_0, .Ls2_1
        SITES opt_s3, 4, .Ls3_0, .Ls3_1, .Ls3_2, .Ls3_3
        SITES opt_s4, 3, .Ls4_0, .Ls4_1, .Ls4_2
        SITES opt_s5, 4, .Ls5_0, .Ls5_1, .Ls5_2, .Ls5_3
        SITES opt_s6, 6, .Ls6_0, .Ls6_1, .Ls6_2, .Ls6_3, .Ls6_4, .Ls6_5
        SITES opt_s7, 4, .Ls7_0, .Ls7_1, .Ls7_2, .Ls7_3
        SITES opt_s8, 6, .Ls8_0, .Ls8_1, .Ls8_2, .Ls8_3, .Ls8_4, .Ls8_5
        SITES opt_s9, 6, .Ls9_0, .Ls9_1, .Ls9_2, .Ls9_3, .Ls9_4, .Ls9_5
        SITES opt_s10, 3, .Ls10_0, .Ls10_1, .Ls10_2
        SITES opt_s11, 6, .Ls11_0, .Ls11_1, .Ls11_2, .Ls11_3, .Ls11_4, .Ls11_5
        SITES opt_s12, 3, .Ls12_0, .Ls12_1, .Ls12_2
        SITES opt_s13, 4, .Ls13_0, .Ls13_1, .Ls13_2, .Ls13_3
        SITES opt_s14, 4, .Ls14_0, .Ls14_1, .Ls14_2, .Ls14_3
        SITES opt_s15, 3, .Ls15_0, .Ls15_1, .Ls15_2
        .size opt_storm_sites, 16 * 32

/* ===================================================================== */
/* Data                                                                  */
/* ===================================================================== */

        .data
        .p2align 6
        .globl opt_state_in, opt_state_out, opt_rsp_at_site, opt_fargs_out
        .type opt_state_in, @object
opt_state_in:   .zero 2304
        .size opt_state_in, 2304
        .p2align 6
        .type opt_state_out, @object
opt_state_out:  .zero 2304
        .size opt_state_out, 2304
        .type opt_rsp_at_site, @object
opt_rsp_at_site: .quad 0
        .size opt_rsp_at_site, 8
        .p2align 4
        .type opt_fargs_out, @object
opt_fargs_out:  .zero 128
        .size opt_fargs_out, 128

        .section .note.GNU-stack, "", @progbits
