/* SPDX-License-Identifier: MIT */
/* libtrace_initfirst.so: a DT_NEEDED library of trace_initfirst linked with
 * -z initfirst (DF_1_INITFIRST). The dynamic linker runs one such object's
 * initializer first -- the last loaded one, and a program's libraries load
 * after LD_PRELOAD's: this one, not the agent. Its constructor runs with
 * nothing else initialized (not even libc), so it only calls initfirst_fn(). */
#include "early.h"

__attribute__((noinline, noclone, used)) long initfirst_fn(long x) {
  __asm__ volatile("");
  return x * 5 + 1;
}

static volatile long sink;

static void calls(int n) {
  for (int i = 0; i < n; i++) sink += initfirst_fn(i);
}

__attribute__((constructor)) static void lib_ctor(void) { calls(INITFIRST_LIB_CTOR); }
__attribute__((destructor)) static void lib_dtor(void) { calls(INITFIRST_LIB_DTOR); }
