// SPDX-License-Identifier: MIT
/// @file decoder_test.cpp
/// libuprobe's decoder is Capstone's x86 part, linked into libuprobe.so
/// (arch/x86_64/capstone_lib.hpp): no libcapstone.so is ever mapped for it,
/// at start-up or at the first analysis, and nothing is left to load.
/// This program still defines `uprobe_decoder_on_demand`, which programs
/// written for libuprobe's earlier loading of libcapstone.so.4 define: it is
/// accepted and changes nothing.

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <string>

#include <uprobe/symbols.hpp>

#include "common.hpp"
#include "proc_text.hpp"
#include "fixtures.hpp"

extern "C" const int uprobe_decoder_on_demand = 1;

namespace {

using coretest::Counter;

bool capstone_mapped() {
  for (const auto& m : uprobe_test::read_maps())
    if (m.path.find("libcapstone") != std::string::npos) return true;
  return false;
}

TEST(Decoder, LinkedIntoLibuprobeNoLibraryMappedAtStartOrAtTheFirstAnalysis) {
  ASSERT_FALSE(capstone_mapped()) << "a libcapstone mapped at start-up";
  Counter c;
  c.expect_ip = reinterpret_cast<std::uint64_t>(&fx_push_rbp) + fx_push_rbp_site;
  uprobe::Uprobe* p = uprobe::register_uprobe(reinterpret_cast<const void*>(c.expect_ip), c);
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(capstone_mapped()) << "a libcapstone mapped by the first analysis";
  // Decoded: the instruction's text and length are Capstone's.
  const uprobe::ProbeInfo info = uprobe::probe_info(p);
  EXPECT_EQ(info.instruction, "push rbp");
  for (int i = 0; i < 10; ++i) fx_push_rbp(i, 0);
  EXPECT_EQ(c.hits.load(), 10u);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  uprobe::unregister_uprobe(p, c);
  EXPECT_EQ(uprobe::load_decoder(), "");
}

TEST(Decoder, OnlyCapstonesX86PartIsLinkedAndNoneOfItIsExported) {
  // None of Capstone's symbols is exported (a program's own Capstone, any
  // version, stays its own) ...
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "cs_open"), nullptr);
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "cs_disasm_iter"), nullptr);
  // ... and of its architectures only x86's decoder is in libuprobe.so
  // (its .symtab: local symbols, read with libuprobe's own API).
  Dl_info where{};
  ASSERT_NE(dladdr(reinterpret_cast<const void*>(&uprobe::load_decoder), &where), 0);
  bool x86 = false, other = false;
  for (const uprobe::Symbol& s : uprobe::read_symbols(where.dli_fname)) {
    x86 = x86 || s.name == "X86_getInstruction";
    other = other || s.name == "ARM_getInstruction" || s.name == "AArch64_getInstruction" ||
            s.name == "Mips_getInstruction" || s.name == "PPC_getInstruction";
  }
  EXPECT_TRUE(x86) << where.dli_fname;
  EXPECT_FALSE(other) << where.dli_fname;
}

}  // namespace
