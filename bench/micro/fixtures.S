// SPDX-License-Identifier: MIT
// 1000 distinct probe sites for the attach/detach micro-benchmarks:
// micro_fixture_N: nop; ret (16-byte aligned, sized, with CFI), and the table
// micro_fixtures[] of their addresses.

	.altmacro

	.macro FIXTURE n
	.p2align 4
	.globl micro_fixture_\n
	.type micro_fixture_\n, @function
micro_fixture_\n:
	.cfi_startproc
	nop
	ret
	.cfi_endproc
	.size micro_fixture_\n, .-micro_fixture_\n
	.endm

	.macro FIXTURE_ADDR n
	.quad micro_fixture_\n
	.endm

	.text
	.set i, 0
	.rept 1000
	FIXTURE %i
	.set i, i+1
	.endr

	.section .data.rel.ro,"aw"
	.p2align 3
	.globl micro_fixtures
	.type micro_fixtures, @object
micro_fixtures:
	.set i, 0
	.rept 1000
	FIXTURE_ADDR %i
	.set i, i+1
	.endr
	.size micro_fixtures, .-micro_fixtures

	.section .rodata
	.p2align 2
	.globl micro_fixture_count
	.type micro_fixture_count, @object
micro_fixture_count:
	.long 1000
	.size micro_fixture_count, 4

	.section .note.GNU-stack,"",@progbits
