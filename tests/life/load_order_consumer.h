/* SPDX-License-Identifier: MIT */
/* tests/life/load_order_test.cpp's programs: a consumer that counts its hits
 * (g_hits), one per including file. */
#pragma once
#include <stdint.h>

#include "uprobe/uprobe.h"

static int g_hits;

static int count_hit(struct uprobe_consumer* self, struct uprobe_regs* regs, uint64_t* cookie) {
  (void)self;
  (void)regs;
  (void)cookie;
  ++g_hits;
  return 0;
}

static struct uprobe_consumer g_consumer = {.handler = count_hit};
