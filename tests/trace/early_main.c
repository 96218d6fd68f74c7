/* SPDX-License-Identifier: MIT */
/* trace_early: every stage of a process's life calls early_fn() (in
 * libtrace_early.so, a DT_NEEDED of this program) and getppid() a known
 * number of times (early.h): the program's DT_PREINIT_ARRAY, the library's
 * constructor, the program's constructor, main (K times), an atexit
 * handler, the program's destructor, the library's destructor.
 *   trace_early return K   main returns 0
 *   trace_early _exit K    main leaves with _exit(3): no atexit handler, no destructor
 *   trace_early kill K     main sends itself SIGKILL
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "early.h"

static volatile long sink;

static void calls(long n) {
  for (long i = 0; i < n; i++) {
    sink += early_fn(i);
    sink += getppid();
  }
}

static void preinit(int argc, char** argv, char** envp) {
  (void)argc, (void)argv, (void)envp;
  calls(EARLY_PREINIT);
}
__attribute__((section(".preinit_array"), used)) static void (*const preinit_entry)(int, char**, char**) = preinit;

__attribute__((constructor)) static void ctor(void) { calls(EARLY_CTOR); }
__attribute__((destructor)) static void dtor(void) { calls(EARLY_DTOR); }
static void at_exit(void) { calls(EARLY_ATEXIT); }

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  if (atexit(at_exit) != 0) return 2;
  calls(atol(argv[2]));
  if (!strcmp(argv[1], "return")) return 0;
  if (!strcmp(argv[1], "_exit")) _exit(3);
  if (!strcmp(argv[1], "kill")) kill(getpid(), SIGKILL);
  return 2;
}
