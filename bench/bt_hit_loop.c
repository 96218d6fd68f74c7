/* SPDX-License-Identifier: MIT */
/* uprobe-bt-hit-loop: what a probe hit costs the probed program, cache-hot
 * (bench/bt-cost runs it under uprobe-trace's one-liners).
 *
 *   uprobe-bt-hit-loop [malloc|fnmatch] [BATCHES]
 *
 * Calls malloc(16..79) + free, or fnmatch("*.h", NAME, 0) with NAME
 * alternating "foo/bar.h" and "x.c", in BATCHES (default 5000) batches of 100
 * calls, each batch timed with rdtscp, and prints the time per call of the
 * fastest batch, of the 10th percentile and of the median, in ns (the TSC's
 * rate measured against CLOCK_MONOTONIC over the whole run). The minimum and
 * the 10th percentile leave out the batches a preemption or an interrupt
 * lengthened: on a shared machine they are the cost itself. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

enum { kBatch = 100 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void* a, const void* b) {
  const unsigned long x = *(const unsigned long*)a, y = *(const unsigned long*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  const int use_fnmatch = argc > 1 && strcmp(argv[1], "fnmatch") == 0;
  if (argc > 1 && !use_fnmatch && strcmp(argv[1], "malloc") != 0) {
    fprintf(stderr, "usage: %s [malloc|fnmatch] [BATCHES]\n", argv[0]);
    return 2;
  }
  const long batches = argc > 2 ? atol(argv[2]) : 5000;
  if (batches < 10) return 2;
  unsigned long* d = malloc((size_t)batches * sizeof *d);
  if (!d) return 1;
  volatile long sink = 0;
  unsigned aux;
  const double t0 = now();
  const unsigned long c0 = __rdtscp(&aux);
  for (long b = 0; b < batches; ++b) {
    const unsigned long a = __rdtscp(&aux);
    for (long k = 0; k < kBatch; ++k) {
      const long i = b * kBatch + k;
      if (use_fnmatch) {
        sink += fnmatch("*.h", (i & 1) ? "foo/bar.h" : "x.c", 0);
      } else {
        void* p = malloc(16 + (size_t)(i & 63));
        sink += (long)p;
        free(p);
      }
    }
    d[b] = __rdtscp(&aux) - a;
  }
  const double ghz = (double)(__rdtscp(&aux) - c0) / ((now() - t0) * 1e9);
  qsort(d, (size_t)batches, sizeof *d, by_value);
  printf("%s: ns per call: min %.1f p10 %.1f p50 %.1f\n", use_fnmatch ? "fnmatch" : "malloc",
         (double)d[0] / ghz / kBatch, (double)d[batches / 10] / ghz / kBatch, (double)d[batches / 2] / ghz / kBatch);
  free(d);
  return 0;
}
