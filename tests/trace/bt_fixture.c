/* SPDX-License-Identifier: MIT */
/* The program tests/trace's bpftrace-language corpus runs: a fixed sequence
 * of calls with known arguments, one thread, no stdio.
 *   bt_add(i, 3*i) for i in 0..19             returns 4*i
 *   bt_name(NAMES[i % 3], i) for i in 0..8    returns i % 3
 *   bt_neg(-i) for i in 1..5                   returns -2*i
 * then exit status 0. */
#define NOINLINE __attribute__((noinline, noclone, used))

static const char* const NAMES[] = {"alpha", "beta", "gamma"};
volatile long sink;

NOINLINE long bt_add(long a, long b) { __asm__ volatile(""); return a + b; }
NOINLINE long bt_name(const char* s, long i) { __asm__ volatile(""); sink += s[0]; return i % 3; }
NOINLINE long bt_neg(long x) { __asm__ volatile(""); return 2 * x; }

int main(void) {
  for (long i = 0; i < 20; ++i) sink += bt_add(i, 3 * i);
  for (long i = 0; i < 9; ++i) sink += bt_name(NAMES[i % 3], i);
  for (long i = 1; i <= 5; ++i) sink += bt_neg(-i);
  return 0;
}
