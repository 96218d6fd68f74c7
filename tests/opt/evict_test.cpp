// SPDX-License-Identifier: MIT
// Successor eviction (E9Patch's tactic T2, ProbeMode::optimized_evicted,
// Config::optimize_evicted, on by default): a 1-byte site whose punned jump's one target
// page is taken (mapped here on purpose with MAP_FIXED_NOREPLACE before the
// attach) gets a jump once its successor has one of its own, to a
// trampoline running the successor relocated; the site's rel32 then reads
// the successor's new bytes. Exact: the mode, both jumps' bytes (the site's
// rel32 is the successor's opcode and first three rel32 bytes; nothing past
// the successor's jump changed), the trampoline's bytes (the successor's
// own, then a jump back past it), the hits, the results on both paths (a
// branch lands on the evicted successor), no trap in steady state, and the
// file's bytes after detach. Switched off, the same site stays int3 and says
// why.

#include <sys/mman.h>

#include <cstring>

#include "opt_common.hpp"
#include "uprobe/config.hpp"

extern "C" {
std::uint64_t ev_one(std::uint64_t, std::uint64_t);
std::uint64_t ev_off(std::uint64_t, std::uint64_t);
std::uint64_t ev_end(std::uint64_t);
std::uint64_t ev_next(std::uint64_t);
extern const std::uint64_t ev_one_site, ev_off_site, ev_end_site;
}

using namespace opttest;

namespace {

constexpr std::uint64_t kPage = 4096;

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

/// The one page a 1-byte site's punned jump (B2) may aim at, mapped
/// PROT_NONE (it must be free) for the life of the object.
class TakenPage {
 public:
  explicit TakenPage(std::uint64_t target) : base_(target & ~(kPage - 1)) {
    void* p = ::mmap(reinterpret_cast<void*>(base_), kPage, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    ok_ = p != MAP_FAILED && reinterpret_cast<std::uint64_t>(p) == base_;
    if (p != MAP_FAILED && !ok_) ::munmap(p, kPage);
  }
  ~TakenPage() {
    if (ok_) ::munmap(reinterpret_cast<void*>(base_), kPage);
  }
  TakenPage(const TakenPage&) = delete;
  TakenPage& operator=(const TakenPage&) = delete;
  bool ok() const { return ok_; }

 private:
  std::uint64_t base_;
  bool ok_ = false;
};

/// Config::optimize_evicted set to `on` for the life of the object.
class EvictSwitch {
 public:
  explicit EvictSwitch(bool on) : old_(uprobe::configuration()) {
    uprobe::Config c = old_;
    c.optimize_evicted = on;
    uprobe::configure(c);
  }
  ~EvictSwitch() { uprobe::configure(old_); }

