// SPDX-License-Identifier: MIT
// Padded punned jumps (E9Patch's tactic T1, ProbeMode::optimized_padded):
// where the pages a punned jump's bytes select are taken (mapped here on
// purpose with MAP_FIXED_NOREPLACE before the attach), the site's jump gets
// one or two redundant prefixes before its opcode, which move its rel32 over
// the following bytes to another range. Exact: the mode, the site's bytes
// (prefixes, opcode, the free rel32 byte, every byte past the instruction
// unchanged), the hop's address (the range the file's bytes select, worked
// out here from them independently of the library), the hits, the
// function's results, and the original bytes after detach. Where every form's
// pages are taken the site stays int3 and says why.

#include <dlfcn.h>
#include <sys/mman.h>

#include <cstring>
#include <memory>

#include "opt_common.hpp"
#include "punned_range.hpp"

extern "C" {
std::uint64_t pad_one(std::uint64_t, std::uint64_t);
std::uint64_t pad_two(std::uint64_t, std::uint64_t);
std::uint64_t pad_none(std::uint64_t, std::uint64_t);
std::uint64_t pad_free(std::uint64_t, std::uint64_t);
std::uint64_t pad_forced(std::uint64_t, std::uint64_t);
std::uint64_t pad_resync(std::uint64_t, std::uint64_t);
std::uint64_t pad_far(std::uint64_t, std::uint64_t);
extern const std::uint64_t pad_one_site, pad_two_site, pad_none_site, pad_free_site, pad_forced_site, pad_resync_site,
    pad_far_site;
}

using namespace opttest;

namespace {

constexpr int kCalls = 1000;
constexpr std::uint64_t kPage = 4096;

/// Counts hits at `ip`.
struct SiteCounter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, bad_ip{0};
  std::uint64_t expect_ip;
  explicit SiteCounter(std::uint64_t ip) : expect_ip(ip) {}
  uprobe::Action handler(uprobe::Regs& regs) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    if (regs.rip != expect_ip) bad_ip.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

/// The targets [lo, lo + span) a punned jump at `site` over its 3-byte
/// instruction may take after `pad` prefixes, from the file's bytes `b`
/// (b[0..2] the instruction, b[3..] the bytes after it): its rel32 is
/// b[pad + 1 .. pad + 4], the bytes before b[3] free.
struct Range {
  std::uint64_t lo, span;
};
Range punned_range(std::uint64_t site, const std::vector<std::uint8_t>& b, unsigned pad) {
  std::uint32_t rel = 0;
  for (unsigned i = 3; i < pad + 5; ++i) rel |= static_cast<std::uint32_t>(b[i]) << (8 * (i - pad - 1));
  const std::uint64_t end = site + pad + 5;
  return {end + static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int32_t>(rel))),
          std::uint64_t{1} << (8 * (2 - pad))};
}

/// The pages holding a range, taken for the life of the object
/// (uprobe_test::TakenPages: mapped PROT_NONE here, or already mapped, as
/// the heap may be there).
class Taken {
 public:
  explicit Taken(Range r) : lo_(r.lo), hi_(r.lo + r.span), pages_(lo_, hi_) {}
  bool ok() const { return pages_.ok(); }
  std::string what() const {
    std::string w = hex(lo_ & ~(kPage - 1));
    w.append(" + ").append(hex(((hi_ + kPage - 1) & ~(kPage - 1)) - (lo_ & ~(kPage - 1))));
    return w;
  }

 private:
  std::uint64_t lo_, hi_;
  uprobe_test::TakenPages pages_;
};

using Fn = std::uint64_t (*)(std::uint64_t, std::uint64_t);

/// a + b - imm, the fixture's result (b = 0 takes the branch past the site).
std::uint64_t model(std::uint64_t a, std::uint64_t b, std::uint64_t imm) { return a + b - imm; }

/// The imm32 of the fixture's sub (bytes 5..6 after the site: i0, i1).
std::uint64_t imm_of(const std::vector<std::uint8_t>& b) { return b[5] | (std::uint64_t{b[6]} << 8); }

