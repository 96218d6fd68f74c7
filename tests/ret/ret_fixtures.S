/* SPDX-License-Identifier: MIT
 * Assembly fixtures for the return-probe suites (tests/ret).
 *
 * Every function is .globl with .type/.size (the runtime's function-entry
 * check for return probes reads the symbol table). `OFF fn, label, name`
 * (tests/support/fixtures.inc) exports `name`, a .quad in .rodata holding
 * `label - fn`, so tests can compute exact return sites without global labels
 * inside functions.
 */

#include "fixtures.inc"

        .data
        .p2align 3
        .globl rt_call_rsp
        .type rt_call_rsp, @object
rt_call_rsp:
        .quad 0
        .size rt_call_rsp, 8

        .section .rodata
        .p2align 3
        .globl rt_c325
        .type rt_c325, @object
rt_c325:
        .double 3.25
        .size rt_c325, 8

/* uint64_t rt_call(fn, a, b, rax_in, rdx_in): calls fn(a, b) with rax and
 * rdx preset, records rsp at the call in rt_call_rsp (= rsp after the
 * return), returns fn's rax (rdx too, for a Pair prototype). The return site
 * is rt_call + rt_call_ret_off; rt_call + rt_call_alt_off is an alternative
 * continuation that adds 1000 to rax and returns. */
FUNC rt_call
        mov %rdi, %r11
        mov %rsi, %rdi
        mov %rdx, %rsi
        mov %rcx, %rax
        mov %r8, %rdx
        mov %rsp, rt_call_rsp(%rip)
        call *%r11
.Lrt_call_ret:
        ret
.Lrt_call_alt:
        add $1000, %rax
        ret
ENDF rt_call
OFF rt_call, .Lrt_call_ret, rt_call_ret_off
OFF rt_call, .Lrt_call_alt, rt_call_alt_off
        .globl rt_call_pair
        .type rt_call_pair, @function
        .set rt_call_pair, rt_call

/* C-08: simple_add(a, b) = a + b */
FUNC rt_simple_add
        lea (%rdi,%rsi), %rax
        ret
ENDF rt_simple_add

/* second simple function (out-of-line first insn differs): a * 3 + b */
FUNC rt_mul3_add
        lea (%rdi,%rdi,2), %rax
        add %rsi, %rax
        ret
ENDF rt_mul3_add

/* fact(n) = n <= 1 ? 1 : n * fact(n - 1). Offset 4 (jbe) is a non-entry
 * instruction boundary (rt_fact_mid_off). */
FUNC rt_fact
        cmp $1, %rdi
.Lfact_mid:
        jbe 1f
        push %rdi
        dec %rdi
        call rt_fact
.Lfact_rs:
        pop %rdi
        imul %rdi, %rax
        ret
1:      mov $1, %eax
        ret
ENDF rt_fact
OFF rt_fact, .Lfact_mid, rt_fact_mid_off
OFF rt_fact, .Lfact_rs, rt_fact_rs_off

/* fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2); first insn push %rbx
 * (emulated). Return sites rt_fib_rs1_off, rt_fib_rs2_off. */
FUNC rt_fib
        push %rbx
        push %r12
        sub $8, %rsp
        mov %rdi, %rbx
        cmp $2, %rdi
        jb 1f
        lea -1(%rbx), %rdi
        call rt_fib
.Lfib_rs1:
        mov %rax, %r12
        lea -2(%rbx), %rdi
        call rt_fib
.Lfib_rs2:
        add %r12, %rax
        jmp 2f
1:      mov %rbx, %rax
2:      add $8, %rsp
        pop %r12
        pop %rbx
        ret
ENDF rt_fib
OFF rt_fib, .Lfib_rs1, rt_fib_rs1_off
OFF rt_fib, .Lfib_rs2, rt_fib_rs2_off

/* sum(n) = n + sum(n - 1), sum(0) = 0: n + 1 nested invocations */
FUNC rt_sum
        test %rdi, %rdi
        jz 1f
        push %rdi
        dec %rdi
        call rt_sum
        pop %rdi
        add %rdi, %rax
        ret
1:      xor %eax, %eax
        ret
ENDF rt_sum

/* deep(n) = n + 1, through n + 1 nested invocations; the innermost calls
 * rt_deep_bottom() (the test's, which may wait; this weak one returns)
 * before it returns. */
        .text
        .weak rt_deep_bottom
        .type rt_deep_bottom, @function
rt_deep_bottom:
        ret
        .size rt_deep_bottom, . - rt_deep_bottom

FUNC rt_deep
        push %rbx
        test %rdi, %rdi
        jnz 1f
        call rt_deep_bottom
        mov $1, %eax
        pop %rbx
        ret
1:      lea -1(%rdi), %rdi
        call rt_deep
        add $1, %rax
        pop %rbx
        ret
ENDF rt_deep

