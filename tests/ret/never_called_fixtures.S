// SPDX-License-Identifier: MIT
// Code a return probe must not be placed on (never_called_test.cpp): a
// function whose cold part is split out as GCC splits it (a FUNC symbol
// "<name>.cold", jumped to from the body, never called), another named as
// GCC names a fragment of a clone ("<name>.part.0.cold.3"), and a called
// function whose name only looks like one (".coldish").

	.text

// long nc_host(long x): x * 2, or -1 for x < 0 (through its cold fragment,
// which finds the saved rbx at *rsp, not a return address).
	.globl nc_host
	.type nc_host, @function
	.p2align 4
nc_host:
	push %rbx
	mov %rdi, %rbx
	test %rdi, %rdi
	js nc_host.cold
	lea (%rbx,%rbx), %rax
	pop %rbx
	ret
	.size nc_host, .-nc_host

// long nc_host2(long x): x + 1, or -2 for x < 0.
	.globl nc_host2
	.type nc_host2, @function
	.p2align 4
nc_host2:
	push %rbx
	mov %rdi, %rbx
	test %rdi, %rdi
	js nc_host2.part.0.cold.3
	lea 1(%rbx), %rax
	pop %rbx
	ret
	.size nc_host2, .-nc_host2

// long nc_warm.coldish(long x): x + 3 (a called function).
	.globl nc_warm.coldish
	.type nc_warm.coldish, @function
	.p2align 4
nc_warm.coldish:
	lea 3(%rdi), %rax
	ret
	.size nc_warm.coldish, .-nc_warm.coldish

	.section .text.unlikely,"ax",@progbits
	.type nc_host.cold, @function
nc_host.cold:
	mov $-1, %rax
	pop %rbx
	ret
	.size nc_host.cold, .-nc_host.cold

	.type nc_host2.part.0.cold.3, @function
nc_host2.part.0.cold.3:
	mov $-2, %rax
	pop %rbx
	ret
	.size nc_host2.part.0.cold.3, .-nc_host2.part.0.cold.3

	.section .note.GNU-stack,"",@progbits
