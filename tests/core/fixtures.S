/* SPDX-License-Identifier: MIT
 * Probe fixtures for the libuprobe end-to-end tests (tests/core).
 *
 * Every function is .globl with .type/.size so the runtime's symbol-based
 * checks (mid-instruction refusal) see it. Branch encodings are spelled out
 * with .byte where the instruction form matters (rel8 vs rel32), so the
 * assembler cannot relax them. `SITE fn, label` exports `fn_site`, a .quad
 * in .rodata holding the offset of the probed instruction inside fn.
 *
 * Unless noted, a fixture is `uint64_t fn(uint64_t a /rdi/, uint64_t b /rsi/)`.
 */

#include "fixtures.inc"

/* The fixtures start a page: where each one lies within its page (which
 * decides, with its bytes, the addresses a punned or evicting jump can
 * select, and whether a trampoline there fits its page) does not move with
 * the code the compiler emits before them. */
        .text
        .p2align 12

/* ===================================================================== */
/* Emulated classes                                                      */
/* ===================================================================== */

/* nop (0x90) at 0: a + 1 */
FUNC fx_nop1
.Lnop1_s:
        nop
        lea 1(%rdi), %rax
        ret
ENDF fx_nop1
SITE fx_nop1, .Lnop1_s

/* 2-byte nop (66 90) in the middle: a + 6 */
FUNC fx_nop2
        lea 6(%rdi), %rax
.Lnop2_s:
        .byte 0x66, 0x90
        ret
ENDF fx_nop2
SITE fx_nop2, .Lnop2_s

/* nop5 (0f 1f 44 00 00) at 0: a + 2 */
FUNC fx_nop5
.Lnop5_s:
        .byte 0x0f, 0x1f, 0x44, 0x00, 0x00
        lea 2(%rdi), %rax
        ret
ENDF fx_nop5
SITE fx_nop5, .Lnop5_s

/* nop9 (66 0f 1f 84 00 00 00 00 00) at 0: a + 3 */
FUNC fx_nop9
.Lnop9_s:
        .byte 0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00
        lea 3(%rdi), %rax
        ret
ENDF fx_nop9
SITE fx_nop9, .Lnop9_s

/* endbr64 at 0: a + 4 */
FUNC fx_endbr
.Lendbr_s:
        .byte 0xf3, 0x0f, 0x1e, 0xfa
        lea 4(%rdi), %rax
        ret
ENDF fx_endbr
SITE fx_endbr, .Lendbr_s

/* push %rbp at 0; checks the pushed value; 3a + 7, or -1 */
FUNC fx_push_rbp
.Lpushrbp_s:
        push %rbp
        cmp (%rsp), %rbp
        jne 1f
        lea (%rdi,%rdi,2), %rax
        add $7, %rax
        pop %rbp
        ret
1:      mov $-1, %rax
        pop %rbp
        ret
ENDF fx_push_rbp
SITE fx_push_rbp, .Lpushrbp_s

/* push %r12 at 0 (41 54); clobbers r12 and restores it; a*b + 5, or -1 */
FUNC fx_push_r12
.Lpushr12_s:
        push %r12
        cmp (%rsp), %r12
        jne 1f
        mov %rdi, %r12
        imul %rsi, %r12
        lea 5(%r12), %rax
        pop %r12
        ret
1:      mov $-1, %rax
        pop %r12
        ret
ENDF fx_push_r12
SITE fx_push_r12, .Lpushr12_s

/* push %rdi at 0; pop %rax: a ^ b */
FUNC fx_push_rdi
.Lpushrdi_s:
        push %rdi
        pop %rax
        xor %rsi, %rax
        ret
ENDF fx_push_rdi
SITE fx_push_rdi, .Lpushrdi_s

/* jmp rel8 at 0: a + 5 */
FUNC fx_jmp8
.Ljmp8_s:
        .byte 0xeb, .Ljmp8_t - .Ljmp8_n
.Ljmp8_n:
        mov $-1, %rax
        ret
.Ljmp8_t:
        lea 5(%rdi), %rax
        ret
ENDF fx_jmp8
SITE fx_jmp8, .Ljmp8_s

/* jmp rel32 at 0: a + 8 */
FUNC fx_jmp32
.Ljmp32_s:
        .byte 0xe9
        .long .Ljmp32_t - .Ljmp32_n
.Ljmp32_n:
        mov $-1, %rax
        ret
.Ljmp32_t:
        lea 8(%rdi), %rax
        ret
ENDF fx_jmp32
SITE fx_jmp32, .Ljmp32_s

/* backward jmp rel8 in the middle: a + 12 */
FUNC fx_jmp8_back
        jmp .Ljmpb_fwd
.Ljmpb_t:
        lea 12(%rdi), %rax
        ret
.Ljmpb_fwd:
        nop
.Ljmpb_s:
        .byte 0xeb, .Ljmpb_t - .Ljmpb_n
.Ljmpb_n:
        mov $-1, %rax
        ret
ENDF fx_jmp8_back
SITE fx_jmp8_back, .Ljmpb_s

