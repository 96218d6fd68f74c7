// SPDX-License-Identifier: MIT
// Unwinders meet hijacked return addresses: while a function with a pending
// return probe runs, its return slot holds the return trampoline (or the
// landing of an optimized entry). The unwinders libuprobe interposes get the
// real addresses back first (unwind_interpose.cpp); for the ones it cannot
// (glibc's pthread_cancel and pthread_exit call libgcc_s's
// _Unwind_ForcedUnwind through dlsym), the trampoline's CFI names a
// personality routine, here, whose landing pad pops the frame's return
// instance and resumes the unwind in the real caller.

#include <unistd.h>
#include <unwind.h>

#include <cstdint>
#include <cstdlib>

#include "arch.hpp"
#include "thread_state.hpp"
#include "uretprobe.hpp"

/// The frame whose return address is the return trampoline is being unwound
/// (forced unwind by an unwinder we do not interpose: pthread_cancel,
/// pthread_exit). Pops its return instance and the ones deeper frames left
/// (their frames are gone: dropped, as the kernel drops them by stack
/// pointer), and returns the real return address. `sp` is the stack pointer
/// after the return (the slot + 8). Called from uprobe_ret_unwind_landing.
extern "C" __attribute__((visibility("hidden"))) std::uint64_t uprobe_ret_unwind_pop(std::uint64_t sp) noexcept {
  using namespace uprobe::detail;
  ReturnStack* rs = &t_state.rstack;
  const std::uint64_t slot = sp - 8;
  StatBlock& st = stat_block();
  std::uint64_t real = 0;
  while (rs->top && rs->top->stack <= slot) {
    ReturnInstance* ri = rs->top;
    rs->top = ri->next;
    rs->depth = rs->depth - 1;
    if (ri->stack == slot) real = ri->orig_ret;
    ri_free(ri);
    count(st.return_dropped);
    if (real && (!rs->top || rs->top->stack != slot)) break;
  }
  if (!real) {
    static const char msg[] = "libuprobe: fatal: unwinding through the return trampoline with no pending return "
                              "instance for the frame\n";
    ssize_t r = ::write(2, msg, sizeof msg - 1);
    (void)r;
    ::abort();
  }
  return real;
}

/// Personality routine of the byte before the return trampoline and before
/// the landing (see ret_trampoline.S): in the cleanup phase of an unwind that
/// meets one of them as a frame's return address, lands in
/// uprobe_ret_unwind_landing with the exception in the first EH data
/// register. Everything else continues (and stops, rip being undefined).
extern "C" __attribute__((visibility("hidden"))) _Unwind_Reason_Code uprobe_ret_personality(
    int version, _Unwind_Action actions, _Unwind_Exception_Class, struct _Unwind_Exception* exc,
    struct _Unwind_Context* ctx) {
  if (version != 1 || !(actions & _UA_CLEANUP_PHASE) ||
      !uprobe::arch::is_return_trampoline(_Unwind_GetIP(ctx)))
    return _URC_CONTINUE_UNWIND;
  _Unwind_SetGR(ctx, __builtin_eh_return_data_regno(0), reinterpret_cast<_Unwind_Word>(exc));
  _Unwind_SetIP(ctx, reinterpret_cast<_Unwind_Ptr>(&uprobe_ret_unwind_landing));
  return _URC_INSTALL_CONTEXT;
}
