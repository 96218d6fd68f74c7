/* SPDX-License-Identifier: MIT */
/* The program tests/trace's bpftrace-language corpus runs: a fixed sequence
 * of calls with known arguments, one thread, no stdio.
 *   bt_add(i, 3*i) for i in 0..19             returns 4*i
 *   bt_name(NAMES[i % 3], i) for i in 0..8    returns i % 3
 *   bt_neg(-i) for i in 1..5                   returns -2*i
 *   bt_many(i, i+1, ..., i+5, 100+i, 200+i, 300+i, 400+i) for i in 0..2
 *                                              (10 arguments: 4 on the stack)
 * then exit status 0. */
#define NOINLINE __attribute__((noinline, noclone, used))

static const char* const NAMES[] = {"alpha", "beta", "gamma"};
volatile long sink;

NOINLINE long bt_add(long a, long b) { __asm__ volatile(""); return a + b; }
NOINLINE long bt_name(const char* s, long i) { __asm__ volatile(""); sink += s[0]; return i % 3; }
NOINLINE long bt_neg(long x) { __asm__ volatile(""); return 2 * x; }
NOINLINE long bt_many(long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8, long a9) {
  __asm__ volatile("");
  return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9;
}

int main(void) {
  for (long i = 0; i < 20; ++i) sink += bt_add(i, 3 * i);
  for (long i = 0; i < 9; ++i) sink += bt_name(NAMES[i % 3], i);
  for (long i = 1; i <= 5; ++i) sink += bt_neg(-i);
  for (long i = 0; i < 3; ++i) sink += bt_many(i, i + 1, i + 2, i + 3, i + 4, i + 5, 100 + i, 200 + i, 300 + i, 400 + i);
  return 0;
}