/* fx_chk_callee(a, b, expected_return_address /rdx/): 3a, or -100 when
 * the return address on the stack is not rdx. */
FUNC fx_chk_callee
        cmp (%rsp), %rdx
        jne 1f
        lea (%rdi,%rdi,2), %rax
        ret
1:      mov $-100, %rax
        ret
ENDF fx_chk_callee

/* call rel32 at 0 to fx_call32_callee, which checks that the return
 * address on the stack is .Lcall32_r: 2a + 9, or -91 */
FUNC fx_call32
.Lcall32_s:
        .byte 0xe8
        .long fx_call32_callee - .Lcall32_r
.Lcall32_r:
        add $9, %rax
        ret
ENDF fx_call32
SITE fx_call32, .Lcall32_s

FUNC fx_call32_callee
        lea .Lcall32_r(%rip), %rcx
        cmp (%rsp), %rcx
        jne 1f
        lea (%rdi,%rdi), %rax
        ret
1:      mov $-100, %rax
        ret
ENDF fx_call32_callee

/* call rel32 in the middle, to fx_chk_callee: 3a + 1 */
FUNC fx_call32_mid
        lea .Lcall32m_r(%rip), %rdx
.Lcall32m_s:
        .byte 0xe8
        .long fx_chk_callee - .Lcall32m_r
.Lcall32m_r:
        add $1, %rax
        ret
ENDF fx_call32_mid
SITE fx_call32_mid, .Lcall32m_s

/* Jcc: cmp %rsi,%rdi (3 bytes) then Jcc at offset 3; 1 if taken, else 0. */
        .macro JCC8 cc, code
FUNC fx_jcc8_\cc
        cmp %rsi, %rdi
.Ls\@:
        .byte 0x70 + \code, .Lt\@ - .Ln\@
.Ln\@:
        xor %eax, %eax
        ret
.Lt\@:
        mov $1, %eax
        ret
ENDF fx_jcc8_\cc
SITE fx_jcc8_\cc, .Ls\@
        .endm

        .macro JCC32 cc, code
FUNC fx_jcc32_\cc
        cmp %rsi, %rdi
.Ls\@:
        .byte 0x0f, 0x80 + \code
        .long .Lt\@ - .Ln\@
.Ln\@:
        xor %eax, %eax
        ret
.Lt\@:
        mov $1, %eax
        ret
ENDF fx_jcc32_\cc
SITE fx_jcc32_\cc, .Ls\@
        .endm


        JCC8 o, 0
        JCC8 no, 1
        JCC8 b, 2
        JCC8 ae, 3
        JCC8 e, 4
        JCC8 ne, 5
        JCC8 be, 6
        JCC8 a, 7
        JCC8 s, 8
        JCC8 ns, 9
        JCC8 p, 10
        JCC8 np, 11
        JCC8 l, 12
        JCC8 ge, 13
        JCC8 le, 14
        JCC8 g, 15
        JCC32 o, 0
        JCC32 no, 1
        JCC32 b, 2
        JCC32 ae, 3
        JCC32 e, 4
        JCC32 ne, 5
        JCC32 be, 6
        JCC32 a, 7
        JCC32 s, 8
        JCC32 ns, 9
        JCC32 p, 10
        JCC32 np, 11
        JCC32 l, 12
        JCC32 ge, 13
        JCC32 le, 14
        JCC32 g, 15

/* jrcxz at 3: 100 if rcx == 0 else 200 */
FUNC fx_jrcxz
        mov %rdi, %rcx
.Ljrcxz_s:
        .byte 0xe3, .Ljrcxz_t - .Ljrcxz_n
.Ljrcxz_n:
        mov $200, %eax
        ret
.Ljrcxz_t:
        mov $100, %eax
        ret
ENDF fx_jrcxz
SITE fx_jrcxz, .Ljrcxz_s

/* jecxz (67 e3) at 3: 100 if ecx == 0 else 200 */
FUNC fx_jecxz
        mov %rdi, %rcx
.Ljecxz_s:
        .byte 0x67, 0xe3, .Ljecxz_t - .Ljecxz_n
.Ljecxz_n:
        mov $200, %eax
        ret
.Ljecxz_t:
        mov $100, %eax
        ret
ENDF fx_jecxz
SITE fx_jecxz, .Ljecxz_s

/* loop at 3: rcx = a - 1; taken (rcx != 0): rcx + 1000, else rcx + 2000 */
FUNC fx_loop
        mov %rdi, %rcx
.Lloop_s:
        .byte 0xe2, .Lloop_t - .Lloop_n
.Lloop_n:
        lea 2000(%rcx), %rax
        ret
.Lloop_t:
        lea 1000(%rcx), %rax
        ret
ENDF fx_loop
SITE fx_loop, .Lloop_s

/* loope at 7 after cmp $5,%rsi: taken iff rcx-1 != 0 && b == 5 */
FUNC fx_loope
        mov %rdi, %rcx
        cmp $5, %rsi
.Lloope_s:
        .byte 0xe1, .Lloope_t - .Lloope_n
.Lloope_n:
        lea 2000(%rcx), %rax
        ret
