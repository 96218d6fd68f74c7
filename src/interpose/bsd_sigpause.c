/* SPDX-License-Identifier: MIT */
/* The interposed BSD sigpause(mask), the `sigpause` symbol. In C and without
 * <signal.h>, which maps the name sigpause to __xpg_sigpause (X/Open) for
 * every program and for masks.cpp: here the name is the symbol, with no
 * assembler label. The work is masks.cpp's (uprobe_bsd_sigpause). */

#include "sanitize.hpp"

/* masks.cpp: sigpause_impl(mask, false). Hidden. */
int uprobe_bsd_sigpause(int mask);

/* Interposed sigpause(mask): waits with `mask` as the thread's mask (SIGTRAP
 * kept as the view only). Async-signal-safe as sigsuspend(). */
__attribute__((visibility("default"))) UPROBE_NO_SANITIZE int sigpause(int mask) { return uprobe_bsd_sigpause(mask); }
