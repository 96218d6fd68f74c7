/* uprobe.h is plain ISO C99: this file is compiled with -std=c99 -Wpedantic -Werror. */
#include <uprobe/uprobe.h>

int pkg_header_c99_check(struct uprobe_consumer *uc) { return uc->handler == 0 && uc->filter == 0; }
