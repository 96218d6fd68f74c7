/* SPDX-License-Identifier: MIT */
/*
 * glibc's getcontext(), __sigsetjmp() and BSD setjmp(), interposed
 * (src/interpose/masks.cpp has the rest). Each saves a signal mask: the real one,
 * which never has SIGTRAP blocked, while the program's mask is the real one
 * plus its SIGTRAP "view" bit (uprobe_view_blocked, initial-exec TLS). These
 * return twice, so they cannot be C wrappers (a resumed context would return
 * into a dead frame): the stubs keep the caller's frame.
 *
 * __sigsetjmp(env, savemask) / setjmp(env): with a mask to save, writes the
 * view into a word of env->__saved_mask the kernel never touches
 * (UPROBE_JB_MARK), then jumps to glibc's __sigsetjmp, which saves the
 * caller's registers and the real mask. siglongjmp() reads it back.
 *
 * getcontext(ucp): calls glibc's getcontext, then makes the saved context
 * resume at the caller through uprobe_context_resume: saved rsp = the
 * caller's rsp after the return, saved rip = uprobe_context_resume, saved
 * rdi = the caller's return address (rdi is caller-saved: its value after
 * a call is not the program's); and shows the view in uc_sigmask. Whoever
 * resumes the context (libuprobe's setcontext(), or glibc's own, from
 * __start_context for a makecontext() function's uc_link, which restores
 * uc_sigmask verbatim) passes through uprobe_context_resume, which takes a
 * SIGTRAP blocked for real back into the view before returning 0 to the
 * caller (uprobe_context_resumed() in src/interpose/masks.cpp).
 *
 * Shadow stacks (CET SHSTK) are not handled: glibc 2.36 never enables them.
 */
#include "../context_layout.h"

	.text

/* int __sigsetjmp(struct __jmp_buf_tag *env, int savemask) */
	.globl __sigsetjmp
	.type __sigsetjmp, @function
	.globl uprobe_sigsetjmp
	.hidden uprobe_sigsetjmp
	.type uprobe_sigsetjmp, @function
	.p2align 4
__sigsetjmp:
uprobe_sigsetjmp:
	.cfi_startproc
	testl	%esi, %esi
	jz	1f
	movq	uprobe_view_blocked@gottpoff(%rip), %rax
	movzbl	%fs:(%rax), %eax
	movabsq	$UPROBE_JB_MARK_CLEAR, %rdx
	orq	%rax, %rdx			/* CLEAR | 1 == BLOCKED */
	movq	%rdx, UPROBE_JB_MARK(%rdi)
1:	movq	uprobe_real_sigsetjmp(%rip), %rax
	testq	%rax, %rax
	jz	2f
	jmp	*%rax
2:	/* Before libuprobe's constructor (another object's constructor): resolve now. */
	pushq	%rdi
	.cfi_adjust_cfa_offset 8
	pushq	%rsi
	.cfi_adjust_cfa_offset 8
	subq	$8, %rsp
	.cfi_adjust_cfa_offset 8
	movl	$0, %edi
	call	uprobe_resolve_real
	addq	$8, %rsp
	.cfi_adjust_cfa_offset -8
	popq	%rsi
	.cfi_adjust_cfa_offset -8
	popq	%rdi
	.cfi_adjust_cfa_offset -8
	jmp	*%rax
	.cfi_endproc
	.size __sigsetjmp, .-__sigsetjmp
	.size uprobe_sigsetjmp, .-uprobe_sigsetjmp

/* int setjmp(jmp_buf env): BSD semantics, the mask is saved. */
	.globl setjmp
	.type setjmp, @function
	.p2align 4
setjmp:
	.cfi_startproc
	movl	$1, %esi
	jmp	uprobe_sigsetjmp		/* not through the PLT: a sanitizer intercepts __sigsetjmp too */
	.cfi_endproc
	.size setjmp, .-setjmp

/* int getcontext(ucontext_t *ucp) */
	.globl getcontext
	.type getcontext, @function
	.globl uprobe_getcontext
	.hidden uprobe_getcontext
	.type uprobe_getcontext, @function
	.p2align 4
getcontext:
uprobe_getcontext:
	.cfi_startproc
	pushq	%rdi
	.cfi_adjust_cfa_offset 8
	movq	uprobe_real_getcontext(%rip), %rax
	testq	%rax, %rax
	jnz	1f
	movl	$1, %edi
	call	uprobe_resolve_real		/* (rsp is 16-aligned here) */
	movq	(%rsp), %rdi
1:	call	*%rax
	popq	%rdi
	.cfi_adjust_cfa_offset -8
	testl	%eax, %eax
	jnz	2f
	movq	(%rsp), %rcx			/* the caller's return address */
	movq	%rcx, UPROBE_UC_RDI(%rdi)
	leaq	uprobe_context_resume(%rip), %rcx
	movq	%rcx, UPROBE_UC_RIP(%rdi)
	leaq	8(%rsp), %rcx
	movq	%rcx, UPROBE_UC_RSP(%rdi)
	movq	uprobe_view_blocked@gottpoff(%rip), %rcx
	cmpb	$0, %fs:(%rcx)
	je	2f
	orq	$UPROBE_SIGTRAP_BIT, UPROBE_UC_SIGMASK(%rdi)
2:	ret
	.cfi_endproc
	.size getcontext, .-getcontext
	.size uprobe_getcontext, .-uprobe_getcontext

/* Where a context saved by getcontext() resumes: rsp = the caller's rsp
 * after getcontext returned, rdi = its return address. Not callable. */
	.globl uprobe_context_resume
	.hidden uprobe_context_resume
	.type uprobe_context_resume, @function
	.p2align 4
uprobe_context_resume:
	.cfi_startproc
	.cfi_undefined rip
	pushq	%rdi
	subq	$8, %rsp
	call	uprobe_context_resumed		/* clobbers only caller-saved registers */
	addq	$8, %rsp
	popq	%rcx
	xorl	%eax, %eax			/* getcontext() returns 0 again */
	jmp	*%rcx
	.cfi_endproc
	.size uprobe_context_resume, .-uprobe_context_resume

	.section .note.GNU-stack,"",@progbits
