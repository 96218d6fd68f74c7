// SPDX-License-Identifier: MIT
// Return probes, basics: what a ret_handler sees (rax/rdx, xmm0/xmm1, rip =
// the caller's next instruction, rsp = the caller's rsp after the return,
// func = the probed address), writes that take effect (rax, rdx, xmm0, rip),
// sessions (cookie shared by entry and return of one invocation, starting at
// 0; Action::ignore and Action::remove mean no return call; filter), consumers
// registered or unregistered while a return is pending, and the refusal of a
// return probe that is not at a function's entry.

#include <cstring>
#include <vector>

#include "ret_common.hpp"

using namespace rettest;
using uprobe::Action;
using uprobe::Callbacks;
using uprobe::Regs;

namespace {

constexpr int kCalls = 1000;

/// Ret-only consumer recording every call; handler() must never run.
struct RetRecorder : uprobe::Consumer {
  RetRecorder() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> entry_calls{0}, ret_calls{0};
  Regs last{};
  std::uint64_t last_func = 0;
  Action handler(Regs&) override {
    entry_calls.fetch_add(1);
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t func) override {
    ret_calls.fetch_add(1);
    last = r;
    last_func = func;
  }
};

TEST(RetBasic, ValuesRipRspFuncAtReturn) {
  RetRecorder rec;
  auto s0 = uprobe::stats();
  uprobe::Attachment a(vaddr(rt_simple_add), rec);
  for (std::uint64_t i = 0; i < kCalls; ++i) {
    std::uint64_t x = i * 0x9E3779B97F4A7C15ull, y = i + 17;
    ASSERT_EQ(rt_call(vaddr(rt_simple_add), x, y, 0, 0), x + y);
    ASSERT_EQ(rec.ret_calls.load(), i + 1);
    ASSERT_EQ(rec.last.rax, x + y);
    ASSERT_EQ(rec.last_func, addr(rt_simple_add)) << "func must be the probed address";
    ASSERT_EQ(rec.last.rip, call_site()) << "rip must be the caller's next instruction";
    ASSERT_EQ(rec.last.rsp, rt_call_rsp) << "rsp must be the caller's rsp after the return";
    ASSERT_EQ(rec.last.rdi, x) << "rdi as the function left it";
    ASSERT_EQ(rec.last.rsi, y);
  }
  // Called straight from C++ too.
  auto volatile f = &rt_simple_add;
  for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(f(i, 2 * i), 3 * i);
  EXPECT_EQ(rec.ret_calls.load(), 2u * kCalls);
  EXPECT_EQ(rec.entry_calls.load(), 0u) << "handler() of a Callbacks::ret consumer must not be called";
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  a.detach();
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(d.hits, 2u * kCalls) << str(d);
  EXPECT_EQ(d.return_hits, 2u * kCalls) << str(d);
  EXPECT_EQ(d.return_misses, 0u) << str(d);
  EXPECT_EQ(d.return_dropped, 0u) << str(d);
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_EQ(f(i, 1), i + 1);
  EXPECT_EQ(rec.ret_calls.load(), 2u * kCalls) << "no return calls after detach";
}

/// A function returning with alignment checking on (rflags.AC): the
/// ret_handler runs with AC off (libc and ld.so do unaligned accesses), sees
/// it on in Regs.rflags, and the caller gets it back on.
struct AcRet : uprobe::Consumer {
  AcRet() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> calls{0}, ac_in_handler{0}, ac_in_regs{0};
  Action handler(Regs&) override { return Action::keep; }
  void ret_handler(Regs& r, std::uint64_t) override {
    std::uint64_t f;
    asm volatile("pushfq; pop %0" : "=r"(f));
    calls.fetch_add(1);
    if (f & 0x40000) ac_in_handler.fetch_add(1);
    if (r.rflags & 0x40000) ac_in_regs.fetch_add(1);
  }
};

TEST(RetBasic, AlignmentCheckOnAtReturn) {
  AcRet c;
  uprobe::Attachment a(vaddr(rt_ac_callee), c);
  for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(rt_ac_caller(i), i + 1 + 0x40000);
  EXPECT_EQ(c.calls.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(c.ac_in_regs.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(c.ac_in_handler.load(), 0u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

/// A function returning with the direction flag and the carry flag set: the
/// ret_handler runs with DF off (the ABI's state for C code), sees DF and CF
/// in Regs.rflags, and the caller gets both back (nothing before the
/// trampoline's pushfq changes an arithmetic flag).
struct DfRet : uprobe::Consumer {
  DfRet() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> calls{0}, df_in_handler{0}, df_cf_in_regs{0};
  Action handler(Regs&) override { return Action::keep; }
  void ret_handler(Regs& r, std::uint64_t) override {
    std::uint64_t f;
    asm volatile("pushfq; pop %0" : "=r"(f));
    calls.fetch_add(1);
    if (f & 0x400) df_in_handler.fetch_add(1);
    if ((r.rflags & 0x401) == 0x401) df_cf_in_regs.fetch_add(1);
  }
};

TEST(RetBasic, DirectionAndCarryFlagsAtReturn) {
  DfRet c;
  uprobe::Attachment a(vaddr(rt_df_callee), c);
  for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(rt_df_caller(i), i + 1 + 0x401);
  EXPECT_EQ(c.calls.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(c.df_cf_in_regs.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(c.df_in_handler.load(), 0u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

/// A function returning with each combination of the arithmetic flags (OF
/// SF ZF AF PF CF): the ret_handler sees them in Regs.rflags and the caller
/// gets them back exactly (the trampoline's quick exit, taken when AC, DF
/// and TF are off, restores them without popfq).
struct FlagsRet : uprobe::Consumer {
  FlagsRet() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> calls{0}, seen{0};
  std::uint64_t want = 0;
  Action handler(Regs&) override { return Action::keep; }
  void ret_handler(Regs& r, std::uint64_t) override {
    calls.fetch_add(1);
    if ((r.rflags & 0x8d5) == want) seen.fetch_add(1);
  }
};

TEST(RetBasic, ArithmeticFlagsAtReturn) {
  static constexpr std::uint64_t kBits[] = {0x800, 0x80, 0x40, 0x10, 0x4, 0x1};
  FlagsRet c;
  uprobe::Attachment a(vaddr(rt_flags_callee), c);
  std::uint64_t n = 0;
  for (unsigned m = 0; m < 64; ++m) {
    std::uint64_t f = 0;
    for (unsigned b = 0; b < 6; ++b)
      if (m & (1u << b)) f |= kBits[b];
    c.want = f;
    for (int i = 0; i < 4; ++i, ++n) ASSERT_EQ(rt_flags_caller(n, f), f) << "flags " << std::hex << f;
  }
  EXPECT_EQ(c.calls.load(), n);
  EXPECT_EQ(c.seen.load(), n);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

/// Session consumer: entry checks the cookie starts at 0 and stores a value
/// derived from the arguments; the return checks it got that value back.
struct Session : uprobe::Consumer {
  explicit Session(std::uint64_t tag) : uprobe::Consumer(Callbacks::entry_and_ret), tag(tag) {}
  std::uint64_t tag;
  std::atomic<std::uint64_t> entries{0}, rets{0}, bad_start{0}, bad_cookie{0}, bad_rax{0};
  Action handler(Regs& r) override {
    entries.fetch_add(1);
    if (uprobe::session_cookie() != 0) bad_start.fetch_add(1);
    uprobe::session_cookie() = r.rdi * 1000 + r.rsi + tag;
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t) override {
    rets.fetch_add(1);
    std::uint64_t c = uprobe::session_cookie();
    std::uint64_t v = c - tag;
    if (r.rax != v / 1000 + v % 1000) bad_rax.fetch_add(1);
    if (r.rdi * 1000 + r.rsi + tag != c) bad_cookie.fetch_add(1);
  }
};

TEST(RetBasic, SessionCookieTwoConsumersOwnCookies) {
  Session s1(7), s2(500000000);
  uprobe::Attachment a1(vaddr(rt_simple_add), s1), a2(vaddr(rt_simple_add), s2);
  for (std::uint64_t x = 0; x < 100; ++x)
    for (std::uint64_t y = 0; y < 10; ++y) ASSERT_EQ(rt_call(vaddr(rt_simple_add), x, y, 0, 0), x + y);
  for (Session* s : {&s1, &s2}) {
    EXPECT_EQ(s->entries.load(), 1000u);
    EXPECT_EQ(s->rets.load(), 1000u);
    EXPECT_EQ(s->bad_start.load(), 0u) << "the cookie must start at 0 for every invocation";
    EXPECT_EQ(s->bad_cookie.load(), 0u) << "ret_handler must read the cookie its entry wrote";
    EXPECT_EQ(s->bad_rax.load(), 0u);
  }
}

TEST(RetBasic, SessionCookieOutsideCallbacksIsScratch) {
  // Outside callbacks session_cookie() is a per-thread scratch value: writing
  // it must not leak into the next invocation's cookie.
  Session s(1);
  uprobe::Attachment a(vaddr(rt_simple_add), s);
  for (int i = 0; i < 100; ++i) {
    uprobe::session_cookie() = 0xdeadbeef;
    ASSERT_EQ(rt_simple_add(3, 4), 7u);
  }
  EXPECT_EQ(s.bad_start.load(), 0u);
  EXPECT_EQ(s.bad_cookie.load(), 0u);
  EXPECT_EQ(s.rets.load(), 100u);
}

/// Entry says ignore for odd a: no return call for those invocations.
struct Ignorer : uprobe::Consumer {
  Ignorer() : uprobe::Consumer(Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0}, bad{0};
  Action handler(Regs& r) override {
    entries.fetch_add(1);
    uprobe::session_cookie() = r.rdi;
    return (r.rdi & 1) ? Action::ignore : Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t) override {
    rets.fetch_add(1);
    if ((uprobe::session_cookie() & 1) || r.rax != uprobe::session_cookie() + 1) bad.fetch_add(1);
  }
};

TEST(RetBasic, IgnoreMeansNoReturnCall) {
  Ignorer ig;
  RetRecorder plain;  // a second, plain return consumer still sees every return
  auto s0 = uprobe::stats();
  uprobe::Attachment a(vaddr(rt_simple_add), ig), b(vaddr(rt_simple_add), plain);
  for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(rt_simple_add(i, 1), i + 1);
  a.detach();
  b.detach();
  EXPECT_EQ(ig.entries.load(), std::uint64_t(kCalls));
  EXPECT_EQ(ig.rets.load(), std::uint64_t(kCalls) / 2) << "Action::ignore must suppress that invocation's return";
  EXPECT_EQ(ig.bad.load(), 0u);
  EXPECT_EQ(plain.ret_calls.load(), std::uint64_t(kCalls));
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(d.return_hits, std::uint64_t(kCalls)) << str(d);
  EXPECT_EQ(d.return_misses, 0u) << str(d);
}

TEST(RetBasic, IgnoreAloneCreatesNoReturnInstance) {
  Ignorer ig;
  auto s0 = uprobe::stats();
  uprobe::Attachment a(vaddr(rt_simple_add), ig);
  for (std::uint64_t i = 1; i < 2 * kCalls; i += 2) ASSERT_EQ(rt_simple_add(i, 1), i + 1);  // all odd
  a.detach();
  EXPECT_EQ(ig.rets.load(), 0u);
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(d.hits, std::uint64_t(kCalls)) << str(d);
  EXPECT_EQ(d.return_hits, 0u) << str(d);
  EXPECT_EQ(d.return_misses, 0u) << str(d);
}

struct Remover : uprobe::Consumer {
  Remover() : uprobe::Consumer(Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0};
  Action handler(Regs&) override {
    entries.fetch_add(1);
    return Action::remove;
  }
  void ret_handler(Regs&, std::uint64_t) override { rets.fetch_add(1); }
};

TEST(RetBasic, RemoveMeansNoReturnCall) {
  Remover rm;
  uprobe::Attachment a(vaddr(rt_mul3_add), rm);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(rt_mul3_add(i, 2), 3 * i + 2);
  EXPECT_EQ(rm.entries.load(), 1u) << "after remove, the consumer is not called again";
  EXPECT_EQ(rm.rets.load(), 0u) << "an entry returning remove gets no return call";
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

struct NoThread : RetRecorder {
  bool filter(pid_t) override { return false; }
};

TEST(RetBasic, FilterFalseMeansNoReturnCall) {
  NoThread nt;
  RetRecorder yes;
  uprobe::Attachment a(vaddr(rt_simple_add), nt), b(vaddr(rt_simple_add), yes);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(rt_simple_add(i, 2), i + 2);
  EXPECT_EQ(nt.ret_calls.load(), 0u);
  EXPECT_EQ(yes.ret_calls.load(), 100u);
}

struct EntryOnly : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs&) override {
    hits.fetch_add(1);
    return Action::keep;
  }
  void ret_handler(Regs&, std::uint64_t) override { ret_calls.fetch_add(1); }
  std::atomic<std::uint64_t> ret_calls{0};
};

TEST(RetBasic, EntryOnlyConsumerGetsNoReturnCall) {
  EntryOnly e;
  auto s0 = uprobe::stats();
  uprobe::Attachment a(vaddr(rt_simple_add), e);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(rt_simple_add(i, 2), i + 2);
  a.detach();
  EXPECT_EQ(e.hits.load(), 100u);
  EXPECT_EQ(e.ret_calls.load(), 0u) << "ret_handler of a Callbacks::entry consumer must not be called";
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(d.return_hits, 0u) << str(d);
}

// --------------------------------------------------------- writes ----

struct RaxWriter : uprobe::Consumer {
  RaxWriter() : uprobe::Consumer(Callbacks::ret) {}
  void ret_handler(Regs& r, std::uint64_t) override { r.rax = r.rax * 10 + 1; }
};

TEST(RetBasic, WritingRaxChangesTheReturnedValue) {
  RaxWriter w;
  uprobe::Attachment a(vaddr(rt_simple_add), w);
  for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(rt_simple_add(i, 5), (i + 5) * 10 + 1);
  a.detach();
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_EQ(rt_simple_add(i, 5), i + 5);
}

struct RipWriter : uprobe::Consumer {
  RipWriter() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> calls{0};
  void ret_handler(Regs& r, std::uint64_t) override {
    calls.fetch_add(1);
    if (r.rip == call_site()) r.rip = addr(rt_call) + rt_call_alt_off;
  }
};

TEST(RetBasic, WritingRipRedirectsTheReturn) {
  RipWriter w;
  uprobe::Attachment a(vaddr(rt_simple_add), w);
  for (std::uint64_t i = 0; i < kCalls; ++i)
    ASSERT_EQ(rt_call(vaddr(rt_simple_add), i, 3, 0, 0), i + 3 + 1000) << "return must continue at rt_call's alt site";
  EXPECT_EQ(w.calls.load(), std::uint64_t(kCalls));
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
}

struct DoubleRec : uprobe::Consumer {
  DoubleRec() : uprobe::Consumer(Callbacks::ret) {}
  bool modify = false;
  std::atomic<std::uint64_t> calls{0};
  double xmm0 = 0, xmm1 = 0;
  void ret_handler(Regs&, std::uint64_t) override {
    calls.fetch_add(1);
    xmm0 = as_double(uprobe::return_xmm(0));
    xmm1 = as_double(uprobe::return_xmm(1));
    if (modify) {
      double v = xmm0 * 2;
      std::memcpy(uprobe::return_xmm(0), &v, sizeof v);
    }
  }
};

TEST(RetBasic, DoubleReturnInXmm0AndWrite) {
  DoubleRec rec;
  uprobe::Attachment a(vaddr(rt_ret_double), rec);
  auto volatile f = &rt_ret_double;
  for (std::int64_t i = -500; i < 500; ++i) {
    ASSERT_EQ(f(i), 3.25 + static_cast<double>(i));
    ASSERT_EQ(rec.xmm0, 3.25 + static_cast<double>(i)) << "return_xmm(0) low 8 bytes = the double returned";
    ASSERT_EQ(rec.xmm1, static_cast<double>(i)) << "return_xmm(1) = xmm1 as the function left it";
  }
  rec.modify = true;
  for (std::int64_t i = -100; i < 100; ++i) {
    ASSERT_EQ(f(i), (3.25 + static_cast<double>(i)) * 2) << "writing return_xmm(0) must change the returned double";
  }
  EXPECT_EQ(rec.calls.load(), 1200u);
}

struct PairRec : uprobe::Consumer {
  PairRec() : uprobe::Consumer(Callbacks::ret) {}
  bool modify = false;
  std::atomic<std::uint64_t> calls{0};
  std::uint64_t rax = 0, rdx = 0;
  void ret_handler(Regs& r, std::uint64_t) override {
    calls.fetch_add(1);
    rax = r.rax;
    rdx = r.rdx;
    if (modify) r.rdx = ~r.rdx;
  }
};

TEST(RetBasic, StructReturnInRaxRdxAndWrite) {
  PairRec rec;
  uprobe::Attachment a(vaddr(rt_ret_pair), rec);
  auto volatile f = &rt_ret_pair;
  for (std::uint64_t i = 0; i < kCalls; ++i) {
    std::uint64_t x = i * 0x100000001ull, y = ~i;
    RtPair p = f(x, y);
    ASSERT_EQ(p.lo, x + 1);
    ASSERT_EQ(p.hi, y + 2);
    ASSERT_EQ(rec.rax, x + 1);
    ASSERT_EQ(rec.rdx, y + 2);
  }
  rec.modify = true;
  for (std::uint64_t i = 0; i < 100; ++i) {
    RtPair p = f(i, i);
    ASSERT_EQ(p.lo, i + 1);
    ASSERT_EQ(p.hi, ~(i + 2)) << "writing rdx must change the second half of the returned struct";
  }
  EXPECT_EQ(rec.calls.load(), std::uint64_t(kCalls) + 100);
}

// ------------------------------------------- pending (un)registration ----

}  // namespace

using Cb = void (*)(void*);

extern "C" __attribute__((noinline, noipa)) std::uint64_t rt_cb_fn(Cb cb, void* arg, std::uint64_t x) {
  cb(arg);
  return x * 2 + 1;  // computed after the callback: not a tail call
}

namespace {

TEST(RetBasic, ReturnStackDepthInsideAProbedFunction) {
  RetRecorder rec;
  uprobe::Attachment a(vaddr(rt_cb_fn), rec);
  unsigned seen = 99;
  Cb cb = [](void* p) { *static_cast<unsigned*>(p) = uprobe::return_stack_depth(); };
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  ASSERT_EQ(rt_cb_fn(cb, &seen, 20), 41u);
  EXPECT_EQ(seen, 1u) << "one return instance pending inside the probed function";
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  EXPECT_EQ(rec.ret_calls.load(), 1u);
  EXPECT_EQ(rec.last.rax, 41u);
  EXPECT_EQ(rec.last_func, addr(rt_cb_fn));
}

struct PendingCtx {
  uprobe::Attachment* att;
  RetRecorder* extra;
  uprobe::Attachment extra_att;
};

TEST(RetBasic, UnregisterWhileReturnPending) {
  RetRecorder rec;
  uprobe::Attachment a(vaddr(rt_cb_fn), rec);
  PendingCtx ctx{&a, nullptr, {}};
  Cb cb = [](void* p) { static_cast<PendingCtx*>(p)->att->detach(); };
  auto s0 = uprobe::stats();
  ASSERT_EQ(rt_cb_fn(cb, &ctx, 5), 11u) << "a function whose probe went away while it ran must still return right";
  EXPECT_EQ(rec.ret_calls.load(), 0u) << "an unregistered consumer must not get the pending return";
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(d.hits, 1u) << str(d);
  // Still unprobed afterwards.
  ASSERT_EQ(rt_cb_fn([](void*) {}, nullptr, 6), 13u);
  EXPECT_EQ(rec.ret_calls.load(), 0u);
}

TEST(RetBasic, RegisterWhileReturnPendingSeesOnlyLaterInvocations) {
  RetRecorder rec, late;
  uprobe::Attachment a(vaddr(rt_cb_fn), rec);
  PendingCtx ctx{&a, &late, {}};
  Cb cb = [](void* p) {
    auto* c = static_cast<PendingCtx*>(p);
    if (!c->extra_att.probe()) c->extra_att = uprobe::Attachment(vaddr(rt_cb_fn), *c->extra);
  };
  ASSERT_EQ(rt_cb_fn(cb, &ctx, 1), 3u);
  EXPECT_EQ(rec.ret_calls.load(), 1u);
  EXPECT_EQ(late.ret_calls.load(), 0u) << "a consumer registered after the entry must not get that invocation's return";
  ASSERT_EQ(rt_cb_fn(cb, &ctx, 2), 5u);
  EXPECT_EQ(rec.ret_calls.load(), 2u);
  EXPECT_EQ(late.ret_calls.load(), 1u);
  EXPECT_EQ(late.last.rax, 5u);
  ctx.extra_att.detach();
}

TEST(RetBasic, ProbeRecreatedWhileReturnPending) {
  // The last consumer goes (the probe is removed) and a new consumer makes a
  // new probe at the same place while an invocation is pending: the pending
  // return belongs to the old probe, so nobody gets it.
  RetRecorder rec, late;
  uprobe::Attachment a(vaddr(rt_cb_fn), rec);
  PendingCtx ctx{&a, &late, {}};
  Cb cb = [](void* p) {
    auto* c = static_cast<PendingCtx*>(p);
    if (c->att->probe()) {
      c->att->detach();
      c->extra_att = uprobe::Attachment(vaddr(rt_cb_fn), *c->extra);
    }
  };
  ASSERT_EQ(rt_cb_fn(cb, &ctx, 7), 15u);
  EXPECT_EQ(rec.ret_calls.load(), 0u);
  EXPECT_EQ(late.ret_calls.load(), 0u);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  ASSERT_EQ(rt_cb_fn(cb, &ctx, 8), 17u);
  EXPECT_EQ(late.ret_calls.load(), 1u);
  EXPECT_EQ(late.last.rax, 17u);
  ctx.extra_att.detach();
}

/// A ret_handler that calls a return-probed function: that hit is inside a
/// handler, so it is not reported (recursion guard) and makes no return instance.
struct CallsProbed : uprobe::Consumer {
  CallsProbed() : uprobe::Consumer(Callbacks::ret) {}
  std::atomic<std::uint64_t> calls{0}, bad{0};
  void ret_handler(Regs& r, std::uint64_t) override {
    calls.fetch_add(1);
    if (rt_simple_add(r.rax, 1) != r.rax + 1) bad.fetch_add(1);
    if (!uprobe::in_handler()) bad.fetch_add(1);
  }
};

TEST(RetBasic, ProbedCallInsideRetHandlerIsNotReported) {
  CallsProbed outer;
  RetRecorder inner;
  uprobe::Attachment a(vaddr(rt_mul3_add), outer), b(vaddr(rt_simple_add), inner);
  auto s0 = uprobe::stats();
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(rt_mul3_add(i, 1), 3 * i + 1);
  auto d = delta(s0, uprobe::stats());
  EXPECT_EQ(outer.calls.load(), 100u);
  EXPECT_EQ(outer.bad.load(), 0u) << "the call inside the ret_handler must return right; in_handler() true there";
  EXPECT_EQ(inner.ret_calls.load(), 0u) << "a probe hit inside a ret_handler is not reported";
  EXPECT_EQ(d.return_hits, 100u) << str(d);
  EXPECT_EQ(d.recursion_misses, 100u) << str(d);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  ASSERT_EQ(rt_simple_add(1, 2), 3u);
  EXPECT_EQ(inner.ret_calls.load(), 1u);
}

// ---------------------------------------------------------- refusal ----

TEST(RetBasic, RefusedAtNonEntryOffset) {
  const void* site = at(rt_fact, rt_fact_mid_off);
  uprobe::FileOffset fo = uprobe::resolve_address(site);
  const std::string want = "rt_fact+" + hexs(rt_fact_mid_off);
  std::vector<std::uint8_t> before(static_cast<const std::uint8_t*>(vaddr(rt_fact)),
                                   static_cast<const std::uint8_t*>(vaddr(rt_fact)) + 16);
  for (Callbacks cbk : {Callbacks::ret, Callbacks::entry_and_ret}) {
    for (int how = 0; how < 2; ++how) {
      SCOPED_TRACE(std::string(cbk == Callbacks::ret ? "ret" : "entry_and_ret") +
                   (how ? " by (path, offset)" : " by address"));
      struct C : uprobe::Consumer {
        explicit C(Callbacks c) : uprobe::Consumer(c) {}
      } c(cbk);
      try {
        uprobe::Uprobe* p = how == 0 ? uprobe::register_uprobe(site, c) : uprobe::register_uprobe(fo.path, fo.offset, c);
        uprobe::unregister_uprobe(p, c);  // (c is about to go away)
        ADD_FAILURE() << "registering a return consumer at rt_fact+" << rt_fact_mid_off << " must throw";
      } catch (const uprobe::Error& e) {
        std::string w = e.what();
        EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(uprobe::Errc::refused_instruction)) << w;
        EXPECT_EQ(e.offset(), fo.offset) << w;
        EXPECT_EQ(e.path(), fo.path) << w;
        EXPECT_NE(w.find(want), std::string::npos) << "what() must name " << want << ": " << w;
      }
      std::vector<std::uint8_t> now(static_cast<const std::uint8_t*>(vaddr(rt_fact)),
                                    static_cast<const std::uint8_t*>(vaddr(rt_fact)) + 16);
      EXPECT_EQ(now, before) << "a refused registration must change no byte";
    }
  }
  // The same offset takes an entry-only consumer, and the entry takes a return one.
  struct Cnt : uprobe::Consumer {
    std::atomic<int> n{0};
    Action handler(Regs&) override {
      n.fetch_add(1);
      return Action::keep;
    }
  } mid;
  RetRecorder entry_ret;
  uprobe::Attachment a(site, mid), b(vaddr(rt_fact), entry_ret);
  ASSERT_EQ(rt_fact(5), 120u);
  EXPECT_EQ(mid.n.load(), 5) << "jbe at rt_fact+4 runs once per invocation (5 invocations)";
  EXPECT_EQ(entry_ret.ret_calls.load(), 5u);
}

}  // namespace
