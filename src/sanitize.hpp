// SPDX-License-Identifier: MIT
#pragma once
// Sanitizer builds (-DUPROBE_SANITIZE=..., see cmake/sanitize.cmake).
//
// UPROBE_NO_SANITIZE marks the few functions that must not be instrumented,
// each with its reason at the use. No effect in an ordinary build.

/// No ASan/UBSan/TSan instrumentation in this function (inlined callees included).
#define UPROBE_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))