 private:
  uprobe::Config old_;
};

std::int64_t rel_at(const std::vector<std::uint8_t>& b, std::size_t at) {
  std::int32_t r;
  std::memcpy(&r, b.data() + at, 4);
  return r;
}

/// The B2 target of the 1-byte site at `s` over the file's bytes `file`.
std::uint64_t b2_target(std::uint64_t s, const std::vector<std::uint8_t>& file) {
  return s + 5 + static_cast<std::uint64_t>(rel_at(file, 1));
}

TEST(Evict, SuccessorGetsItsJumpAndTheSiteReadsItsBytes) {
  const void* site = at(ev_one, ev_one_site);
  const auto s = reinterpret_cast<std::uint64_t>(site);
  const std::vector<std::uint8_t> file = file_bytes_at(site, 16);
  ASSERT_EQ(hex_bytes(std::vector<std::uint8_t>(file.begin(), file.begin() + 7)), "91 48 05 34 12 00 00");
  TakenPage taken(b2_target(s, file));
  ASSERT_TRUE(taken.ok()) << hex(b2_target(s, file)) << " was not free";
  EXPECT_TRUE(uprobe::Config{}.optimize_evicted) << "on by default";
  EXPECT_TRUE(uprobe::configuration().optimize_evicted) << "on by default";
  SiteCounter c(s);
  const uprobe::Stats s0 = uprobe::stats();
  std::uint64_t want_hits = 0;
  {
    uprobe::Attachment a(site, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    ASSERT_EQ(info.mode, uprobe::ProbeMode::optimized_evicted) << info.why_not_optimized;
    EXPECT_EQ(std::string(uprobe::to_string(info.mode)), "optimized-evicted");
    EXPECT_EQ(info.displaced, 1u);
    EXPECT_EQ(info.why_not_optimized, "");
    EXPECT_TRUE(rwx_mappings().empty());
    const std::vector<std::uint8_t> now = mem(site, 16);
    // The site: e9, then the successor's jump: e9 r0 r1 r2 r3 (unpadded,
    // the first form tried), then the successor's last byte and the rest
    // unchanged.
    EXPECT_EQ(hex(now[0]), "0xe9");
    EXPECT_EQ(hex(now[1]), "0xe9");
    for (std::size_t i = 6; i < 16; ++i) EXPECT_EQ(hex(now[i]), hex(file[i])) << "byte " << i << " changed";
    // The successor's trampoline: its own 6 bytes, then jmp back to s + 7.
    const std::uint64_t tramp = s + 6 + static_cast<std::uint64_t>(rel_at(now, 2));
    EXPECT_NE(tramp & ~(kPage - 1), b2_target(s, file) & ~(kPage - 1));
    const std::vector<std::uint8_t> t = mem(reinterpret_cast<const void*>(tramp), 19);
    EXPECT_EQ(hex_bytes(std::vector<std::uint8_t>(t.begin(), t.begin() + 6)), "48 05 34 12 00 00");
    EXPECT_EQ(hex(t[6]), "0xe9");
    EXPECT_EQ(hex(tramp + 11 + static_cast<std::uint64_t>(rel_at(t, 7))), hex(s + 7));
    // Then the mark the step path finds the successor by: ud2 'E' 'V', the
    // successor's address relative to the trampoline.
    EXPECT_EQ(hex_bytes(std::vector<std::uint8_t>(t.begin() + 11, t.begin() + 15)), "0f 0b 45 56");
    EXPECT_EQ(hex(tramp + static_cast<std::uint64_t>(rel_at(t, 15))), hex(s + 1));
    // The site's jump: rel32 = [e9, r0, r1, r2], to its hop, a jump on to
    // the stub in XOL memory.
    const std::uint64_t hop = s + 5 + static_cast<std::uint64_t>(rel_at(now, 1));
    EXPECT_EQ(hex(jump_target(site)), hex(hop));
    EXPECT_EQ(hex(hop & 0xff), hex((s + 5 + 0xe9) & 0xff));
    EXPECT_EQ(check_jump_into_xol(site), "");
    for (int i = 0; i < 1000; ++i) {
      const std::uint64_t x = 3u * i + 1, y = i % 3 == 0 ? 0 : 5u * i + 7;
      want_hits += y != 0;
      ASSERT_EQ(hex(ev_one(x, y)), hex(x + y + 0x1234)) << "call " << i;
    }
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(want_hits, 666u);
  EXPECT_EQ(c.hits.load(), want_hits);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(d.optimized, want_hits) << stats_str(d);
  EXPECT_EQ(d.emulated + d.out_of_line, 0u) << stats_str(d);  // no trap at the site nor at the successor
  EXPECT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file)) << "bytes not restored";
  EXPECT_EQ(hex(ev_one(5, 0)), hex(5 + 0x1234u));
  EXPECT_EQ(hex(ev_one(5, 9)), hex(5 + 9 + 0x1234u));
}

/// A function's last instruction (a 1-byte ret) whose punned jump's page is
/// taken: the bytes after it are the next function's, not known to be its
/// own code, so it evicts nothing (on by default) and stays int3, saying
/// why; both functions give their results, and the bytes are back.
TEST(Evict, NothingAfterAFunctionsLastReturnIsEvicted) {
  const void* site = at(ev_end, ev_end_site);
  const auto s = reinterpret_cast<std::uint64_t>(site);
  const std::vector<std::uint8_t> file = file_bytes_at(site, 16);
  ASSERT_EQ(hex_bytes(std::vector<std::uint8_t>(file.begin(), file.begin() + 4)), "c3 48 89 f8");
  ASSERT_EQ(reinterpret_cast<std::uint64_t>(&ev_next), s + 1);
  TakenPage taken(b2_target(s, file));
  ASSERT_TRUE(taken.ok()) << hex(b2_target(s, file)) << " was not free";
  SiteCounter c(s);
  {
    uprobe::Attachment a(site, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.mode, uprobe::ProbeMode::int3);
    EXPECT_EQ(info.why_not_optimized,
              "no free page at the addresses the punned jump's bytes after the instruction select (a 1-byte "
              "instruction has no room for a padded form); no successor eviction: the instruction is a jump or a "
              "return, and what follows it is not known to be code of its function");
    EXPECT_EQ(hex_bytes(mem(site, 4)), "cc 48 89 f8");
    for (std::uint64_t i = 0; i < 100; ++i) {
      ASSERT_EQ(hex(ev_end(i)), hex(i + 0x99)) << "call " << i;
      ASSERT_EQ(hex(ev_next(i)), hex(i + 0x139a)) << "call " << i;
    }
  }
  EXPECT_EQ(c.hits.load(), 100u);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file)) << "bytes not restored";
}

TEST(Evict, SwitchedOffTheSiteStaysInt3AndSaysWhy) {
  const void* site = at(ev_off, ev_off_site);
  const auto s = reinterpret_cast<std::uint64_t>(site);
  const std::vector<std::uint8_t> file = file_bytes_at(site, 16);
  TakenPage taken(b2_target(s, file));
  ASSERT_TRUE(taken.ok()) << hex(b2_target(s, file)) << " was not free";
  EvictSwitch off(false);
  SiteCounter c(s);
  {
    uprobe::Attachment a(site, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.mode, uprobe::ProbeMode::int3);
    EXPECT_EQ(info.why_not_optimized,
              "no free page at the addresses the punned jump's bytes after the instruction select (a 1-byte "
              "instruction has no room for a padded form); no successor eviction: successor eviction is switched "
              "off (Config::optimize_evicted)");
    EXPECT_EQ(hex_bytes(mem(site, 7)), "cc 48 05 78 16 00 00");
    for (int i = 0; i < 100; ++i) ASSERT_EQ(hex(ev_off(i, i + 1)), hex(i + (i + 1) + 0x1678u)) << "call " << i;
  }
  EXPECT_EQ(c.hits.load(), 100u);
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file)) << "bytes not restored";
}

}  // namespace
