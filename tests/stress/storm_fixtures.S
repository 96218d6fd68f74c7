/* SPDX-License-Identifier: MIT
 * Probed fixtures of uprobe-storm (tests/stress). Each is
 * `uint64_t fn(uint64_t x)`; its model is in storm.cpp (storm_model).
 * Every function is .globl with .type/.size (the runtime's mid-instruction
 * check reads the symbol table); `OFF fn, label, name` exports `name`, a
 * .quad in .rodata holding `label - fn` (the probe offset).
 */

#include "fixtures.inc"

/* 3x + 10. Entry `push %rbp` (emulated); `lea` (run out of line);
 * `add sym(%rip)` (run out of line with the rip-relative fixup). */
FUNC storm_mid
        push %rbp
        mov %rsp, %rbp
.Lmid_lea:
        lea 3(%rdi,%rdi,2), %rax
.Lmid_rip:
        add storm_mid_addend(%rip), %rax
        pop %rbp
        ret
ENDF storm_mid
OFF storm_mid, .Lmid_lea, storm_mid_lea_site
OFF storm_mid, .Lmid_rip, storm_mid_rip_site

/* x + 5, with a 5-byte nop between real instructions (an optimized site). */
FUNC storm_nop5
        mov %rdi, %rax
.Lnop5:
        .byte 0x0f, 0x1f, 0x44, 0x00, 0x00
        add $5, %rax
        ret
ENDF storm_nop5
OFF storm_nop5, .Lnop5, storm_nop5_site

/* 7x, entry `push %rbx`. */
FUNC storm_entry
        push %rbx
        mov %rdi, %rbx
        imul $7, %rbx, %rbx
        mov %rbx, %rax
        pop %rbx
        ret
ENDF storm_entry

/* x + 11, for return probes and sessions (entry `lea`, run out of line). */
FUNC storm_ret
        lea 11(%rdi), %rax
        ret
ENDF storm_ret

/* x < 2^63: 2x + 1; else x + 1. The site `add %rax, %rax` (3 bytes) is
 * followed by a branch target 3 bytes into the 5 a jump would displace, so
 * no window applies: a punned jump (E9Patch's B2) whose rel32 keeps the
 * `inc` bytes after it. */
FUNC storm_pun
        mov %rdi, %rax
        test %rdi, %rdi
        js 1f
.Lpun:
        add %rax, %rax
1:      inc %rax
        ret
ENDF storm_pun
OFF storm_pun, .Lpun, storm_pun_site

/* x < 2^63: 2x - 0xe2f6; else x - 0xe2f6. As storm_pun, but the bytes after
 * the site are `sub $0xe2f6, %rax` (49 2d f6 e2 00 00, spelled in bytes): the
 * storm takes the pages its unpadded punned jump would aim at
 * (make_kinds()), so the site takes a padded one (E9Patch's T1). */
FUNC storm_pad
        mov %rdi, %rax
        test %rdi, %rdi
        js 1f
.Lpad:
        .byte 0x48, 0x01, 0xf8                   /* add %rdi, %rax */
1:      .byte 0x49, 0x2d, 0xf6, 0xe2, 0x00, 0x00 /* sub $0xe2f6, %rax */
        ret
ENDF storm_pad
OFF storm_pad, .Lpad, storm_pad_site

/* x < 2^63: x + 0x5679; else x + 0x5678. A 1-byte site (stc: no padded
 * form) that a branch enters right after (no window), then its successor
 * `adc $0x5678, %rax` (48 15 78 56 00 00, spelled in bytes): the storm
 * takes the page its punned jump [48 15 78 56] aims at (make_kinds()), so
 * the site evicts the successor (E9Patch's T2): the adc gets a jump of its
 * own to a trampoline, and the site's jump keeps that jump's bytes. */
FUNC storm_ev
        mov %rdi, %rax
        test %rdi, %rdi
        js 1f
.Lev:
        stc
1:      .byte 0x48, 0x15, 0x78, 0x56, 0x00, 0x00
        ret
ENDF storm_ev
OFF storm_ev, .Lev, storm_ev_site

/* x + 3x (4x) with the site at `lea` inside the function: a window of the
 * lea and the add after it (4 + 3 bytes), relocated together. */
FUNC storm_win
        mov %rdi, %rcx
.Lwin:
        lea (%rcx,%rcx,2), %rax
        add %rcx, %rax
        ret
ENDF storm_win
OFF storm_win, .Lwin, storm_win_site

        .section .rodata
        .p2align 3
        .globl storm_mid_addend
        .type storm_mid_addend, @object
storm_mid_addend:
        .quad 7
        .size storm_mid_addend, 8

        .section .note.GNU-stack, "", @progbits
