/* SPDX-License-Identifier: MIT */
/* trace_initfirst K: calls initfirst_fn() (libtrace_initfirst.so, a
 * DF_1_INITFIRST library) K times and returns. */
#include <stdlib.h>

#include "early.h"

static volatile long sink;

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  for (long i = 0, k = atol(argv[1]); i < k; i++) sink += initfirst_fn(i);
  return 0;
}
