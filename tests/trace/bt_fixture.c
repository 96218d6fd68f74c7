/* SPDX-License-Identifier: MIT */
/* The program tests/trace's bpftrace-language corpus runs: a fixed sequence
 * of calls with known arguments, one thread, no stdio.
 *   bt_add(i, 3*i) for i in 0..19             returns 4*i
 *   bt_name(NAMES[i % 3], i) for i in 0..8    returns i % 3
 *   bt_neg(-i) for i in 1..5                   returns -2*i
 *   bt_many(i, i+1, ..., i+5, 100+i, 200+i, 300+i, 400+i) for i in 0..2
 *                                              (10 arguments: 4 on the stack)
 * then exit status 0.
 *
 * With the argument "stacks" (ustack, usym): instead, from st_stacks(), with
 * frame pointers where FP says (bpftrace's ustack walks frame pointers, as
 * the kernel's user stack walker does):
 *   st_top(i) -> st_mid -> st_leaf        for i in 0..2   (3 stacks)
 *   st_mid(i) -> st_leaf                  for i in 0..1   (2)
 *   st_nofp_mid(0) -> st_leaf             once: st_nofp_mid keeps no frame pointer
 *   code at 0x10000000 (an anonymous page, no symbol) -> st_mid -> st_leaf, 4 times
 *   st_take(f, s): f st_cb once (calls it), 0x1234 twice, bt_add 3 times
 *   a thread: st_thread_main -> st_thread_mid(9) -> st_thread_leaf
 *   malloc(12345), freed
 * then st_done() and a 2 s sleep (none with a second argument "nosleep") (the process is alive while bpftrace
 * prints what a probe of st_done asks for: it symbolizes only live
 * processes).
 *
 * With "dlopen PATH": dlopen()s PATH (bt_dl_lib.c), calls its st_dl_mid(1)
 * (-> st_dl_leaf) from st_dl_call() twice, then st_done() and a 0.3 s sleep.
 *
 * With "badptr": bt_badptr.c's calls (linked after this file, and chosen
 * before main() runs: the code here keeps its addresses, which the corpus's
 * stacks print). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define NOINLINE __attribute__((noinline, noclone, used))
#define FP __attribute__((optimize("no-omit-frame-pointer")))

static const char* const NAMES[] = {"alpha", "beta", "gamma"};
volatile long sink;

NOINLINE long bt_add(long a, long b) { __asm__ volatile(""); return a + b; }
NOINLINE long bt_name(const char* s, long i) { __asm__ volatile(""); sink += s[0]; return i % 3; }
NOINLINE long bt_neg(long x) { __asm__ volatile(""); return 2 * x; }
NOINLINE long bt_many(long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8, long a9) {
  __asm__ volatile("");
  return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9;
}

NOINLINE FP long st_leaf(long x) { __asm__ volatile(""); return x + 1; }
NOINLINE FP long st_mid(long x) { long r = st_leaf(x); __asm__ volatile(""); return r + 1; }
NOINLINE FP long st_top(long x) { long r = st_mid(x); __asm__ volatile(""); return r + 1; }
NOINLINE __attribute__((optimize("omit-frame-pointer"))) long st_nofp_mid(long x) {
  long r = st_leaf(x);
  __asm__ volatile("");
  return r + 1;
}
NOINLINE FP void st_cb(void) { sink++; }
NOINLINE FP void st_take(void (*f)(void), const char* s) {
  if (f == st_cb) f();
  sink += s[0];
}
NOINLINE FP void st_done(void) { __asm__ volatile(""); }

static volatile long two = 2;

NOINLINE FP long st_thread_leaf(long x) { __asm__ volatile(""); return x + 1; }
NOINLINE FP long st_thread_mid(long x) { long r = st_thread_leaf(x); __asm__ volatile(""); return r + 1; }
NOINLINE FP void* st_thread_main(void* arg) {
  sink += st_thread_mid(9);
  struct timespec ts = {0, 200000000};  // (bpftrace resolves a thread's stack only while the thread runs)
  nanosleep(&ts, NULL);
  return arg;
}

static char take_names[3][8] = {"cb", "num", "add"};  // (written below: their page is in memory for str())

NOINLINE FP int st_stacks(int nosleep) {
  for (long i = 0; i < 3; ++i) sink += st_top(i);
  for (long i = 0; i < two; ++i) sink += st_mid(i);  // (one call site: not unrolled)
  sink += st_nofp_mid(0);
  // push %rbp; mov %rsp,%rbp; call *%rsi; pop %rbp; ret: a frame with a frame pointer, in no module
  static const unsigned char code[] = {0x55, 0x48, 0x89, 0xe5, 0xff, 0xd6, 0x5d, 0xc3};
  unsigned char* page = mmap((void*)0x10000000, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (page != (void*)0x10000000) return 1;
  memcpy(page, code, sizeof code);
  if (mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0) return 1;
  long (*jit)(long, long (*)(long)) = (long (*)(long, long (*)(long)))(void*)page;
  for (long i = 0; i < 4; ++i) sink += jit(i, st_mid);
  take_names[0][0] = 'c', take_names[1][0] = 'n', take_names[2][0] = 'a';
  st_take(st_cb, take_names[0]);
  for (int i = 0; i < 2; ++i) st_take((void (*)(void))0x1234, take_names[1]);
  for (int i = 0; i < 3; ++i) st_take((void (*)(void))bt_add, take_names[2]);
  pthread_t t;  // (a thread's stack: glibc's start_thread below it)
  if (pthread_create(&t, NULL, st_thread_main, NULL) != 0 || pthread_join(t, NULL) != 0) return 1;
  void* volatile block = malloc(12345);  // (a libc function's stack: glibc has no frame pointers, its caller has)
  free(block);
  st_done();
  struct timespec ts = {nosleep ? 0 : 2, 0};
  nanosleep(&ts, NULL);
  return 0;
}

NOINLINE FP long st_dl_call(long (*f)(long)) { long r = f(1); __asm__ volatile(""); return r; }

NOINLINE FP int st_dlopen(const char* path) {
  void* h = dlopen(path, RTLD_NOW);
  long (*f)(long) = h ? (long (*)(long))dlsym(h, "st_dl_mid") : 0;
  if (!f) return 1;
  for (int i = 0; i < 2; ++i) sink += st_dl_call(f);
  st_done();
  struct timespec ts = {0, 300000000};
  nanosleep(&ts, NULL);
  return 0;
}

FP int main(int argc, char** argv) {
  if (argc > 2 && strcmp(argv[1], "dlopen") == 0) return st_dlopen(argv[2]);
  if (argc > 1 && strcmp(argv[1], "stacks") == 0) return st_stacks(argc > 2 && strcmp(argv[2], "nosleep") == 0);
  for (long i = 0; i < 20; ++i) sink += bt_add(i, 3 * i);
  for (long i = 0; i < 9; ++i) sink += bt_name(NAMES[i % 3], i);
  for (long i = 1; i <= 5; ++i) sink += bt_neg(-i);
  for (long i = 0; i < 3; ++i) sink += bt_many(i, i + 1, i + 2, i + 3, i + 4, i + 5, 100 + i, 200 + i, 300 + i, 400 + i);
  return 0;
}
