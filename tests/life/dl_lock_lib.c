/* SPDX-License-Identifier: MIT */
/* tests/life/dl_lock_test.cpp: a library whose constructor, run by dlopen()
 * with the dynamic linker's lock held, calls back into the program
 * (dl_lock_child.cpp), which registers a probe from there. */

void dl_lock_in_constructor(void); /* the program's (exported) */

__attribute__((constructor)) static void dl_lock_lib_init(void) { dl_lock_in_constructor(); }
