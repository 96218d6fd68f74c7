// SPDX-License-Identifier: MIT
// Return probes through an optimized entry (a function whose first
// instruction is a nop5, with a session consumer; recursion), and
// Action::remove at an optimized site (the original bytes come back through
// int3 once every consumer said remove).

#include "opt_common.hpp"

using namespace opttest;
using uprobe::Action;
using uprobe::Regs;

namespace {

std::uint64_t fact(std::uint64_t n) { return n <= 1 ? 1 : n * fact(n - 1); }

struct FactSession : uprobe::Consumer {
  static constexpr std::uint64_t kSalt = 0xF4C7000000000000ull;
  FactSession() : uprobe::Consumer(uprobe::Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, returns{0}, bad_rax{0}, bad_cookie{0}, bad_func{0}, bad_entry{0};
  std::uint64_t func = 0;
  Action handler(Regs& r) override {
    entries.fetch_add(1);
    if (r.rip != func || r.rdi > 20) bad_entry.fetch_add(1);
    uprobe::session_cookie() = kSalt | r.rdi;
    return Action::keep;
  }
  void ret_handler(Regs& r, std::uint64_t fn) override {
    returns.fetch_add(1);
    if (fn != func) bad_func.fetch_add(1);
    const std::uint64_t c = uprobe::session_cookie();
    if ((c & ~0xffull) != kSalt) {
      bad_cookie.fetch_add(1);
      return;
    }
    if (r.rax != fact(c & 0xff)) bad_rax.fetch_add(1);
  }
};

TEST(Return, SessionThroughOptimizedEntryWithRecursion) {
  FactSession c;
  c.func = addr(opt_fact);
  uprobe::Attachment a(vaddr(opt_fact), c);
  const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
  ASSERT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << info.why_not_optimized;
  EXPECT_EQ(check_jump_into_xol(vaddr(opt_fact)), "");
  const uprobe::Stats s0 = uprobe::stats();
  std::uint64_t invocations = 0;
  for (int round = 0; round < 100; ++round)
    for (std::uint64_t n = 0; n <= 15; ++n) {
      ASSERT_EQ(opt_fact(n), fact(n)) << "n = " << n;
      invocations += n <= 1 ? 1 : n;
      ASSERT_EQ(uprobe::return_stack_depth(), 0u);
    }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(c.entries.load(), invocations);
  EXPECT_EQ(c.returns.load(), invocations);
  EXPECT_EQ(c.bad_entry.load(), 0u);
  EXPECT_EQ(c.bad_rax.load(), 0u);
  EXPECT_EQ(c.bad_cookie.load(), 0u);
  EXPECT_EQ(c.bad_func.load(), 0u);
  EXPECT_EQ(d.optimized, invocations) << stats_str(d);
  EXPECT_EQ(d.hits, invocations) << stats_str(d);
  EXPECT_EQ(d.return_hits, invocations) << stats_str(d);
  EXPECT_EQ(d.return_misses, 0u) << stats_str(d);
  EXPECT_EQ(d.emulated + d.out_of_line, 0u) << stats_str(d);
  a.detach();
  EXPECT_EQ(hex_bytes(mem(vaddr(opt_fact), 5)), hex_bytes(file_bytes_at(vaddr(opt_fact), 5)));
}

// ------------------------------------------------------ Action::remove ----

struct RemoveAfter : uprobe::Consumer {
  explicit RemoveAfter(std::uint64_t n) : n_(n) {}
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs&) override { return hits.fetch_add(1) + 1 >= n_ ? Action::remove : Action::keep; }

 private:
  std::uint64_t n_;
};

TEST(Remove, EveryConsumerRemovesRestoresBytes) {
  const void* site = vaddr(opt_remove);
  const auto file = file_bytes_at(site, 16);
  ASSERT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file));
  RemoveAfter a5(5), b10(10);
  const uprobe::Stats s0 = uprobe::stats();
  uprobe::Uprobe* p = uprobe::register_uprobe(site, a5);
  ASSERT_EQ(uprobe::register_uprobe(site, b10), p);
  ASSERT_EQ(uprobe::probe_info(p).mode, uprobe::ProbeMode::optimized_nop5);
  for (std::uint64_t i = 1; i <= 20; ++i) {
    ASSERT_EQ(opt_remove(i), 3 * i + 1);
    if (i < 10) {
      ASSERT_EQ(check_jump_into_xol(site), "") << "after call " << i << " (one consumer still wants hits)";
    } else {
      ASSERT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file)) << "after call " << i << ": every consumer said remove";
    }
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(a5.hits.load(), 5u);
  EXPECT_EQ(b10.hits.load(), 10u);
  EXPECT_EQ(d.hits, 10u) << stats_str(d);
  EXPECT_EQ(d.optimized, 10u) << stats_str(d);
  EXPECT_TRUE(rwx_mappings().empty());

  // A new consumer on the same (still registered) probe: applied and optimized again.
  Counter c(addr(opt_remove));
  ASSERT_EQ(uprobe::register_uprobe(site, c), p);
  const uprobe::ProbeInfo info = uprobe::probe_info(p);
  EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << info.why_not_optimized;
  EXPECT_EQ(info.consumers, 3u);
  EXPECT_EQ(check_jump_into_xol(site), "");
  const uprobe::Stats s1 = uprobe::stats();
  for (std::uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(opt_remove(i), 3 * i + 1);
  const uprobe::Stats d1 = stats_delta(s1, uprobe::stats());
  EXPECT_EQ(c.hits.load(), 1000u);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(a5.hits.load(), 5u) << "a removed consumer was called again";
  EXPECT_EQ(b10.hits.load(), 10u) << "a removed consumer was called again";
  EXPECT_EQ(d1.optimized, 1000u) << stats_str(d1);
  uprobe::unregister_uprobe(p, a5);
  uprobe::unregister_uprobe(p, b10);
  EXPECT_EQ(check_jump_into_xol(site), "");
  uprobe::unregister_uprobe(p, c);
  EXPECT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file));
}

TEST(Remove, RemoveAtFirstHitThenUnregister) {
  const void* site = at(opt_mid5, opt_mid5_site);
  const auto file = file_bytes_at(vaddr(opt_mid5), 16);
  RemoveAfter r1(1);
  uprobe::Uprobe* p = uprobe::register_uprobe(site, r1);
  ASSERT_EQ(uprobe::probe_info(p).mode, uprobe::ProbeMode::optimized_nop5);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(opt_mid5(i, 2), 2 * i - 2);
  EXPECT_EQ(r1.hits.load(), 1u);
  EXPECT_EQ(hex_bytes(mem(vaddr(opt_mid5), 16)), hex_bytes(file));
  uprobe::unregister_uprobe(p, r1);
  EXPECT_EQ(hex_bytes(mem(vaddr(opt_mid5), 16)), hex_bytes(file));
}

}  // namespace
