// SPDX-License-Identifier: MIT
// C-04: a branch lands inside the bytes an optimized probe would overwrite.
// (a) a conditional rel32 branch at offset 3; (b) a loop whose backward
// branch targets offset 2; (c) a conditional rel32 backward branch targeting
// offset 3. Probe offset 0 in every mode (Config::optimize on/off, XOL
// jump-back/single-step): correct results for negative, zero and positive
// inputs x1000 each, exactly one hit per call. (b) and (c): a jump lands
// inside the window an entry jump would displace, so the probe stays int3 and
// names the branch. (a): nothing jumps into the window (the jle is inside it,
// and is relocated with it), so with optimization on the entry is optimized
// and the jle runs from the window slot; only byte 0..4 change.

#include "opt_common.hpp"

using namespace opttest;

namespace {

struct C04Case {
  const char* name;
  std::uint64_t (*fn)(std::uint64_t);
  std::int64_t (*model)(std::int64_t);
  std::size_t len;  ///< bytes compared with the file
  const char* into_window;  ///< the refusal naming the branch into the window, or nullptr (none)
};

std::int64_t model_a(std::int64_t x) { return x > 0 ? 3 * x : x == 0 ? 7 : -2 * x; }
std::int64_t model_b(std::int64_t x) {
  const std::int64_t m = x < 0 ? -x : x;
  return (x < 0 ? -1 : 1) * m * (m + 1) / 2;
}
std::int64_t model_c(std::int64_t x) { return x >= 0 ? x : x - 1; }

const C04Case kCases[] = {
    {"C-04a jle rel32 at offset 3", opt_c04a, model_a, 32, nullptr},
    {"C-04b loop back to offset 2", opt_c04b, model_b, 27, ") branches to +0x2, inside the"},
    {"C-04c ja rel32 back to offset 3", opt_c04c, model_c, 20, ") branches to +0x3, inside the"},
};

struct Mode {
  const char* name;
  bool optimize;
  uprobe::XolMode xol;
};
const Mode kModes[] = {
    {"optimize on, jump_back", true, uprobe::XolMode::jump_back},
    {"optimize off, jump_back", false, uprobe::XolMode::jump_back},
    {"optimize on, single_step", true, uprobe::XolMode::single_step},
    {"optimize off, single_step", false, uprobe::XolMode::single_step},
};

TEST(C04, BranchIntoPatchWindowStaysInt3) {
  ASSERT_EQ(opt_c04a_branch, 3u);
  ASSERT_EQ(opt_c04b_target, 2u);
  ASSERT_EQ(opt_c04c_target, 3u);
  ConfigGuard g;
  for (const Mode& m : kModes) {
    uprobe::Config cfg = uprobe::configuration();
    cfg.optimize = m.optimize;
    cfg.xol = m.xol;
    cfg.optimize_punned = false;  // the window's refusal, not the punned jump that takes over
    uprobe::configure(cfg);
    for (const C04Case& c : kCases) {
      SCOPED_TRACE(std::string(c.name) + " / " + m.name);
      const void* fn = vaddr(c.fn);
      const auto file = file_bytes_at(fn, c.len);
      ASSERT_EQ(hex_bytes(mem(fn, c.len)), hex_bytes(file));
      Counter h(addr(c.fn));
      const uprobe::Stats s0 = uprobe::stats();
      uprobe::Uprobe* p = uprobe::register_uprobe(fn, h);
      const uprobe::ProbeInfo info = uprobe::probe_info(p);
      const bool optimized = m.optimize && !c.into_window;
      EXPECT_EQ(info.mode, optimized ? uprobe::ProbeMode::optimized_entry : uprobe::ProbeMode::int3) << info.why_not_optimized;
      EXPECT_EQ(info.why_not_optimized.empty(), optimized);
      if (!m.optimize) {
        EXPECT_NE(info.why_not_optimized.find("Config::optimize"), std::string::npos) << info.why_not_optimized;
      } else if (c.into_window) {
        EXPECT_NE(info.why_not_optimized.find(c.into_window), std::string::npos)
            << "why does not name the branch into the window: " << info.why_not_optimized;
      }
      // Only byte 0 changed (int3), or bytes 0..4 (the jump).
      const auto now = mem(fn, c.len);
      EXPECT_EQ(hex(now[0]), optimized ? "0xe9" : "0xcc");
      const std::size_t keep = optimized ? 5 : 1;
      EXPECT_EQ(hex_bytes(std::vector<std::uint8_t>(now.begin() + keep, now.end())),
                hex_bytes(std::vector<std::uint8_t>(file.begin() + keep, file.end())));
      std::uint64_t calls = 0;
      for (std::int64_t sign : {-1, 0, 1}) {
        for (int i = 0; i < 1000; ++i) {
          const std::int64_t x = sign * (i % 40 + 1);
          const std::uint64_t before = h.hits.load();
          const auto r = static_cast<std::int64_t>(c.fn(static_cast<std::uint64_t>(x)));
          ++calls;
          ASSERT_EQ(r, c.model(x)) << "x = " << x;
          ASSERT_EQ(h.hits.load() - before, 1u) << "x = " << x << ": not exactly one hit";
        }
      }
      const uprobe::Stats d = stats_delta(s0, uprobe::stats());
      EXPECT_EQ(h.hits.load(), calls);
      EXPECT_EQ(h.bad_ip.load(), 0u);
      EXPECT_EQ(d.hits, calls) << stats_str(d);
      EXPECT_EQ(d.optimized, optimized ? calls : 0u) << stats_str(d);
      uprobe::unregister_uprobe(p, h);
      EXPECT_EQ(hex_bytes(mem(fn, c.len)), hex_bytes(file));
    }
  }
}

}  // namespace