.Lloope_t:
        lea 1000(%rcx), %rax
        ret
ENDF fx_loope
SITE fx_loope, .Lloope_s

/* loopne at 7 after cmp $5,%rsi: taken iff rcx-1 != 0 && b != 5 */
FUNC fx_loopne
        mov %rdi, %rcx
        cmp $5, %rsi
.Lloopne_s:
        .byte 0xe0, .Lloopne_t - .Lloopne_n
.Lloopne_n:
        lea 2000(%rcx), %rax
        ret
.Lloopne_t:
        lea 1000(%rcx), %rax
        ret
ENDF fx_loopne
SITE fx_loopne, .Lloopne_s

/* ret at offset 0 (probed) and its caller: a + 1 */
FUNC fx_ret0
.Lret0_s:
        ret
ENDF fx_ret0
SITE fx_ret0, .Lret0_s

FUNC fx_ret0_caller
        lea 1(%rdi), %rax
        call fx_ret0
        ret
ENDF fx_ret0_caller

/* rep ret (f3 c3) at 0 and its caller: a + 2 */
FUNC fx_repret
.Lrepret_s:
        .byte 0xf3, 0xc3
ENDF fx_repret
SITE fx_repret, .Lrepret_s

FUNC fx_repret_caller
        lea 2(%rdi), %rax
        call fx_repret
        ret
ENDF fx_repret_caller

/* ret $16 (c2 10 00) at 0 and its caller: a + 7, or -1 if rsp is off */
FUNC fx_retimm
.Lretimm_s:
        .byte 0xc2, 0x10, 0x00
ENDF fx_retimm
SITE fx_retimm, .Lretimm_s

FUNC fx_retimm_caller
        mov %rsp, %r11
        lea 7(%rdi), %rax
        push %rdi
        push %rsi
        call fx_retimm
        cmp %rsp, %r11
        je 1f
        mov $-1, %rax
1:      ret
ENDF fx_retimm_caller

/* jmp *%rax (ff e0) at 7: a + 11 */
FUNC fx_ind_target
        lea 11(%rdi), %rax
        ret
ENDF fx_ind_target

FUNC fx_jmp_rax
        lea fx_ind_target(%rip), %rax
.Ljmprax_s:
        jmp *%rax
ENDF fx_jmp_rax
SITE fx_jmp_rax, .Ljmprax_s

/* call *%rax (ff d0) at 14: 3a + 1 */
FUNC fx_call_rax
        lea .Lcallrax_r(%rip), %rdx
        lea fx_chk_callee(%rip), %rax
.Lcallrax_s:
        call *%rax
.Lcallrax_r:
        add $1, %rax
        ret
ENDF fx_call_rax
SITE fx_call_rax, .Lcallrax_s

/* call *%r11 (41 ff d3) at 14: 3a + 1 */
FUNC fx_call_r11
        lea .Lcallr11_r(%rip), %rdx
        lea fx_chk_callee(%rip), %r11
.Lcallr11_s:
        call *%r11
.Lcallr11_r:
        add $1, %rax
        ret
ENDF fx_call_r11
SITE fx_call_r11, .Lcallr11_s

/* jmp *(%rsi,%rax,8) (ff 24 c6) through a table: a + 100 * (1 + (a & 3)) */
FUNC fx_jmp_tab
        lea fx_jtab(%rip), %rsi
        mov %rdi, %rax
        and $3, %eax
.Ljmptab_s:
        jmp *(%rsi,%rax,8)
.Lcase0:
        lea 100(%rdi), %rax
        ret
.Lcase1:
        lea 200(%rdi), %rax
        ret
.Lcase2:
        lea 300(%rdi), %rax
        ret
.Lcase3:
        lea 400(%rdi), %rax
        ret
ENDF fx_jmp_tab
SITE fx_jmp_tab, .Ljmptab_s

/* call *8(%rsi) (ff 56 08), rsi -> fx_ctab: 3a + 2 */
FUNC fx_call_mem
        lea .Lcallmem_r(%rip), %rdx
        lea fx_ctab(%rip), %rsi
.Lcallmem_s:
        call *8(%rsi)
.Lcallmem_r:
        add $2, %rax
        ret
ENDF fx_call_mem
SITE fx_call_mem, .Lcallmem_s

/* ===================================================================== */
/* Out-of-line (XOL) classes                                             */
/* ===================================================================== */

/* movabs $imm64, %rax at 0: a ^ 0x1122334455667788 */
FUNC fx_movabs
.Lmovabs_s:
        movabs $0x1122334455667788, %rax
        xor %rdi, %rax
        ret
ENDF fx_movabs
SITE fx_movabs, .Lmovabs_s

/* mov $imm32, %r10 (49 c7 c2) at 0: a + 0x1234 */
FUNC fx_mov_r10
.Lmovr10_s:
        mov $0x1234, %r10
        lea (%r10,%rdi), %rax
        ret
ENDF fx_mov_r10
SITE fx_mov_r10, .Lmovr10_s

/* mov fx_var(%rip), %rax at 0: fx_var + a */
FUNC fx_rip_load
.Lripload_s:
        mov fx_var(%rip), %rax
        add %rdi, %rax
        ret
