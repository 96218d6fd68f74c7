// SPDX-License-Identifier: MIT
// Unwinders meet hijacked return addresses: while a function with a pending
// return probe runs, its return slot holds the return trampoline. Before a
// C++ exception or a backtrace walks the stack, the calling thread's slots get
// their real return addresses back ("unhijack"); afterwards the frames that
// are still live get the trampoline again and the ones an exception left are
// dropped without running their ret_handlers (the kernel drops them by stack
// pointer on the next return the same way). We interpose the unwinder entry
// points that programs and libstdc++ call through the PLT; glibc's
// backtrace(3) calls libgcc_s through dlsym, so backtrace itself is
// interposed too.

#include <dlfcn.h>
#include <unistd.h>
#include <unwind.h>
#include <gnu/libc-version.h>

#include <cstdint>
#include <cstdlib>

#include "arch.hpp"
#include "next_symbol.hpp"
#include "thread_state.hpp"
#include "uretprobe.hpp"

extern "C" void __cxa_end_catch();  // (libstdc++; <cxxabi.h> declares it in __cxxabiv1)

namespace uprobe::detail {

namespace {

/// Real return addresses into every pending slot of this thread.
void unhijack() noexcept {
  for (ReturnInstance* ri = t_state.rstack.top; ri; ri = ri->next) {
    auto* slot = reinterpret_cast<std::uint64_t*>(ri->stack);
    if (arch::is_return_trampoline(*slot)) {
      ri->unhijacked = *slot;
      *slot = ri->orig_ret;
    }
  }
}

/// Drops the instances whose slot is below `live_sp` (their frames are gone),
/// then puts our return address (the trampoline or the landing, as before)
/// back into the slots of the others.
void rehijack(std::uint64_t live_sp) noexcept {
  ReturnStack* rs = &t_state.rstack;
  StatBlock& st = stat_block();
  while (rs->top && rs->top->stack < live_sp) {
    ReturnInstance* ri = rs->top;
    rs->top = ri->next;
    rs->depth = rs->depth - 1;
    ri_free(ri);
    count(st.return_dropped);
  }
  for (ReturnInstance* ri = rs->top; ri; ri = ri->next) {
    auto* slot = reinterpret_cast<std::uint64_t*>(ri->stack);
    if (ri->unhijacked && *slot == ri->orig_ret) *slot = ri->unhijacked;
    ri->unhijacked = 0;
  }
}

/// (The interposers below keep no stack object of their own: when the
/// unwinder lands in a handler their frames end without an epilogue, and an
/// ASan build would keep their redzones poisoned; next_symbol() is never
/// inlined into them.)
/// The definition after ours (next_symbol()): libgcc_s's _Unwind_* (anchored
/// at _Unwind_GetCFA, which libuprobe does not interpose), libstdc++'s
/// __cxa_begin_catch (at __cxa_end_catch), libc's backtrace.
template <typename F>
F next(const char* name, const void* anchor) {
  return reinterpret_cast<F>(next_symbol(name, anchor));
}
const void* const kLibgcc = reinterpret_cast<const void*>(&_Unwind_GetCFA);
const void* const kLibstdcxx = reinterpret_cast<const void*>(&__cxa_end_catch);
const void* const kLibc = reinterpret_cast<const void*>(&gnu_get_libc_version);

}  // namespace

}  // namespace uprobe::detail

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

using uprobe::detail::kLibc;
using uprobe::detail::kLibgcc;
using uprobe::detail::kLibstdcxx;
using uprobe::detail::next;
using uprobe::detail::rehijack;
using uprobe::detail::unhijack;

#define UPROBE_EXPORT extern "C" __attribute__((visibility("default")))

UPROBE_EXPORT _Unwind_Reason_Code _Unwind_RaiseException(struct _Unwind_Exception* e) {
  static auto real = next<_Unwind_Reason_Code (*)(struct _Unwind_Exception*)>("_Unwind_RaiseException", kLibgcc);
  unhijack();
  _Unwind_Reason_Code rc = real(e);  // returns only when no handler was found
  rehijack(0);
  return rc;
}

UPROBE_EXPORT _Unwind_Reason_Code _Unwind_Resume_or_Rethrow(struct _Unwind_Exception* e) {
  static auto real = next<_Unwind_Reason_Code (*)(struct _Unwind_Exception*)>("_Unwind_Resume_or_Rethrow", kLibgcc);
  unhijack();
  _Unwind_Reason_Code rc = real(e);
  rehijack(0);
  return rc;
}

UPROBE_EXPORT _Unwind_Reason_Code _Unwind_ForcedUnwind(struct _Unwind_Exception* e, _Unwind_Stop_Fn stop,
                                                       void* arg) {
  static auto real =
      next<_Unwind_Reason_Code (*)(struct _Unwind_Exception*, _Unwind_Stop_Fn, void*)>("_Unwind_ForcedUnwind", kLibgcc);
  unhijack();
  _Unwind_Reason_Code rc = real(e, stop, arg);
  rehijack(0);
  return rc;
}

UPROBE_EXPORT _Unwind_Reason_Code _Unwind_Backtrace(_Unwind_Trace_Fn fn, void* arg) {
  static auto real = next<_Unwind_Reason_Code (*)(_Unwind_Trace_Fn, void*)>("_Unwind_Backtrace", kLibgcc);
  unhijack();
  _Unwind_Reason_Code rc = real(fn, arg);
  rehijack(0);
  return rc;
}

/// The catch: frames below the catching function are gone.
UPROBE_EXPORT void* __cxa_begin_catch(void* exc) noexcept {
  static auto real = next<void* (*)(void*)>("__cxa_begin_catch", kLibstdcxx);
  void* r = real(exc);
  rehijack(reinterpret_cast<std::uint64_t>(__builtin_dwarf_cfa()));
  return r;
}

UPROBE_EXPORT int backtrace(void** buffer, int size) {
  static auto real = next<int (*)(void**, int)>("backtrace", kLibc);
  unhijack();
  int n = real(buffer, size);
  rehijack(0);
  return n;
}
