// SPDX-License-Identifier: MIT
// Cases C-03 (rip-relative first instructions run out of line) and C-06
// (offsets that are not instruction starts); the cases are described in
// tests/README.md.

#include <cstring>

#include "common.hpp"
#include "fixtures.hpp"

using namespace coretest;

namespace {

constexpr int kCalls = 1000;

struct Target {
  std::string exe;
  ElfSym sym;
  std::string path;  // as resolve_address names it
};

Target target(const char* symbol, const void* fn) {
  Target t;
  t.exe = self_exe();
  auto s = elf_symbol(t.exe, symbol);
  EXPECT_TRUE(s.has_value()) << symbol;
  if (s) t.sym = *s;
  uprobe::FileOffset fo = uprobe::resolve_address(fn);
  EXPECT_EQ(fo.offset, t.sym.file_offset) << symbol << ": resolve_address vs ELF";
  t.path = fo.path;
  return t;
}

// ---------------------------------------------------------------- C-03 ----

/// Runs `body` (1000 calls, returning the number of wrong results) with a
/// probe at offset 0 of `symbol`: once registered by address, once by
/// (path, file offset). Exactly one hit per call at rip == the symbol.
template <typename Body>
void c03_run(const char* symbol, const void* fn, Body body) {
  Target t = target(symbol, fn);
  const auto orig = mem_bytes(fn, t.sym.size);
  for (int how = 0; how < 2; ++how) {
    SCOPED_TRACE(how == 0 ? "by address" : "by (path, offset)");
    Counter c;
    c.expect_ip = reinterpret_cast<std::uint64_t>(fn);
    const uprobe::Stats s0 = uprobe::stats();
    uprobe::Uprobe* p = how == 0 ? uprobe::register_uprobe(fn, c)
                                 : uprobe::register_uprobe(t.path, t.sym.file_offset, c);
    ASSERT_NE(p, nullptr);
    const std::string insn = uprobe::probe_info(p).instruction;
    int wrong = body();
    uprobe::Stats d = stats_delta(s0, uprobe::stats());
    EXPECT_EQ(wrong, 0) << "wrong results under the probe [" << insn << "]";
    EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls)) << insn;
    EXPECT_EQ(c.bad_ip.load(), 0u);
    EXPECT_EQ(d.hits, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
    EXPECT_EQ(d.emulated + d.out_of_line, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
    uprobe::unregister_uprobe(p, c);
    EXPECT_EQ(hex_bytes(mem_bytes(fn, t.sym.size)), hex_bytes(orig));
  }
}

TEST(C03_RipRelative, MovsdRipRelativeReturns325) {
  ASSERT_EQ(fx_c03_movsd(), 3.25);
  c03_run("fx_c03_movsd", fx_addr(fx_c03_movsd), [] {
    int wrong = 0;
    for (int i = 0; i < kCalls; ++i) wrong += fx_c03_movsd() != 3.25;
    return wrong;
  });
}

TEST(C03_RipRelative, MovsdRipRelativeOutOfLineCounted) {
  Counter c;
  uprobe::Attachment a(fx_addr(fx_c03_movsd), c);
  EXPECT_FALSE(uprobe::probe_info(a.probe()).emulated);
  const uprobe::Stats s0 = uprobe::stats();
  for (int i = 0; i < kCalls; ++i) ASSERT_EQ(fx_c03_movsd(), 3.25) << "call " << i;
  uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(d.out_of_line, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
  EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls));
}

TEST(C03_RipRelative, LeaRipRelativeReturnsSymAddress) {
  ASSERT_EQ(fx_c03_lea(), &fx_c03_sym);
  c03_run("fx_c03_lea", fx_addr(fx_c03_lea), [] {
    int wrong = 0;
    for (int i = 0; i < kCalls; ++i) wrong += fx_c03_lea() != &fx_c03_sym;
    return wrong;
  });
}

