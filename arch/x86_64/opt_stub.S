/* SPDX-License-Identifier: MIT */
/*
 * Template of an optimized-probe stub (copied per probe site by
 * build_opt_stub(), which patches the two 64-bit immediates). The site holds
 * `jmp rel32` to the copy. The frame built here is a uprobe::Regs (low to
 * high: r15 .. rdi, rip, rflags, rsp), then the target slot, the 128-byte red
 * zone, and the site's stack.
 * uprobe_opt_entry() writes the continuation address into a target slot 136
 * bytes below the stack pointer to continue with (normally the slot this stub
 * reserved; lower when a handler moved rsp) and leaves that slot's address in
 * Regs.rsp; `pop %rsp; ret $128` then continues there with every register as
 * the handlers left it. `lea` does not touch the flags; `and`/`cld`/`test`
 * and the clearing of AC (alignment check) run after pushfq, and popfq
 * restores them.
 */
	.text
	.globl uprobe_opt_stub_template
	.hidden uprobe_opt_stub_template
	.globl uprobe_opt_stub_template_end
	.hidden uprobe_opt_stub_template_end
	.globl uprobe_opt_stub_desc_imm
	.hidden uprobe_opt_stub_desc_imm
	.globl uprobe_opt_stub_entry_imm
	.hidden uprobe_opt_stub_entry_imm
	.p2align 4
uprobe_opt_stub_template:
	lea	-136(%rsp), %rsp
	push	%rsp			/* Regs.rsp (site rsp - 136; fixed up in C) */
	pushfq				/* Regs.rflags */
	push	$0			/* Regs.rip (filled in C) */
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
	.byte	0x48, 0xbe		/* movabs $desc, %rsi */
uprobe_opt_stub_desc_imm:
	.quad	0
	mov	%rsp, %rbx
	and	$-16, %rsp
	cld
	testl	$0x40000, 128(%rbx)	/* Regs.rflags.AC: alignment checking on at the site */
	jz	1f
	pushfq				/* the C code runs with it off (libc, ld.so and consumers */
	andl	$~0x40000, (%rsp)	/* do unaligned accesses); popfq below puts the */
	popfq				/* site's rflags back */
1:
	.byte	0x48, 0xb8		/* movabs $uprobe_opt_entry, %rax */
uprobe_opt_stub_entry_imm:
	.quad	0
	call	*%rax
	mov	%rbx, %rsp
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
	lea	8(%rsp), %rsp		/* Regs.rip */
	popfq
	pop	%rsp			/* Regs.rsp: uprobe_opt_entry() left the target slot's address there */
	ret	$128
uprobe_opt_stub_template_end:
	.section .note.GNU-stack,"",@progbits
