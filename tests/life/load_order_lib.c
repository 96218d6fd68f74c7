/* SPDX-License-Identifier: MIT */
/* tests/life/load_order_test.cpp: a library that links libuprobe, so that a
 * program linking it (load_order_main.c) loads libuprobe after libc. */
#include <string.h>

#include "load_order_consumer.h"

int order_hits(void) { return g_hits; }

/* Registers the counting consumer at addr: 0 or a negative errno, the message in why. */
int order_probe(const void* addr, char* why, unsigned long why_size) {
  struct uprobe_probe* probe = NULL;
  const int rc = uprobe_register_addr(addr, &g_consumer, &probe);
  why[0] = '\0';
  if (rc != 0) strncat(why, uprobe_last_error(), why_size - 1);
  return rc;
}
