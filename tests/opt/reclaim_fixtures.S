/* SPDX-License-Identifier: MIT
 * Fixtures of reclaim_test.cpp: many distinct probe sites in one function.
 *
 *   opt_many(x) = x + 512: 512 units of NOP5 (a nop5 site, at
 *                 opt_many + 3 + 10 i) then `add $1, %rax` (4 bytes, shorter
 *                 than the jump: a window or, with SiteTactics::
 *                 instruction_only, a punned jump; at opt_many + 8 + 10 i)
 *                 and a `nop` (0x90), the last byte of the add's punned
 *                 jump's rel32: its targets lie ~1.8 GiB below the code,
 *                 where ASLR never puts the heap (with the next NOP5's 0x0f
 *                 there they lay ~250 MiB after it, where it may).
 *   opt_park(x) = x + 5: a nop5 at its entry (the parked consumer's site).
 */
#include "fixtures.inc"

FUNC opt_many
        mov     %rdi, %rax
        .rept 512
        NOP5
        add     $1, %rax
        nop
        .endr
        ret
ENDF opt_many

FUNC opt_park
        NOP5
        lea     5(%rdi), %rax
        ret
ENDF opt_park

        .section .note.GNU-stack,"",@progbits
