/* A program using an installed libuprobe (C; cc ... $(pkg-config --cflags --libs uprobe)). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>
#include <uprobe/uprobe.h>

__attribute__((noinline)) long triple(long x) {
  __asm__ volatile(""); /* keep the calls: probes count real executions */
  return 3 * x;
}

struct counter {
  atomic_long hits, arg_sum;
};

/* Signal context: async-signal-safe code only. */
static int on_hit(struct uprobe_consumer *self, struct uprobe_regs *regs, uint64_t *cookie) {
  struct counter *c = self->user_data;
  (void)cookie;
  atomic_fetch_add(&c->hits, 1);
  atomic_fetch_add(&c->arg_sum, (long)regs->rdi); /* first argument */
  return 0;                                        /* or UPROBE_HANDLER_REMOVE */
}

static bool main_thread_only(struct uprobe_consumer *self, pid_t tid) {
  (void)self;
  return tid == getpid();
}

int main(void) {
  struct counter mine = {0}, libc = {0};
  struct uprobe_consumer c1 = {.handler = on_hit, .filter = main_thread_only, .user_data = &mine};
  struct uprobe_consumer c2 = {.handler = on_hit, .user_data = &libc};
  struct uprobe_probe *p1, *p2;
  char path[4096];
  uint64_t offset;
  /* One of our functions, by address; libc's getppid() by (file, offset). */
  int err = uprobe_register_addr((const void *)&triple, &c1, &p1);
  if (!err) err = uprobe_resolve_address(dlsym(RTLD_NEXT, "getppid"), path, sizeof path, &offset);
  if (!err) err = uprobe_register(path, offset, &c2, &p2);
  if (err) { /* a negative errno; the message names path, offset and reason */
    fprintf(stderr, "%s (%s)\n", uprobe_last_error(), uprobe_strerror(err));
    return 2;
  }
  long sum = 0;
  for (long i = 1; i <= 10; i++) sum += triple(i);
  for (int i = 0; i < 7; i++) getppid();
  if (uprobe_unregister(p1, &c1) || uprobe_unregister(p2, &c2)) return 2;
  triple(1), getppid(); /* detached: not counted */
  err = uprobe_register("/proc/self/exe", 1ull << 40, &c1, &p1);
  printf("triple: %ld hits (arguments sum %ld), getppid: %ld hits, bad offset: %s\n", atomic_load(&mine.hits),
         atomic_load(&mine.arg_sum), atomic_load(&libc.hits), uprobe_strerror(err));
  return mine.hits == 10 && mine.arg_sum == 55 && libc.hits == 7 && sum == 165 && err == -EINVAL ? 0 : 1;
}
