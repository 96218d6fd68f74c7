/* SPDX-License-Identifier: MIT
 * libuprobe_storm_dl.so: dlopen()ed and dlclose()d by uprobe-storm's
 * producers while its probe is attached and detached (pending probes). */
#include <stdint.h>

/* 5x + 1 */
__attribute__((noipa)) uint64_t storm_dl_fn(uint64_t x) {
  __asm__ volatile("");
  return 5 * x + 1;
}
