/* SPDX-License-Identifier: MIT */
/*
 * Template of an optimized-probe stub (copied per probe site by
 * build_opt_stub(), which patches the three 64-bit immediates and puts the
 * site's OptSite descriptor right after the code). The site holds `jmp
 * rel32` to the copy. The stub steps past the red zone and calls its own
 * body: the call pushes the stub's resume point into the target slot, 136
 * bytes below the site's stack pointer. The body's frame is a uprobe::Regs
 * (low to high: r15 .. rdi, rip, rflags, rsp), then the target slot, the
 * 128-byte red zone, and the site's stack. After uprobe_opt_entry() the body
 * jumps to uprobe_opt_stub_exit (one copy, in libuprobe: the stubs stay
 * small), which puts every register back as the handlers left them and
 * returns through the target slot with `pop %rsp; ret $128`, rsp then the
 * site's: normally to the resume point its call pushed, a return the CPU
 * predicts (its return stack buffer stays in step with the program's calls:
 * a `ret` to an address no call pushed cost two mispredicted returns a hit,
 * this one and the probed function's own), which jumps to
 * OptSite::resume (at a function entry, to what opt_frame_leave() wrote 16
 * bytes below the site's rsp: see uprobe_opt_stub_entry_resume). A handler's new rip or rsp: uprobe_opt_entry() writes the
 * continuation into the target slot below the stack pointer to continue with
 * and leaves that slot's address in Regs.rsp (opt_frame_leave()).
 * `lea` and `call` do not touch the flags; `and`/`cld`/`test` and the
 * clearing of AC (alignment check) run after pushfq; on the way out the
 * arithmetic flags come back by an add (OF) and sahf, or, when AC, DF or TF
 * is to be restored (a handler's write, or set at the site), the whole
 * rflags by popfq.
 */
#include "regs_restore.inc"

	.text
	.globl uprobe_opt_stub_template
	.hidden uprobe_opt_stub_template
	.globl uprobe_opt_stub_template_end
	.hidden uprobe_opt_stub_template_end
	.globl uprobe_opt_stub_desc_imm
	.hidden uprobe_opt_stub_desc_imm
	.globl uprobe_opt_stub_entry_imm
	.hidden uprobe_opt_stub_entry_imm
	.globl uprobe_opt_stub_exit_imm
	.hidden uprobe_opt_stub_exit_imm
	.globl uprobe_opt_stub_resume
	.hidden uprobe_opt_stub_resume
	.globl uprobe_opt_stub_resume_end
	.hidden uprobe_opt_stub_resume_end
	.globl uprobe_opt_stub_entry_resume
	.hidden uprobe_opt_stub_entry_resume
	.p2align 4
uprobe_opt_stub_template:
	lea	-128(%rsp), %rsp	/* past the red zone */
	call	1f			/* its return address: the target slot, site rsp - 136 */
uprobe_opt_stub_resume:
	jmp	*(uprobe_opt_stub_template_end + 8)(%rip)	/* OptSite::resume (the descriptor follows the code) */
uprobe_opt_stub_resume_end:
1:
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
	andl	$~0x40000, (%rsp)	/* do unaligned accesses); uprobe_opt_stub_exit's */
	popfq				/* popfq puts the site's rflags back */
1:
	.byte	0x48, 0xb8		/* movabs $uprobe_opt_entry, %rax */
uprobe_opt_stub_entry_imm:
	.quad	0
	call	*%rax
	.byte	0x48, 0xb9		/* movabs $uprobe_opt_stub_exit, %rcx (rcx: restored there) */
uprobe_opt_stub_exit_imm:
	.quad	0
	jmp	*%rcx
	.p2align 4, 0xcc
uprobe_opt_stub_template_end:			/* (16-aligned: where build_opt_stub() puts the descriptor) */

/*
 * The resume point of a stub at a function's first instruction made while
 * the probe had a return consumer (OptSite::at_entry), copied over the
 * template's by build_opt_stub(): when the hit armed a return probe, the
 * continuation comes from the red zone, 16 bytes below the site's stack
 * pointer, where opt_frame_leave() wrote uprobe_ret_thunk (ret_trampoline.S);
 * a hit that armed none returns past this point, to OptSite::resume, and
 * leaves the red zone alone. Below rsp at a function's first instruction is
 * dead for a uretprobe (whose hijack of the return slot assumes a call); the
 * stub's own frame starts 136 bytes below it, and a signal frame 128 bytes below it.
 * Never executed here; as long as the template's.
 */
	.section .rodata
uprobe_opt_stub_entry_resume:
	jmp	*-16(%rsp)
	.fill	(uprobe_opt_stub_resume_end - uprobe_opt_stub_resume) - (. - uprobe_opt_stub_entry_resume), 1, 0xcc

/*
 * The way out of every stub, in the optimized path's section (a thread here
 * counts as inside the stubs: it may still continue in a retired stub's
 * slot; arch.hpp, UPROBE_OPT_PATH_TEXT). rbx: the Regs frame.
 */
	.section uprobe_opt_path, "ax", @progbits
	.globl uprobe_opt_stub_exit
	.hidden uprobe_opt_stub_exit
	.type uprobe_opt_stub_exit, @function
	.p2align 4
uprobe_opt_stub_exit:
	mov	%rbx, %rsp
	testl	$0x40500, 128(%rsp)	/* AC, DF or TF to restore: popfq (below) */
	jnz	2f
	RESTORE_FLAGS_AND_GPRS		/* (regs_restore.inc) */
	mov	136(%rsp), %rsp		/* Regs.rsp: the target slot (normally the stub's resume point) */
	ret	$128
2:
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
	pop	%rsp			/* Regs.rsp */
	ret	$128
	.size uprobe_opt_stub_exit, .-uprobe_opt_stub_exit

	.section .note.GNU-stack,"",@progbits
