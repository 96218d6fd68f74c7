/* SPDX-License-Identifier: MIT
 * Fixtures of the padded punned jump tests (padded_test.cpp, E9Patch's
 * tactic T1): a 3-byte site (add %rsi, %rax) that a branch enters right
 * after (so no window applies: a punned jump), followed by
 * `sub $imm32, %rax` spelled in bytes (rex 2d i0 i1 00 00, rex one of the
 * REX.W forms 48..4f, whose other bits the short form ignores): the jump's
 * rel32 reads [free, free, rex, 2d] unpadded (B2), [free, rex, 2d, i0] after
 * one prefix, [rex, 2d, i0, i1] after two. Each fixture has its own i0/i1 and
 * the ones whose B2 pages a test takes or uses their own rex (2 apart: 64 KiB
 * between their ranges), so that no fixture's pages are another's, whatever
 * the order the tests run in. Result: a + b - (i1 << 8 | i0).
 */

#include "fixtures.inc"

        .macro PADFN name, rex, i0, i1
FUNC \name
        mov %rdi, %rax
        test %rsi, %rsi
        jz 2f
1:      .byte 0x48, 0x01, 0xf0                   /* add %rsi, %rax: the site */
2:      .byte \rex, 0x2d, \i0, \i1, 0x00, 0x00  /* sub $(i1 << 8 | i0), %rax */
        ret
ENDF \name
        SITE \name, 1b
        .endm

        PADFN pad_one, 0x48, 0xf0, 0xe0
        PADFN pad_two, 0x4a, 0xe8, 0xd8
        PADFN pad_none, 0x4c, 0xe4, 0xd4
        PADFN pad_free, 0x4e, 0xec, 0xdc
        PADFN pad_forced, 0x48, 0xf4, 0xe4
        PADFN pad_resync, 0x4b, 0xfc, 0xec

/* pad_far: the site followed by `mov $0x60a0, %ecx` (b9 a0 60 00 00): B2's
 * rel32 reads [free, free, b9, a0], ~1.59 GiB below the site (beyond the
 * 1 GiB within which XOL memory serves a jump: its stub gets a region near
 * its hop); one prefix, [free, b9, a0, 60], ~1.62 GiB above: the two hops
 * 3.2 GiB apart, beyond a rel32 from one's stub to the other. Result:
 * a + b - 0x60a0. */
FUNC pad_far
        mov %rdi, %rax
        test %rsi, %rsi
        jz 2f
1:      .byte 0x48, 0x01, 0xf0                   /* add %rsi, %rax: the site */
2:      .byte 0xb9, 0xa0, 0x60, 0x00, 0x00       /* mov $0x60a0, %ecx */
        sub %rcx, %rax
        ret
ENDF pad_far
        SITE pad_far, 1b

        .section .note.GNU-stack, "", @progbits
