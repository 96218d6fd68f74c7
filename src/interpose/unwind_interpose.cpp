// SPDX-License-Identifier: MIT
// Unwinders meet hijacked return addresses: while a function with a pending
// return probe runs, its return slot holds the return trampoline (or the
// landing). Before a C++ exception or a backtrace walks the stack, the
// calling thread's slots get their real return addresses back ("unhijack");
// afterwards the frames that are still live get ours again and the ones an
// exception left are dropped without running their ret_handlers (the kernel
// drops them by stack pointer on the next return the same way). We
// interpose the unwinder entry points that programs and libstdc++ call
// through the PLT; glibc's backtrace(3) calls libgcc_s through dlsym, so
// backtrace itself is interposed too. (Its own object file, uprobe_unwind_objects:
// in libuprobe.so and libuprobe.a; uprobe-trace's command line, which never
// probes itself, links libuprobe without it and libstdc++ statically.)

#include <dlfcn.h>
#include <unwind.h>
#include <gnu/libc-version.h>

#include <cstdint>

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
const void* const kLibgcc = reinterpret_cast<const void*>(&_Unwind_GetCFA);
const void* const kLibstdcxx = reinterpret_cast<const void*>(&__cxa_end_catch);
const void* const kLibc = reinterpret_cast<const void*>(&gnu_get_libc_version);

/// The definitions after ours, looked up at libuprobe's load (resolve_reals(),
/// below) rather than at the first call: a first exception thrown with the
/// registry mutex held would ask the dynamic linker then, and wait for its
/// lock, which a thread in dlopen() holds while a constructor that registers
/// a probe waits for the mutex. (An interposer called before the load's
/// lookup, from an earlier constructor, looks up itself: a race stores the
/// same answer twice.)
struct Reals {
  _Unwind_Reason_Code (*raise)(struct _Unwind_Exception*);
  _Unwind_Reason_Code (*resume_or_rethrow)(struct _Unwind_Exception*);
  _Unwind_Reason_Code (*forced_unwind)(struct _Unwind_Exception*, _Unwind_Stop_Fn, void*);
  _Unwind_Reason_Code (*backtrace_walk)(_Unwind_Trace_Fn, void*);
  void* (*begin_catch)(void*);
  int (*backtrace)(void**, int);
};
Reals g_reals;

auto real_raise() { return next_symbol_in(g_reals.raise, "_Unwind_RaiseException", kLibgcc); }
auto real_resume_or_rethrow() { return next_symbol_in(g_reals.resume_or_rethrow, "_Unwind_Resume_or_Rethrow", kLibgcc); }
auto real_forced_unwind() { return next_symbol_in(g_reals.forced_unwind, "_Unwind_ForcedUnwind", kLibgcc); }
auto real_backtrace_walk() { return next_symbol_in(g_reals.backtrace_walk, "_Unwind_Backtrace", kLibgcc); }
auto real_begin_catch() { return next_symbol_in(g_reals.begin_catch, "__cxa_begin_catch", kLibstdcxx); }
auto real_backtrace() { return next_symbol_in(g_reals.backtrace, "backtrace", kLibc); }

__attribute__((constructor)) void resolve_reals() noexcept {
  (void)real_raise();
  (void)real_resume_or_rethrow();
  (void)real_forced_unwind();
  (void)real_backtrace_walk();
  (void)real_begin_catch();
  (void)real_backtrace();
}

}  // namespace

}  // namespace uprobe::detail

using uprobe::detail::real_backtrace;
using uprobe::detail::real_backtrace_walk;
using uprobe::detail::real_begin_catch;
using uprobe::detail::real_forced_unwind;
using uprobe::detail::real_raise;
using uprobe::detail::real_resume_or_rethrow;
using uprobe::detail::rehijack;
using uprobe::detail::unhijack;

#define UPROBE_EXPORT extern "C" __attribute__((visibility("default")))

UPROBE_EXPORT _Unwind_Reason_Code _Unwind_RaiseException(struct _Unwind_Exception* e) {
  const auto real = real_raise();
  unhijack();
  _Unwind_Reason_Code rc = real(e);  // returns only when no handler was found
  rehijack(0);
  return rc;
}

