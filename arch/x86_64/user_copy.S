/* SPDX-License-Identifier: MIT */
/*
 * Copies from memory that may not be readable, in the process itself: the
 * user-space counterpart of the kernel's copy_from_user() and
 * strncpy_from_user() with their exception table
 * (arch/x86/lib/copy_user_64.S, lib/strncpy_from_user.c,
 * arch/x86/mm/extable.c). Each load that may fault has a label
 * (uprobe_ucopy_load8/load1, uprobe_ustr_load8/load1); the SIGSEGV/SIGBUS
 * handler libuprobe installs (src/interpose/signals.cpp) takes a fault at
 * exactly one of these addresses for its own and resumes at the routine's
 * fixup (arch::user_copy_fixup(), user_copy.cpp), which returns what was
 * copied so far. The stores to the destination are not in the table: a bad
 * destination is the caller's bug and faults as any other access.
 *
 * Loads are 8 bytes only at 8-aligned source addresses, which never cross a
 * page: a faulting word has no readable byte, so the count of bytes copied
 * is exact to the byte, as the kernel's byte-at-a-time fallback makes it.
 * No stack use, no call: leaf functions with the SysV convention (rax, rcx,
 * r8-r11 clobbered). Not instrumented (assembly): safe under ASan and TSan.
 * Async-signal-safe.
 */
	.text

/* size_t uprobe_arch_copy_user(void *dst, const void *src, size_t n):
 * copies n bytes; returns n, or the count copied before the first byte that
 * cannot be read (the bytes before it are in dst). */
	.globl uprobe_arch_copy_user
	.hidden uprobe_arch_copy_user
	.type uprobe_arch_copy_user, @function
	.globl uprobe_ucopy_load8
	.hidden uprobe_ucopy_load8
	.globl uprobe_ucopy_load1
	.hidden uprobe_ucopy_load1
	.globl uprobe_ucopy_fixup
	.hidden uprobe_ucopy_fixup
	.p2align 4
uprobe_arch_copy_user:
	.cfi_startproc
	xorl	%eax, %eax		/* rax: bytes copied */
1:	cmpq	%rdx, %rax
	jae	9f
	leaq	(%rsi,%rax), %r8	/* r8: the next source byte */
	testb	$7, %r8b
	jnz	3f
	movq	%rdx, %rcx
	subq	%rax, %rcx
	cmpq	$8, %rcx
	jb	3f
uprobe_ucopy_load8:
	movq	(%r8), %r9
	movq	%r9, (%rdi,%rax)
	addq	$8, %rax
	jmp	1b
3:
uprobe_ucopy_load1:
	movzbl	(%r8), %r9d
	movb	%r9b, (%rdi,%rax)
	incq	%rax
	jmp	1b
9:	ret
uprobe_ucopy_fixup:			/* a load faulted: rax bytes were copied */
	ret
	.cfi_endproc
	.size uprobe_arch_copy_user, .-uprobe_arch_copy_user

/* long uprobe_arch_copy_user_str(char *dst, const char *src, size_t size):
 * copies the bytes of src up to and including its first NUL, reading at
 * most size bytes; returns the NUL's index (the string's length: the NUL
 * is copied), size when the first size bytes hold none (all copied, no
 * NUL written), or -1 when a byte up to there cannot be read (dst holds
 * what was copied before it). */
	.globl uprobe_arch_copy_user_str
	.hidden uprobe_arch_copy_user_str
	.type uprobe_arch_copy_user_str, @function
	.globl uprobe_ustr_load8
	.hidden uprobe_ustr_load8
	.globl uprobe_ustr_load1
	.hidden uprobe_ustr_load1
	.globl uprobe_ustr_fixup
	.hidden uprobe_ustr_fixup
	.p2align 4
uprobe_arch_copy_user_str:
	.cfi_startproc
	xorl	%eax, %eax		/* rax: bytes copied */
	movabsq	$0x0101010101010101, %r10
	movabsq	$0x8080808080808080, %r11
1:	cmpq	%rdx, %rax
	jae	9f
	leaq	(%rsi,%rax), %r8	/* r8: the next source byte */
	testb	$7, %r8b
	jnz	3f
	movq	%rdx, %rcx
	subq	%rax, %rcx
	cmpq	$8, %rcx
	jb	3f
uprobe_ustr_load8:
	movq	(%r8), %r9
	movq	%r9, %rcx		/* a zero byte in the word: (w - 0x01..) & ~w & 0x80.. != 0 */
	subq	%r10, %rcx
	notq	%r9
	andq	%r9, %rcx
	notq	%r9
	andq	%r11, %rcx
	jnz	3f			/* then byte by byte (the word's page is readable) */
	movq	%r9, (%rdi,%rax)
	addq	$8, %rax
	jmp	1b
3:
uprobe_ustr_load1:
	movzbl	(%r8), %r9d
	movb	%r9b, (%rdi,%rax)
	testb	%r9b, %r9b
	jz	9f
	incq	%rax
	jmp	1b
9:	ret				/* rax: the NUL's index, or size */
uprobe_ustr_fixup:			/* a load faulted */
	movq	$-1, %rax
	ret
	.cfi_endproc
	.size uprobe_arch_copy_user_str, .-uprobe_arch_copy_user_str

	.section .note.GNU-stack,"",@progbits
