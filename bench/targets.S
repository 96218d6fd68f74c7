// SPDX-License-Identifier: MIT
// Probe targets of uprobe-bench (the kernel's bench_trigger.c targets, in asm
// so that the first byte of each is known exactly), and the raw-int3 target of
// the sigtrap-floor variant. No endbr64: the probed first byte is the one named.

#define TARGET(name) \
	.p2align 4; .globl name; .type name, @function; name: .cfi_startproc
#define END(name) \
	.cfi_endproc; .size name, .-name

#include "regs_restore.inc"

	.text

TARGET(uprobe_target_nop)
	nop
	ret
END(uprobe_target_nop)

TARGET(uprobe_target_push)
	push %rbp
	.cfi_adjust_cfa_offset 8
	pop %rbp
	.cfi_adjust_cfa_offset -8
	ret
END(uprobe_target_push)

TARGET(uprobe_target_ret)
	ret
END(uprobe_target_ret)

TARGET(uprobe_target_nop5)
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00	// nopl 0x0(%rax,%rax,1)
	ret
END(uprobe_target_nop5)

// A nop5 inside a function, after its first instruction (uprobe-nop5-mid,
// probed at +1): a mid-function site, as a USDT probe is.
TARGET(uprobe_target_nop5_mid)
	push %rbp
	.cfi_adjust_cfa_offset 8
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00	// nopl 0x0(%rax,%rax,1)
	pop %rbp
	.cfi_adjust_cfa_offset -8
	ret
END(uprobe_target_nop5_mid)

// A frame-pointer prologue: the optimized-entry target (the jump displaces
// push %rbp; mov %rsp,%rbp; pop %rbp, 5 bytes, relocated in a window slot).
TARGET(uprobe_target_entry)
	push %rbp
	.cfi_adjust_cfa_offset 8
	mov %rsp, %rbp
	pop %rbp
	.cfi_adjust_cfa_offset -8
	ret
END(uprobe_target_entry)

// trampoline-floor: what an optimized hit costs with nothing of libuprobe in
// it. The site is a jmp rel32 into a stub laid out as libuprobe's
// (arch/x86_64/opt_stub.S): past the red zone, a call of its own body (the
// return address in the target slot), every GPR and rflags saved in a Regs
// frame, an aligned call of a C function that only counts the hit,
// everything restored (the arithmetic flags by an add and sahf; popfq only
// where AC, DF or TF is to be restored), `pop %rsp; ret $128` back to the
// stub's resume point (a predicted return), a jump to the next instruction.
// trampoline-floor-popfq: the stub libuprobe had until session 16: no call
// (the C code wrote the next instruction's address into the target slot, so
// `ret $128` returned where no call had pushed: two mispredicted returns a
// hit, this one and the function's own), rflags always restored by popfq;
// the floor that earlier sessions' figures and issue 17's ratios are relative to.
	.macro FLOOR_STUB name, resume, popfq_only
	.p2align 4
	.type \name, @function
\name:
	.if \popfq_only == 0
	lea	-128(%rsp), %rsp
	call	1f
	jmp	\resume
1:
	.else
	lea	-136(%rsp), %rsp
	.endif
	push	%rsp
	pushfq
	push	$0
	push	%rdi
	push	%rsi
	push	%rdx
	push	%rcx
	push	%rax
	push	%r8
	push	%r9
	push	%r10
	push	%r11
	push	%rbx
	push	%rbp
	push	%r12
	push	%r13
	push	%r14
	push	%r15
	mov	%rsp, %rdi
	xor	%esi, %esi
	mov	%rsp, %rbx
	and	$-16, %rsp
	cld
	call	bench_trampoline_floor_entry
	mov	%rbx, %rsp
	.if \popfq_only == 0
	testl	$0x40500, 128(%rsp)	/* (never here: AC, DF or TF to restore takes popfq) */
	jnz	2f
	RESTORE_FLAGS_AND_GPRS		/* as libuprobe's stubs (arch/x86_64/regs_restore.inc) */
	mov	136(%rsp), %rsp
	ret	$128
2:
	.else
	mov	17*8(%rsp), %rax		/* the target slot (site rsp - 136) */
	lea	\resume(%rip), %rcx
	mov	%rcx, (%rax)
	.endif
	pop	%r15
	pop	%r14
	pop	%r13
	pop	%r12
	pop	%rbp
	pop	%rbx
	pop	%r11
	pop	%r10
	pop	%r9
	pop	%r8
	pop	%rax
	pop	%rcx
	pop	%rdx
	pop	%rsi
	pop	%rdi
	lea	8(%rsp), %rsp
	popfq
	pop	%rsp
	ret	$128
	.size \name, .-\name
	.endm

TARGET(trampoline_floor_target)
	.byte 0xe9
	.long trampoline_floor_stub - . - 4
trampoline_floor_resume:
	ret
END(trampoline_floor_target)
	FLOOR_STUB trampoline_floor_stub, trampoline_floor_resume, 0

TARGET(trampoline_floor_popfq_target)
	.byte 0xe9
	.long trampoline_floor_popfq_stub - . - 4
trampoline_floor_popfq_resume:
	ret
END(trampoline_floor_popfq_target)
	FLOOR_STUB trampoline_floor_popfq_stub, trampoline_floor_popfq_resume, 1

// int3; ret: the SIGTRAP handler returns to the ret (rip is past the int3).
TARGET(sigtrap_floor_target)
	int3
	ret
END(sigtrap_floor_target)

	.section .note.GNU-stack,"",@progbits
