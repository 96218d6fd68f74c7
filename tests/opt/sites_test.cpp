// SPDX-License-Identifier: MIT
// Optimized probe sites: a nop5 at a function's entry and between real
// instructions becomes `jmp rel32` into r-x XOL memory; every 5-byte nop
// encoding and what happens to longer/shorter nops; Config::optimize; the red
// zone; unregister restores the file's bytes exactly.

#include <cstring>
#include <functional>
#include <optional>

#include "opt_common.hpp"

using namespace opttest;
using uprobe::Action;
using uprobe::Regs;

namespace {

constexpr int kCalls = 1000;

/// Registers `c` at `site`, checks the optimized form, calls `run(i)` kCalls
/// times (it returns "" or a mismatch), checks exact hits and Stats, then
/// unregisters and checks the file's bytes are back.
void check_optimized_site(const void* site, std::size_t fn_len, const void* fn,
                          const std::function<std::string(int)>& run) {
  const auto site_a = reinterpret_cast<std::uint64_t>(site);
  const std::vector<std::uint8_t> file_fn = file_bytes_at(fn, fn_len);
  ASSERT_EQ(hex_bytes(mem(fn, fn_len)), hex_bytes(file_fn)) << "fixture differs from its file before the test";
  ASSERT_EQ(hex_bytes(mem(site, 5)), hex_bytes(std::vector<std::uint8_t>(kNop5, kNop5 + 5)));
  ASSERT_TRUE(rwx_mappings().empty()) << rwx_mappings()[0];

  Counter c(site_a);
  const uprobe::Stats s0 = uprobe::stats();
  uprobe::Uprobe* p = uprobe::register_uprobe(site, c);
  const uprobe::ProbeInfo info = uprobe::probe_info(p);
  EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << "why: " << info.why_not_optimized;
  EXPECT_EQ(info.why_not_optimized, "");
  EXPECT_EQ(info.sites, 1u);
  EXPECT_EQ(info.consumers, 1u);
  EXPECT_EQ(check_jump_into_xol(site), "");
  {
    const auto rwx = rwx_mappings();
    EXPECT_TRUE(rwx.empty()) << "writable+executable mapping while optimized: " << rwx[0];
  }
  // Only the 5 site bytes changed in the function.
  {
    const auto now = mem(fn, fn_len);
    const std::size_t so = static_cast<std::size_t>(site_a - reinterpret_cast<std::uint64_t>(fn));
    for (std::size_t k = 0; k < fn_len; ++k)
      if (k < so || k >= so + 5) {
        EXPECT_EQ(hex(now[k]), hex(file_fn[k])) << "byte " << k << " of the function changed";
      }
  }

  std::string first_bad;
  int bad = 0;
  for (int i = 0; i < kCalls; ++i) {
    std::string r = run(i);
    if (!r.empty() && bad++ == 0) first_bad = "call " + std::to_string(i) + ": " + r;
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(bad, 0) << first_bad;
  EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(d.hits, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
  EXPECT_EQ(d.optimized, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
  EXPECT_EQ(d.emulated, 0u) << stats_str(d);
  EXPECT_EQ(d.out_of_line, 0u) << stats_str(d);
  EXPECT_EQ(d.recursion_misses, 0u) << stats_str(d);

  uprobe::unregister_uprobe(p, c);
  EXPECT_EQ(hex_bytes(mem(site, 5)), hex_bytes(file_bytes_at(site, 5))) << "site bytes not restored";
  EXPECT_EQ(hex_bytes(mem(fn, fn_len)), hex_bytes(file_fn)) << "function bytes not restored";
  {
    const auto rwx = rwx_mappings();
    EXPECT_TRUE(rwx.empty()) << rwx[0];
  }
  // Detached: no hit.
  const uprobe::Stats s1 = uprobe::stats();
  for (int i = 0; i < 10; ++i) (void)run(i);
  EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(stats_delta(s1, uprobe::stats()).hits, 0u);
}

TEST(Sites, Nop5AtFunctionEntry) {
  check_optimized_site(vaddr(opt_entry5), 9, vaddr(opt_entry5), [](int i) -> std::string {
    const std::uint64_t a = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull, b = static_cast<std::uint64_t>(i) + 3;
    const std::uint64_t r = opt_entry5(a, b);
    return r == a + 2 * b ? "" : "got " + hex(r) + " want " + hex(a + 2 * b);
  });
}

// A stub outlives its probe and is reused by the next probe at the same
// site; its descriptor names the uprobe object to dispatch to (no lookup by
// key on a hit). The first probe's consumer must see none of the second
// probe's hits, and the second all of them.
TEST(Sites, StubReusedByTheNextProbeAtTheSameSite) {
  const void* site = vaddr(opt_entry5);
  const auto site_a = reinterpret_cast<std::uint64_t>(site);
  Counter a(site_a), b(site_a);
  uprobe::Uprobe* pa = uprobe::register_uprobe(site, a);
  ASSERT_EQ(uprobe::probe_info(pa).mode, uprobe::ProbeMode::optimized_nop5);
  const std::uint64_t stub = jump_target(site);
  ASSERT_NE(stub, 0u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(opt_entry5(1, 2), 5u);
  uprobe::unregister_uprobe(pa, a);
  EXPECT_EQ(jump_target(site), 0u);
  for (int round = 0; round < 3; ++round) {
    uprobe::Uprobe* pb = uprobe::register_uprobe(site, b);
    ASSERT_EQ(uprobe::probe_info(pb).mode, uprobe::ProbeMode::optimized_nop5);
    EXPECT_EQ(jump_target(site), stub) << "the stub was not reused";
    for (int i = 0; i < 5; ++i) EXPECT_EQ(opt_entry5(1, 2), 5u);
    uprobe::unregister_uprobe(pb, b);
  }
  EXPECT_EQ(a.hits.load(), 3u);
  EXPECT_EQ(b.hits.load(), 15u);
  EXPECT_EQ(a.bad_ip.load() + b.bad_ip.load(), 0u);
  EXPECT_EQ(hex_bytes(mem(site, 5)), hex_bytes(file_bytes_at(site, 5)));
}

TEST(Sites, Nop5MidFunction) {
  ASSERT_EQ(opt_mid5_site, 7u);
  check_optimized_site(at(opt_mid5, opt_mid5_site), 16, vaddr(opt_mid5), [](int i) -> std::string {
    const std::uint64_t a = static_cast<std::uint64_t>(i) * 77 + 5, b = static_cast<std::uint64_t>(i) ^ 0xabcdef;
    const std::uint64_t r = opt_mid5(a, b);
    return r == a * b - b ? "" : "got " + hex(r) + " want " + hex(a * b - b);
  });
}

// A site reached with alignment checking on (rflags.AC, which would make
// libc's and ld.so's unaligned accesses raise SIGBUS): the consumer runs with
// AC off, sees it on in Regs.rflags, and the function continues with it on.
struct AcConsumer : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, ac_in_handler{0}, ac_in_regs{0};
  Action handler(Regs& regs) override {
    std::uint64_t f;
    asm volatile("pushfq; pop %0" : "=r"(f));
    hits.fetch_add(1, std::memory_order_relaxed);
    if (f & 0x40000) ac_in_handler.fetch_add(1, std::memory_order_relaxed);
    if (regs.rflags & 0x40000) ac_in_regs.fetch_add(1, std::memory_order_relaxed);
    return Action::keep;
  }
};

TEST(Sites, AlignmentCheckOnAtSite) {
  const void* site = at(opt_ac5, opt_ac5_site);
  AcConsumer c;
  uprobe::Attachment a(site, c);
  EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_nop5) << uprobe::probe_info(a.probe()).why_not_optimized;
  for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(opt_ac5(i), i + 0x40000);
  EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(c.ac_in_regs.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(c.ac_in_handler.load(), 0u);
}

TEST(Sites, SameSiteByPathAndOffset) {
  // Registered by (path, file offset): the same probe, optimized once.
  const uprobe::FileOffset fo = uprobe::resolve_address(vaddr(opt_entry5));
  Counter c1(addr(opt_entry5)), c2(addr(opt_entry5));
  uprobe::Attachment a1(vaddr(opt_entry5), c1);
  uprobe::Attachment a2(fo.path, fo.offset, c2);
  EXPECT_EQ(a1.probe(), a2.probe());
  EXPECT_EQ(uprobe::probe_info(a1.probe()).mode, uprobe::ProbeMode::optimized_nop5);
  EXPECT_EQ(uprobe::probe_info(a1.probe()).consumers, 2u);
  EXPECT_EQ(check_jump_into_xol(vaddr(opt_entry5)), "");
  for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(opt_entry5(i, 1), i + 2);
  EXPECT_EQ(c1.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(c2.hits.load(), static_cast<std::uint64_t>(kCalls));
  a2.detach();
  EXPECT_EQ(uprobe::probe_info(a1.probe()).mode, uprobe::ProbeMode::optimized_nop5);
  EXPECT_EQ(check_jump_into_xol(vaddr(opt_entry5)), "");
  a1.detach();
  EXPECT_EQ(hex_bytes(mem(vaddr(opt_entry5), 5)), hex_bytes(file_bytes_at(vaddr(opt_entry5), 5)));
}

// A probe hit inside a handler (both sites optimized) is not reported again.
struct CallsProbed : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, bad{0};
  Action handler(Regs&) override {
    hits.fetch_add(1);
    if (opt_entry5(5, 6) != 17) bad.fetch_add(1);
    return Action::keep;
  }
};

TEST(Sites, HitInsideHandlerIsARecursionMiss) {
  CallsProbed outer;
  Counter inner(addr(opt_entry5));
  uprobe::Attachment ai(vaddr(opt_entry5), inner);
  uprobe::Attachment ao(at(opt_mid5, opt_mid5_site), outer);
  ASSERT_EQ(uprobe::probe_info(ai.probe()).mode, uprobe::ProbeMode::optimized_nop5);
  ASSERT_EQ(uprobe::probe_info(ao.probe()).mode, uprobe::ProbeMode::optimized_nop5);
  const uprobe::Stats s0 = uprobe::stats();
  std::optional<testsupport::RecursionMissCount> missed(std::in_place);
  for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(opt_mid5(i, 2), 2 * i - 2);
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(outer.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(outer.bad.load(), 0u) << "the probed function called from the handler returned a wrong value";
  EXPECT_EQ(inner.hits.load(), 0u);
  EXPECT_EQ(d.recursion_misses, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
  // The RecursionMissHook was told of each, with the probe missed.
  EXPECT_EQ(missed->calls(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(missed->last_probe(), ai.probe());
  missed.reset();
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_EQ(opt_entry5(i, 1), i + 2);
  EXPECT_EQ(inner.hits.load(), 10u);
}

// ------------------------------------------------------- nop encodings ----

struct NopCase {
  const char* name;
  std::uint64_t (*fn)(std::uint64_t);
  std::uint64_t k;
  std::size_t len;
  bool optimize;  ///< expected: a 5-byte nop is optimized, any other length stays int3
};

const NopCase kNops[] = {
    {"0f 1f 44 00 00 (nopl 0x0(%rax,%rax,1))", opt_nop_0f1f440000, 11, 5, true},
    {"66 0f 1f 04 00 (nopw (%rax,%rax,1))", opt_nop_660f1f0400, 12, 5, true},
    {"0f 1f 44 00 12 (nopl 0x12(%rax,%rax,1))", opt_nop_0f1f440012, 13, 5, true},
    {"66 0f 1f 40 12 (nopw 0x12(%rax))", opt_nop_660f1f4012, 14, 5, true},
    {"2e 0f 1f 40 12 (cs nopl 0x12(%rax))", opt_nop_2e0f1f4012, 15, 5, true},
    {"66 66 66 66 90 (data16 xchg %ax,%ax)", opt_nop_6666666690, 16, 5, true},
    {"66 0f 1f 44 00 00 (6 bytes)", opt_nop_660f1f440000, 17, 6, false},
    {"0f 1f 40 00 (4 bytes)", opt_nop_0f1f4000, 18, 4, false},
    {"0f 1f 80 00 00 00 00 (7 bytes)", opt_nop_0f1f8000000000, 19, 7, false},
};

TEST(Sites, NopEncodings) {
  // The nop5 rule alone: with entry optimization on, the other nops (at these
  // functions' entries) would be displaced instead (tests/opt/entry_test.cpp).
  ConfigGuard g;
  uprobe::Config cfg = uprobe::configuration();
  cfg.optimize_entries = false;
  uprobe::configure(cfg);
  for (const NopCase& n : kNops) {
    SCOPED_TRACE(n.name);
    const void* fn = vaddr(n.fn);
    const std::size_t fn_len = n.len + 5;  // nop; lea k(%rdi),%rax (4); ret (1)
    const auto file = file_bytes_at(fn, fn_len);
    ASSERT_EQ(hex_bytes(mem(fn, fn_len)), hex_bytes(file));
    Counter c(addr(n.fn));
    const uprobe::Stats s0 = uprobe::stats();
    uprobe::Uprobe* p = uprobe::register_uprobe(fn, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(p);
    std::printf("[ info ] %-42s -> mode %s, instruction `%s`, why \"%s\"\n", n.name, uprobe::to_string(info.mode),
                info.instruction.c_str(), info.why_not_optimized.c_str());
    if (n.optimize) {
      EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << "why: " << info.why_not_optimized;
      EXPECT_EQ(info.why_not_optimized, "");
      EXPECT_EQ(check_jump_into_xol(fn), "");
    } else {
      EXPECT_EQ(info.mode, uprobe::ProbeMode::int3);
      EXPECT_FALSE(info.instruction.empty());
      EXPECT_NE(info.why_not_optimized.find(info.instruction), std::string::npos)
          << "why_not_optimized does not name the instruction `" << info.instruction
          << "`: " << info.why_not_optimized;
      EXPECT_EQ(hex(mem(fn, 1)[0]), "0xcc");
      EXPECT_EQ(hex_bytes(mem(at(n.fn, 1), fn_len - 1)),
                hex_bytes(std::vector<std::uint8_t>(file.begin() + 1, file.end())));
    }
    for (std::uint64_t i = 0; i < kCalls; ++i) {
      const std::uint64_t x = i * 0x10001 + 7;
      ASSERT_EQ(n.fn(x), x + n.k) << "call " << i;
    }
    const uprobe::Stats d = stats_delta(s0, uprobe::stats());
    EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls));
    EXPECT_EQ(c.bad_ip.load(), 0u);
    EXPECT_EQ(d.hits, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
    EXPECT_EQ(d.optimized, n.optimize ? static_cast<std::uint64_t>(kCalls) : 0u) << stats_str(d);
    EXPECT_EQ(d.emulated + d.out_of_line, n.optimize ? 0u : static_cast<std::uint64_t>(kCalls)) << stats_str(d);
    uprobe::unregister_uprobe(p, c);
    EXPECT_EQ(hex_bytes(mem(fn, fn_len)), hex_bytes(file)) << "bytes not restored";
  }
  EXPECT_TRUE(rwx_mappings().empty());
}

// -------------------------------------------------- Config::optimize ----

TEST(Config, OptimizeOffKeepsNop5OnInt3) {
  ConfigGuard g;
  const void* site = at(opt_mid5, opt_mid5_site);
  const auto file = file_bytes_at(site, 5);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "first registration" : "second registration");
    set_optimize(false);
    {
      Counter c(reinterpret_cast<std::uint64_t>(site));
      const uprobe::Stats s0 = uprobe::stats();
      uprobe::Uprobe* p = uprobe::register_uprobe(site, c);
      const uprobe::ProbeInfo info = uprobe::probe_info(p);
      EXPECT_EQ(info.mode, uprobe::ProbeMode::int3);
      EXPECT_NE(info.why_not_optimized.find("Config::optimize"), std::string::npos)
          << "why does not mention the switch: " << info.why_not_optimized;
      EXPECT_EQ(hex(mem(site, 1)[0]), "0xcc");
      EXPECT_EQ(hex_bytes(mem(at(opt_mid5, opt_mid5_site + 1), 4)),
                hex_bytes(std::vector<std::uint8_t>(file.begin() + 1, file.end())));
      for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(opt_mid5(i, i + 1), i * (i + 1) - (i + 1));
      const uprobe::Stats d = stats_delta(s0, uprobe::stats());
      EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls));
      EXPECT_EQ(c.bad_ip.load(), 0u);
      EXPECT_EQ(d.hits, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
      EXPECT_EQ(d.optimized, 0u) << stats_str(d);
      EXPECT_EQ(d.emulated, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
      uprobe::unregister_uprobe(p, c);
      EXPECT_EQ(hex_bytes(mem(site, 5)), hex_bytes(file));
    }
    set_optimize(true);
    {
      Counter c(reinterpret_cast<std::uint64_t>(site));
      const uprobe::Stats s0 = uprobe::stats();
      uprobe::Uprobe* p = uprobe::register_uprobe(site, c);
      const uprobe::ProbeInfo info = uprobe::probe_info(p);
      EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << info.why_not_optimized;
      EXPECT_EQ(check_jump_into_xol(site), "");
      for (std::uint64_t i = 0; i < kCalls; ++i) ASSERT_EQ(opt_mid5(i, 3), 3 * i - 3);
      const uprobe::Stats d = stats_delta(s0, uprobe::stats());
      EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls));
      EXPECT_EQ(d.optimized, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
      EXPECT_EQ(d.emulated, 0u) << stats_str(d);
      uprobe::unregister_uprobe(p, c);
      EXPECT_EQ(hex_bytes(mem(site, 5)), hex_bytes(file));
    }
  }
}

// Config says: "false keeps every probe on int3" and configure() "takes
// effect for hits that start after the call".
TEST(Config, SwitchingOffTakesEffectForAttachedProbes) {
  ConfigGuard g;
  set_optimize(true);
  Counter c(addr(opt_entry5));
  uprobe::Attachment a(vaddr(opt_entry5), c);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_nop5);
  set_optimize(false);
  const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
  EXPECT_EQ(info.mode, uprobe::ProbeMode::int3) << "after configure(optimize = false) the attached probe still jumps: "
                               << hex_bytes(mem(vaddr(opt_entry5), 5)) << ", why \"" << info.why_not_optimized
                               << "\"";
  const uprobe::Stats s0 = uprobe::stats();
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(opt_entry5(i, 2), i + 4);
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(d.hits, 100u) << stats_str(d);
  EXPECT_EQ(d.optimized, 0u) << "hits after configure(optimize = false) still came through the jump: "
                             << stats_str(d);
  a.detach();
  EXPECT_EQ(hex_bytes(mem(vaddr(opt_entry5), 5)), hex_bytes(file_bytes_at(vaddr(opt_entry5), 5)));
}

// ------------------------------------------------------------ red zone ----

__attribute__((noinline)) void dirty_stack(std::uint8_t v) {
  volatile std::uint8_t buf[8192];
  for (std::size_t i = 0; i < sizeof buf; ++i) buf[i] = v;
  asm volatile("" : : "r"(buf) : "memory");
}

struct StackDirtier : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs&) override {
    hits.fetch_add(1);
    dirty_stack(0xA5);
    return Action::keep;
  }
};

TEST(RedZone, MarkersSurviveOptimizedAndInt3) {
  ConfigGuard g;
  for (bool optimize : {true, false}) {
    SCOPED_TRACE(optimize ? "optimized" : "int3");
    set_optimize(optimize);
    StackDirtier h;
    uprobe::Attachment a(at(opt_redzone, opt_redzone_site), h);
    EXPECT_EQ(uprobe::probe_info(a.probe()).mode, optimize ? uprobe::ProbeMode::optimized_nop5 : uprobe::ProbeMode::int3);
    const uprobe::Stats s0 = uprobe::stats();
    for (std::uint64_t i = 0; i < kCalls; ++i) {
      const std::uint64_t x = 0x1111111111111111ull * (i % 15 + 1) + i, y = ~x * 3;
      ASSERT_EQ(hex(opt_redzone(x, y)), hex(x + y + (x ^ y))) << "call " << i;
    }
    const uprobe::Stats d = stats_delta(s0, uprobe::stats());
    EXPECT_EQ(h.hits.load(), static_cast<std::uint64_t>(kCalls));
    EXPECT_EQ(d.optimized, optimize ? static_cast<std::uint64_t>(kCalls) : 0u) << stats_str(d);
  }
}

}  // namespace