ENDF fx_rip_load
SITE fx_rip_load, .Lripload_s

/* mov %rdi, fx_store(%rip) at 0: a + 1, and fx_store = a */
FUNC fx_rip_store
.Lripstore_s:
        mov %rdi, fx_store(%rip)
        mov fx_store(%rip), %rax
        add $1, %rax
        ret
ENDF fx_rip_store
SITE fx_rip_store, .Lripstore_s

/* lea fx_var(%rip), %rax at 0: &fx_var + a */
FUNC fx_rip_lea
.Lriplea_s:
        lea fx_var(%rip), %rax
        add %rdi, %rax
        ret
ENDF fx_rip_lea
SITE fx_rip_lea, .Lriplea_s

/* cmpq $0, fx_flag(%rip) at 0 then je: 222 if fx_flag == 0 else 111 */
FUNC fx_rip_cmp
.Lripcmp_s:
        cmpq $0, fx_flag(%rip)
        je 1f
        mov $111, %eax
        ret
1:      mov $222, %eax
        ret
ENDF fx_rip_cmp
SITE fx_rip_cmp, .Lripcmp_s

/* call *fx_fp(%rip) (ff 15) at 0: (a + 0x5151) + 1, or -98 on a bad return address */
FUNC fx_fp_target
        lea .Lcallrip_r(%rip), %rcx
        cmp (%rsp), %rcx
        jne 1f
        lea 0x5151(%rdi), %rax
        ret
1:      mov $-99, %rax
        ret
ENDF fx_fp_target

FUNC fx_call_riprel
.Lcallrip_s:
        call *fx_fp(%rip)
.Lcallrip_r:
        add $1, %rax
        ret
ENDF fx_call_riprel
SITE fx_call_riprel, .Lcallrip_s

/* jmp *fx_fp2(%rip) (ff 25) at 0: a + 0x5252 */
FUNC fx_fp2_target
        lea 0x5252(%rdi), %rax
        ret
ENDF fx_fp2_target

FUNC fx_jmp_riprel
.Ljmprip_s:
        jmp *fx_fp2(%rip)
ENDF fx_jmp_riprel
SITE fx_jmp_riprel, .Ljmprip_s

/* movsd fx_c325(%rip), %xmm0 at 0; returns the bits of xmm0 (3.25) + a */
FUNC fx_movsd_bits
.Lmovsd_s:
        movsd fx_c325(%rip), %xmm0
        movq %xmm0, %rax
        add %rdi, %rax
        ret
ENDF fx_movsd_bits
SITE fx_movsd_bits, .Lmovsd_s

/* movq %rdi,%xmm0 ; addsd fx_c325(%rip),%xmm0 at 5: bits(double(a) + 3.25) */
FUNC fx_addsd_rip
        movq %rdi, %xmm0
.Laddsd_s:
        addsd fx_c325(%rip), %xmm0
        movq %xmm0, %rax
        ret
ENDF fx_addsd_rip
SITE fx_addsd_rip, .Laddsd_s

/* movdqu (%rdi), %xmm0 at 0; movdqu %xmm0, (%rsi): copies 16 bytes, returns 1 */
FUNC fx_movdqu_load
.Lmovdqul_s:
        movdqu (%rdi), %xmm0
        movdqu %xmm0, (%rsi)
        mov $1, %eax
        ret
ENDF fx_movdqu_load
SITE fx_movdqu_load, .Lmovdqul_s

/* movdqu (%rdi), %xmm1 ; movdqu %xmm1, (%rsi) at 4: copies, returns 2 */
FUNC fx_movdqu_store
        movdqu (%rdi), %xmm1
.Lmovdqus_s:
        movdqu %xmm1, (%rsi)
        mov $2, %eax
        ret
ENDF fx_movdqu_store
SITE fx_movdqu_store, .Lmovdqus_s

/* movaps fx_vec16(%rip), %xmm1 at 0; movups %xmm1, (%rdi): returns 3 */
FUNC fx_movaps_load_rip
.Lmovapsl_s:
        movaps fx_vec16(%rip), %xmm1
        movups %xmm1, (%rdi)
        mov $3, %eax
        ret
ENDF fx_movaps_load_rip
SITE fx_movaps_load_rip, .Lmovapsl_s

/* movups (%rdi), %xmm2 ; movaps %xmm2, fx_vecout(%rip) at 3: returns 4 */
FUNC fx_movaps_store_rip
        movups (%rdi), %xmm2
.Lmovapss_s:
        movaps %xmm2, fx_vecout(%rip)
        mov $4, %eax
        ret
ENDF fx_movaps_store_rip
SITE fx_movaps_store_rip, .Lmovapss_s

/* add $0x1000, %rdi (48 81 c7) at 0; then CF through sbb: (a + 0x1000) ^ -CF */
FUNC fx_add_imm
.Laddimm_s:
        add $0x1000, %rdi
        sbb %rax, %rax
        xor %rdi, %rax
        ret
ENDF fx_add_imm
SITE fx_add_imm, .Laddimm_s

