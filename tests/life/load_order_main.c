/* SPDX-License-Identifier: MIT */
/* tests/life/load_order_test.cpp: links load_order_lib (which links
 * libuprobe), so libuprobe comes after libc in its search order unless it is
 * LD_PRELOADed. Probes order_target() through the library, calls it 10 times
 * and prints "rc=RC sum=SUM hits=HITS same=SAME why=MESSAGE" (same: 1 when
 * order_target's first 16 bytes are what they were before the request). */
#include <stdio.h>
#include <string.h>

int order_probe(const void* addr, char* why, unsigned long why_size);
int order_hits(void);

__attribute__((noinline)) int order_target(int x) {
  __asm__ volatile("");
  return 3 * x + 1;
}

int main(void) {
  unsigned char before[16], after[16];
  memcpy(before, (const void*)order_target, sizeof before);
  char why[1024];
  const int rc = order_probe((const void*)order_target, why, sizeof why);
  memcpy(after, (const void*)order_target, sizeof after);
  int (*volatile call)(int) = order_target;
  int sum = 0;
  for (int i = 0; i < 10; ++i) sum += call(i);
  printf("rc=%d sum=%d hits=%d same=%d why=%s\n", rc, sum, order_hits(), memcmp(before, after, sizeof before) == 0, why);
  return 0;
}
