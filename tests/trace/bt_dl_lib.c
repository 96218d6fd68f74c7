/* SPDX-License-Identifier: MIT */
/* A library trace_bt_fixture dlopen()s ("dlopen PATH"): its frames are in no
 * mapping the agent recorded at attach (ustack's symbolizer then reads the
 * process's mappings while it runs). */
#define NOINLINE __attribute__((noinline, noclone, used))
#define FP __attribute__((optimize("no-omit-frame-pointer")))
volatile long st_dl_sink;
NOINLINE FP long st_dl_leaf(long x) { __asm__ volatile(""); return x + 1; }
NOINLINE FP long st_dl_mid(long x) { long r = st_dl_leaf(x); __asm__ volatile(""); return r + 1; }
