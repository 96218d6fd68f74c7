/* SPDX-License-Identifier: MIT */
/*
 * The return trampoline (the kernel's uretprobe trampoline page, as our own
 * code): a function with a pending return probe returns here instead of to
 * its caller. It saves every GPR and rflags as a uprobe::Regs, in place, and
 * xmm0/xmm1 (return_xmm()), calls uprobe_ret_entry(frame) which pops the
 * return instance(s), runs the ret_handlers on that Regs (preserving the
 * vector and x87 state a return makes live around those that use it) and
 * puts the address to continue at in the return slot; then everything is
 * restored and a jump through the old return-address slot continues there,
 * with rsp exactly as the returning function left it. No signal, no
 * syscall. rflags.AC (alignment check) and DF are cleared by the first
 * instructions, before any access that alignment checking could fault on
 * (xmm0/xmm1 are stored at rsp % 16 == 8, and AMD raises #AC for that
 * 16-byte store when AC is on); the ret_handlers run with both off, and the
 * saved rflags, AC and DF included, are restored.
 *
 * Frame (low to high; arch::RetFrame): xmm0, xmm1, then a uprobe::Regs:
 * r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi, rip (filled in
 * by the dispatch), rflags, rsp (filled in by the dispatch: the stack
 * pointer after the return), then the return slot.
 *
 * The area below rsp is free: the returning function's frame is gone and a
 * caller cannot keep red-zone data live across its own call.
 *
 * CFI: the return slot is filled with the real return address before any
 * handler runs, so unwinding from inside a ret_handler continues into the
 * real caller. The byte before the entry point has rip undefined, so an
 * unwinder that meets the trampoline address as a return address of a frame
 * that has not returned yet stops there (libuprobe restores real return
 * addresses before C++ exceptions and backtraces unwind). For the unwinders
 * it cannot interpose (glibc's pthread_cancel and pthread_exit call
 * libgcc_s's _Unwind_ForcedUnwind through dlsym) that byte carries a
 * personality routine (uprobe_ret_personality) whose cleanup phase lands in
 * uprobe_ret_unwind_landing below: it pops the frame's return instance and
 * resumes the unwind as if called from the real return address, so the
 * caller's destructors and cleanup handlers run.
 *
 * A function entered through an optimized entry stub returns to
 * uprobe_ret_landing instead (below: a return address its thunk's call
 * pushed, so the return is predicted), which runs the same body and leaves
 * through `ret`. arch::is_return_trampoline() knows both addresses; the
 * landing's CFI and personality are the trampoline's.
 */
#include "regs_restore.inc"

/*
 * The body both return addresses run: the frame, uprobe_ret_entry(), the
 * restore. rsp on entry: just past the return slot, CFA = rsp (the slot, the
 * rip rule). \landing = 0 (uprobe_ret_trampoline, reached by a return no call
 * pushed): leaves through `jmp *-8(%rsp)` with rsp as the function returned
 * it, the return stack buffer left to the caller's own return; \landing = 1
 * (uprobe_ret_landing, reached by a return the thunk's call pushed): leaves
 * through `ret` with rsp at the return slot, which returns to the caller's
 * real return address, the one the return stack buffer holds next.
 */
	.macro RET_BODY landing
	lea	-16(%rsp), %rsp		/* the return slot (reused) and Regs.rsp; lea keeps the flags */
	.cfi_adjust_cfa_offset 16
	pushfq				/* Regs.rflags: the returning code's, restored at the end */
	.cfi_adjust_cfa_offset 8
	testl	$0x40400, (%rsp)	/* AC or DF on? (a 4-byte read at an 8-byte aligned address) */
	jz	1f
	pushfq				/* AC and DF off before any other access: with AC on, */
	.cfi_adjust_cfa_offset 8
	andl	$~0x40400, (%rsp)	/* a 16-byte store at rsp % 16 == 8 raises #AC on AMD */
	popfq				/* (pushfq is an 8-byte store at an 8-byte aligned */
	.cfi_adjust_cfa_offset -8	/* address: no CPU checks it stricter) */
