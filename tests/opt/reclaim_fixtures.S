/* SPDX-License-Identifier: MIT
 * Fixtures of reclaim_test.cpp: many distinct probe sites in one function.
 *
 *   opt_many(x) = x + 512: 512 units of NOP5 (a nop5 site, at
 *                 opt_many + 3 + 9 i) then `add $1, %rax` (4 bytes, shorter
 *                 than the jump: a window or, with SiteTactics::
 *                 instruction_only, a punned jump; at opt_many + 8 + 9 i).
 *   opt_park(x) = x + 5: a nop5 at its entry (the parked consumer's site).
 */
#include "fixtures.inc"

FUNC opt_many
        mov     %rdi, %rax
        .rept 512
        NOP5
        add     $1, %rax
        .endr
        ret
ENDF opt_many

FUNC opt_park
        NOP5
        lea     5(%rdi), %rax
        ret
ENDF opt_park

        .section .note.GNU-stack,"",@progbits
