/* SPDX-License-Identifier: MIT */
/* libtrace_early.so: a DT_NEEDED library of trace_early. Its constructor
 * runs before the program's own and its destructor after main() returns:
 * both call early_fn() (the probed function) and getppid() (a libc function
 * the agent itself never calls while counting) a known number of times. */
#include <unistd.h>

#include "early.h"

__attribute__((noinline, noclone, used)) long early_fn(long x) {
  __asm__ volatile("");
  return x * 3 + 1;
}

static volatile long sink;

static void calls(int n) {
  for (int i = 0; i < n; i++) {
    sink += early_fn(i);
    sink += getppid();
  }
}

__attribute__((constructor)) static void lib_ctor(void) { calls(EARLY_LIB_CTOR); }
__attribute__((destructor)) static void lib_dtor(void) { calls(EARLY_LIB_DTOR); }