TEST(C03_RipRelative, MovRipRelativeReturnsSymValue) {
  c03_run("fx_c03_mov", fx_addr(fx_c03_mov), [] {
    int wrong = 0;
    for (int i = 0; i < kCalls; ++i) {
      fx_c03_sym = 0x0C03000000000000ull + static_cast<std::uint64_t>(i);
      wrong += fx_c03_mov() != 0x0C03000000000000ull + static_cast<std::uint64_t>(i);
    }
    return wrong;
  });
}

TEST(C03_RipRelative, CmpRipRelativeTakesTheRightBranch) {
  c03_run("fx_c03_cmp", fx_addr(fx_c03_cmp), [] {
    int wrong = 0;
    for (int i = 0; i < kCalls; ++i) {
      fx_c03_flag = (i % 2) ? static_cast<std::uint64_t>(i) : 0;
      wrong += fx_c03_cmp() != ((i % 2) ? 0xB2u : 0xA1u);
    }
    fx_c03_flag = 0;
    return wrong;
  });
}

TEST(C03_RipRelative, CallThroughRipRelativePointer) {
  ASSERT_EQ(fx_c03_callfp(), 0xC03C03u);
  c03_run("fx_c03_callfp", fx_addr(fx_c03_callfp), [] {
    int wrong = 0;
    for (int i = 0; i < kCalls; ++i) wrong += fx_c03_callfp() != 0xC03C03u;
    return wrong;
  });
}

// ---------------------------------------------------------------- C-06 ----

struct RipRecorder : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> last_rip{0};
  uprobe::Action handler(uprobe::Regs& r) override {
    hits.fetch_add(1);
    last_rip.store(r.rip);
    return uprobe::Action::keep;
  }
};