/// Attaches at `site` (the function `fn`), expects the jump padded with
/// `pad` prefixes into XOL memory at the range the file's bytes select, runs
/// kCalls calls (every third one with b = 0, which branches past the site),
/// and checks hits, results and the bytes restored at detach.
void expect_padded(Fn fn, const void* site, unsigned pad, uprobe::ProbeMode want) {
  const std::vector<std::uint8_t> file = file_bytes_at(site, 16);
  ASSERT_EQ(hex_bytes(std::vector<std::uint8_t>(file.begin(), file.begin() + 3)), "48 01 f0");
  ASSERT_EQ(file[3] & 0xf8, 0x48);
  ASSERT_EQ(file[4], 0x2d);
  const auto s = reinterpret_cast<std::uint64_t>(site);
  const std::uint64_t imm = imm_of(file);
  SiteCounter c(s);
  const uprobe::Stats s0 = uprobe::stats();
  std::uint64_t want_hits = 0;
  {
    uprobe::Attachment a(site, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    // B2 padded once only where every page of its range is mapped (the
    // heap may lie there).
    ASSERT_EQ(info.mode, punned_form_here(site, 3, info.mode, want)) << info.why_not_optimized;
    if (info.mode != want) pad = 1;
    EXPECT_EQ(info.displaced, 3u);
    EXPECT_EQ(info.why_not_optimized, "");
    EXPECT_EQ(check_jump_into_xol(site), "");
    EXPECT_TRUE(rwx_mappings().empty());
    const std::vector<std::uint8_t> now = mem(site, 16);
    static constexpr std::uint8_t kPrefix[] = {0x26, 0x36, 0x3e};
    for (unsigned i = 0; i < pad; ++i) EXPECT_EQ(hex(now[i]), hex(kPrefix[i])) << "prefix " << i;
    EXPECT_EQ(hex(now[pad]), "0xe9");
    // Only the instruction's own bytes changed.
    for (std::size_t i = 3; i < 16; ++i) EXPECT_EQ(hex(now[i]), hex(file[i])) << "byte " << i << " changed";
    // The hop: in the range this pad's bytes select.
    const Range r = punned_range(s, file, pad);
    const std::uint64_t hop = jump_target(site);
    EXPECT_GE(hop, r.lo) << hex(hop);
    EXPECT_LT(hop, r.lo + r.span) << hex(hop);
    for (int i = 0; i < kCalls; ++i) {
      const std::uint64_t x = 3u * i + 1, y = i % 3 == 0 ? 0 : 5u * i + 7;
      want_hits += y != 0;
      ASSERT_EQ(hex(fn(x, y)), hex(model(x, y, imm))) << "call " << i;
    }
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(want_hits, 666u);
  EXPECT_EQ(c.hits.load(), want_hits);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(d.optimized, want_hits) << stats_str(d);
  EXPECT_EQ(d.emulated + d.out_of_line, 0u) << stats_str(d);
  EXPECT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file)) << "bytes not restored";
}

TEST(Padded, OnePrefixWhereThePunnedJumpsPagesAreTaken) {
  const void* site = at(pad_one, pad_one_site);
  const auto s = reinterpret_cast<std::uint64_t>(site);
  const std::vector<std::uint8_t> file = file_bytes_at(site, 16);
  const Range b2 = punned_range(s, file, 0);
  EXPECT_EQ(b2.span, 0x10000u);
  EXPECT_EQ(b2.lo, s + 5 + 0x2d480000u);  // [free, free, 48, 2d]
  Taken taken(b2);
  ASSERT_TRUE(taken.ok()) << taken.what() << " was not free";
  expect_padded(pad_one, site, 1, uprobe::ProbeMode::optimized_padded);
  EXPECT_EQ(punned_range(s, file, 1).lo, s + 6 - 0x0fd2b800u);  // [free, 48, 2d, f0]
}

TEST(Padded, TwoPrefixesWhereTheOnePrefixPagesAreTakenToo) {
  const void* site = at(pad_two, pad_two_site);
  const auto s = reinterpret_cast<std::uint64_t>(site);
  const std::vector<std::uint8_t> file = file_bytes_at(site, 16);
  Taken b2(punned_range(s, file, 0)), p1(punned_range(s, file, 1));
  ASSERT_TRUE(b2.ok()) << b2.what() << " was not free";
  ASSERT_TRUE(p1.ok()) << p1.what() << " was not free";
  const Range r2 = punned_range(s, file, 2);
  EXPECT_EQ(r2.span, 1u);
  EXPECT_EQ(r2.lo, s + 7 - 0x2717d2b6u);  // [4a, 2d, e8, d8]: one address
  expect_padded(pad_two, site, 2, uprobe::ProbeMode::optimized_padded);
  EXPECT_EQ(jump_target(site), 0u) << "detached";
}

