/* SPDX-License-Identifier: MIT
 * C-09 baseline: a program NOT linked with libuprobe that executes a raw int3
 * with no SIGTRAP handler. Its wait status is what "dies by SIGTRAP exactly as
 * without the library" means. */
#include <stdio.h>
#include <sys/resource.h>

int main(void) {
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  __asm__ volatile("int3");
  puts("survived int3");
  return 0;
}