1:
	lea	-8(%rsp), %rsp		/* Regs.rip */
	.cfi_adjust_cfa_offset 8
	push	%rdi
	.cfi_adjust_cfa_offset 8
	push	%rsi
	.cfi_adjust_cfa_offset 8
	push	%rdx
	.cfi_adjust_cfa_offset 8
	push	%rcx
	.cfi_adjust_cfa_offset 8
	push	%rax
	.cfi_adjust_cfa_offset 8
	push	%r8
	.cfi_adjust_cfa_offset 8
	push	%r9
	.cfi_adjust_cfa_offset 8
	push	%r10
	.cfi_adjust_cfa_offset 8
	push	%r11
	.cfi_adjust_cfa_offset 8
	push	%rbx
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset rbx, 0
	push	%rbp
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset rbp, 0
	push	%r12
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset r12, 0
	push	%r13
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset r13, 0
	push	%r14
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset r14, 0
	push	%r15
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset r15, 0
	lea	-32(%rsp), %rsp
	.cfi_adjust_cfa_offset 32
	movdqu	%xmm0, 0(%rsp)
	movdqu	%xmm1, 16(%rsp)
	mov	%rsp, %rbx
	.cfi_def_cfa_register rbx
	and	$-16, %rsp
	mov	%rbx, %rdi
	call	uprobe_ret_entry
	mov	%rbx, %rsp
	.cfi_def_cfa_register rsp
	movdqu	0(%rsp), %xmm0
	movdqu	16(%rsp), %xmm1
	lea	32(%rsp), %rsp		/* the Regs: r15 at 0 ... rdi 112, rip 120, rflags 128, rsp 136; return slot 144 */
	.cfi_adjust_cfa_offset -32
	.cfi_remember_state
	testl	$0x40500, 128(%rsp)	/* AC, DF or TF to restore: popfq (below) */
	jnz	2f
	/*
	 * Only the arithmetic flags: OF from an add that overflows or not, then
	 * SF ZF AF PF CF by sahf (about 3 cycles; popfq takes 10 or more). The
	 * registers come back by mov, which leaves the flags alone; the way out
	 * reads the continuation from the return slot (the trampoline: just
	 * below the restored rsp, the red zone, where no signal frame is
	 * written).
	 */
	RESTORE_FLAGS_AND_GPRS
	.if \landing
	lea	144(%rsp), %rsp		/* the return slot */
	.cfi_adjust_cfa_offset -144
	ret
	.else
	lea	152(%rsp), %rsp		/* rsp as the function returned it */
	.cfi_adjust_cfa_offset -152
	jmp	*-8(%rsp)
	.endif
2:
	.cfi_restore_state
	/*
	 * popfq right before the ret, so that a TF it sets (a handler's write to
	 * Regs::rflags) traps after the return, in the caller: rflags moves to
	 * the Regs.rsp slot, just below the return slot.
	 */
	mov	128(%rsp), %rax
	mov	%rax, 136(%rsp)
	pop	%r15
	.cfi_adjust_cfa_offset -8
	pop	%r14
	.cfi_adjust_cfa_offset -8
	pop	%r13
	.cfi_adjust_cfa_offset -8
	pop	%r12
	.cfi_adjust_cfa_offset -8
	pop	%rbp
	.cfi_adjust_cfa_offset -8
	pop	%rbx
	.cfi_adjust_cfa_offset -8
	pop	%r11
	.cfi_adjust_cfa_offset -8
	pop	%r10
	.cfi_adjust_cfa_offset -8
	pop	%r9
	.cfi_adjust_cfa_offset -8
	pop	%r8
	.cfi_adjust_cfa_offset -8
	pop	%rax
	.cfi_adjust_cfa_offset -8
	pop	%rcx
	.cfi_adjust_cfa_offset -8
	pop	%rdx
	.cfi_adjust_cfa_offset -8
	pop	%rsi
	.cfi_adjust_cfa_offset -8
	pop	%rdi
	.cfi_adjust_cfa_offset -8
	lea	16(%rsp), %rsp		/* Regs.rip, Regs.rflags (its copy is next) */
	.cfi_adjust_cfa_offset -16
	popfq
	.cfi_adjust_cfa_offset -8
	ret
	.endm

	.text
	.p2align 4
	.globl uprobe_ret_trampoline_begin
	.hidden uprobe_ret_trampoline_begin
	.globl uprobe_ret_trampoline
	.hidden uprobe_ret_trampoline
	.type uprobe_ret_trampoline, @function
