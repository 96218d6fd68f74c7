// SPDX-License-Identifier: MIT
// The plain consumers of the uprobe-* and uretprobe-* variants (the default,
// --consumer=plain): what a user writes. Compiled with the project's normal
// flags (SSE is the compiler's to use anywhere), they do not call
// set_vector_state_unused(), and every hit does floating-point work: a
// double computed from a register, kept in an SSE register. libuprobe then
// preserves whatever the site makes live (vector arguments and control state
// at a function entry, return values at a return, everything at other sites)
// around them. The int consumers (--consumer=int) are the same with integer
// work instead of the double: code libuprobe reads as touching no vector
// register, around which it saves nothing.

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

/// What the int consumers do instead: integer work only (libuprobe reads
/// their code as touching no vector register and saves nothing around it).
inline void touch_integer(std::uint64_t v) noexcept {
  std::uint64_t i = (v & 0xffff) * 3 + 1;
  asm volatile("" : "+r"(i));
}

/// The opaque consumers' call: through a pointer the reading of their code
/// at registration cannot follow.
void opaque_noop() noexcept {}
void (*volatile g_opaque_call)() noexcept = opaque_noop;
inline void opaque_call() noexcept { g_opaque_call(); }
inline void no_call() noexcept {}

/// An entry consumer whose every hit does `Touch` on a register, then
/// `Call`, then counts (both inlined: the code libuprobe reads is theirs).
template <void (*Touch)(std::uint64_t) noexcept, void (*Call)() noexcept>
class WorkConsumer final : public uprobe::Consumer {
 public:
  uprobe::Action handler(uprobe::Regs& regs) override {
    Touch(regs.rsp);
    Call();
    count_hit();
    return uprobe::Action::keep;
  }
};

#if defined(UPROBE_HAS_URETPROBE)
/// The return consumer of the same work.
template <void (*Touch)(std::uint64_t) noexcept, void (*Call)() noexcept>
class WorkRetConsumer final : public uprobe::Consumer {
 public:
  WorkRetConsumer() noexcept : uprobe::Consumer(uprobe::Callbacks::ret) {}
  void ret_handler(uprobe::Regs& regs, std::uint64_t func) override {
    Touch(regs.rsp ^ func);
    Call();
    count_hit();
  }
};
using PlainRetConsumer = WorkRetConsumer<touch_double, no_call>;
using IntRetConsumer = WorkRetConsumer<touch_integer, no_call>;
using OpaqueRetConsumer = WorkRetConsumer<touch_double, opaque_call>;
#endif

using PlainConsumer = WorkConsumer<touch_double, no_call>;
using IntConsumer = WorkConsumer<touch_integer, no_call>;
using OpaqueConsumer = WorkConsumer<touch_double, opaque_call>;

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
  static IntConsumer int_entry;
  static IntRetConsumer int_ret;
  switch (k) {
    case ConsumerKind::gpr:
      return ret ? gpr_ret_consumer() : gpr_consumer();
    case ConsumerKind::opaque:
      return ret ? opaque_ret_consumer() : opaque_consumer();
    case ConsumerKind::integer:
      return ret ? static_cast<uprobe::Consumer&>(int_ret) : int_entry;
    case ConsumerKind::plain:
      break;
  }
  return ret ? plain_ret_consumer() : plain_consumer();
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
  return k == ConsumerKind::gpr      ? "gpr"
         : k == ConsumerKind::opaque ? "opaque"
         : k == ConsumerKind::integer ? "int"
                                      : "plain";
}

const char* consumer_description(ConsumerKind k) noexcept {
  switch (k) {
    case ConsumerKind::gpr:
      return "gpr (general registers only, set_vector_state_unused(): no vector state saved)";
    case ConsumerKind::opaque:
      return "opaque (plain, and a call its code's reading cannot follow: the full save of what the site makes "
             "live)";
    case ConsumerKind::integer:
      return "int (normal flags, integer work per hit, no opt-out: its code read as touching no vector register, "
             "nothing saved)";
    case ConsumerKind::plain:
      break;
  }
  return "plain (normal flags, a double per hit, no opt-out: its code read as SSE only, xmm0..xmmN and the "
         "MXCSR saved)";
}

}  // namespace bench
