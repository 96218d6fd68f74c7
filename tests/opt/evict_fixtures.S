/* SPDX-License-Identifier: MIT
 * Fixtures of the successor eviction tests (evict_test.cpp, E9Patch's
 * tactic T2): a 1-byte site (xchg %eax, %ecx) that a branch enters right
 * after (so no window applies; a 1-byte instruction has no padded form),
 * then its successor `add $(i1 << 8 | i0), %rax` (48 05 i0 i1 00 00, 6
 * bytes), which the branch (b = 0) lands on. The site's punned jump reads
 * [48, 05, i0, i1] (B2: one address, whose page a test takes); evicted, the
 * successor holds its own jump (e9 r0 r1 r2 r3, then its last byte) and the
 * site's jump reads [e9, r0, r1, r2]. Result: a + b + (i1 << 8 | i0), for a
 * and b below 2^31 (the xchg zero-extends both).
 */

#include "fixtures.inc"

        .macro EVFN name, i0, i1
FUNC \name
        mov %rdi, %rax
        mov %rsi, %rcx
        test %rsi, %rsi
        jz 2f
1:      .byte 0x91                               /* xchg %eax, %ecx: the site */
2:      .byte 0x48, 0x05, \i0, \i1, 0x00, 0x00   /* add $(i1 << 8 | i0), %rax: the successor */
        add %rcx, %rax
        ret
ENDF \name
        SITE \name, 1b
        .endm

        EVFN ev_one, 0x34, 0x12
        EVFN ev_off, 0x78, 0x16

/* ev_end(a) = a + 0x99: its last instruction, the 1-byte ret (the site),
 * is followed by ev_next's first (add $0x139a, %rax, spelled in bytes),
 * which is not its function's: never evicted (what follows a function's
 * last jump or return may be anything). ev_next(a) = a + 0x139a. */
FUNC ev_end
        lea 0x99(%rdi), %rax
1:      ret
ENDF ev_end
        SITE ev_end, 1b
FUNC_NOALIGN ev_next
        mov %rdi, %rax
        .byte 0x48, 0x05, 0x9a, 0x13, 0x00, 0x00
        ret
ENDF ev_next

/* ev_span(a) = a + 0x90: a 3-byte site (mov %rdi, %rax: 48 89 f8) and a
 * 3-byte successor (mov %rax, %rdx: 48 89 c2), then lea 0x90(%rdx), %rax
 * spelled with a disp32 (48 8d 82 90 00 00 00). Evicted, the successor's
 * jump keeps the bytes after it, so its trampoline lies in one span per
 * pad: unpadded [e9 r0 r1 | 48 8d], rel32 0x8d48xxxx (64 KiB); with one
 * prefix [26 e9 r0 | 48 8d 82], 0x828d48xx (256 bytes); with two [26 36 e9
 * | 48 8d 82 90], 0x90828d48 (one address): all below the code, where the
 * tests map them on purpose. ev_span_rcx: the same with lea 0x90(%rdx),
 * %rcx (48 8d 8a ...; then mov %rcx, %rax): its padded spans lie 128 MiB
 * from ev_span's (where a trampoline of ev_span's may stay retired). */
FUNC ev_span
        mov %rdi, %rcx
1:      mov %rdi, %rax                                  /* the site */
        mov %rax, %rdx                                  /* its successor */
        .byte 0x48, 0x8d, 0x82, 0x90, 0x00, 0x00, 0x00  /* lea 0x90(%rdx), %rax */
        ret
ENDF ev_span
        SITE ev_span, 1b
FUNC ev_span_rcx
        mov %rdi, %rcx
1:      mov %rdi, %rax                                  /* the site */
        mov %rax, %rdx                                  /* its successor */
        .byte 0x48, 0x8d, 0x8a, 0x90, 0x00, 0x00, 0x00  /* lea 0x90(%rdx), %rcx */
        mov %rcx, %rax
        ret
ENDF ev_span_rcx
        SITE ev_span_rcx, 1b

/* ev_site_span(a, b) = a + b + 0xa010 (a, b below 2^31): the 1-byte site
 * (xchg %eax, %ecx) and a 1-byte successor (push %rcx: 51), then add
 * $0xa010, %rax (48 05 10 a0 00 00), pop %rcx, add %rcx, %rax. Every
 * byte a jump would read is fixed: B2 reads [51, 48, 05, 10] (one
 * address, ~256 MiB above); evicted, the site's jump reads [e9, 48, 05,
 * 10] (one address, 152 bytes past B2's), the successor's [48, 05, 10, a0]
 * (one address ~1.5 GiB below the code, where the heap never lies). */
FUNC ev_site_span
        mov %rdi, %rax
        mov %rsi, %rcx
        test %rsi, %rsi
        jz 2f
1:      .byte 0x91                               /* xchg %eax, %ecx: the site */
2:      .byte 0x51                               /* push %rcx: the successor */
        .byte 0x48, 0x05, 0x10, 0xa0, 0x00, 0x00 /* add $0xa010, %rax */
        pop %rcx
        add %rcx, %rax
        ret
ENDF ev_site_span
        SITE ev_site_span, 1b

        .section .note.GNU-stack, "", @progbits