TEST(Padded, EveryFormsPagesTakenStaysInt3AndSaysWhy) {
  // Successor eviction (T2, on by default) switched off: int3 is what is
  // left (opt.Evict.* covers the default).
  ConfigGuard g;
  uprobe::Config cfg = uprobe::configuration();
  cfg.optimize_evicted = false;
  uprobe::configure(cfg);
  const void* site = at(pad_none, pad_none_site);
  const auto s = reinterpret_cast<std::uint64_t>(site);
  const std::vector<std::uint8_t> file = file_bytes_at(site, 16);
  Taken b2(punned_range(s, file, 0)), p1(punned_range(s, file, 1)), p2(punned_range(s, file, 2));
  ASSERT_TRUE(b2.ok() && p1.ok() && p2.ok()) << b2.what() << p1.what() << p2.what();
  SiteCounter c(s);
  const std::uint64_t imm = imm_of(file);
  {
    uprobe::Attachment a(site, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.mode, uprobe::ProbeMode::int3);
    EXPECT_EQ(info.why_not_optimized,
              "no free page at the addresses the punned jump's bytes after the instruction select, nor at those "
              "its 2 padded forms (1 to 2 redundant prefixes before the opcode) select; no successor eviction: "
              "successor eviction is switched off (Config::optimize_evicted)");
    EXPECT_EQ(hex(mem(site, 1)[0]), "0xcc");
    for (int i = 0; i < 100; ++i) ASSERT_EQ(hex(pad_none(i, i + 1)), hex(model(i, i + 1, imm))) << "call " << i;
  }
  EXPECT_EQ(c.hits.load(), 100u);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file)) << "bytes not restored";
}

/// The unpadded form's pages free up while the padded jump is in: a resync
/// of the address space (any dlopen()) recomputes the sites, and the site
/// keeps its padded form (the jump in memory), so it stays optimized, counts
/// exactly, and detach restores every byte.
TEST(Padded, KeepsItsFormWhenTheOtherPagesFreeUp) {
  const void* site = at(pad_resync, pad_resync_site);
  const auto s = reinterpret_cast<std::uint64_t>(site);
  const std::vector<std::uint8_t> file = file_bytes_at(site, 16);
  const std::uint64_t imm = imm_of(file);
  SiteCounter c(s);
  {
    auto taken = std::make_unique<Taken>(punned_range(s, file, 0));
    ASSERT_TRUE(taken->ok()) << taken->what() << " was not free";
    uprobe::Attachment a(site, c);
    ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_padded)
        << uprobe::probe_info(a.probe()).why_not_optimized;
    const std::vector<std::uint8_t> padded = mem(site, 16);
    EXPECT_EQ(hex(padded[0]), "0x26");
    taken.reset();  // B2's pages are free now
    void* h = ::dlopen("libc.so.6", RTLD_NOW);  // a resync of every probe's sites
    ASSERT_NE(h, nullptr);
    ::dlclose(h);
    EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_padded)
        << uprobe::probe_info(a.probe()).why_not_optimized;
    EXPECT_EQ(hex_bytes(mem(site, 16)), hex_bytes(padded));
    for (int i = 0; i < 100; ++i) ASSERT_EQ(hex(pad_resync(i, i + 1)), hex(model(i, i + 1, imm))) << "call " << i;
  }
  EXPECT_EQ(c.hits.load(), 100u);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file)) << "bytes not restored";
}

