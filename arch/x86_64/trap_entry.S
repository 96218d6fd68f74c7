/* SPDX-License-Identifier: MIT */
/*
 * The SIGTRAP handler's entry point (what sigaction() installs): clears
 * rflags.AC, then tail-calls uprobe_sigtrap_handler() (src/hit/trap.cpp).
 *
 * The kernel delivers a signal with the interrupted code's AC (alignment
 * check) flag still set; a probe hit in code that turned alignment checking
 * on would run the trap path, the dynamic linker's lazy binding and the
 * consumers with it on, and their unaligned accesses (glibc's string
 * functions, ld.so's strcmp) would raise SIGBUS. The interrupted context
 * keeps its own rflags in the ucontext, restored by rt_sigreturn (a program
 * SIGTRAP handler the trap is forwarded to also runs with AC off).
 * The stack is as the kernel set it up (the return address is the signal
 * restorer): pushfq/popfq leave it so, and the jmp keeps it for unwinding.
 */
	.text
	.globl uprobe_sigtrap_entry
	.hidden uprobe_sigtrap_entry
	.type uprobe_sigtrap_entry, @function
	.p2align 4
uprobe_sigtrap_entry:
	.cfi_startproc
	pushfq
	.cfi_adjust_cfa_offset 8
	andl	$~0x40000, (%rsp)
	popfq
	.cfi_adjust_cfa_offset -8
	jmp	uprobe_sigtrap_handler
	.cfi_endproc
	.size uprobe_sigtrap_entry, .-uprobe_sigtrap_entry
	.section .note.GNU-stack,"",@progbits
