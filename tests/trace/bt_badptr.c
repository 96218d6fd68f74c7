/* SPDX-License-Identifier: MIT */
/* trace_bt_fixture's "badptr" mode (str() of pointers that cannot be read
 * all the way): bad_take(p, i) for i in 0..9 with p: NULL, an unmapped page,
 * a PROT_NONE page, 10 'a' bytes before an unmapped page (no NUL), 9 and a
 * NUL there, 63 and 64 bytes before it, 3 bytes before it, a non-canonical
 * address, a kernel address. Then a fault of its own, which its own SIGSEGV
 * handler takes: exit status 0 when that handler ran exactly once (and not
 * for the reads). Chosen by a constructor, so bt_fixture.c's main() is as
 * it was. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

extern volatile long sink;

__attribute__((noinline, noclone, used)) long bad_take(const char* s, long i) {
  __asm__ volatile("" ::"r"(s) : "memory");
  return i;
}

static volatile int segv_runs;
static sigjmp_buf segv_jmp;

static void on_segv(int sig) {
  (void)sig;
  segv_runs++;
  siglongjmp(segv_jmp, 1);
}

static int bad_pointers(void) {
  /* Far from where other mappings go: the hole at page 1 stays a hole. */
  char* p = mmap((void*)0x200000000000, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                 -1, 0);
  if (p != (void*)0x200000000000) return 1;
  memset(p, 'a', 4096);
  if (munmap(p + 4096, 4096) != 0 || mprotect(p + 8192, 4096, PROT_NONE) != 0) return 1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_segv;
  sigaction(SIGSEGV, &sa, NULL);
  sink += bad_take(NULL, 0);
  sink += bad_take(p + 4096, 1);
  sink += bad_take(p + 8192, 2);
  sink += bad_take(p + 4096 - 10, 3);
  p[4095] = 0;
  sink += bad_take(p + 4096 - 10, 4);
  p[4095] = 'a';
  sink += bad_take(p + 4096 - 63, 5);
  sink += bad_take(p + 4096 - 64, 6);
  sink += bad_take(p + 4096 - 3, 7);
  sink += bad_take((const char*)0xdead000000000000ull, 8);
  sink += bad_take((const char*)-4096L, 9);
  if (segv_runs != 0) return 2;
  if (sigsetjmp(segv_jmp, 1) == 0) sink += *(volatile char*)(p + 4096);
  return segv_runs == 1 ? 0 : 3;
}

__attribute__((constructor)) static void badptr_mode(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "badptr") == 0) exit(bad_pointers());
}