UPROBE_EXPORT _Unwind_Reason_Code _Unwind_Resume_or_Rethrow(struct _Unwind_Exception* e) {
  const auto real = real_resume_or_rethrow();
  unhijack();
  _Unwind_Reason_Code rc = real(e);
  rehijack(0);
  return rc;
}

UPROBE_EXPORT _Unwind_Reason_Code _Unwind_ForcedUnwind(struct _Unwind_Exception* e, _Unwind_Stop_Fn stop,
                                                       void* arg) {
  const auto real = real_forced_unwind();
  unhijack();
  _Unwind_Reason_Code rc = real(e, stop, arg);
  rehijack(0);
  return rc;
}

/// The program's trace callback, called from the frame after the first
/// (libgcc's walk begins at its caller, this interposer: the program's
/// callback sees its own frame first, as without libuprobe).
struct SkipFirstFrame {
  _Unwind_Trace_Fn fn;
  void* arg;
  bool skipped;
};

_Unwind_Reason_Code skip_first_frame(struct _Unwind_Context* c, void* p) {
  auto* s = static_cast<SkipFirstFrame*>(p);
  if (!s->skipped) {
    s->skipped = true;
    return _URC_NO_REASON;
  }
  return s->fn(c, s->arg);
}

UPROBE_EXPORT _Unwind_Reason_Code _Unwind_Backtrace(_Unwind_Trace_Fn fn, void* arg) {
  const auto real = real_backtrace_walk();
  unhijack();
  SkipFirstFrame skip{fn, arg, false};
  _Unwind_Reason_Code rc = real(skip_first_frame, &skip);
  rehijack(0);
  return rc;
}

/// The catch: frames below the catching function are gone.
UPROBE_EXPORT void* __cxa_begin_catch(void* exc) noexcept {
  const auto real = real_begin_catch();
  void* r = real(exc);
  rehijack(reinterpret_cast<std::uint64_t>(__builtin_dwarf_cfa()));
  return r;
}

/// backtrace(3)'s walk, as glibc's: libgcc's _Unwind_Backtrace() from here,
/// the first frame (this function's caller's call into it: the interposer)
/// left out, each frame's IP, a walk that makes no progress (the same IP
/// and CFA twice) ended, and the NULL IP libgcc reports above _start
/// dropped. For more frames than backtrace() walks on its stack.
struct WalkInto {
  void** array;
  int size;
  int cnt;  // -1 until the first (left out) frame
  _Unwind_Word cfa;
};

_Unwind_Reason_Code walk_one(struct _Unwind_Context* c, void* p) {
  auto* w = static_cast<WalkInto*>(p);
  if (w->cnt != -1) {
    w->array[w->cnt] = reinterpret_cast<void*>(_Unwind_GetIP(c));
    const _Unwind_Word cfa = _Unwind_GetCFA(c);
    if (w->cnt > 0 && w->array[w->cnt - 1] == w->array[w->cnt] && cfa == w->cfa) return _URC_END_OF_STACK;
    w->cfa = cfa;
  }
  if (++w->cnt == w->size) return _URC_END_OF_STACK;
  return _URC_NO_REASON;
}

/// glibc's backtrace() leaves out its own frame and starts at its caller,
/// this interposer: asked for one frame more, whose first is dropped, the
/// program gets the frames it would without libuprobe (its own first). More
/// than kBacktraceOnStack frames: the same walk, here (walk_one()).
constexpr int kBacktraceOnStack = 512;

UPROBE_EXPORT int backtrace(void** buffer, int size) {
  const auto real = real_backtrace();
  const auto real_walk = real_backtrace_walk();
  if (size <= 0) return real(buffer, size);
  unhijack();
  int n;
  if (size < kBacktraceOnStack) {
    void* frames[kBacktraceOnStack];
    n = real(frames, size + 1);
    n = n > 0 ? n - 1 : 0;
    for (int i = 0; i < n; ++i) buffer[i] = frames[i + 1];
  } else {
    WalkInto w{buffer, size, -1, 0};
    real_walk(walk_one, &w);
    if (w.cnt > 1 && w.array[w.cnt - 1] == nullptr) --w.cnt;
    n = w.cnt != -1 ? w.cnt : 0;
  }
  rehijack(0);
  return n;
}
