// SPDX-License-Identifier: MIT
// Cases C-01 (longjmp out of return-probed frames), C-02 (C++ exceptions
// through return-probed frames, backtraces), C-05 (entry and return probes on
// functions too short for a patch), C-08 (two return consumers on one
// function), and fixup_backtrace() on a frame-pointer walk. See
// tests/README.md.

#include <dlfcn.h>
#include <execinfo.h>
#include <setjmp.h>
#include <unwind.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ret_common.hpp"
#include "uprobe/symbols.hpp"

using namespace rettest;
using uprobe::Action;
using uprobe::Callbacks;
using uprobe::Regs;

namespace {

/// Entry+return counter: counts entries and returns, records the last return.
struct SessCount : uprobe::Consumer {
  SessCount() : uprobe::Consumer(Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0}, bad_cookie{0};
  std::uint64_t last_rax = 0, last_rip = 0, last_func = 0;
  Action handler(Regs& r) override {
    std::uint64_t n = entries.fetch_add(1, std::memory_order_relaxed);
    uprobe::session_cookie() = n + 1;
    (void)r;
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t func) override {
    rets.fetch_add(1, std::memory_order_relaxed);
    if (uprobe::session_cookie() == 0) bad_cookie.fetch_add(1);
    last_rax = r.rax;
    last_rip = r.rip;
    last_func = func;
  }
};

std::string sym_name(const void* p) {
  Dl_info di{};
  if (dladdr(p, &di) && di.dli_sname) return di.dli_sname;
  return "?";
}

}  // namespace

// ================================================================ C-01 ====

namespace c01 {
jmp_buf g_env;
volatile long g_counter;
volatile long g_x;
volatile unsigned g_max_depth;
volatile unsigned g_min_depth;
}  // namespace c01

extern "C" __attribute__((noinline, noipa)) long c01_f2(long x) {
  unsigned d = uprobe::return_stack_depth();
  if (d > c01::g_max_depth) c01::g_max_depth = d;
  if (d < c01::g_min_depth) c01::g_min_depth = d;
  c01::g_counter = c01::g_counter - 1;
  if (c01::g_counter > 0) longjmp(c01::g_env, 1);
  return x + 7;
}

extern "C" __attribute__((noinline, noipa)) long c01_f1() {
  setjmp(c01::g_env);
  return c01_f2(c01::g_x) * 2;
}

namespace {

void run_c01(long counter) {
  SessCount f1, f2;
  c01::g_counter = counter;
  c01::g_x = 5;
  c01::g_max_depth = 0;
  c01::g_min_depth = ~0u;
  uprobe::Attachment a1(vaddr(c01_f1), f1), a2(vaddr(c01_f2), f2);
  auto s0 = uprobe::stats();
  auto t0 = std::chrono::steady_clock::now();
  long r = c01_f1();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto d = delta(s0, uprobe::stats());
  std::printf("[ info ] C-01 counter %ld: %.3f s\n", counter, secs);
  EXPECT_EQ(r, (5 + 7) * 2) << "program result";
  EXPECT_EQ(f2.entries.load(), static_cast<std::uint64_t>(counter)) << "f2 entry hits = counter start";
  EXPECT_EQ(f2.rets.load(), 1u) << "f2 return hits";
  EXPECT_EQ(f1.entries.load(), 1u);
  EXPECT_EQ(f1.rets.load(), 1u) << "f1 return hits";
  EXPECT_EQ(f2.last_rax, 12u);
  EXPECT_EQ(f1.last_rax, 24u);
  EXPECT_EQ(f1.bad_cookie.load() + f2.bad_cookie.load(), 0u);
  EXPECT_LE(c01::g_max_depth, 3u) << "the return stack must stay bounded (not grow with the counter)";
  EXPECT_GE(c01::g_min_depth, 2u) << "inside f2, f1's and f2's return instances are pending";
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  EXPECT_EQ(d.return_misses, 0u) << "no depth-limit misses: " << str(d);
  EXPECT_EQ(d.return_hits, 2u) << str(d);
  EXPECT_EQ(d.return_dropped, static_cast<std::uint64_t>(counter - 1))
      << "each f2 frame left by longjmp is dropped once: " << str(d);
  EXPECT_EQ(d.hits, static_cast<std::uint64_t>(counter) + 1) << str(d);
}

TEST(C01_Longjmp, Counter1024) { run_c01(1024); }
TEST(C01_Longjmp, Counter1000000) { run_c01(1000000); }

}  // namespace

// The frames longjmp left are found stale at the next *return* instead (no
// probed call in between): f1 -> deep(n) -> ... -> deep(0) longjmps to f1,
// which then returns. The kernel drops the stale chain at the trampoline and
// runs f1's return.
namespace c01 {
jmp_buf g_env2;
}