TEST(C06_MidInstruction, OffsetsFourAndElevenAttachAndHit) {
  Target t = target("fx_c06", fx_addr(fx_c06));
  ASSERT_EQ(t.sym.size, 15u);
  const std::uint8_t* fn = reinterpret_cast<const std::uint8_t*>(fx_addr(fx_c06));
  RipRecorder at4, at11;
  // offset 4 through /proc/self/exe, offset 11 through the resolved path.
  uprobe::Attachment a4("/proc/self/exe", t.sym.file_offset + 4, at4);
  uprobe::Attachment a11(t.path, t.sym.file_offset + 11, at11);
  EXPECT_EQ(uprobe::probe_info(a4.probe()).where.offset, t.sym.file_offset + 4);
  EXPECT_EQ(uprobe::probe_info(a11.probe()).where.offset, t.sym.file_offset + 11);
  EXPECT_NE(uprobe::probe_info(a4.probe()).instruction.find("mov"), std::string::npos)
      << uprobe::probe_info(a4.probe()).instruction;
  EXPECT_NE(uprobe::probe_info(a11.probe()).instruction.find("add"), std::string::npos)
      << uprobe::probe_info(a11.probe()).instruction;
  int wrong = 0;
  for (int i = 0; i < kCalls; ++i) wrong += fx_c06(static_cast<std::uint64_t>(i)) != i + 1 + 0x12345678u;
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(at4.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(at11.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(at4.last_rip.load(), reinterpret_cast<std::uint64_t>(fn + 4));
  EXPECT_EQ(at11.last_rip.load(), reinterpret_cast<std::uint64_t>(fn + 11));
  a4.detach();
  a11.detach();
  EXPECT_EQ(hex_bytes(mem_bytes(fn, 15)), hex_bytes(file_bytes("/proc/self/exe", t.sym.file_offset, 15)));
}

void expect_mid_instruction_refused(const Target& t, std::uint64_t off, const char* how, bool by_address) {
  const std::uint8_t* fn = reinterpret_cast<const std::uint8_t*>(fx_addr(fx_c06));
  Counter c;
  ExecSnapshot snap = snapshot_exec();
  const auto fn_before = mem_bytes(fn, 15);
  std::string w = expect_error(
      [&] {
        if (by_address)
          uprobe::register_uprobe(fn + off, c);
        else
          uprobe::register_uprobe(t.path, t.sym.file_offset + off, c);
      },
      uprobe::Errc::mid_instruction, t.path, t.sym.file_offset + off, how);
  // The instruction it falls in: offsets 5..10 are inside the 7-byte mov.
  // The instruction it falls in: its mnemonic and its start offset.
  const char* mnemonic = (off >= 5 && off <= 10) ? "mov" : "add";
  const std::uint64_t start = off < 4 ? 0 : off < 11 ? 4 : 11;
  EXPECT_NE(w.find(mnemonic), std::string::npos) << how << ": what() does not name the `" << mnemonic << "`: " << w;
  EXPECT_TRUE(names_offset(w, t.sym.file_offset + start))
      << how << ": what() does not name the start of the instruction (" << hex(t.sym.file_offset + start) << "): " << w;
  if (off == 5) std::printf("[ info ] %s refused: %s\n", how, w.c_str());
  EXPECT_EQ(diff_exec(snap), "") << how << ": the process's code changed on a refused request";
  EXPECT_EQ(hex_bytes(mem_bytes(fn, 15)), hex_bytes(fn_before));
  EXPECT_EQ(c.hits.load(), 0u);
}

TEST(C06_MidInstruction, OffsetFiveIsRefusedAndNothingChanges) {
  Target t = target("fx_c06", fx_addr(fx_c06));
  const std::uint8_t* fn = reinterpret_cast<const std::uint8_t*>(fx_addr(fx_c06));
  const auto disk = file_bytes("/proc/self/exe", t.sym.file_offset, 15);
  ASSERT_EQ(hex_bytes(disk), "48 83 c7 01 48 c7 c0 78 56 34 12 48 01 f8 c3");
  ASSERT_EQ(hex_bytes(mem_bytes(fn, 15)), hex_bytes(disk));
  expect_mid_instruction_refused(t, 5, "(path, offset+5)", false);
  expect_mid_instruction_refused(t, 5, "address symbol+5", true);
  EXPECT_EQ(hex_bytes(mem_bytes(fn, 15)), hex_bytes(disk)) << "function bytes differ from the file";
  // The function still runs unprobed.
  EXPECT_EQ(fx_c06(1), 2u + 0x12345678u);
}

TEST(C06_MidInstruction, EveryNonStartOffsetIsRefused) {
  Target t = target("fx_c06", fx_addr(fx_c06));
  for (std::uint64_t off : {1, 2, 3, 5, 6, 7, 8, 9, 10, 12, 13}) {
    SCOPED_TRACE("offset " + std::to_string(off));
    expect_mid_instruction_refused(t, off, "mid-instruction", false);
  }
}

TEST(C06_MidInstruction, OffsetFiveRefusedWhileFourAndElevenAreAttached) {
  Target t = target("fx_c06", fx_addr(fx_c06));
  RipRecorder at4, at11;
  uprobe::Attachment a4(t.path, t.sym.file_offset + 4, at4);
  uprobe::Attachment a11(t.path, t.sym.file_offset + 11, at11);
  expect_mid_instruction_refused(t, 5, "offset 5 with 4 and 11 attached", false);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(fx_c06(static_cast<std::uint64_t>(i)), i + 1 + 0x12345678u);
  EXPECT_EQ(at4.hits.load(), 100u);
  EXPECT_EQ(at11.hits.load(), 100u);
}

TEST(C06_MidInstruction, SymbolPlusZeroIsTheSymbolsFirstByte) {
  Target t = target("fx_c06", fx_addr(fx_c06));
  for (int how = 0; how < 2; ++how) {
    RipRecorder r;
    uprobe::Attachment a = how == 0 ? uprobe::Attachment(fx_addr(fx_c06), r)
                                    : uprobe::Attachment(t.path, t.sym.file_offset + 0, r);
    EXPECT_EQ(uprobe::probe_info(a.probe()).where.offset, t.sym.file_offset);
    for (int i = 0; i < 10; ++i) ASSERT_EQ(fx_c06(7), 8u + 0x12345678u);
    EXPECT_EQ(r.hits.load(), 10u);
    EXPECT_EQ(r.last_rip.load(), reinterpret_cast<std::uint64_t>(fx_addr(fx_c06)));
  }
}

}  // namespace