/* add %rsi, %rdi at 0; returns the arithmetic flags xor the sum */
FUNC fx_add_flags
.Laddflags_s:
        add %rsi, %rdi
        pushfq
        pop %rax
        and $0x8d5, %eax
        xor %rdi, %rax
        ret
ENDF fx_add_flags
SITE fx_add_flags, .Laddflags_s

/* imul %rsi, %rdi at 0: a * b */
FUNC fx_imul
.Limul_s:
        imul %rsi, %rdi
        mov %rdi, %rax
        ret
ENDF fx_imul
SITE fx_imul, .Limul_s

/* xchg %rdi, %rsi (48 87 fe) at 0: 2b - a */
FUNC fx_xchg
.Lxchg_s:
        xchg %rdi, %rsi
        mov %rdi, %rax
        shl $1, %rax
        sub %rsi, %rax
        ret
ENDF fx_xchg
SITE fx_xchg, .Lxchg_s

/* cmovl %rsi, %rax at 6: signed max(a, b) */
FUNC fx_cmov
        mov %rdi, %rax
        cmp %rsi, %rdi
.Lcmov_s:
        cmovl %rsi, %rax
        ret
ENDF fx_cmov
SITE fx_cmov, .Lcmov_s

/* sub $0x18, %rsp at 0 (stack frame at entry): a + b through the stack */
FUNC fx_sub_rsp
.Lsubrsp_s:
        sub $0x18, %rsp
        mov %rdi, (%rsp)
        mov %rsi, 8(%rsp)
        mov (%rsp), %rax
        add 8(%rsp), %rax
        add $0x18, %rsp
        ret
ENDF fx_sub_rsp
SITE fx_sub_rsp, .Lsubrsp_s

/* push %rbp ; mov %rsp, %rbp at 1: a (if rbp == rsp afterwards) */
FUNC fx_mov_rsp_rbp
        push %rbp
.Lmovrsprbp_s:
        mov %rsp, %rbp
        mov %rbp, %rax
        sub %rsp, %rax
        add %rdi, %rax
        pop %rbp
        ret
ENDF fx_mov_rsp_rbp
SITE fx_mov_rsp_rbp, .Lmovrsprbp_s

/* mov %rdi, %rax ; lock xadd %rax, fx_ctr(%rip) at 3: old fx_ctr; fx_ctr += a */
FUNC fx_xadd
        mov %rdi, %rax
.Lxadd_s:
        lock xadd %rax, fx_ctr(%rip)
        ret
ENDF fx_xadd
SITE fx_xadd, .Lxadd_s

/* movl $0x5a5a5a5a, fx_store32(%rip) (c7 05 disp32 imm32) at 0: imm after disp */
FUNC fx_movl_imm_rip
.Lmovlimm_s:
        movl $0x5a5a5a5a, fx_store32(%rip)
        mov fx_store32(%rip), %eax
        add %rdi, %rax
        ret
ENDF fx_movl_imm_rip
SITE fx_movl_imm_rip, .Lmovlimm_s

/* add fx_var(%rip), %r9 (4c 03 0d) at 3: a + fx_var */
FUNC fx_rip_r9
        mov %rdi, %r9
.Lripr9_s:
        add fx_var(%rip), %r9
        mov %r9, %rax
        ret
ENDF fx_rip_r9
SITE fx_rip_r9, .Lripr9_s

/* movzbl fx_byte(%rip), %eax (0f b6 05) at 0: a + 0xab */
FUNC fx_movzb_rip
.Lmovzb_s:
        movzbl fx_byte(%rip), %eax
        add %rdi, %rax
        ret
ENDF fx_movzb_rip
SITE fx_movzb_rip, .Lmovzb_s

/* push fx_var(%rip) (ff 35) at 0: fx_var + a */
FUNC fx_push_rip
.Lpushrip_s:
        pushq fx_var(%rip)
        pop %rax
        add %rdi, %rax
        ret
ENDF fx_push_rip
SITE fx_push_rip, .Lpushrip_s

/* cmp %rsi, %rdi ; pushfq at 3: the arithmetic flags of a - b */
FUNC fx_pushf
        cmp %rsi, %rdi
.Lpushf_s:
        pushfq
        pop %rax
        and $0x8d5, %eax
        ret
ENDF fx_pushf
SITE fx_pushf, .Lpushf_s

/* popfq at 6 turns on alignment checking (rflags.AC) for the rest of the
 * function: its XOL copy runs, and jumps back, with AC set (an unaligned
 * jump-back address raised SIGBUS in the slot). a + b; AC cleared on return. */
FUNC fx_popf_ac
        pushfq
        orl $0x40000, (%rsp)
.Lpopfac_s:
        popfq
        lea (%rdi,%rsi), %rax
        pushfq
        andl $~0x40000, (%rsp)
        popfq
        ret
ENDF fx_popf_ac
SITE fx_popf_ac, .Lpopfac_s

/* lea at 6 runs with alignment checking on (rflags.AC): the probe's trap
 * handler and the consumers run with AC set too (the kernel keeps AC on
 * signal delivery). a + b; AC cleared on return. */