extern "C" __attribute__((noinline, noipa)) long c01_deep(long n) {
  if (n < 0) return 0;  // (never: keeps a normal return path)
  if (n == 0) longjmp(c01::g_env2, 1);
  long r = c01_deep(n - 1);
  c01::g_x = r;  // not a tail call
  return r + 1;
}

extern "C" __attribute__((noinline, noipa)) long c01_f1b(long n) {
  if (setjmp(c01::g_env2) == 0) return c01_deep(n) + 1000;  // never returns normally
  return 77;
}

namespace {

TEST(C01_Longjmp, StaleFramesDroppedAtReturn) {
  for (long n : {0L, 1L, 5L, 40L}) {
    SCOPED_TRACE("deep(" + std::to_string(n) + ")");
    SessCount f1, deep;
    uprobe::Attachment a1(vaddr(c01_f1b), f1), a2(vaddr(c01_deep), deep);
    auto s0 = uprobe::stats();
    ASSERT_EQ(c01_f1b(n), 77);
    auto d = delta(s0, uprobe::stats());
    EXPECT_EQ(deep.entries.load(), static_cast<std::uint64_t>(n + 1));
    EXPECT_EQ(deep.rets.load(), 0u) << "frames left by longjmp get no return call";
    EXPECT_EQ(f1.rets.load(), 1u) << "f1's own return is reported";
    EXPECT_EQ(f1.last_rax, 77u);
    EXPECT_EQ(f1.last_func, addr(c01_f1b));
    EXPECT_EQ(uprobe::return_stack_depth(), 0u);
    EXPECT_EQ(d.return_hits, 1u) << str(d);
    EXPECT_EQ(d.return_dropped, static_cast<std::uint64_t>(n + 1)) << str(d);
    EXPECT_EQ(d.return_misses, 0u) << str(d);
  }
}

}  // namespace

// ================================================================ C-02 ====

namespace c02 {
volatile int g_sink;
struct Trace {
  void* f[64];
  int n = 0;
};
Trace g_bt, g_ub;
bool g_take = false;

_Unwind_Reason_Code collect(struct _Unwind_Context* ctx, void* arg) {
  auto* t = static_cast<Trace*>(arg);
  if (t->n < 64) t->f[t->n++] = reinterpret_cast<void*>(_Unwind_GetIP(ctx));
  return _URC_NO_REASON;
}
struct Guard {
  ~Guard() { g_sink = g_sink + static_cast<int>(rt_simple_add(2, 3)); }
};
}  // namespace c02

extern "C" __attribute__((noinline, noipa)) void c02_f() {
  if (c02::g_take) {
    c02::g_bt.n = backtrace(c02::g_bt.f, 64);
    c02::g_ub.n = 0;
    _Unwind_Backtrace(c02::collect, &c02::g_ub);
  }
  throw std::runtime_error("c02");
}

extern "C" __attribute__((noinline, noipa)) void c02_g() {
  c02_f();
  c02::g_sink = 1;  // not a tail call
}

/// g with a cleanup (landing pad + _Unwind_Resume) whose destructor calls a
/// return-probed function.
extern "C" __attribute__((noinline, noipa)) void c02_g2() {
  c02::Guard guard;
  c02_f();
  c02::g_sink = 2;
}

/// Catches inside a (return-probed) function.
extern "C" __attribute__((noinline, noipa)) long c02_h(long x) {
  try {
    c02_g();
  } catch (const std::runtime_error&) {
    return x + 1;
  }
  return -1;
}

/// The "main" of C-02: iters times try { g } catch; counts catches and
/// catches after which the return stack is not empty.
extern "C" __attribute__((noinline, noipa)) int c02_main(int iters, int take_bt, int use_g2, unsigned* not_empty) {
  int caught = 0;
  for (int i = 0; i < iters; ++i) {
    c02::g_take = i < take_bt;
    try {
      if (use_g2)
        c02_g2();
      else
        c02_g();
    } catch (const std::runtime_error& e) {
      ++caught;
      if (uprobe::return_stack_depth() != 0) ++*not_empty;
    }
  }
  c02::g_take = false;
  return caught;
}

