/* SPDX-License-Identifier: MIT */
/* Functions arch::analyze_clobbers() reads (clobber_test.cpp): each says
 * what the analysis must answer. Never called. */
	.text
#define FN(name) .globl name; .type name, @function; .p2align 4; name:

FN(cl_int_only)			/* known, no xmm */
	mov	$1, %eax
	add	%rdi, %rax
	ret
FN(cl_sse_0_2_5)		/* known: xmm0, xmm2, xmm5 -> 6 */
	pxor	%xmm0, %xmm0
	movaps	%xmm5, %xmm2
	ret
FN(cl_stmxcsr)			/* known, no xmm (stmxcsr only reads) */
	stmxcsr	-4(%rsp)
	ret
FN(cl_syscall)			/* known, no xmm */
	mov	$39, %eax
	syscall
	ret
FN(cl_callee_xmm9)
	xorps	%xmm9, %xmm9
	ret
FN(cl_calls)			/* known: xmm9 in the callee -> 10 */
	call	cl_callee_xmm9
	addsd	%xmm1, %xmm1
	ret
FN(cl_tail)			/* known: the tail-called function's xmm9 -> 10 */
	jmp	cl_callee_xmm9
FN(cl_branches)			/* known: both ways, xmm3/xmm4 and xmm7 -> 8 */
	test	%edi, %edi
	je	1f
	movsd	%xmm3, %xmm4
	ret
1:	cvtsi2sd %edi, %xmm7
	jmp	2f
	pcmpeqd	%xmm15, %xmm15		/* (never reached: not counted) */
2:	ret
FN(cl_loop)			/* known: a backward branch, xmm1 -> 2 */
1:	addsd	%xmm1, %xmm1
	dec	%edi
	jnz	1b
	ret
FN(cl_pcmpistrm)		/* known: xmm1, xmm2 (and xmm0, which it writes implicitly) -> 3 */
	pcmpistrm $0, %xmm2, %xmm1
	ret
FN(cl_ud2_path)			/* unknown: ud2 (a SIGILL handler may resume after it) */
	test	%edi, %edi
	jne	1f
	ud2
	pcmpeqd	%xmm14, %xmm14
1:	ret
FN(cl_vex)			/* unknown: VEX zeroes the upper halves */
	vpxor	%xmm1, %xmm1, %xmm1
	ret
FN(cl_vzeroupper)		/* unknown */
	vzeroupper
	ret
FN(cl_evex)			/* unknown */
	vpxord	%xmm17, %xmm17, %xmm17
	ret
FN(cl_x87)			/* unknown */
	fld1
	fstp	%st(0)
	ret
FN(cl_mmx)			/* unknown */
	pxor	%mm0, %mm0
	ret
FN(cl_ldmxcsr)			/* unknown: a control load */
	ldmxcsr	(%rdi)
	ret
FN(cl_fxrstor)			/* unknown: a state restore */
	fxrstor	(%rdi)
	ret
FN(cl_indirect_call)		/* unknown: code not read */
	call	*%rax
	ret
FN(cl_indirect_jmp)		/* unknown */
	jmp	*(%rax)
FN(cl_behind_indirect)		/* unknown: a direct callee calls through a pointer */
	call	cl_indirect_call
	ret
FN(cl_unreadable_callee)	/* unknown when the reader cannot read the callee */
	call	cl_callee_xmm9
	ret
FN(cl_int3)			/* unknown: int3 may be a probe's breakpoint over other code */
	int3
	ret
FN(cl_rex_before_prefix_vex)	/* unknown: REX, then a segment prefix, then VEX (vpxor) */
	.byte	0x40, 0x2e, 0xc5, 0xf1, 0xef, 0xc9
	ret
FN(cl_rex_before_prefix_fldcw)	/* unknown: REX, a segment prefix, fldcw (x87 control load) */
	.byte	0x40, 0x2e, 0xd9, 0x2f
	ret
FN(cl_rex_before_prefix_emms)	/* unknown */
	.byte	0x40, 0x2e, 0x0f, 0x77
	ret
FN(cl_retpoline_thunk)		/* a retpoline: the `ret` goes to *%rax */
	call	1f
2:	pause
	lfence
	jmp	2b
1:	mov	%rax, (%rsp)
	ret
FN(cl_retpoline_call)		/* unknown: calls through the retpoline */
	call	cl_retpoline_thunk
	ret
FN(cl_push_ret)			/* unknown: push; ret is a jump */
	push	%rax
	ret
FN(cl_frame)			/* known: a frame pointer, locals, leave, xmm2 -> 3 */
	push	%rbp
	mov	%rsp, %rbp
	sub	$32, %rsp
	mov	%rdi, -8(%rbp)
	mov	%rsi, 8(%rsp)
	movsd	%xmm2, 16(%rsp)
	leave
	ret
FN(cl_frame_slot_write)		/* unknown: writes its return address through rbp */
	push	%rbp
	mov	%rsp, %rbp
	mov	%rdi, 8(%rbp)
	pop	%rbp
	ret
FN(cl_unbalanced)		/* unknown: returns with 8 bytes left on the stack */
	sub	$8, %rsp
	ret
FN(cl_end)

	.section .note.GNU-stack,"",@progbits