/// A site probed unpadded (B2), detached, then probed again padded (as
/// where B2's pages are taken; here by SiteTactics::instruction_padded, as
/// B2's hop page may still be mapped): B2's hop ~1.59 GiB below the site,
/// so its stub is made near it; the padded hop ~1.62 GiB above. The stub
/// the site had (kept for it while retired) is out of a rel32's reach of
/// the new hop, whose jump to it would wrap into unmapped memory (SIGSEGV at
/// the first hit): the new hop gets a stub within its reach. (Unpadded
/// twice first: retired blocks are reclaimed at most every 10 ms, so the
/// second detach leaves the stub retired, and taken back, as a quick
/// reattach does.) Exact: both modes, the hops in their ranges, each hop's
/// jump lands in r-x XOL memory, hits and results.
TEST(Padded, ANewFormsHopGetsAStubWithinItsReach) {
  const void* site = at(pad_far, pad_far_site);
  const auto s = reinterpret_cast<std::uint64_t>(site);
  const std::vector<std::uint8_t> file = file_bytes_at(site, 16);
  ASSERT_EQ(hex_bytes(std::vector<std::uint8_t>(file.begin(), file.begin() + 8)), "48 01 f0 b9 a0 60 00 00");
  const std::uint64_t imm = 0x60a0;
  const Range r0 = punned_range(s, file, 0), r1 = punned_range(s, file, 1);
  ASSERT_GT(s - (r0.lo + r0.span), std::uint64_t{5} << 28) << hex(r0.lo);  // 1.25 GiB below
  ASSERT_GT(r1.lo - s, std::uint64_t{5} << 28) << hex(r1.lo);               // 1.25 GiB above
  SiteCounter c(s);
  std::uint64_t hops[3] = {};
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round < 2 ? "unpadded" : "padded (SiteTactics::instruction_padded)");
    ConfigGuard g;
    if (round == 2) {
      uprobe::Config cfg = uprobe::configuration();
      cfg.site_tactics = uprobe::SiteTactics::instruction_padded;
      uprobe::configure(cfg);
    }
    uprobe::Attachment a(site, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    ASSERT_EQ(info.mode, round < 2 ? uprobe::ProbeMode::optimized_punned : uprobe::ProbeMode::optimized_padded)
        << info.why_not_optimized;
    hops[round] = jump_target(site);
    const Range& r = round < 2 ? r0 : r1;
    EXPECT_GE(hops[round], r.lo) << hex(hops[round]);
    EXPECT_LT(hops[round], r.lo + r.span) << hex(hops[round]);
    EXPECT_EQ(check_jump_into_xol(site), "");
    EXPECT_EQ(check_jump_into_xol(reinterpret_cast<const void*>(hops[round])), "") << "the hop's jump to its stub";
    for (int i = 0; i < 100; ++i) ASSERT_EQ(hex(pad_far(i, i + 1)), hex(model(i, i + 1, imm))) << "call " << i;
  }
  EXPECT_EQ(c.hits.load(), 300u);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file)) << "bytes not restored";
}

/// SiteTactics::instruction_padded pads wherever it can, its pages free or
/// not: one prefix here (the first padded form).
TEST(Padded, InstructionPaddedTacticsPadsFirst) {
  ConfigGuard g;
  uprobe::Config cfg = uprobe::configuration();
  cfg.site_tactics = uprobe::SiteTactics::instruction_padded;
  uprobe::configure(cfg);
  const void* site = at(pad_forced, pad_forced_site);
  const uprobe::FileOffset fo = uprobe::resolve_address(site);
  const uprobe::SitePlan p = uprobe::plan_site(fo.path, fo.offset);
  EXPECT_EQ(p.tactic, uprobe::ProbeMode::optimized_padded) << p.why_int3;
  EXPECT_EQ(p.displaced, 3u);
  expect_padded(pad_forced, site, 1, uprobe::ProbeMode::optimized_padded);
}

/// Nothing taken: the unpadded punned jump (B2), as before.
TEST(Padded, UnpaddedWhereThePunnedJumpsPagesAreFree) {
  const void* site = at(pad_free, pad_free_site);
  const uprobe::FileOffset fo = uprobe::resolve_address(site);
  const uprobe::SitePlan p = uprobe::plan_site(fo.path, fo.offset);
  EXPECT_EQ(p.tactic, uprobe::ProbeMode::optimized_punned) << p.why_int3;
  // (One prefix only where every page of B2's range is mapped: the heap may lie there.)
  expect_padded(pad_free, site, 0, uprobe::ProbeMode::optimized_punned);
}

}  // namespace
