// SPDX-License-Identifier: MIT
/// @file decoder_test.cpp
/// libuprobe's decoder (Capstone) is loaded by libuprobe itself
/// (arch/x86_64/capstone_lib.hpp). This program defines
/// uprobe_decoder_on_demand, so it is loaded at the first analysis, or by
/// uprobe::load_decoder(): not at start-up. (The default, a load from
/// libuprobe's constructor, is what every other test program runs with;
/// core.C06_MidInstruction asserts that a refused request then adds no mapping.)

#include <gtest/gtest.h>

#include <string>

#include "common.hpp"
#include "proc_text.hpp"
#include "fixtures.hpp"

extern "C" const int uprobe_decoder_on_demand = 1;

namespace {

using coretest::Counter;

bool capstone_mapped() {
  for (const auto& m : uprobe_test::read_maps())
    if (m.path.find("libcapstone.so") != std::string::npos) return true;
  return false;
}

TEST(DecoderOnDemand, LoadedAtTheFirstAnalysisThenProbesWork) {
  ASSERT_FALSE(capstone_mapped()) << "loaded at start-up although the program asked for on demand";
  // A request refused before any instruction is decoded (no such address)
  // does not load it either.
  Counter c;
  EXPECT_THROW(uprobe::register_uprobe(reinterpret_cast<const void*>(std::uintptr_t(16)), c), uprobe::Error);
  EXPECT_FALSE(capstone_mapped());
  // The first registration decodes: loaded then; the probe works.
  c.expect_ip = reinterpret_cast<std::uint64_t>(&fx_push_rbp) + fx_push_rbp_site;
  uprobe::Uprobe* p = uprobe::register_uprobe(reinterpret_cast<const void*>(c.expect_ip), c);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(capstone_mapped());
  EXPECT_EQ(uprobe::probe_info(p).instruction, "push rbp");
  for (int i = 0; i < 10; ++i) fx_push_rbp(i, 0);
  EXPECT_EQ(c.hits.load(), 10u);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  uprobe::unregister_uprobe(p, c);
  // load_decoder(): loaded already, "" (no error).
  EXPECT_EQ(uprobe::load_decoder(), "");
}

}  // namespace
