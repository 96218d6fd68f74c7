/* SPDX-License-Identifier: MIT
 * libuprobe_core_testlib.so: a small shared library linked with the core
 * tests, so probes are exercised on a file other than the executable. */
#include <stdint.h>

uint64_t tl_add(uint64_t a, uint64_t b) { return a + b; }

uint64_t tl_mix(uint64_t a, uint64_t b) {
  uint64_t r = a * 31 + b;
  for (unsigned i = 0; i < (a & 7); ++i) r = (r << 3) ^ (r >> 5) ^ b;
  return r;
}

/* A fixture with a known layout inside the library:
 *   0: cmp %rsi,%rdi          3: jb (rel8) -> site tl_asm_jcc_site
 *   5: mov tl_data(%rip),%rax (rip-relative, out of line) -> tl_asm_load_site
 * returns a < b ? b + 7 : tl_data + a (tl_data = 0x10000). */
__asm__(
    ".text\n"
    ".globl tl_asm\n"
    ".type tl_asm, @function\n"
    ".p2align 4\n"
    "tl_asm:\n"
    "  cmp %rsi, %rdi\n"
    ".Ltl_jcc:\n"
    "  .byte 0x72, .Ltl_below - .Ltl_load\n"
    ".Ltl_load:\n"
    "  mov tl_data(%rip), %rax\n"
    "  add %rdi, %rax\n"
    "  ret\n"
    ".Ltl_below:\n"
    "  lea 7(%rsi), %rax\n"
    "  ret\n"
    ".size tl_asm, . - tl_asm\n"
    ".section .rodata\n"
    ".p2align 3\n"
    ".globl tl_asm_jcc_site, tl_asm_load_site\n"
    ".type tl_asm_jcc_site, @object\n"
    ".size tl_asm_jcc_site, 8\n"
    "tl_asm_jcc_site: .quad .Ltl_jcc - tl_asm\n"
    ".type tl_asm_load_site, @object\n"
    ".size tl_asm_load_site, 8\n"
    "tl_asm_load_site: .quad .Ltl_load - tl_asm\n"
    ".data\n"
    ".p2align 3\n"
    ".hidden tl_data\n"
    ".globl tl_data\n"
    ".type tl_data, @object\n"
    ".size tl_data, 8\n"
    "tl_data: .quad 0x10000\n"
    ".text\n");
