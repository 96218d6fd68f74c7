// SPDX-License-Identifier: MIT
/// @file sweep_test.cpp
/// The linear sweep's table of instruction lengths (arch/x86_64/sweep.cpp)
/// against Capstone, which it stands in for: wherever known_length()
/// answers, Capstone 4 decodes the same length (or, for a VEX form it cannot
/// decode, the sweep's vex_length() steps over the same bytes), and the lea
/// and branch flags are what Capstone's instruction id and branch_info() say.
/// Over every prefix the table takes (with REX forms), every opcode of its
/// maps, every ModRM and both SIB kinds that change a length; over sampled
/// VEX payloads; and at every instruction start of libc's code and every
/// fifth byte. Then the neighbour index built from it: the exact targets of
/// a sweep, and a window it clears is one check_neighbour_branches() accepts
/// (and one it does not clear, refused), on hand-made code and on libc.

#include <capstone/capstone.h>
#include <elf.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "arch.hpp"
#include "sweep.hpp"
#include "uprobe/symbols.hpp"

namespace uprobe::arch {
namespace {

using Bytes = std::vector<std::uint8_t>;

/// Capstone, detail off, as the sweep asks it.
class Reference {
 public:
  Reference() {
    EXPECT_EQ(cs_open(CS_ARCH_X86, CS_MODE_64, &h_), CS_ERR_OK);
    insn_ = cs_malloc(h_);
  }
  ~Reference() {
    cs_free(insn_, 1);
    cs_close(&h_);
  }
  /// The sweep's step as Capstone alone gives it: Capstone's length, else
  /// (undecodable) vex_length(); `lea` from Capstone's id.
  std::size_t step(const std::uint8_t* b, std::size_t n, bool& lea, bool& capstone) {
    const std::uint8_t* c = b;
    std::size_t left = n;
    std::uint64_t at = 0;
    capstone = cs_disasm_iter(h_, &c, &left, &at, insn_);
    lea = capstone && insn_->id == X86_INS_LEA;
    return capstone ? insn_->size : vex_length(b, n);
  }