uprobe_ret_trampoline_begin:
	.cfi_startproc
	.cfi_personality 0x1b, uprobe_ret_personality	/* DW_EH_PE_pcrel | DW_EH_PE_sdata4 */
	.cfi_undefined rip
	nop
uprobe_ret_trampoline:
	.cfi_def_cfa rsp, 0
	.cfi_offset rip, -8
	RET_BODY 0
	.cfi_endproc
	.size uprobe_ret_trampoline, .-uprobe_ret_trampoline

/*
 * The predicted return (an optimized entry's return probe; arch.hpp,
 * opt_frame_leave()): the entry stub's resume point jumps to
 * uprobe_ret_thunk with rsp at the function's return slot, which the hit
 * filled with the function's continuation (OptSite::resume; the real return
 * address is in the return instance). The thunk steps over the slot and
 * calls the continuation through it: the call pushes uprobe_ret_landing into
 * the same slot, with rsp and every register as at the function's entry, so
 * the function runs as called from the thunk and its `ret` returns to the
 * landing as the return stack buffer predicts; the landing's own `ret` then
 * takes the caller's real return address, the one that buffer holds next.
 * In the optimized path's section (arch.hpp, UPROBE_OPT_PATH_TEXT): a thread
 * in the thunk may continue in a retired stub's window slot. The landing only
 * jumps to its body in .text, where the ret_handlers run.
 *
 * CFI: the thunk's and the landing's (the byte before it is the thunk's call)
 * as the trampoline's: rip undefined and uprobe_ret_personality there, the
 * body's rule from the landing on.
 */
	.section uprobe_opt_path, "ax", @progbits
	.p2align 4
	.globl uprobe_ret_thunk
	.hidden uprobe_ret_thunk
	.type uprobe_ret_thunk, @function
	.globl uprobe_ret_landing
	.hidden uprobe_ret_landing
uprobe_ret_thunk:
	.cfi_startproc
	.cfi_personality 0x1b, uprobe_ret_personality
	.cfi_undefined rip
	lea	8(%rsp), %rsp		/* past the return slot (lea keeps the flags) */
	call	*-8(%rsp)		/* the continuation; pushes the landing into the slot */
uprobe_ret_landing:
	.cfi_def_cfa rsp, 0
	.cfi_offset rip, -8
	jmp	uprobe_ret_landing_body
	.cfi_endproc
	.size uprobe_ret_thunk, .-uprobe_ret_thunk

	.text
	.p2align 4
	.type uprobe_ret_landing_body, @function
uprobe_ret_landing_body:
	.cfi_startproc
	.cfi_def_cfa rsp, 0
	.cfi_offset rip, -8
	RET_BODY 1
	.cfi_endproc
	.size uprobe_ret_landing_body, .-uprobe_ret_landing_body

/*
 * Landing pad of uprobe_ret_personality: installed by the unwinder with the
 * state of the frame whose return address was hijacked, as if the probed
 * function had returned (rsp = its return slot + 8, the caller's callee-saved
 * registers), rax = the _Unwind_Exception. uprobe_ret_unwind_pop(rsp) pops
 * that frame's return instance (and any left by deeper frames, dropped) and
 * returns the real return address; it goes back into the slot and
 * _Unwind_Resume runs as if called from there, continuing the unwind in the
 * real caller.
 */
	.p2align 4
	.globl uprobe_ret_unwind_landing
	.hidden uprobe_ret_unwind_landing
	.type uprobe_ret_unwind_landing, @function
uprobe_ret_unwind_landing:
	.cfi_startproc
	.cfi_undefined rip
	push	%rax			/* the exception; rsp = slot */
	sub	$8, %rsp		/* slot % 16 == 8 (the callee's entry): aligned for the call */
	lea	16(%rsp), %rdi
	call	uprobe_ret_unwind_pop
	add	$8, %rsp
	pop	%rdi
	push	%rax			/* the real return address back in the slot */
	jmp	_Unwind_Resume@PLT
	.cfi_endproc
	.size uprobe_ret_unwind_landing, .-uprobe_ret_unwind_landing
	.section .note.GNU-stack,"",@progbits