/* Tail calls: c(x) = x + 3; b(x) = c(2x) = 2x + 3 (tail jump);
 * a(x) = b(x + 1) = 2x + 5 (tail jump); j(x) = b(x): its first instruction
 * is the tail jump itself. */
FUNC rt_tail_c
        lea 3(%rdi), %rax
        ret
ENDF rt_tail_c

FUNC rt_tail_b
        lea (%rdi,%rdi), %rdi
        jmp rt_tail_c
ENDF rt_tail_b

FUNC rt_tail_a
        lea 1(%rdi), %rdi
        jmp rt_tail_b
ENDF rt_tail_a

FUNC rt_tail_j
        .byte 0xe9
        .long rt_tail_b - (. + 4)
ENDF rt_tail_j

/* C-05 (a): only `rep ret`: returns the caller's rax */
FUNC rt_c05a
        .byte 0xf3, 0xc3
ENDF rt_c05a

/* C-05 (b): xor eax,eax; ret, with rt_c05b_next right after it */
FUNC rt_c05b
        xor %eax, %eax
        ret
ENDF rt_c05b
/* rt_c05b_next(a) = a + 5, placed directly after rt_c05b */
FUNC_NOALIGN rt_c05b_next
        lea 5(%rdi), %rax
        ret
ENDF rt_c05b_next

/* C-05 (c): a function that is just `ret` */
FUNC rt_c05c
        ret
ENDF rt_c05c

/* C-05 (d): inc %rax; dec %rdx; jmp +0; ret (rax + 1, rdx - 1) */
FUNC rt_c05d
        .byte 0x48, 0xff, 0xc0
.Lc05d_1:
        .byte 0x48, 0xff, 0xca
.Lc05d_2:
        .byte 0xeb, 0x00
.Lc05d_3:
        ret
ENDF rt_c05d
OFF rt_c05d, .Lc05d_1, rt_c05d_off1
OFF rt_c05d, .Lc05d_2, rt_c05d_off2
OFF rt_c05d, .Lc05d_3, rt_c05d_off3

/* double rt_ret_double(int64 a) = 3.25 + a (movsd rip-relative first);
 * leaves (double)a in xmm1 */
FUNC rt_ret_double
        movsd rt_c325(%rip), %xmm0
        cvtsi2sd %rdi, %xmm1
        addsd %xmm1, %xmm0
        ret
ENDF rt_ret_double

/* struct {u64, u64} rt_ret_pair(a, b) = {a + 1, b + 2} in rax:rdx */
FUNC rt_ret_pair
        lea 1(%rdi), %rax
        lea 2(%rsi), %rdx
        ret
ENDF rt_ret_pair

/* rt_ac_callee(a): returns a + 1 with alignment checking on (rflags.AC), so
 * a return probe's trampoline and ret_handlers meet AC set.
 * rt_ac_caller(a): calls it, returns its result + (rflags.AC after the
 * return) and clears AC. */
FUNC rt_ac_callee
        pushfq
        orl $0x40000, (%rsp)
        popfq
        lea 1(%rdi), %rax
        ret
ENDF rt_ac_callee

FUNC rt_ac_caller
        sub $8, %rsp
        call rt_ac_callee
        add $8, %rsp
        pushfq
        pop %rdx
        and $0x40000, %edx
        add %rdx, %rax
        pushfq
        andl $~0x40000, (%rsp)
        popfq
        ret
ENDF rt_ac_caller

/* rt_df_callee(a): returns a + 1 with the direction flag and the carry flag
 * set (hand-written code may return a status in CF), so a return probe's
 * trampoline and ret_handlers meet DF set and must hand both back.
 * rt_df_caller(a): calls it, returns its result + (rflags & (DF|CF) after
 * the return) and clears DF. */
FUNC rt_df_callee
        lea 1(%rdi), %rax
        std
        stc
        ret
ENDF rt_df_callee

FUNC rt_df_caller
        sub $8, %rsp
        call rt_df_callee
        lea 8(%rsp), %rsp
        pushfq
        pop %rdx
        cld
        and $0x401, %edx
        add %rdx, %rax
        ret
ENDF rt_df_caller

/* rt_flags_callee(a, f): returns a with the arithmetic flags (OF SF ZF AF
 * PF CF) set to those of f and nothing else changed, so a return probe's
 * trampoline meets them and must hand them back (its quick exit restores
 * them without popfq).
 * rt_flags_caller(a, f): calls it, returns rflags & 0x8d5 after the return. */
FUNC rt_flags_callee
        pushfq
        andl $~0x8d5, (%rsp)
        and $0x8d5, %esi
        or %esi, (%rsp)
        mov %rdi, %rax
        popfq
        ret
ENDF rt_flags_callee

FUNC rt_flags_caller
        sub $8, %rsp
        call rt_flags_callee
        lea 8(%rsp), %rsp
        pushfq
        pop %rax
        and $0x8d5, %eax
        ret
ENDF rt_flags_caller

        .section .note.GNU-stack,"",@progbits
