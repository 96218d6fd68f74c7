// SPDX-License-Identifier: MIT
// Return probes on code that is never called are refused, with the reason,
// nothing written (src/attach/return_entry.cpp): a compiler's cold fragment
// of a function (jumped to from its body: at its start *rsp is the
// function's saved data, which the return probe would overwrite), glibc's
// __start_context (entered by a return from makecontext()'s function: *rsp
// is the uc_link), an executable's _start (entered by the kernel: *rsp is
// argc). An entry probe on each counts every time it runs, and the code
// gives its values as without it. A called function whose name only looks
// like a fragment's (".coldish") takes a return probe.
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <ucontext.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "uprobe/symbols.hpp"
#include "uprobe/uprobe.hpp"

extern "C" {
long nc_host(long);
long nc_host2(long);
long nc_warm_coldish(long) __asm__("nc_warm.coldish");
}

namespace {

using uprobe::Action;
using uprobe::Callbacks;
using uprobe::Regs;

std::string self_exe() {
  char buf[PATH_MAX];
  return ::realpath("/proc/self/exe", buf) ? std::string(buf) : std::string();
}

struct Entries : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    return Action::keep;
  }
};

struct Returns : uprobe::Consumer {
  Returns() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> rets{0};
  std::uint64_t last_rax = 0;
  void ret_handler(Regs& r, std::uint64_t) override {
    rets.fetch_add(1, std::memory_order_relaxed);
    last_rax = r.rax;
  }
};

/// A return probe at `path`'s `symbol` is refused (refused_instruction, the
/// message naming it with `why`) and its bytes stay as they were.
void expect_return_refused(const std::string& path, const std::string& symbol, const std::string& why) {
  SCOPED_TRACE(symbol);
  const uprobe::Symbol sym = uprobe::find_symbol(path, symbol);
  const auto addrs = uprobe::runtime_addresses(path, sym.offset);
  ASSERT_EQ(addrs.size(), 1u);
  std::uint8_t before[8];
  std::memcpy(before, reinterpret_cast<const void*>(addrs[0]), sizeof before);
  Returns r;
  try {
    uprobe::Attachment a(path, sym.offset, r);
    ADD_FAILURE() << "a return probe on " << symbol << " was accepted";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(e.code(), uprobe::Errc::refused_instruction) << e.what();
    EXPECT_NE(std::string(e.what()).find("a return probe on " + symbol + ": " + why), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::memcmp(before, reinterpret_cast<const void*>(addrs[0]), sizeof before), 0);
}

TEST(NeverCalled, ReturnProbeOnAColdFragmentIsRefusedEntryProbeCounts) {
  const std::string exe = self_exe();
  const std::string why = "a compiler's cold fragment of a function, jumped to from its body, never called";
  expect_return_refused(exe, "nc_host.cold", why);
  expect_return_refused(exe, "nc_host2.part.0.cold.3", why);
  Entries e1, e2;
  {
    uprobe::Attachment a(exe, uprobe::find_symbol(exe, "nc_host.cold").offset, e1);
    uprobe::Attachment b(exe, uprobe::find_symbol(exe, "nc_host2.part.0.cold.3").offset, e2);
    long sum = 0;
    for (long x : {-5L, 4L, -1L, 7L, -9L}) sum += nc_host(x) * 1000 + nc_host2(x);
    // -1-2 | 8+5 | -1-2 | 14+8 | -1-2, each nc_host value times 1000.
    EXPECT_EQ(sum, (-1 + 8 - 1 + 14 - 1) * 1000L + (-2 + 5 - 2 + 8 - 2));
  }
  EXPECT_EQ(e1.hits.load(), 3u);
  EXPECT_EQ(e2.hits.load(), 3u);
}

TEST(NeverCalled, ACalledFunctionNamedLikeAFragmentTakesAReturnProbe) {
  const std::string exe = self_exe();
  Returns r;
  {
    uprobe::Attachment a(exe, uprobe::find_symbol(exe, "nc_warm.coldish").offset, r);
    EXPECT_EQ(nc_warm_coldish(39), 42);
    EXPECT_EQ(nc_warm_coldish(-3), 0);
  }
  EXPECT_EQ(r.rets.load(), 2u);
  EXPECT_EQ(r.last_rax, 0u);
}

TEST(NeverCalled, ReturnProbeOnStartIsRefused) {
  expect_return_refused(self_exe(), "_start", "it is entered by a return or by the kernel, never by a call");
}

ucontext_t g_main_ctx, g_fn_ctx;
int g_ran = 0;
void context_fn() { ++g_ran; }

/// context_fn() run once on `stack` through makecontext(): it returns into
/// __start_context, which resumes this function.
bool run_context(char* stack, std::size_t size) {
  if (getcontext(&g_fn_ctx) != 0) return false;
  g_fn_ctx.uc_stack.ss_sp = stack;
  g_fn_ctx.uc_stack.ss_size = size;
  g_fn_ctx.uc_link = &g_main_ctx;
  makecontext(&g_fn_ctx, context_fn, 0);
  return swapcontext(&g_main_ctx, &g_fn_ctx) == 0;
}

TEST(NeverCalled, ReturnProbeOnStartContextIsRefusedEntryProbeCounts) {
  const std::string libc = uprobe::resolve_library("libc.so.6");
  try {
    uprobe::find_symbol(libc, "__start_context");
  } catch (const uprobe::Error&) {
    GTEST_SKIP() << "libc's __start_context has no symbol here (its debug file: apt-get install libc6-dbg)";
  }
  expect_return_refused(libc, "__start_context", "it is entered by a return or by the kernel, never by a call");
  Entries e;
  static char stack[64 * 1024];
  {
    uprobe::Attachment a(libc, uprobe::find_symbol(libc, "__start_context").offset, e);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(run_context(stack, sizeof stack));
  }
  EXPECT_EQ(g_ran, 3);
  EXPECT_EQ(e.hits.load(), 3u);
}

}  // namespace
