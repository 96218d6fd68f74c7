// SPDX-License-Identifier: MIT
// tests/life/dl_lock_test.cpp: linked into life_dl_lock_child_deferred with
// DF_1_INITFIRST, as uprobe-trace's agent is: its initializer runs before
// libuprobe.so's and defers elfutils to the first ELF read.

#include "uprobe/symbols.hpp"

__attribute__((constructor)) static void dl_lock_defer_elfutils() { uprobe::defer_elfutils(); }
