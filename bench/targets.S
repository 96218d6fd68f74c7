// SPDX-License-Identifier: MIT
// Probe targets of uprobe-bench (the kernel's bench_trigger.c targets, in asm
// so that the first byte of each is known exactly), and the raw-int3 target of
// the sigtrap-floor variant. No endbr64: the probed first byte is the one named.

#define TARGET(name) \
	.p2align 4; .globl name; .type name, @function; name: .cfi_startproc
#define END(name) \
	.cfi_endproc; .size name, .-name

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

// int3; ret: the SIGTRAP handler returns to the ret (rip is past the int3).
TARGET(sigtrap_floor_target)
	int3
	ret
END(sigtrap_floor_target)

	.section .note.GNU-stack,"",@progbits