FUNC fx_ac_on
        pushfq
        orl $0x40000, (%rsp)
        popfq
.Lacon_s:
        lea (%rdi,%rsi), %rax
        pushfq
        andl $~0x40000, (%rsp)
        popfq
        ret
ENDF fx_ac_on
SITE fx_ac_on, .Lacon_s

/* rep movsb at 13: copies a & 31 bytes from b to b + 64; returns the bytes
 * moved (how far rdi advanced) + (rcx after it << 12). A single-stepped copy
 * traps after every iteration, at the instruction itself. */
FUNC fx_rep_movsb
        mov %rdi, %rcx
        and $31, %ecx
        lea 64(%rsi), %rdi
        mov %rdi, %rdx
.Lrepmovsb_s:
        rep movsb
        mov %rdi, %rax
        sub %rdx, %rax
        shl $12, %rcx
        add %rcx, %rax
        ret
ENDF fx_rep_movsb
SITE fx_rep_movsb, .Lrepmovsb_s

/* repne scasb at 11: looks for byte a & 0xff in the 32 bytes at b; returns
 * 2 * rcx after it + ZF (found). */
FUNC fx_repne_scasb
        mov %rdi, %rax
        mov %rsi, %rdi
        mov $32, %ecx
.Lrepnescasb_s:
        repne scasb
        sete %al
        movzbl %al, %eax
        lea (%rax,%rcx,2), %rax
        ret
ENDF fx_repne_scasb
SITE fx_repne_scasb, .Lrepnescasb_s

/* syscall (getppid) at 5: getppid() + a */
FUNC fx_syscall
        mov $110, %eax
.Lsyscall_s:
        syscall
        add %rdi, %rax
        ret
ENDF fx_syscall
SITE fx_syscall, .Lsyscall_s

/* ===================================================================== */
/* C-03: rip-relative first instructions                                 */
/* ===================================================================== */

/* double fx_c03_movsd(void): 3.25 */
FUNC fx_c03_movsd
        movsd fx_c325(%rip), %xmm0
        ret
ENDF fx_c03_movsd

/* const void* fx_c03_lea(void): &fx_c03_sym */
FUNC fx_c03_lea
        lea fx_c03_sym(%rip), %rax
        ret
ENDF fx_c03_lea

/* uint64_t fx_c03_mov(void): fx_c03_sym */
FUNC fx_c03_mov
        mov fx_c03_sym(%rip), %rax
        ret
ENDF fx_c03_mov

/* uint64_t fx_c03_cmp(void): 0xA1 if fx_c03_flag == 0, else 0xB2 */
FUNC fx_c03_cmp
        cmpq $0, fx_c03_flag(%rip)
        jne 1f
        mov $0xA1, %eax
        ret
1:      mov $0xB2, %eax
        ret
ENDF fx_c03_cmp

/* uint64_t fx_c03_callfp(void): fx_c03_target() == 0xC03C03 */
FUNC fx_c03_target
        mov $0xC03C03, %eax
        ret
ENDF fx_c03_target

FUNC fx_c03_callfp
        call *fx_c03_fp(%rip)
        ret
ENDF fx_c03_callfp

/* ===================================================================== */
/* C-06: a 7-byte instruction at offset 4                                */
/* ===================================================================== */

/* uint64_t fx_c06(a): (a + 1) + 0x12345678
 *   0: 48 83 c7 01            add $1, %rdi
 *   4: 48 c7 c0 78 56 34 12   mov $0x12345678, %rax
 *  11: 48 01 f8               add %rdi, %rax
 *  14: c3                     ret                                        */
FUNC fx_c06
        .byte 0x48, 0x83, 0xc7, 0x01
        .byte 0x48, 0xc7, 0xc0, 0x78, 0x56, 0x34, 0x12
        .byte 0x48, 0x01, 0xf8
        .byte 0xc3
ENDF fx_c06

/* ===================================================================== */
/* C-09 and refusals                                                     */
/* ===================================================================== */

/* A raw int3 in the file: uint64_t fx_int3(void) returns 0x77 if it survives */
FUNC fx_int3
        int3
        mov $0x77, %eax
        ret
ENDF fx_int3

/* Undecodable first byte (0x06 is invalid in 64-bit mode); never called */
FUNC fx_undecodable
        .byte 0x06
        ret
ENDF fx_undecodable

/* ===================================================================== */
/* Register-context fixtures                                             */
/* ===================================================================== */

/* fx_args(a, b): a + b; lea at 0 */
FUNC fx_args
        lea (%rdi,%rsi), %rax
        ret
ENDF fx_args

/* fx_args_caller(): records rsp in fx_saved_rsp, calls fx_args(11, 22) */
FUNC fx_args_caller
        mov %rsp, fx_saved_rsp(%rip)
        mov $11, %edi
        mov $22, %esi
        call fx_args
.Largs_r:
        ret
ENDF fx_args_caller
SITE fx_args_caller, .Largs_r

/* fx_ret_rax(a): mov %rdi,%rax ; ret at 3 */
FUNC fx_ret_rax
        mov %rdi, %rax
