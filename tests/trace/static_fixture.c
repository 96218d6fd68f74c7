// SPDX-License-Identifier: MIT
// A statically linked program (no PT_INTERP: LD_PRELOAD loads nothing into
// it, so no agent waits at uprobe-trace's start gate): prints one line.
#include <stdio.h>

int main(void) {
  puts("static fixture ran");
  return 0;
}
