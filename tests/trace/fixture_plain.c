/* SPDX-License-Identifier: MIT */
/* A USDT probe without a semaphore (this file does not define _SDT_HAS_SEMAPHORES). */
#include <sys/sdt.h>

__attribute__((noinline, used)) void usdt_plain(long i) { STAP_PROBE2(tracefix, plain, i, i * 3); }