 private:
  csh h_ = 0;
  cs_insn* insn_ = nullptr;
};

/// A deterministic byte stream for the bytes after the ones enumerated.
struct Noise {
  std::uint32_t s = 0x12345678;
  std::uint8_t next() {
    s = s * 1103515245u + 12345u;
    return static_cast<std::uint8_t>(s >> 16);
  }
};

/// Checks the table at `b` (`n` bytes) against Capstone; counts what it
/// answered. Returns false (after a failed expectation) on a mismatch.
bool agrees(Reference& ref, const std::uint8_t* b, std::size_t n, std::size_t& known) {
  bool lea = false, branch = false;
  const std::size_t len = known_length(b, n, lea, branch);
  if (len == 0) return true;
  ++known;
  bool ref_lea = false, decoded = false;
  const std::size_t ref_len = ref.step(b, n, ref_lea, decoded);
  char hex[64] = {};
  for (std::size_t i = 0; i < std::min<std::size_t>(n, 15); ++i) std::snprintf(hex + 3 * i, 4, "%02x ", b[i]);
  EXPECT_EQ(len, ref_len) << hex;
  EXPECT_EQ(lea, ref_lea) << hex;
  EXPECT_EQ(branch, branch_info(b, len).relative) << hex;
  return len == ref_len && lea == ref_lea && branch == branch_info(b, len).relative;
}

TEST(Sweep, TableLengthsAreCapstonesOverEveryOpcodeAndModrm) {
  Reference ref;
  Noise noise;
  const std::vector<Bytes> prefixes = {{},     {0x66}, {0xf3}, {0xf2}, {0x64}, {0xf0}, {0x66, 0x2e},
                                       {0x66, 0x66, 0x2e}};
  const Bytes maps[] = {{}, {0x0f}, {0x0f, 0x38}, {0x0f, 0x3a}};
  std::size_t known = 0, mismatches = 0;
  for (const Bytes& p : prefixes)
    // REX.W changes immediates, and with 66 Capstone's lengths (a REX byte
    // is the opcode enumerated after any prefix too: 0x40 .. 0x4f).
    for (const int rex : p.empty() || p == Bytes{0x66} ? std::vector<int>{-1, 0x41, 0x48, 0x4f} : std::vector<int>{-1, 0x4c})
      for (const Bytes& map : maps)
        for (int op = 0; op < 256; ++op)
          for (int modrm = 0; modrm < 256; ++modrm)
            for (int sib : {0x00, 0x05}) {  // base 5 with mod 0: a disp32 follows
              if (sib == 0x05 && !((modrm >> 6) != 3 && (modrm & 7) == 4)) continue;
              std::uint8_t b[32];
              std::size_t k = 0;
              for (std::uint8_t x : p) b[k++] = x;
              if (rex >= 0) b[k++] = static_cast<std::uint8_t>(rex);
              for (std::uint8_t x : map) b[k++] = x;
              b[k++] = static_cast<std::uint8_t>(op);
              b[k++] = static_cast<std::uint8_t>(modrm);
              b[k++] = static_cast<std::uint8_t>(sib);
              while (k < sizeof b) b[k++] = noise.next();
              if (!agrees(ref, b, sizeof b, known) && ++mismatches > 20) FAIL() << "too many mismatches";
            }
  EXPECT_GT(known, 1'500'000u);  // the table answers for most of these
  RecordProperty("known", static_cast<int>(known));
}

TEST(Sweep, VexLengthsAreCapstones) {
  Reference ref;
  Noise noise;
  std::size_t known = 0, mismatches = 0;
  // c5 RvvvvLpp, c4 RXBmmmmm WvvvvLpp: payloads with every L and pp, both
  // R, vvvv unused (1111) or not, W both; maps 0F, 0F38, 0F3A (and one the
  // table leaves to Capstone).
  std::vector<Bytes> heads;
  for (int b1 : {0xf8, 0xf9, 0xfe, 0xff, 0x78, 0x46}) heads.push_back({0xc5, static_cast<std::uint8_t>(b1)});
  for (int m : {1, 2, 3, 4})
    for (int b2 : {0x78, 0xfd, 0x46})
      heads.push_back({0xc4, static_cast<std::uint8_t>(0xe0 | m), static_cast<std::uint8_t>(b2)});
  for (const Bytes& h : heads)
    for (int op = 0; op < 256; ++op)
      for (int modrm = 0; modrm < 256; ++modrm) {
        std::uint8_t b[24];
        std::size_t k = 0;
        for (std::uint8_t x : h) b[k++] = x;
        b[k++] = static_cast<std::uint8_t>(op);
        b[k++] = static_cast<std::uint8_t>(modrm);
        while (k < sizeof b) b[k++] = noise.next();
        if (!agrees(ref, b, sizeof b, known) && ++mismatches > 20) FAIL() << "too many mismatches";
      }
  EXPECT_GT(known, 300'000u);
}

/// libc's bytes and the file ranges of its executable sections.
struct Code {
  Bytes file;
  std::vector<std::pair<std::size_t, std::size_t>> sections;  ///< [offset, size)
};

Code libc_code() {
  Code c;
  const std::string path = uprobe::resolve_library("libc.so.6");
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return c;
  std::fseek(f, 0, SEEK_END);
  c.file.resize(static_cast<std::size_t>(std::ftell(f)));
  std::fseek(f, 0, SEEK_SET);
  c.file.resize(std::fread(c.file.data(), 1, c.file.size(), f));
  std::fclose(f);
  if (c.file.size() < sizeof(Elf64_Ehdr)) return c;
  Elf64_Ehdr eh;
  std::memcpy(&eh, c.file.data(), sizeof eh);
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, c.file.data() + eh.e_shoff + i * sizeof sh, sizeof sh);
    if (sh.sh_type == SHT_PROGBITS && (sh.sh_flags & SHF_EXECINSTR) && sh.sh_offset + sh.sh_size <= c.file.size())
      c.sections.emplace_back(sh.sh_offset, sh.sh_size);
  }
  return c;
}

TEST(Sweep, LibcInstructionsAgreeWithCapstone) {
  const Code c = libc_code();
  ASSERT_FALSE(c.sections.empty());
  Reference ref;
  std::size_t known = 0, starts = 0, mismatches = 0;
  for (const auto& [off, size] : c.sections) {
    const std::uint8_t* b = c.file.data() + off;
    // Every instruction start of a sweep of the section (Capstone's), and
    // every fifth byte (inside instructions too).
    for (std::size_t p = 0; p < size;) {
      ++starts;
      if (!agrees(ref, b + p, size - p, known) && ++mismatches > 20) FAIL() << "too many mismatches";
      bool lea = false, decoded = false;
      const std::size_t n = ref.step(b + p, size - p, lea, decoded);
      p += n ? n : 1;
    }
    for (std::size_t p = 0; p < size; p += 5)
      if (!agrees(ref, b + p, size - p, known) && ++mismatches > 20) FAIL() << "too many mismatches";
  }
  EXPECT_GT(starts, 100'000u);
  EXPECT_GT(known, starts);  // most instruction starts, and most bytes, are the table's
  RecordProperty("starts", static_cast<int>(starts));
  RecordProperty("known", static_cast<int>(known));
}

TEST(Sweep, StepFallsBackToCapstoneAndToVexLength) {
  // EVEX vpcmpeqb (%rdi), %ymm16, %k0: Capstone 4 cannot decode it, the
  // sweep steps over it (6 bytes); with vex off it is undecodable.
  const std::uint8_t evex[] = {0x62, 0xb1, 0x7d, 0x20, 0x74, 0x07, 0xc3};
  SweepStep s = sweep_step(evex, sizeof evex, true);
  EXPECT_TRUE(s.capstone);
  EXPECT_FALSE(s.lea);
  EXPECT_EQ(s.len, 6u);
  EXPECT_EQ(sweep_step(evex, sizeof evex, false).len, 0u);
  // VEX kmovd %k0, %edx: Capstone 4 cannot decode it either; the table
  // steps over it.
  const std::uint8_t kmovd[] = {0xc5, 0xfb, 0x93, 0xd0, 0xc3};
  s = sweep_step(kmovd, sizeof kmovd, true);
  EXPECT_FALSE(s.capstone);
  EXPECT_EQ(s.len, 4u);
  s = sweep_step(kmovd, sizeof kmovd, false);  // without vex: Capstone's answer alone
  EXPECT_TRUE(s.capstone);
  EXPECT_EQ(s.len, 0u);
  // lock cmpxchg %rcx,(%rdx): the table's; xtest (0f 01 d6): Capstone's.
  const std::uint8_t lock[] = {0xf0, 0x48, 0x0f, 0xb1, 0x0a};
  s = sweep_step(lock, sizeof lock, true);
  EXPECT_FALSE(s.capstone);
  EXPECT_EQ(s.len, 5u);
  const std::uint8_t xtest[] = {0x0f, 0x01, 0xd6};
  s = sweep_step(xtest, sizeof xtest, true);
  EXPECT_TRUE(s.capstone);
  EXPECT_EQ(s.len, 3u);
  // A truncated instruction is undecodable: jmp rel32 with 3 bytes of it.
  const std::uint8_t cut[] = {0xe9, 0x00, 0x00, 0x00};
  EXPECT_EQ(sweep_step(cut, sizeof cut, true).len, 0u);
  // lea 0x100(%rip), %rax: a lea; jne rel8: a branch.
  const std::uint8_t lea[] = {0x48, 0x8d, 0x05, 0x00, 0x01, 0x00, 0x00};
  s = sweep_step(lea, sizeof lea, true);
  EXPECT_TRUE(s.lea);
  EXPECT_EQ(s.len, 7u);
  const std::uint8_t jne[] = {0x75, 0x10};
  s = sweep_step(jne, sizeof jne, true);
  EXPECT_TRUE(s.branch);
  EXPECT_EQ(s.len, 2u);
}

// The batch index of a neighbour (neighbour_branch_targets()): the target of
// every branch and rip-relative lea its sweep decodes, nothing else; a
// window it misses is one the exact check accepts, one it reaches is refused
// (validate.cpp checks only those).
TEST(NeighbourIndex, HoldsExactlyTheSweepsTargets) {
  // jmp rel32 to +0x40 (from its end at +5), jne rel8 to +0x20 (end +7),
  // lea 0x100(%rip), %rax (end +14), then `mov $0xe8e8e8e8, %eax` (bytes of
  // calls inside an immediate: no target), ret.
  const Bytes f = {0xe9, 0x3b, 0x00, 0x00, 0x00, 0x75, 0x19, 0x48, 0x8d, 0x05, 0xf2, 0x00,
                   0x00, 0x00, 0xb8, 0xe8, 0xe8, 0xe8, 0xe8, 0xc3};
  std::vector<std::int32_t> t = {7};  // appended after what is there
  ASSERT_TRUE(neighbour_branch_targets(f.data(), f.size(), t));
  EXPECT_EQ(t, (std::vector<std::int32_t>{7, 0x20, 0x40, 0x100}));
  std::string why;
  EXPECT_FALSE(check_neighbour_branches(f.data(), f.size(), 0x3e, 5, why));  // the jmp's target is inside
  EXPECT_TRUE(check_neighbour_branches(f.data(), f.size(), 0x40, 5, why)) << why;  // at the entry itself: fine
  // Undecodable bytes (a truncated jmp rel32 at the end): not whole.
  const Bytes cut = {0x90, 0xe9, 0x00, 0x00};
  t.clear();
  EXPECT_FALSE(neighbour_branch_targets(cut.data(), cut.size(), t));
}

TEST(NeighbourIndex, LibcWindowsItClearsAreAcceptedAndTheOthersRefused) {
  const std::string path = uprobe::resolve_library("libc.so.6");
  std::set<std::pair<std::uint64_t, std::uint64_t>> funcs;  // (file offset, size)
  for (const uprobe::Symbol& s : uprobe::read_symbols(path))
    if (s.type == STT_FUNC && s.executable && s.in_file && s.size > 0 && s.size < (64u << 10))
      funcs.emplace(s.offset, s.size);
  ASSERT_GT(funcs.size(), 1000u);
  FILE* file = std::fopen(path.c_str(), "rb");
  ASSERT_NE(file, nullptr);
  std::size_t windows = 0, cleared = 0, refused = 0, undecodable = 0;
  std::vector<std::int32_t> t;
  for (const auto& [offset, size] : funcs) {
    Bytes f(static_cast<std::size_t>(size));
    ASSERT_EQ(std::fseek(file, static_cast<long>(offset), SEEK_SET), 0);
    f.resize(std::fread(f.data(), 1, f.size(), file));
    t.clear();
    const bool whole = neighbour_branch_targets(f.data(), f.size(), t);
    ASSERT_TRUE(std::is_sorted(t.begin(), t.end()));
    undecodable += !whole;
    // Windows before and after the function (a neighbour's entries), and on
    // each of its own targets (a window there is reached).
    std::vector<std::int64_t> wins;
    for (std::int64_t w = -4096; w < 0; w += 509) wins.push_back(w);
    for (std::int64_t w = static_cast<std::int64_t>(f.size()); w < static_cast<std::int64_t>(f.size()) + 4096; w += 509)
      wins.push_back(w);
    for (std::size_t k = 0; k < t.size(); k += 7) wins.push_back(t[k] - 2);
    for (const std::int64_t win : wins) {
      for (const std::size_t len : {std::size_t{5}, std::size_t{9}}) {
        ++windows;
        const auto next = std::upper_bound(t.begin(), t.end(), win);
        const bool clear = next == t.end() || *next >= win + static_cast<std::int64_t>(len);
        std::string why;
        const bool ok = check_neighbour_branches(f.data(), f.size(), win, len, why);
        if (!whole) continue;  // (undecodable bytes: the exact check decides)
        if (clear) {
          ++cleared;
          EXPECT_TRUE(ok) << "libc+" << std::hex << offset << " window " << win << "+" << len << ": " << why;
        } else {
          ++refused;
          EXPECT_FALSE(ok) << "libc+" << std::hex << offset << " window " << win << "+" << len;
          EXPECT_TRUE(why.find("branches to the window's +") != std::string::npos ||
                      why.find("takes the address the window's +") != std::string::npos)
              << why;
        }
      }
    }
  }
  std::fclose(file);
  EXPECT_GT(cleared, windows / 2);  // most windows are cleared without a sweep
  EXPECT_GT(refused, 100u);         // and the windows on targets are refused
  RecordProperty("windows", static_cast<int>(windows));
  RecordProperty("cleared", static_cast<int>(cleared));
  RecordProperty("undecodable", static_cast<int>(undecodable));
}

}  // namespace
}  // namespace uprobe::arch
