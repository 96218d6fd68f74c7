/* SPDX-License-Identifier: MIT
 * Fixtures of the padded punned jump tests (padded_test.cpp, E9Patch's
 * tactic T1): a 3-byte site (add %rsi, %rax) that a branch enters right
 * after (so no window applies: a punned jump), followed by
 * `sub $imm32, %rax` spelled in bytes (48 2d i0 i1 00 00): the jump's rel32
 * reads [free, free, 48, 2d] unpadded (B2), [free, 48, 2d, i0] after one
 * prefix, [48, 2d, i0, i1] after two. Each fixture has its own i0/i1, so the
 * padded forms of each aim at pages of their own. Result: a + b - (i1 << 8 | i0).
 */

#include "fixtures.inc"

        .macro PADFN name, i0, i1
FUNC \name
        mov %rdi, %rax
        test %rsi, %rsi
        jz 2f
1:      .byte 0x48, 0x01, 0xf0                   /* add %rsi, %rax: the site */
2:      .byte 0x48, 0x2d, \i0, \i1, 0x00, 0x00   /* sub $(i1 << 8 | i0), %rax */
        ret
ENDF \name
        SITE \name, 1b
        .endm

        PADFN pad_one, 0xf0, 0xe0
        PADFN pad_two, 0xe8, 0xd8
        PADFN pad_none, 0xe4, 0xd4
        PADFN pad_free, 0xec, 0xdc
        PADFN pad_forced, 0xf4, 0xe4

        .section .note.GNU-stack, "", @progbits
