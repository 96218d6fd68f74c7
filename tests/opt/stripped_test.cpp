// SPDX-License-Identifier: MIT
// A stripped program (linked with -s: no .symtab) whose functions are not
// exported: their bounds come only from the .eh_frame FDEs, and with them an
// entry takes the optimized jump (before, the size was unknown: int3), an
// offset inside an instruction is refused, and a return probe off the entry
// is refused. Exact hits and return values, the bytes back after detach.

#include <gtest/gtest.h>

#include <atomic>
#include <functional>

#include "opt_common.hpp"
#include "uprobe/symbols.hpp"
#include "uprobe/uprobe.hpp"

extern "C" {
std::uint64_t strip_mix(std::uint64_t, std::uint64_t);
std::uint64_t strip_leaf(std::uint64_t, std::uint64_t);
extern const std::uint8_t strip_mix_end[], strip_leaf_end[];
}

using namespace opttest;

namespace {

struct Counter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, bad{0};
  std::uint64_t expect_ip = 0;
  explicit Counter(std::uint64_t ip, uprobe::Callbacks cb = uprobe::Callbacks::entry)
      : uprobe::Consumer(cb), expect_ip(ip) {}
  uprobe::Action handler(uprobe::Regs& regs) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    if (regs.rip != expect_ip) bad.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

std::uint64_t file_offset(const void* p) {
  const auto m = mapping_of(reinterpret_cast<std::uint64_t>(p));
  EXPECT_TRUE(m.has_value());
  return m ? m->offset + reinterpret_cast<std::uint64_t>(p) - m->start : 0;
}

TEST(Stripped, TheProgramHasNoSymbolForItsFunctions) {
  int symtab = 0, named = 0;
  for (const uprobe::Symbol& s : uprobe::read_symbols("/proc/self/exe")) {
    symtab += !s.dynamic;
    named += s.name == "strip_mix" || s.name == "strip_leaf";
  }
  EXPECT_EQ(symtab, 0) << "linked with -s: no .symtab";
  EXPECT_EQ(named, 0);
  EXPECT_FALSE(uprobe::symbol_at("/proc/self/exe", file_offset(reinterpret_cast<const void*>(&strip_mix))).has_value());
}

void check(const void* fn, const std::uint8_t* end, unsigned displaced,
           const std::function<std::uint64_t(std::uint64_t)>& call, const std::function<std::uint64_t(std::uint64_t)>& want) {
  const std::size_t len = static_cast<std::size_t>(end - static_cast<const std::uint8_t*>(fn));
  const std::vector<std::uint8_t> file = file_bytes_at(fn, len);
  ASSERT_EQ(hex_bytes(mem(fn, len)), hex_bytes(file));
  Counter c(reinterpret_cast<std::uint64_t>(fn));
  uprobe::Uprobe* p = uprobe::register_uprobe(fn, c);
  const uprobe::ProbeInfo info = uprobe::probe_info(p);
  EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_entry) << info.why_not_optimized;
  EXPECT_EQ(info.displaced, displaced);
  EXPECT_EQ(info.bounds, "eh_frame " + hex(file_offset(fn)) + "+" + hex(len));
  EXPECT_EQ(info.symbol, "");
  EXPECT_EQ(check_jump_into_xol(fn), "");
  const uprobe::Stats s0 = uprobe::stats();
  for (std::uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(call(i), want(i)) << "call " << i;
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(c.hits.load(), 1000u);
  EXPECT_EQ(c.bad.load(), 0u);
  EXPECT_EQ(d.optimized, 1000u) << stats_str(d);
  uprobe::unregister_uprobe(p, c);
  EXPECT_EQ(hex_bytes(mem(fn, len)), hex_bytes(file)) << "bytes not restored";
  EXPECT_EQ(call(5), want(5));
  EXPECT_EQ(c.hits.load(), 1000u) << "hit after detach";
}

TEST(Stripped, EntryBoundedByItsFdeTakesTheJump) {
  check(reinterpret_cast<const void*>(&strip_mix), strip_mix_end, 8,
        [](std::uint64_t i) { return strip_mix(i, 7); }, [](std::uint64_t i) { return 3 * i + 7; });
  check(reinterpret_cast<const void*>(&strip_leaf), strip_leaf_end, 6,
        [](std::uint64_t i) { return strip_leaf(i, 0x55); }, [](std::uint64_t i) { return i ^ 0x55; });
}

TEST(Stripped, InsideTheFdeOffsetsAreChecked) {
  const auto* base = reinterpret_cast<const std::uint8_t*>(&strip_mix);
  // push %rbp (0), mov %rsp,%rbp (1..3), lea (4..7): +5 is inside the lea.
  Counter c(0);
  try {
    uprobe::Attachment a(base + 5, c);
    ADD_FAILURE() << "a probe inside an instruction was accepted";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(e.code(), uprobe::Errc::mid_instruction) << e.what();
    EXPECT_NE(std::string(e.what()).find("the function at file offset " + hex(file_offset(base)) + "+0x4"),
              std::string::npos)
        << e.what();
  }
  Counter r(0, uprobe::Callbacks::entry_and_ret);
  try {
    uprobe::Attachment a(base + 4, r);
    ADD_FAILURE() << "a return probe off the entry was accepted";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(e.code(), uprobe::Errc::refused_instruction) << e.what();
    EXPECT_NE(std::string(e.what()).find("a return probe must be at a function's entry"), std::string::npos)
        << e.what();
  }
  // An instruction start inside it: a window (the lea and the add, 7
  // bytes; Config::optimize_windows) planned from the FDE's bounds, exact hits.
  Counter mid(reinterpret_cast<std::uint64_t>(base + 4));
  {
    uprobe::Attachment a(base + 4, mid);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_window) << info.why_not_optimized;
    EXPECT_EQ(info.displaced, 7u);
    EXPECT_EQ(info.why_not_optimized, "");
    for (std::uint64_t i = 0; i < 10; ++i) EXPECT_EQ(strip_mix(i, 1), 3 * i + 1);
  }
  EXPECT_EQ(mid.hits.load(), 10u);
  EXPECT_EQ(mid.bad.load(), 0u);
}

}  // namespace