.Lretrax_s:
        ret
ENDF fx_ret_rax
SITE fx_ret_rax, .Lretrax_s

/* fx_redir_from(a): incq fx_redir_count(%rip) at 0; a + 1 */
FUNC fx_redir_from
        incq fx_redir_count(%rip)
        lea 1(%rdi), %rax
        ret
ENDF fx_redir_from

/* fx_redir_to(a): a + 1000 */
FUNC fx_redir_to
        lea 1000(%rdi), %rax
        ret
ENDF fx_redir_to

/* fx_allregs_<kind>(): loads every GPR and the flags with known values,
 * runs the probe site, stores every GPR to fx_regs_out[16] (Regs order
 * rax rcx rdx rbx rsp(unused) rbp rsi rdi r8..r15) and the flags to
 * fx_flags_out, restores the callee-saved registers and returns 0.
 * Loaded values: reg number n (0..15, rsp skipped) -> 0x5a00000000000000 | n << 40 | n.
 * Site kinds: nop (90) or xol: lea 0x10(%r10), %r11 (4d 8d 5a 10). */
        .macro ALLREGS kind, site_bytes:vararg
FUNC fx_allregs_\kind
        push %rbx
        push %rbp
        push %r12
        push %r13
        push %r14
        push %r15
        pushq $0x8c7
        popfq
        movabs $0x5a00000000000000, %rax
        movabs $0x5a00010000000001, %rcx
        movabs $0x5a00020000000002, %rdx
        movabs $0x5a00030000000003, %rbx
        movabs $0x5a00050000000005, %rbp
        movabs $0x5a00060000000006, %rsi
        movabs $0x5a00070000000007, %rdi
        movabs $0x5a00080000000008, %r8
        movabs $0x5a00090000000009, %r9
        movabs $0x5a000a000000000a, %r10
        movabs $0x5a000b000000000b, %r11
        movabs $0x5a000c000000000c, %r12
        movabs $0x5a000d000000000d, %r13
        movabs $0x5a000e000000000e, %r14
        movabs $0x5a000f000000000f, %r15
.Ls\@:
        .byte \site_bytes
        pushfq
        popq fx_flags_out(%rip)
        mov %rax, fx_regs_out+0(%rip)
        mov %rcx, fx_regs_out+8(%rip)
        mov %rdx, fx_regs_out+16(%rip)
        mov %rbx, fx_regs_out+24(%rip)
        mov %rsp, fx_regs_out+32(%rip)
        mov %rbp, fx_regs_out+40(%rip)
        mov %rsi, fx_regs_out+48(%rip)
        mov %rdi, fx_regs_out+56(%rip)
        mov %r8, fx_regs_out+64(%rip)
        mov %r9, fx_regs_out+72(%rip)
        mov %r10, fx_regs_out+80(%rip)
        mov %r11, fx_regs_out+88(%rip)
        mov %r12, fx_regs_out+96(%rip)
        mov %r13, fx_regs_out+104(%rip)
        mov %r14, fx_regs_out+112(%rip)
        mov %r15, fx_regs_out+120(%rip)
        pop %r15
        pop %r14
        pop %r13
        pop %r12
        pop %rbp
        pop %rbx
        xor %eax, %eax
        ret
ENDF fx_allregs_\kind
SITE fx_allregs_\kind, .Ls\@
        .endm

        ALLREGS nop, 0x90
        ALLREGS xol, 0x4d, 0x8d, 0x5a, 0x10

/* fx_xmm_keep_<kind>(a, b): xmm3 = a, xmm7 = b, xmm15 = a ^ b; site;
 * stores them to fx_xmm_out[0..2]. Sites: nop (90) / xol: add $1, %rsi (48 83 c6 01). */
        .macro XMMKEEP kind, site_bytes:vararg
FUNC fx_xmm_keep_\kind
        movq %rdi, %xmm3
        movq %rsi, %xmm7
        mov %rdi, %rax
        xor %rsi, %rax
        movq %rax, %xmm15
.Ls\@:
        .byte \site_bytes
        movq %xmm3, fx_xmm_out+0(%rip)
        movq %xmm7, fx_xmm_out+8(%rip)
        movq %xmm15, fx_xmm_out+16(%rip)
        xor %eax, %eax
        ret
ENDF fx_xmm_keep_\kind
SITE fx_xmm_keep_\kind, .Ls\@
        .endm

        XMMKEEP nop, 0x90
        XMMKEEP xol, 0x48, 0x83, 0xc6, 0x01

/* fx_ymm_keep(src, dst): vmovdqu (%rdi), %ymm3 ; site nop ; vmovdqu %ymm3, (%rsi) */
FUNC fx_ymm_keep
        vmovdqu (%rdi), %ymm3
.Lymm_s:
        nop
        vmovdqu %ymm3, (%rsi)
        vzeroupper
        xor %eax, %eax
        ret
ENDF fx_ymm_keep
SITE fx_ymm_keep, .Lymm_s

