/* SPDX-License-Identifier: MIT */
/* tests/life/load_order_test.cpp: libuprobe loaded into a namespace of its
 * own (dlmopen(LM_ID_NEWLM)): the program's sigprocmask goes to the base
 * namespace's libc, never to libuprobe's interposer, so a registration must
 * be refused. Prints "rc=RC hits=HITS why=MESSAGE" after calling the
 * would-be probed function with SIGTRAP blocked (a hit there is fatal). The
 * namespace needs static TLS room for libuprobe's initial-exec variables:
 * run with GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>

#include "load_order_consumer.h"

__attribute__((noinline)) int order_target(int x) {
  __asm__ volatile("");
  return 3 * x + 1;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* h = dlmopen(LM_ID_NEWLM, argv[1], RTLD_NOW);
  if (!h) {
    printf("dlmopen: %s\n", dlerror());
    return 2;
  }
  int (*reg)(const void*, struct uprobe_consumer*, struct uprobe_probe**) =
      (int (*)(const void*, struct uprobe_consumer*, struct uprobe_probe**))dlsym(h, "uprobe_register_addr");
  const char* (*last)(void) = (const char* (*)(void))dlsym(h, "uprobe_last_error");
  if (!reg || !last) return 3;
  struct uprobe_probe* probe = NULL;
  const int rc = reg((const void*)order_target, &g_consumer, &probe);
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTRAP);
  sigprocmask(SIG_BLOCK, &s, NULL);
  int (*volatile call)(int) = order_target;
  const int v = call(1) + call(2);
  printf("rc=%d hits=%d sum=%d why=%s\n", rc, g_hits, v, rc ? last() : "");
  return 0;
}
