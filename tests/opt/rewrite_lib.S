// SPDX-License-Identifier: MIT
// Two builds of one small library (opt_rewrite_into, opt_rewrite_entry), the
// same size and layout: fb ends with a short jump into fa, at fa+3 (inside
// the 5 bytes an entry jump at fa displaces: fa must stay int3) or at fa
// itself (a tail call to its entry: fa's entry may take the jump).
// rewrite_test.cpp rewrites one over the other in place.
	.text
	.globl	fb
	.type	fb, @function
	.p2align 4
fb:
	.cfi_startproc
	mov	%rdi, %rax
	add	%rdi, %rax
#ifdef REWRITE_INTO_WINDOW
	jmp	.Lin
#else
	jmp	.Lfa
#endif
	.cfi_endproc
	.size	fb, .-fb

	.globl	fa
	.type	fa, @function
	.p2align 4
fa:
	.cfi_startproc
.Lfa:
	mov	%rdi, %rax
.Lin:
	add	%rsi, %rax
	ret
	.cfi_endproc
	.size	fa, .-fa
	.section .note.GNU-stack, "", @progbits
