// SPDX-License-Identifier: MIT
// Frame-pointer fixtures for fixup_backtrace(): this file is compiled with
// -fno-omit-frame-pointer, so each function keeps rbp -> [saved rbp][return
// address]. fp_inner walks exactly n frames (never dereferencing the rbp of
// a frame beyond the n-th, which may belong to code built without frame
// pointers).

#include "ret_common.hpp"

namespace {
volatile int g_fp_sink;
}

extern "C" {

void** fp_raw_out = nullptr;
int fp_fixed = -1;

__attribute__((noinline, noipa)) int fp_inner(void** out, int n) {
  void** fp = static_cast<void**>(__builtin_frame_address(0));
  int i = 0;
  for (; i < n; ++i) {
    out[i] = fp[1];
    if (i + 1 < n) fp = static_cast<void**>(fp[0]);
  }
  if (fp_raw_out) {  // fix the walk up while the return instances are pending
    for (int k = 0; k < n; ++k) fp_raw_out[k] = out[k];
    fp_fixed = uprobe::fixup_backtrace(out, n);
  }
  g_fp_sink = i;
  return i;
}

__attribute__((noinline, noipa)) int fp_mid(void** out, int n) {
  int r = fp_inner(out, n);
  g_fp_sink = r;  // not a tail call
  return r + 100;
}

__attribute__((noinline, noipa)) int fp_outer(void** out, int n) {
  int r = fp_mid(out, n);
  g_fp_sink = r;  // not a tail call
  return r + 1000;
}

}  // extern "C"
