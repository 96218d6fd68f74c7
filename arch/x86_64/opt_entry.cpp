// SPDX-License-Identifier: MIT
// The C entries of an optimized-probe stub and of the return trampoline.
// Compiled with -mgeneral-regs-only: nothing here touches a vector or x87
// register. The core saves what its consumers need (call_preserving(), in
// dispatch.cpp and uretprobe.cpp, also compiled with -mgeneral-regs-only);
// a ThreadSanitizer build saves everything here, before any instrumented
// code runs.

#include <cstdint>

#include "arch.hpp"

// ThreadSanitizer builds (the runtime's src/common/sanitize.hpp says the same).
#if defined(__SANITIZE_THREAD__)
#define UPROBE_OPT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UPROBE_OPT_TSAN 1
#endif
#endif
#ifdef UPROBE_OPT_TSAN
#include <sanitizer/tsan_interface.h>
#endif
// Not instrumented by ThreadSanitizer: there every access calls into the
// TSan runtime, which uses vector registers, before they are saved.
#define UPROBE_OPT_NO_TSAN __attribute__((no_sanitize("thread")))

namespace {

#ifdef UPROBE_OPT_TSAN
struct OptCall {
  std::uint64_t* frame;
  const uprobe::arch::OptSite* site;
};

UPROBE_OPT_PATH_TEXT UPROBE_OPT_NO_TSAN void opt_hit_cb(void* p) {
  const auto* c = static_cast<const OptCall*>(p);
  // The descriptor was written through the XOL alias before the jump here
  // was patched in (sites.cpp, tsan_publish_stub()): tell TSan.
  __tsan_acquire(const_cast<std::uint64_t*>(&c->site->owner));
  uprobe_opt_hit(c->frame, c->site);
}

UPROBE_OPT_NO_TSAN void ret_dispatch_cb(void* f) { uprobe_ret_dispatch(static_cast<uprobe::arch::RetFrame*>(f)); }
#endif

}  // namespace

extern "C" __attribute__((visibility("hidden"))) UPROBE_OPT_PATH_TEXT UPROBE_OPT_NO_TSAN void uprobe_opt_entry(
    std::uint64_t* frame, const uprobe::arch::OptSite* site) {
#ifdef UPROBE_OPT_TSAN
  OptCall c{frame, site};
  uprobe::arch::call_preserving(uprobe::arch::SaveMode::full, opt_hit_cb, &c);
#else
  uprobe_opt_hit(frame, site);  // a tail call
#endif
}

/// What the return trampoline calls (ret_trampoline.S).
extern "C" __attribute__((visibility("hidden"))) UPROBE_OPT_NO_TSAN void uprobe_ret_entry(
    uprobe::arch::RetFrame* f) {
#ifdef UPROBE_OPT_TSAN
  uprobe::arch::call_preserving(uprobe::arch::SaveMode::ret, ret_dispatch_cb, f);
#else
  uprobe_ret_dispatch(f);  // a tail call
#endif
}
