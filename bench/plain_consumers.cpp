// SPDX-License-Identifier: MIT
// The plain consumers of the uprobe-* and uretprobe-* variants (the default,
// --consumer=plain): what a user writes. Compiled with the project's normal
// flags (SSE is the compiler's to use anywhere), they do not call
// set_vector_state_unused(), and every hit does floating-point work: a
// double computed from a register, kept in an SSE register. libuprobe then
// preserves whatever the site makes live (vector arguments and control state
// at a function entry, return values at a return, everything at other sites)
// around them.

#include "bench.hpp"
#include "uprobe/uprobe.hpp"

namespace bench {
namespace {

/// Touches a double: converted, multiplied and added in SSE registers (the
/// empty asm keeps the result, in an "x" register, from being folded away).
inline void touch_double(std::uint64_t v) noexcept {
  double d = static_cast<double>(v & 0xffff) * 0.5 + 1.0;
  asm volatile("" : "+x"(d));
}

class PlainConsumer final : public uprobe::Consumer {
 public:
  uprobe::Action handler(uprobe::Regs& regs) override {
    touch_double(regs.rsp);
    count_hit();
    return uprobe::Action::keep;
  }
};

#if defined(UPROBE_HAS_URETPROBE)
class PlainRetConsumer final : public uprobe::Consumer {
 public:
  PlainRetConsumer() noexcept : uprobe::Consumer(uprobe::Callbacks::ret) {}
  void ret_handler(uprobe::Regs& regs, std::uint64_t func) override {
    touch_double(regs.rsp ^ func);
    count_hit();
  }
};
#endif

/// The opaque consumers' call: through a pointer the reading of their code
/// at registration cannot follow.
void opaque_noop() noexcept {}
void (*volatile g_opaque_call)() noexcept = opaque_noop;

class OpaqueConsumer final : public uprobe::Consumer {
 public:
  uprobe::Action handler(uprobe::Regs& regs) override {
    touch_double(regs.rsp);
    g_opaque_call();
    count_hit();
    return uprobe::Action::keep;
  }
};

#if defined(UPROBE_HAS_URETPROBE)
class OpaqueRetConsumer final : public uprobe::Consumer {
 public:
  OpaqueRetConsumer() noexcept : uprobe::Consumer(uprobe::Callbacks::ret) {}
  void ret_handler(uprobe::Regs& regs, std::uint64_t func) override {
    touch_double(regs.rsp ^ func);
    g_opaque_call();
    count_hit();
  }
};
#endif

}  // namespace

uprobe::Consumer& opaque_consumer() {
  static OpaqueConsumer c;
  return c;
}

#if defined(UPROBE_HAS_URETPROBE)
uprobe::Consumer& opaque_ret_consumer() {
  static OpaqueRetConsumer c;
  return c;
}
#endif

uprobe::Consumer& consumer_of(ConsumerKind k, bool ret) {
#if defined(UPROBE_HAS_URETPROBE)
  if (ret) return k == ConsumerKind::gpr ? gpr_ret_consumer() : k == ConsumerKind::opaque ? opaque_ret_consumer()
                                                                                         : plain_ret_consumer();
#endif
  (void)ret;
  return k == ConsumerKind::gpr ? gpr_consumer() : k == ConsumerKind::opaque ? opaque_consumer() : plain_consumer();
}

uprobe::Consumer& plain_consumer() {
  static PlainConsumer c;
  return c;
}

#if defined(UPROBE_HAS_URETPROBE)
uprobe::Consumer& plain_ret_consumer() {
  static PlainRetConsumer c;
  return c;
}
#endif

const char* consumer_name(ConsumerKind k) noexcept {
  return k == ConsumerKind::gpr ? "gpr" : k == ConsumerKind::opaque ? "opaque" : "plain";
}

const char* consumer_description(ConsumerKind k) noexcept {
  switch (k) {
    case ConsumerKind::gpr:
      return "gpr (general registers only, set_vector_state_unused(): no vector state saved)";
    case ConsumerKind::opaque:
      return "opaque (plain, and a call its code's reading cannot follow: the full save of what the site makes "
             "live)";
    case ConsumerKind::plain:
      break;
  }
  return "plain (normal flags, a double per hit, no opt-out: its code read as SSE only, xmm0..xmmN and the "
         "MXCSR saved)";
}

}  // namespace bench