/* fx_clobber_vec(): sets xmm3/xmm7/xmm15 to all-ones (for handlers) */
FUNC fx_clobber_xmm
        pcmpeqd %xmm3, %xmm3
        pcmpeqd %xmm7, %xmm7
        pcmpeqd %xmm15, %xmm15
        ret
ENDF fx_clobber_xmm

/* fx_clobber_ymm(): sets ymm3 to all-ones (AVX2 only) */
FUNC fx_clobber_ymm
        vpcmpeqd %ymm3, %ymm3, %ymm3
        ret
ENDF fx_clobber_ymm

/* fx_redzone_<kind>(a, b): stores a at -8(%rsp), b at -128(%rsp), site,
 * returns the two red-zone words' xor with a sentinel check: a - b if both
 * survived. Sites: nop / xol: lea 1(%rdi), %rdx (48 8d 57 01). */
        .macro REDZONE kind, site_bytes:vararg
FUNC fx_redzone_\kind
        mov %rdi, -8(%rsp)
        mov %rsi, -128(%rsp)
        mov %rdi, -64(%rsp)
.Ls\@:
        .byte \site_bytes
        mov -8(%rsp), %rax
        sub -128(%rsp), %rax
        cmp -64(%rsp), %rdi
        je 1f
        mov $-1, %rax
1:      ret
ENDF fx_redzone_\kind
SITE fx_redzone_\kind, .Ls\@
        .endm

        REDZONE nop, 0x90
        REDZONE xol, 0x48, 0x8d, 0x57, 0x01

/* fx_conc(a): 7a + 3 (lea at 0), the concurrency target; fx_conc2 likewise 5a + 1 */
FUNC fx_conc
        lea (,%rdi,8), %rax
        sub %rdi, %rax
        add $3, %rax
        ret
ENDF fx_conc

FUNC fx_conc2
        nop
        lea (%rdi,%rdi,4), %rax
        add $1, %rax
        ret
ENDF fx_conc2

/* ===================================================================== */
/* Data                                                                  */
/* ===================================================================== */

        .data
        .p2align 4
        .globl fx_var, fx_store, fx_flag, fx_ctr, fx_store32, fx_fp, fx_fp2
        .globl fx_jtab, fx_ctab, fx_vecout, fx_c03_sym, fx_c03_flag, fx_c03_fp
        .globl fx_saved_rsp, fx_redir_count, fx_regs_out, fx_flags_out, fx_xmm_out
        .type fx_var, @object
fx_var:         .quad 0x1234567890
        .size fx_var, 8
        .type fx_store, @object
fx_store:       .quad 0
        .size fx_store, 8
        .type fx_flag, @object
fx_flag:        .quad 0
        .size fx_flag, 8
        .type fx_ctr, @object
fx_ctr:         .quad 0
        .size fx_ctr, 8
        .type fx_store32, @object
fx_store32:     .long 0
        .size fx_store32, 4
        .p2align 3
        .type fx_fp, @object
fx_fp:          .quad fx_fp_target
        .size fx_fp, 8
        .type fx_fp2, @object
fx_fp2:         .quad fx_fp2_target
        .size fx_fp2, 8
        .type fx_jtab, @object
fx_jtab:        .quad .Lcase0, .Lcase1, .Lcase2, .Lcase3
        .size fx_jtab, 32
        .type fx_ctab, @object
fx_ctab:        .quad 0, fx_chk_callee
        .size fx_ctab, 16
        .p2align 4
        .type fx_vecout, @object
fx_vecout:      .quad 0, 0
        .size fx_vecout, 16
        .type fx_c03_sym, @object
fx_c03_sym:     .quad 0x0C03C03C03C03C03
        .size fx_c03_sym, 8
        .type fx_c03_flag, @object
fx_c03_flag:    .quad 0
        .size fx_c03_flag, 8
        .type fx_c03_fp, @object
fx_c03_fp:      .quad fx_c03_target
        .size fx_c03_fp, 8
        .type fx_saved_rsp, @object
fx_saved_rsp:   .quad 0
        .size fx_saved_rsp, 8
        .type fx_redir_count, @object
fx_redir_count: .quad 0
        .size fx_redir_count, 8
        .type fx_regs_out, @object
fx_regs_out:    .zero 128
        .size fx_regs_out, 128
        .type fx_flags_out, @object
fx_flags_out:   .quad 0
        .size fx_flags_out, 8
        .type fx_xmm_out, @object
fx_xmm_out:     .zero 24
        .size fx_xmm_out, 24

        .section .rodata
        .p2align 4
        .globl fx_c325, fx_vec16, fx_byte, fx_rodata_word
        .type fx_vec16, @object
fx_vec16:       .quad 0x0706050403020100, 0x0f0e0d0c0b0a0908
        .size fx_vec16, 16
        .type fx_c325, @object
fx_c325:        .double 3.25
        .size fx_c325, 8
        .type fx_byte, @object
fx_byte:        .byte 0xab
        .size fx_byte, 1
        .p2align 3
        .type fx_rodata_word, @object
fx_rodata_word: .quad 0x90909090c3c3c3c3
        .size fx_rodata_word, 8

        .section .note.GNU-stack, "", @progbits