namespace {

/// Frames up to and including the first one in c02_main.
std::vector<void*> upto_main(const c02::Trace& t) {
  std::vector<void*> v;
  for (int i = 0; i < t.n; ++i) {
    v.push_back(t.f[i]);
    if (sym_name(t.f[i]) == "c02_main") break;
  }
  return v;
}

void check_trace(const c02::Trace& t, const std::vector<void*>& baseline, const char* what) {
  SCOPED_TRACE(what);
  bool has_g = false, has_main = false;
  for (int i = 0; i < t.n; ++i) {
    EXPECT_FALSE(uprobe::is_return_trampoline(t.f[i])) << "frame " << i << " is a return address of ours";
    std::string nm = sym_name(t.f[i]);
    if (nm == "c02_g") has_g = true;
    if (nm == "c02_main") has_main = true;
  }
  EXPECT_TRUE(has_g) << "the backtrace must show g";
  EXPECT_TRUE(has_main) << "the backtrace must show the function that calls g";
  EXPECT_EQ(upto_main(t), baseline) << "frames up to c02_main must equal the unprobed backtrace";
}

TEST(C02_Exceptions, ThousandThrowsThroughReturnProbedFrames) {
  // Unprobed baseline backtraces (same call path).
  unsigned not_empty = 0;
  ASSERT_EQ(c02_main(1, 1, 0, &not_empty), 1);
  const std::vector<void*> base_bt = upto_main(c02::g_bt), base_ub = upto_main(c02::g_ub);
  ASSERT_FALSE(base_bt.empty());
  ASSERT_EQ(sym_name(base_bt.back()), "c02_main") << "baseline backtrace(3) does not reach c02_main";
  ASSERT_EQ(sym_name(base_ub.back()), "c02_main") << "baseline _Unwind_Backtrace does not reach c02_main";

  SessCount f, g;
  uprobe::Attachment af(vaddr(c02_f), f), ag(vaddr(c02_g), g);
  auto s0 = uprobe::stats();
  c02::g_bt.n = c02::g_ub.n = 0;
  int caught = c02_main(1000, 5, 0, &not_empty);
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(caught, 1000);
  EXPECT_EQ(not_empty, 0u) << "the return stack must be empty after each catch";
  EXPECT_EQ(f.entries.load(), 1000u);
  EXPECT_EQ(g.entries.load(), 1000u);
  EXPECT_EQ(f.rets.load(), 0u) << "f's frames were left by the exception: no return call";
  EXPECT_EQ(g.rets.load(), 0u) << "g's frames were left by the exception: no return call";
  EXPECT_EQ(d.return_hits, 0u) << str(d);
  EXPECT_EQ(d.return_misses, 0u) << str(d);
  EXPECT_EQ(d.return_dropped, 2000u) << str(d);
  check_trace(c02::g_bt, base_bt, "backtrace(3) inside f");
  check_trace(c02::g_ub, base_ub, "_Unwind_Backtrace inside f");

  auto t0 = std::chrono::steady_clock::now();
  af.detach();
  ag.detach();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 1.0) << "detach must return at once";
  std::printf("[ info ] C-02 detach of 2 probes: %.6f s\n", secs);
  EXPECT_EQ(c02_main(1, 0, 0, &not_empty), 1) << "g still throws and is caught after detach";
  EXPECT_EQ(not_empty, 0u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

/// A return probe on the unwinder's entry points (libgcc_s's
/// _Unwind_RaiseException, _Unwind_Resume, _Unwind_Resume_or_Rethrow,
/// _Unwind_ForcedUnwind) is refused, with the reason, nothing written: the
/// unwinder starts at its own frame, whose replaced return address stopped
/// the unwind (every throw ended in std::terminate()). An entry probe on
/// _Unwind_RaiseException counts each throw; _Unwind_Resume's each cleanup
/// that resumes (c02_g2's guard).
TEST(C02_Exceptions, ReturnProbeOnTheUnwindersEntryPointsIsRefusedEntryProbeCounts) {
  const std::string gcc_s = uprobe::resolve_library("libgcc_s.so.1");
  for (const char* name : {"_Unwind_RaiseException", "_Unwind_Resume", "_Unwind_Resume_or_Rethrow",
                           "_Unwind_ForcedUnwind"}) {
    SCOPED_TRACE(name);
    const uprobe::Symbol sym = uprobe::find_symbol(gcc_s, name);
    const auto addrs = uprobe::runtime_addresses(gcc_s, sym.offset);
    ASSERT_EQ(addrs.size(), 1u);
    std::uint8_t before[8];
    std::memcpy(before, reinterpret_cast<const void*>(addrs[0]), sizeof before);
    SessCount s;
    try {
      uprobe::Attachment a(gcc_s, sym.offset, s);
      ADD_FAILURE() << "a return probe on " << name << " was accepted";
    } catch (const uprobe::Error& e) {
      EXPECT_EQ(e.code(), uprobe::Errc::refused_instruction) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("a return probe on ") + name +
                                           ": the exception unwinder starts at its own frame"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(std::memcmp(before, reinterpret_cast<const void*>(addrs[0]), sizeof before), 0);
    unsigned not_empty = 0;
    EXPECT_EQ(c02_main(10, 0, 1, &not_empty), 10);
    EXPECT_EQ(s.entries.load(), 0u);
  }
  struct Hits : uprobe::Consumer {
    std::atomic<std::uint64_t> hits{0};
    Action handler(Regs&) override {
      hits.fetch_add(1, std::memory_order_relaxed);
      return Action::keep;
    }
  } raise, resume;
  std::uint64_t resumes_per_100 = 0;
  {
    uprobe::Attachment a(gcc_s, uprobe::find_symbol(gcc_s, "_Unwind_RaiseException").offset, raise);
    uprobe::Attachment b(gcc_s, uprobe::find_symbol(gcc_s, "_Unwind_Resume").offset, resume);
    unsigned not_empty = 0;
    EXPECT_EQ(c02_main(100, 0, 1, &not_empty), 100);
    resumes_per_100 = resume.hits.load();
    EXPECT_EQ(c02_main(100, 0, 1, &not_empty), 100);
    EXPECT_EQ(not_empty, 0u);
  }
  EXPECT_EQ(raise.hits.load(), 200u);
  // c02_g2's guard resumes the unwind once per throw (a sanitizer's
  // instrumentation adds landing pads of its own: as many per throw).
  EXPECT_GE(resumes_per_100, 100u);
  EXPECT_EQ(resumes_per_100 % 100, 0u) << resumes_per_100;
  EXPECT_EQ(resume.hits.load(), 2 * resumes_per_100);
}

TEST(C02_Exceptions, CatchInsideAReturnProbedFunction) {
  SessCount f, g, h;
  uprobe::Attachment af(vaddr(c02_f), f), ag(vaddr(c02_g), g), ah(vaddr(c02_h), h);
  for (long i = 0; i < 200; ++i) {
    ASSERT_EQ(c02_h(i), i + 1);
    ASSERT_EQ(h.rets.load(), static_cast<std::uint64_t>(i + 1)) << "h caught and returned: its return call runs";
    ASSERT_EQ(h.last_rax, static_cast<std::uint64_t>(i + 1));
    ASSERT_EQ(h.last_func, addr(c02_h));
    ASSERT_EQ(uprobe::return_stack_depth(), 0u);
  }
  EXPECT_EQ(f.rets.load(), 0u);
  EXPECT_EQ(g.rets.load(), 0u);
  EXPECT_EQ(f.entries.load(), 200u);
}

TEST(C02_Exceptions, CleanupCallsAReturnProbedFunction) {
  SessCount f, g2, add;
  uprobe::Attachment af(vaddr(c02_f), f), ag(vaddr(c02_g2), g2), aa(vaddr(rt_simple_add), add);
  unsigned not_empty = 0;
  EXPECT_EQ(c02_main(500, 0, 1, &not_empty), 500);
  EXPECT_EQ(not_empty, 0u);
  EXPECT_EQ(add.entries.load(), 500u);
  EXPECT_EQ(add.rets.load(), 500u) << "the destructor's call returned normally during unwinding";
  EXPECT_EQ(add.last_rax, 5u);
  EXPECT_EQ(f.rets.load() + g2.rets.load(), 0u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

// ====================================================== backtraces ====

volatile int g_call_sink;
/// Calls fp_outer from one fixed call site (not a tail call).
__attribute__((noinline, noipa)) int call_fp_outer3(void** out) {
  int r = fp_outer(out, 3);
  g_call_sink = r;
  return r;
}

namespace btfirst {
void* g_frames[8];
int g_n = 0;
void* g_one[1];
int g_n_one = 0;
std::vector<void*> g_unwound;
_Unwind_Reason_Code collect(struct _Unwind_Context* c, void*) {
  g_unwound.push_back(reinterpret_cast<void*>(_Unwind_GetIP(c)));
  return g_unwound.size() < 4 ? _URC_NO_REASON : _URC_END_OF_STACK;
}
}  // namespace btfirst

extern "C" __attribute__((noinline, noipa)) void bt_first_leaf() {
  btfirst::g_n = backtrace(btfirst::g_frames, 8);
  btfirst::g_n_one = backtrace(btfirst::g_one, 1);
  btfirst::g_unwound.clear();
  _Unwind_Backtrace(btfirst::collect, nullptr);
  asm volatile("");  // (not a tail call)
}

extern "C" __attribute__((noinline, noipa)) void bt_first_caller() {
  bt_first_leaf();
  asm volatile("");
}

/// The file a code address is in ("" when none).
std::string object_of(const void* p) {
  Dl_info di{};
  return dladdr(p, &di) && di.dli_fname ? di.dli_fname : "";
}

/// Frames of a sanitizer's runtime (its own backtrace() interceptor calls
/// the next one: under ASan or TSan the first frame is the interceptor's,
/// with or without libuprobe).
std::size_t sanitizer_frames(void* const* f, std::size_t n) {
  std::size_t i = 0;
  while (i < n && (object_of(f[i]).find("libasan") != std::string::npos ||
                   object_of(f[i]).find("libtsan") != std::string::npos))
    ++i;
  return i;
}

/// backtrace(3) and _Unwind_Backtrace() start at their caller, as without
/// libuprobe, though it interposes both (to restore the real return
/// addresses first): the first frame is the calling function (after a
/// sanitizer's interceptor, in those builds), the second its caller; no
/// frame is libuprobe's. Before, the interposer's own frame came first
/// (`backtrace`, `_Unwind_Backtrace`), in every program that loads
/// libuprobe.
TEST(RetBacktrace, BacktraceStartsAtItsCallerAsWithoutLibuprobe) {
  bt_first_caller();
  const std::size_t s = sanitizer_frames(btfirst::g_frames, static_cast<std::size_t>(btfirst::g_n));
  ASSERT_GE(static_cast<std::size_t>(btfirst::g_n), s + 3);
  EXPECT_EQ(sym_name(btfirst::g_frames[s]), "bt_first_leaf");
  EXPECT_EQ(sym_name(btfirst::g_frames[s + 1]), "bt_first_caller");
  for (int i = 0; i < btfirst::g_n; ++i)
    EXPECT_EQ(object_of(btfirst::g_frames[i]).find("libuprobe"), std::string::npos) << "frame " << i;
  ASSERT_EQ(btfirst::g_n_one, 1);
  if (s == 0) {
    EXPECT_EQ(sym_name(btfirst::g_one[0]), "bt_first_leaf");
  }
  ASSERT_GE(btfirst::g_unwound.size(), 2u);
  EXPECT_EQ(sym_name(btfirst::g_unwound[0]), "bt_first_leaf");
  EXPECT_EQ(sym_name(btfirst::g_unwound[1]), "bt_first_caller");
}

namespace btdeep {
constexpr int kDepth = 700;
int g_sizes[] = {1, 2, 511, 512, 513, 600, 2000};
int g_n[7], g_real_n[7];
std::vector<void*> g_frames[7], g_real[7];
}  // namespace btdeep

extern "C" __attribute__((noinline, noipa)) int bt_deep(int d) {
  if (d > 0) {
    const int r = bt_deep(d - 1);
    asm volatile("");
    return r + 1;
  }
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  const auto real_backtrace = reinterpret_cast<int (*)(void**, int)>(dlsym(libc, "backtrace"));
  for (int k = 0; k < 7; ++k) {
    const int size = btdeep::g_sizes[k];
    btdeep::g_frames[k].assign(static_cast<std::size_t>(size), nullptr);
    btdeep::g_real[k].assign(static_cast<std::size_t>(size), nullptr);
    btdeep::g_n[k] = backtrace(btdeep::g_frames[k].data(), size);
    btdeep::g_real_n[k] = real_backtrace ? real_backtrace(btdeep::g_real[k].data(), size) : -1;
  }
  return 0;
}

/// backtrace() of any size gives what glibc's own gives, called from the
/// same function: as many frames (the deepest included, past 512 frames
/// too: there libuprobe walks itself), the same ones after the first (the
/// two calls' own return addresses differ). 700 frames deep; sizes 1 to
/// 2000 (the whole stack).
TEST(RetBacktrace, BacktraceOfAnySizeIsGlibcs) {
  ASSERT_EQ(bt_deep(btdeep::kDepth), btdeep::kDepth);
  for (int k = 0; k < 7; ++k) {
    SCOPED_TRACE("size " + std::to_string(btdeep::g_sizes[k]));
    ASSERT_GT(btdeep::g_real_n[k], 0);
    const std::size_t s = sanitizer_frames(btdeep::g_frames[k].data(), static_cast<std::size_t>(btdeep::g_n[k]));
    if (s != 0) continue;  // (a sanitizer's interceptor in front: its own count)
    EXPECT_EQ(btdeep::g_n[k], btdeep::g_real_n[k]);
    EXPECT_EQ(sym_name(btdeep::g_frames[k][0]), "bt_deep");
    for (int i = 1; i < std::min(btdeep::g_n[k], btdeep::g_real_n[k]); ++i)
      ASSERT_EQ(btdeep::g_frames[k][static_cast<std::size_t>(i)], btdeep::g_real[k][static_cast<std::size_t>(i)])
          << "frame " << i;
  }
}

TEST(RetBacktrace, FixupFramePointerWalk) {
  void* real[3] = {};
  ASSERT_EQ(call_fp_outer3(real), 1103);
  for (void* p : real) ASSERT_FALSE(uprobe::is_return_trampoline(p));
  struct R : uprobe::Consumer {
    R() : uprobe::Consumer(Callbacks::ret) {}
  } r;
  void* raw[3] = {};
  fp_raw_out = raw;
  {
    uprobe::Attachment a(vaddr(fp_outer), r), b(vaddr(fp_mid), r), c(vaddr(fp_inner), r);
    void* frames[3] = {};
    fp_fixed = -1;
    ASSERT_EQ(call_fp_outer3(frames), 1103);
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(uprobe::is_return_trampoline(raw[i])) << "raw frame " << i << " must be a return address of ours";
    EXPECT_EQ(fp_fixed, 3) << "fixup_backtrace() inside fp_inner";
    for (int i = 0; i < 3; ++i) EXPECT_EQ(frames[i], real[i]) << "fixed frame " << i;
  }
  {
    uprobe::Attachment b(vaddr(fp_mid), r);
    void* frames[3] = {};
    fp_fixed = -1;
    ASSERT_EQ(call_fp_outer3(frames), 1103);
    EXPECT_EQ(raw[0], real[0]);
    EXPECT_TRUE(uprobe::is_return_trampoline(raw[1]));
    EXPECT_EQ(raw[2], real[2]);
    EXPECT_EQ(fp_fixed, 1);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(frames[i], real[i]) << "fixed frame " << i;
  }
  {
    void* frames[3] = {};
    fp_fixed = -1;
    ASSERT_EQ(call_fp_outer3(frames), 1103);
    EXPECT_EQ(fp_fixed, 0) << "nothing pending: nothing replaced";
    for (int i = 0; i < 3; ++i) EXPECT_EQ(frames[i], real[i]) << "frame " << i;
  }
  fp_raw_out = nullptr;
}

/// Takes backtrace(3) from inside fp_mid's ret_handler.
struct BtInRet : uprobe::Consumer {
  BtInRet() : uprobe::Consumer(Callbacks::ret) {}
  void* f[64];
  int n = 0;
  void ret_handler(Regs&, std::uint64_t func) override {
    if (func == addr(fp_mid)) n = backtrace(f, 64);
  }
};

TEST(RetBacktrace, BacktraceInsideRetHandlerSeesRealCallers) {
  void* warm[4];
  ASSERT_GT(backtrace(warm, 4), 0);  // loads the unwinder outside the handler
  BtInRet bt;
  uprobe::Attachment a(vaddr(fp_outer), bt), b(vaddr(fp_mid), bt);
  void* frames[3];
  ASSERT_EQ(call_fp_outer3(frames), 1103);
  ASSERT_GT(bt.n, 0);
  bool outer = false, caller = false;
  for (int i = 0; i < bt.n; ++i) {
    EXPECT_FALSE(uprobe::is_return_trampoline(bt.f[i])) << "frame " << i;
    std::string nm = sym_name(bt.f[i]);
    if (nm == "fp_outer") outer = true;
    if (nm.find("call_fp_outer3") != std::string::npos) caller = true;
  }
  EXPECT_TRUE(outer) << "fp_mid returns into fp_outer: the backtrace must show it";
  (void)caller;  // call_fp_outer3 is internal (no dynamic symbol); fp_outer is enough
}

// ================================================================ C-05 ====

struct EntryCount : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    return Action::keep;
  }
};

struct RetCheck : uprobe::Consumer {
  explicit RetCheck(Callbacks c = Callbacks::ret) : uprobe::Consumer(c) {}
  std::atomic<std::uint64_t> rets{0}, entries{0};
  std::uint64_t want_rax = 0, want_rdx = 0, func = 0;
  bool check_rdx = false;
  std::atomic<std::uint64_t> bad{0};
  Action handler(Regs&) override {
    entries.fetch_add(1);
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t f) override {
    rets.fetch_add(1);
    if (r.rax != want_rax || (check_rdx && r.rdx != want_rdx) || f != func || r.rip != call_site() ||
        r.rsp != rt_call_rsp)
      bad.fetch_add(1);
  }
};

TEST(C05_Short, RepRetOnly) {
  EntryCount e;
  RetCheck r, s(Callbacks::entry_and_ret);
  r.func = s.func = addr(rt_c05a);
  auto s0 = uprobe::stats();
  uprobe::Attachment a(vaddr(rt_c05a), e), b(vaddr(rt_c05a), r), c(vaddr(rt_c05a), s);
  for (std::uint64_t i = 0; i < 1000; ++i) {
    r.want_rax = s.want_rax = i + 2;
    ASSERT_EQ(rt_call(vaddr(rt_c05a), i, 0, i + 2, 0), i + 2);
  }
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(e.hits.load(), 1000u);
  EXPECT_EQ(s.entries.load(), 1000u);
  EXPECT_EQ(r.rets.load(), 1000u);
  EXPECT_EQ(s.rets.load(), 1000u);
  EXPECT_EQ(r.bad.load() + s.bad.load(), 0u);
  EXPECT_EQ(d.hits, 1000u) << str(d);
  EXPECT_EQ(d.return_hits, 1000u) << str(d);
}

TEST(C05_Short, XorRetWithNeighbour) {
  const std::vector<std::uint8_t> next_before(static_cast<const std::uint8_t*>(vaddr(rt_c05b_next)),
                                              static_cast<const std::uint8_t*>(vaddr(rt_c05b_next)) + 5);
  ASSERT_EQ(addr(rt_c05b_next), addr(rt_c05b) + 3) << "fixture: the neighbour must follow directly";
  EntryCount e;
  RetCheck r;
  r.func = addr(rt_c05b);
  r.want_rax = 0;
  {
    uprobe::Attachment a(vaddr(rt_c05b), e), b(vaddr(rt_c05b), r);
    std::vector<std::uint8_t> next_now(static_cast<const std::uint8_t*>(vaddr(rt_c05b_next)),
                                       static_cast<const std::uint8_t*>(vaddr(rt_c05b_next)) + 5);
    EXPECT_EQ(next_now, next_before) << "probing rt_c05b must not touch the next function's bytes";
    for (std::uint64_t i = 0; i < 1000; ++i) {
      ASSERT_EQ(rt_call(vaddr(rt_c05b), i, 0, 12345, 0), 0u);
      ASSERT_EQ(rt_c05b_next(i), i + 5) << "the neighbouring function returns its own value";
    }
    EXPECT_EQ(e.hits.load(), 1000u);
    EXPECT_EQ(r.rets.load(), 1000u);
    EXPECT_EQ(r.bad.load(), 0u);
    // Both probed.
    RetCheck rn;
    rn.func = addr(rt_c05b_next);
    uprobe::Attachment c(vaddr(rt_c05b_next), rn);
    for (std::uint64_t i = 0; i < 1000; ++i) {
      rn.want_rax = i + 5;
      ASSERT_EQ(rt_call(vaddr(rt_c05b_next), i, 0, 0, 0), i + 5);
      ASSERT_EQ(rt_call(vaddr(rt_c05b), i, 0, 777, 0), 0u);
    }
    EXPECT_EQ(rn.rets.load(), 1000u);
    EXPECT_EQ(rn.bad.load(), 0u);
    EXPECT_EQ(r.rets.load(), 2000u);
    EXPECT_EQ(r.bad.load(), 0u);
    EXPECT_EQ(e.hits.load(), 2000u);
  }
  std::vector<std::uint8_t> next_after(static_cast<const std::uint8_t*>(vaddr(rt_c05b_next)),
                                       static_cast<const std::uint8_t*>(vaddr(rt_c05b_next)) + 5);
  EXPECT_EQ(next_after, next_before);
}

TEST(C05_Short, ProbeDirectlyOnRet) {
  EntryCount e;
  RetCheck s(Callbacks::entry_and_ret);
  s.func = addr(rt_c05c);
  auto s0 = uprobe::stats();
  uprobe::Attachment a(vaddr(rt_c05c), e), b(vaddr(rt_c05c), s);
  for (std::uint64_t i = 0; i < 1000; ++i) {
    s.want_rax = 3 * i;
    ASSERT_EQ(rt_call(vaddr(rt_c05c), i, 0, 3 * i, 0), 3 * i);
  }
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(e.hits.load(), 1000u);
  EXPECT_EQ(s.entries.load(), 1000u);
  EXPECT_EQ(s.rets.load(), 1000u);
  EXPECT_EQ(s.bad.load(), 0u);
  EXPECT_EQ(d.hits, 1000u) << str(d);
  EXPECT_EQ(d.return_hits, 1000u) << str(d);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

TEST(C05_Short, IncDecJmp0Ret) {
  EntryCount e0, e1, e2, e3;
  RetCheck r, s(Callbacks::entry_and_ret);
  r.func = s.func = addr(rt_c05d);
  r.check_rdx = s.check_rdx = true;
  auto s0 = uprobe::stats();
  uprobe::Attachment a0(vaddr(rt_c05d), e0), a1(at(rt_c05d, rt_c05d_off1), e1), a2(at(rt_c05d, rt_c05d_off2), e2),
      a3(at(rt_c05d, rt_c05d_off3), e3), b(vaddr(rt_c05d), r), c(vaddr(rt_c05d), s);
  for (std::uint64_t i = 1; i <= 1000; ++i) {
    r.want_rax = s.want_rax = 10 * i + 1;
    r.want_rdx = s.want_rdx = 7 * i - 1;
    RtPair p = rt_call_pair(vaddr(rt_c05d), 0, 0, 10 * i, 7 * i);
    ASSERT_EQ(p.lo, 10 * i + 1);
    ASSERT_EQ(p.hi, 7 * i - 1);
  }
  auto d = delta(s0, uprobe::stats());
  for (EntryCount* e : {&e0, &e1, &e2, &e3}) EXPECT_EQ(e->hits.load(), 1000u);
  EXPECT_EQ(r.rets.load(), 1000u);
  EXPECT_EQ(s.rets.load(), 1000u);
  EXPECT_EQ(s.entries.load(), 1000u);
  EXPECT_EQ(r.bad.load() + s.bad.load(), 0u);
  EXPECT_EQ(d.hits, 4000u) << str(d);
  EXPECT_EQ(d.return_hits, 1000u) << str(d);
}

// ================================================================ C-08 ====

struct C08Entry : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, bad{0};
  std::uint64_t a = 0, b = 0;
  Action handler(Regs& r) override {
    hits.fetch_add(1);
    if (r.rdi != a || r.rsi != b || r.rip != addr(rt_simple_add) ||
        *reinterpret_cast<const std::uint64_t*>(r.rsp) != call_site())
      bad.fetch_add(1);
    return Action::keep;
  }
};

struct C08Ret : uprobe::Consumer {
  C08Ret() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> calls{0}, bad_rax{0}, bad_func{0}, bad_rip{0}, bad_rsp{0};
  std::uint64_t want = 0;
  void ret_handler(Regs& r, std::uint64_t func) override {
    calls.fetch_add(1);
    if (r.rax != want) bad_rax.fetch_add(1);
    if (func != addr(rt_simple_add)) bad_func.fetch_add(1);
    if (r.rip != call_site()) bad_rip.fetch_add(1);
    if (r.rsp != rt_call_rsp) bad_rsp.fetch_add(1);
  }
  void expect_clean(const char* who) const {
    EXPECT_EQ(bad_rax.load(), 0u) << who << ": rax must be a + b";
    EXPECT_EQ(bad_func.load(), 0u) << who << ": func must be simple_add's address";
    EXPECT_EQ(bad_rip.load(), 0u) << who << ": rip must be the caller's next instruction";
    EXPECT_EQ(bad_rsp.load(), 0u) << who << ": rsp must be the caller's rsp after the return";
  }
};

class C08_TwoReturnHandlers : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override { uprobe::configure(config_for(GetParam())); }
  ConfigGuard guard_;
};

TEST_P(C08_TwoReturnHandlers, BothSeeSumThenDetachOne) {
  C08Entry e;
  C08Ret r1, r2;
  auto s0 = uprobe::stats();
  uprobe::Attachment ae(vaddr(rt_simple_add), e), a1(vaddr(rt_simple_add), r1), a2(vaddr(rt_simple_add), r2);
  auto loop = [&] {
    for (std::uint64_t a = 1; a <= 10; ++a)
      for (std::uint64_t b = 1; b <= 10; ++b) {
        e.a = a;
        e.b = b;
        r1.want = r2.want = a + b;
        ASSERT_EQ(rt_call(vaddr(rt_simple_add), a, b, 0, 0), a + b);
      }
  };
  loop();
  EXPECT_EQ(e.hits.load(), 100u);
  EXPECT_EQ(e.bad.load(), 0u) << "entry: args, rip, and the real return address at *rsp";
  EXPECT_EQ(r1.calls.load(), 100u);
  EXPECT_EQ(r2.calls.load(), 100u);
  r1.expect_clean("r1");
  r2.expect_clean("r2");
  a1.detach();
  loop();
  EXPECT_EQ(r1.calls.load(), 100u) << "detached: no more calls";
  EXPECT_EQ(r2.calls.load(), 200u) << "the other return consumer keeps working";
  r2.expect_clean("r2 after detaching r1");
  EXPECT_EQ(e.hits.load(), 200u);
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(d.return_hits, 200u) << str(d);
  EXPECT_EQ(d.return_misses, 0u) << str(d);
  EXPECT_EQ(d.return_dropped, 0u) << str(d);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Config, C08_TwoReturnHandlers,
                         ::testing::Values(Mode::def, Mode::freelist, Mode::global_lock, Mode::freelist_global,
                                           Mode::no_emulate, Mode::single_step, Mode::locked_lookup),
                         [](const auto& info) { return std::string(mode_name(info.param)); });

}  // namespace
