// SPDX-License-Identifier: MIT
// A program single-stepping itself: it sets TF with pushf/popf and counts the
// single-step traps in its own SIGTRAP handler (installed after the library
// started, so libuprobe forwards them). Across a region holding probes (a
// nop5 site, int3 or optimized; an out-of-line instruction; an emulated push;
// a call to a function with a probed nop5 entry) it must see exactly the
// traps, at exactly the addresses, it sees without the probes: the probed
// instructions single-step as one instruction each, as with the kernel's
// uprobes. A probed `pushf; pop %rax` (probe on the pushf, or on the nop5
// before it) reads TF == 0 when not stepping and the same flags as without
// the probe when stepping.

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <cstring>
#include <vector>

#include "life_common.hpp"
#include "punned_range.hpp"

using namespace lifetest;

namespace {

/// This suite's sites inside functions are int3 and out-of-line sites (what
/// it checks is how they step): windows inside functions stay off
/// (Config::optimize_windows; tests/opt/window_test.cpp covers them).
[[maybe_unused]] testing::Environment* const g_windows_off =
    testing::AddGlobalTestEnvironment(windows_off_environment());

constexpr std::uint64_t kTF = 0x100;
constexpr int kMaxSteps = 256;

struct StepLog {
  std::atomic<int> n{0};
  std::uint64_t rip[kMaxSteps];
  std::atomic<int> bad_code{0};
};
StepLog g_log;

/// The program's SIGTRAP handler: one call per single-step trap.
void on_step(int sig, siginfo_t* si, void* ctx) {
  const auto* uc = static_cast<const ucontext_t*>(ctx);
  const int i = g_log.n.fetch_add(1);
  if (i < kMaxSteps) g_log.rip[i] = static_cast<std::uint64_t>(uc->uc_mcontext.gregs[REG_RIP]);
  if (sig != SIGTRAP || si->si_code != TRAP_TRACE) g_log.bad_code.fetch_add(1);
}

/// Installs the program's handler for the test's lifetime (after the
/// library started: a probe was registered and removed first).
struct ProgramHandler {
  struct sigaction old {};
  ProgramHandler() {
    Counter c;
    uprobe::Attachment start(vaddr(lf_mul), c);  // the runtime owns SIGTRAP from here on
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_step;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    EXPECT_EQ(sigaction(SIGTRAP, &sa, &old), 0);
  }
  ~ProgramHandler() { sigaction(SIGTRAP, &old, nullptr); }
};

std::vector<std::uint64_t> take_log() {
  const int n = g_log.n.load();
  std::vector<std::uint64_t> v(g_log.rip, g_log.rip + (n < kMaxSteps ? n : kMaxSteps));
  g_log.n = 0;
  return v;
}

std::string render(const std::vector<std::uint64_t>& v) {
  std::string s;
  char b[32];
  const auto base = addr(lf_step_run);
  for (std::uint64_t ip : v) {
    if (ip >= base && ip < base + 0x40)
      std::snprintf(b, sizeof b, " run+%llu", static_cast<unsigned long long>(ip - base));
    else if (ip >= addr(lf_step_ret) && ip < addr(lf_step_ret) + 0x20)
      std::snprintf(b, sizeof b, " ret+%llu", static_cast<unsigned long long>(ip - addr(lf_step_ret)));
    else if (ip >= addr(lf_win) && ip < addr(lf_win) + 0x10)
      std::snprintf(b, sizeof b, " win+%llu", static_cast<unsigned long long>(ip - addr(lf_win)));
    else if (ip >= addr(lf_step_win) && ip < addr(lf_step_win) + 0x20)
      std::snprintf(b, sizeof b, " stepwin+%llu", static_cast<unsigned long long>(ip - addr(lf_step_win)));
    else if (ip >= addr(lf_add) && ip < addr(lf_add) + 0x10)
      std::snprintf(b, sizeof b, " add+%llu", static_cast<unsigned long long>(ip - addr(lf_add)));
    else if (ip >= addr(lf_step_ev) && ip < addr(lf_step_ev) + 0x30)
      std::snprintf(b, sizeof b, " ev+%llu", static_cast<unsigned long long>(ip - addr(lf_step_ev)));
    else if (ip >= addr(lf_step_callee) && ip < addr(lf_step_callee) + 0x20)
      std::snprintf(b, sizeof b, " callee+%llu", static_cast<unsigned long long>(ip - addr(lf_step_callee)));
    else
      std::snprintf(b, sizeof b, " %#llx", static_cast<unsigned long long>(ip));
    s += b;
  }
  return s;
}

struct Baseline {
  std::vector<std::uint64_t> steps;
  std::uint64_t result = 0;
};

Baseline baseline() {
  Baseline b;
  g_log.n = 0;
  b.result = lf_step_run(5, 7);
  b.steps = take_log();
  return b;
}

/// Runs lf_step_run(5, 7) `rounds` times: each gives the unprobed result and
/// the program sees exactly the unprobed run's single-step traps.
/// Optimization on, with `t`'s choice of tactics at a site (the caller's
/// ConfigGuard restores the configuration).
void use_site_tactics(uprobe::SiteTactics t) {
  uprobe::Config c = uprobe::configuration();
  c.optimize = true;
  c.optimize_windows = true;
  c.site_tactics = t;
  uprobe::configure(c);
}

void runs_as_baseline(const Baseline& base, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    g_log.n = 0;
    const std::uint64_t r = lf_step_run(5, 7);
    const std::vector<std::uint64_t> steps = take_log();
    EXPECT_EQ(r, base.result);
    EXPECT_EQ(render(steps), render(base.steps)) << "single-step traps seen by the program";
    EXPECT_EQ(steps.size(), base.steps.size());
  }
}

void check_region(Kind kind, uprobe::XolMode xol) {
  ConfigGuard guard;
  ProgramHandler ph;
  const Baseline base = baseline();
  // (5 + 7) * 3 + (5 + 1) = 42; the region is 14 instructions (3 in the
  // callee) plus the popfq that clears TF: 15 traps without any probe.
  ASSERT_EQ(base.result, 42u);
  ASSERT_EQ(base.steps.size(), 15u) << render(base.steps);
  ASSERT_EQ(g_log.bad_code.load(), 0);
  use_kind(kind);
  uprobe::Config c = uprobe::configuration();
  c.xol = xol;
  uprobe::configure(c);
  Counter nop5, xolc, push, callee;
  uprobe::Attachment a(at(lf_step_run, lf_step_nop5_site), nop5), b(at(lf_step_run, lf_step_xol_site), xolc),
      p(at(lf_step_run, lf_step_push_site), push), e(vaddr(lf_step_callee), callee);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, kind_mode(kind));
  ASSERT_EQ(uprobe::probe_info(e.probe()).mode, kind_mode(kind));
  ASSERT_EQ(uprobe::probe_info(b.probe()).mode, uprobe::ProbeMode::int3);
  ASSERT_FALSE(uprobe::probe_info(b.probe()).emulated) << "the imul runs out of line";
  ASSERT_TRUE(uprobe::probe_info(p.probe()).emulated) << "the push is emulated";
  const uprobe::Stats s0 = uprobe::stats();
  runs_as_baseline(base, 3);
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(nop5.hits.load(), 3u);
  EXPECT_EQ(xolc.hits.load(), 3u);
  EXPECT_EQ(push.hits.load(), 3u);
  EXPECT_EQ(callee.hits.load(), 3u);
  EXPECT_EQ(d.hits, 12u) << stats_str(d);
  EXPECT_EQ(g_log.bad_code.load(), 0) << "every trap the program saw was a TRAP_TRACE";
  // Not stepping any more: the probes still work and nothing traps.
  g_log.n = 0;
  Counter plain;
  {
    uprobe::Attachment pa(vaddr(lf_add), plain);
    for (std::uint64_t i = 0; i < 10; ++i) EXPECT_EQ(lf_add(i, 2), i + 2);
  }
  EXPECT_EQ(plain.hits.load(), 10u);
  EXPECT_EQ(g_log.n.load(), 0) << "a trap reached the program while it was not stepping";
}

/// A probed rep movsb runs out of line under the program's TF: the
/// iterations' traps inside the copy are not the program's, which sees the
/// instruction step as one (the same trap after it as without the probe,
/// none of the traps at it in between).
void check_rep(uprobe::XolMode xol) {
  ConfigGuard guard;
  ProgramHandler ph;
  uprobe::Config c = uprobe::configuration();
  c.xol = xol;
  uprobe::configure(c);
  const std::uint64_t rep = addr(lf_step_rep) + lf_step_rep_site;
  for (std::uint64_t n : {0u, 1u, 2u, 5u, 33u}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    g_log.n = 0;
    ASSERT_EQ(lf_step_rep(n), n);
    const std::vector<std::uint64_t> base = take_log();
    std::vector<std::uint64_t> want;
    for (std::uint64_t ip : base)
      if (ip != rep) want.push_back(ip);
    ASSERT_EQ(base.size() - want.size(), n > 1 ? n - 1 : 0) << render(base) << ": a trap after each iteration but the last";
    Counter hit;
    std::uint64_t r;
    std::vector<std::uint64_t> steps;
    {
      uprobe::Attachment a(at(lf_step_rep, lf_step_rep_site), hit);
      ASSERT_FALSE(uprobe::probe_info(a.probe()).emulated);
      std::memset(lf_rep_buf + 64, 0, 64);
      g_log.n = 0;
      r = lf_step_rep(n);
      steps = take_log();
    }
    EXPECT_EQ(r, n);
    EXPECT_EQ(hit.hits.load(), 1u);
    EXPECT_EQ(std::memcmp(lf_rep_buf + 64, lf_rep_buf, n), 0);
    EXPECT_EQ(render(steps), render(want));
  }
  EXPECT_EQ(g_log.bad_code.load(), 0) << "every trap the program saw was a TRAP_TRACE";
}

TEST(Step, ProbedRepMovsbStepsAsOne) { check_rep(uprobe::XolMode::jump_back); }
TEST(Step, ProbedRepMovsbStepsAsOneSingleStepXol) { check_rep(uprobe::XolMode::single_step); }

/// Punned jumps (E9Patch's B2) at the region's imul (4 bytes) and push (1
/// byte) under the program's TF: the step after the site's jmp lands on the
/// site's hop (in libuprobe's memory, not the stub), which is followed to the
/// stub and run there as for a nop5; the displaced instruction then steps as
/// one through its window slot. The program sees exactly its 15 traps.
TEST(Step, RegionWithPunnedProbes) {
  ConfigGuard guard;
  ProgramHandler ph;
  const Baseline base = baseline();
  ASSERT_EQ(base.result, 42u);
  ASSERT_EQ(base.steps.size(), 15u) << render(base.steps);
  use_site_tactics(uprobe::SiteTactics::instruction_only);
  // One at a time: the push is one of the bytes the imul's punned jump keeps.
  for (const std::uint64_t site : {lf_step_xol_site, lf_step_push_site}) {
    SCOPED_TRACE("site run+" + std::to_string(site));
    Counter hits;
    uprobe::Attachment a(at(lf_step_run, site), hits);
    ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_punned)
        << uprobe::probe_info(a.probe()).why_not_optimized;
    runs_as_baseline(base, 3);
    EXPECT_EQ(hits.hits.load(), 3u);
  }
  EXPECT_EQ(g_log.bad_code.load(), 0) << "every trap the program saw was a TRAP_TRACE";
}

/// A padded punned jump (E9Patch's T1: redundant prefixes before the
/// opcode) at the region's imul (4 bytes) under the program's TF: the CPU
/// steps the prefixed jump as one instruction onto the hop, whose site's jump
/// the SIGTRAP handler reads past its prefixes; the program sees exactly its
/// 15 traps, the imul's site stepping as one.
TEST(Step, RegionWithPaddedProbe) {
  ConfigGuard guard;
  ProgramHandler ph;
  const Baseline base = baseline();
  ASSERT_EQ(base.result, 42u);
  ASSERT_EQ(base.steps.size(), 15u) << render(base.steps);
  use_site_tactics(uprobe::SiteTactics::instruction_padded);
  const void* site = at(lf_step_run, lf_step_xol_site);
  const std::vector<std::uint8_t> orig(static_cast<const std::uint8_t*>(site),
                                       static_cast<const std::uint8_t*>(site) + 16);
  Counter hits;
  {
    uprobe::Attachment a(site, hits);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    ASSERT_EQ(info.mode, uprobe::ProbeMode::optimized_padded) << info.why_not_optimized;
    ASSERT_EQ(info.displaced, 4u);
    const auto* b = static_cast<const std::uint8_t*>(site);
    EXPECT_EQ(b[0], 0x26);  // the first prefix (ES)
    EXPECT_EQ(b[1], 0xe9);
    for (std::size_t i = 4; i < 16; ++i) EXPECT_EQ(b[i], orig[i]) << "byte " << i << " changed";
    runs_as_baseline(base, 3);
    EXPECT_EQ(hits.hits.load(), 3u);
  }
  for (std::size_t i = 0; i < 16; ++i)
    EXPECT_EQ(static_cast<const std::uint8_t*>(site)[i], orig[i]) << "byte " << i << " not restored";
  EXPECT_EQ(g_log.bad_code.load(), 0) << "every trap the program saw was a TRAP_TRACE";
}

/// Successor eviction (E9Patch's T2) under the program's TF: lf_step_ev's
/// 1-byte xchg site, whose punned jump's one page is taken here (mapped
/// PROT_NONE with MAP_FIXED_NOREPLACE), evicts its successor (an add a
/// branch lands on) to a trampoline. The program steps through the site
/// (its hop, then its slot, silent), onto the successor's jump, into the
/// trampoline (silent: the jump and the relocated add step as the add) and
/// back; with b == 0 the branch lands on the successor directly. Each run
/// sees exactly the unprobed run's traps (8 and 7, at the same addresses),
/// the probe hits once per pass through the site, and the bytes are the
/// file's after detach.
TEST(Step, RegionWithEvictedSuccessor) {
  ConfigGuard guard;
  ProgramHandler ph;
  const void* site = at(lf_step_ev, lf_step_ev_site);
  const auto s = reinterpret_cast<std::uint64_t>(site);
  const std::vector<std::uint8_t> orig(static_cast<const std::uint8_t*>(site),
                                       static_cast<const std::uint8_t*>(site) + 16);
  ASSERT_EQ(orig[0], 0x91);
  ASSERT_EQ(orig[1], 0x48);
  std::vector<std::uint64_t> base[2];
  for (int nz = 0; nz < 2; ++nz) {
    g_log.n = 0;
    ASSERT_EQ(lf_step_ev(1000, nz * 7), 1000u + nz * 7 + 0x1234);
    base[nz] = take_log();
  }
  // Traps after: test, jz, xchg, add, add, pushfq, andq, popfq (TF takes
  // effect after the instruction after the popfq that sets it).
  ASSERT_EQ(render(base[1]), " ev+19 ev+21 ev+22 ev+28 ev+31 ev+32 ev+40 ev+41");
  ASSERT_EQ(render(base[0]), " ev+19 ev+22 ev+28 ev+31 ev+32 ev+40 ev+41");  // (jz to the add)
  ASSERT_EQ(g_log.bad_code.load(), 0);
  // The page the site's punned jump (e9 48 05 34 12) selects: taken.
  std::int32_t rel;
  std::memcpy(&rel, orig.data() + 1, 4);
  const std::uint64_t page = (s + 5 + static_cast<std::uint64_t>(static_cast<std::int64_t>(rel))) & ~0xfffull;
  // (Mapped here, or already: the heap may lie there.)
  uprobe_test::TakenPages taken(page, page + 1);
  ASSERT_TRUE(taken.ok()) << "the punned jump's page " << uprobe_test::hex(page) << " could not be taken";
  use_site_tactics(uprobe::SiteTactics::windows);
  ASSERT_TRUE(uprobe::configuration().optimize_evicted) << "successor eviction is on by default";
  Counter hits;
  {
    uprobe::Attachment a(site, hits);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    ASSERT_EQ(info.mode, uprobe::ProbeMode::optimized_evicted) << info.why_not_optimized;
    const auto* b = static_cast<const std::uint8_t*>(site);
    EXPECT_EQ(b[0], 0xe9);  // the site's jump
    EXPECT_EQ(b[1], 0xe9);  // the successor's, whose bytes its rel32 keeps
    EXPECT_EQ(b[6], orig[6]) << "the successor's last byte changed";
    for (int round = 0; round < 3; ++round) {
      for (int nz = 1; nz >= 0; --nz) {
        SCOPED_TRACE("round " + std::to_string(round) + ", b " + (nz ? "!= 0" : "== 0"));
        g_log.n = 0;
        EXPECT_EQ(lf_step_ev(1000 + round, nz * 7), 1000u + round + nz * 7 + 0x1234);
        const std::vector<std::uint64_t> steps = take_log();
        EXPECT_EQ(render(steps), render(base[nz])) << "single-step traps seen by the program";
        EXPECT_EQ(steps.size(), base[nz].size());
      }
    }
    EXPECT_EQ(hits.hits.load(), 3u);
    EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_evicted);
  }
  for (std::size_t i = 0; i < 16; ++i)
    EXPECT_EQ(static_cast<const std::uint8_t*>(site)[i], orig[i]) << "byte " << i << " not restored";
  EXPECT_EQ(g_log.bad_code.load(), 0) << "every trap the program saw was a TRAP_TRACE";
}

TEST(Step, RegionWithInt3Probes) { check_region(Kind::int3, uprobe::XolMode::jump_back); }
TEST(Step, RegionWithOptimizedProbes) { check_region(Kind::optimized, uprobe::XolMode::jump_back); }
TEST(Step, RegionWithInt3ProbesSingleStepXol) { check_region(Kind::int3, uprobe::XolMode::single_step); }

/// Stepping across a call to a function with an entry+return probe: the
/// return goes through the return trampoline, which must not be stepped
/// through either: the program sees the `ret` step land at the real return
/// address, as without the probe.
void check_return(Kind kind) {
  ConfigGuard guard;
  ProgramHandler ph;
  g_log.n = 0;
  ASSERT_EQ(lf_step_ret(20, 21), 42u);
  const std::vector<std::uint64_t> base = take_log();
  ASSERT_EQ(base.size(), 8u) << render(base);  // call, nop5, lea, ret, add, pushfq, andq, popfq
  use_kind(kind);
  Session s;
  s.adds = true;
  uprobe::Attachment a(vaddr(lf_add), s);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, kind_mode(kind));
  const uprobe::Stats s0 = uprobe::stats();
  for (int round = 0; round < 3; ++round) {
    g_log.n = 0;
    EXPECT_EQ(lf_step_ret(20, 21), 42u);
    const std::vector<std::uint64_t> steps = take_log();
    EXPECT_EQ(render(steps), render(base)) << "round " << round;
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(s.entries.load(), 3u);
  EXPECT_EQ(s.rets.load(), 3u);
  EXPECT_EQ(s.bad.load(), 0u);
  EXPECT_EQ(d.return_hits, 3u) << stats_str(d);
  EXPECT_EQ(uprobe::return_stack_depth(), 0u);
  EXPECT_EQ(g_log.bad_code.load(), 0);
}

TEST(Step, ReturnProbeInt3) { check_return(Kind::int3); }
TEST(Step, ReturnProbeOptimized) { check_return(Kind::optimized); }

/// Probes on the popfq that sets TF and on the one that clears it (int3: a
/// 1-byte instruction): the program's steps are the same as without them.
void check_popf(uprobe::XolMode xol) {
  ConfigGuard guard;
  ProgramHandler ph;
  const Baseline base = baseline();
  ASSERT_EQ(base.steps.size(), 15u) << render(base.steps);
  uprobe::Config c = uprobe::configuration();
  c.xol = xol;
  uprobe::configure(c);
  Counter on, off;
  uprobe::Attachment a(at(lf_step_run, lf_step_on_popf_site), on), b(at(lf_step_run, lf_step_off_popf_site), off);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::int3);
  for (int round = 0; round < 3; ++round) {
    g_log.n = 0;
    EXPECT_EQ(lf_step_run(5, 7), base.result);
    const std::vector<std::uint64_t> steps = take_log();
    EXPECT_EQ(render(steps), render(base.steps)) << "round " << round;
  }
  EXPECT_EQ(on.hits.load(), 3u);
  EXPECT_EQ(off.hits.load(), 3u);
  EXPECT_EQ(g_log.bad_code.load(), 0);
  g_log.n = 0;
  EXPECT_EQ(lf_add(2, 3), 5u);
  EXPECT_EQ(g_log.n.load(), 0) << "TF stayed set after the region";
}

TEST(Step, ProbesOnThePopfs) { check_popf(uprobe::XolMode::jump_back); }
TEST(Step, ProbesOnThePopfsSingleStepXol) { check_popf(uprobe::XolMode::single_step); }

/// Stepping across a function-entry probe with a real prologue. On int3
/// (Config::optimize off) every instruction steps at its own address, as
/// without the probe. Optimized, the jump displaced push/mov/add into a
/// window slot: the probe runs in the SIGTRAP handler and the window steps
/// as one instruction (the program sees the step after it, at lf_win+7, and
/// none at lf_win+1 or lf_win+4; never an address in our slots or stubs).
void check_window(bool optimized) {
  ConfigGuard guard;
  ProgramHandler ph;
  g_log.n = 0;
  ASSERT_EQ(lf_step_win(20, 21), 42u);
  const std::vector<std::uint64_t> base = take_log();
  const std::uint64_t w = addr(lf_win);
  std::vector<std::uint64_t> want;
  for (std::uint64_t ip : base)
    if (!optimized || (ip != w + 1 && ip != w + 4)) want.push_back(ip);
  ASSERT_EQ(base.size(), 10u);  // call, push, mov, add, pop, ret, add, pushfq, andq, popfq
  ASSERT_EQ(want.size(), optimized ? 8u : 10u);
  use_kind(optimized ? Kind::optimized : Kind::int3);
  Session s;
  s.adds = true;
  uprobe::Attachment a(vaddr(lf_win), s);
  const uprobe::ProbeMode mode = uprobe::probe_info(a.probe()).mode;
  if (optimized && mode != uprobe::ProbeMode::optimized_entry) GTEST_SKIP() << "entry not optimized here: " << mode;
  ASSERT_EQ(mode, optimized ? uprobe::ProbeMode::optimized_entry : uprobe::ProbeMode::int3);
  for (int round = 0; round < 3; ++round) {
    g_log.n = 0;
    EXPECT_EQ(lf_step_win(20, 21), 42u);
    const std::vector<std::uint64_t> steps = take_log();
    EXPECT_EQ(render(steps), render(want)) << "round " << round;
  }
  EXPECT_EQ(s.entries.load(), 3u);
  EXPECT_EQ(s.rets.load(), 3u);
  EXPECT_EQ(s.bad.load(), 0u);
  EXPECT_EQ(g_log.bad_code.load(), 0);
  g_log.n = 0;
  EXPECT_EQ(lf_win(1, 2), 3u);
  EXPECT_EQ(g_log.n.load(), 0);
}

TEST(Step, EntryWindowInt3) { check_window(false); }
TEST(Step, EntryWindowOptimized) { check_window(true); }

// --------------------------------------------------------------- pushf ----

void check_pushf(Kind kind, bool on_pushf, uprobe::XolMode xol) {
  ConfigGuard guard;
  ProgramHandler ph;
  // Baselines without probes.
  ASSERT_EQ(lf_pushf() & kTF, 0u);
  g_log.n = 0;
  const std::uint64_t stepped = lf_step_pushf();
  const std::vector<std::uint64_t> base_steps = take_log();
  ASSERT_EQ(stepped & kTF, kTF) << "pushf while stepping reads TF set";
  use_kind(kind);
  uprobe::Config c = uprobe::configuration();
  c.xol = xol;
  uprobe::configure(c);
  Counter cnt;
  uprobe::Attachment a(on_pushf ? at(lf_pushf, lf_pushf_site) : vaddr(lf_pushf), cnt);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, on_pushf ? uprobe::ProbeMode::int3 : kind_mode(kind));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(lf_pushf() & kTF, 0u) << "TF leaked into the program's pushf, call " << i;
  g_log.n = 0;
  const std::uint64_t stepped_probed = lf_step_pushf();
  const std::vector<std::uint64_t> steps = take_log();
  EXPECT_EQ(stepped_probed & 0xdd5, stepped & 0xdd5) << "flags pushed while stepping";
  EXPECT_EQ(render(steps), render(base_steps));
  EXPECT_EQ(cnt.hits.load(), 101u);
  EXPECT_EQ(g_log.bad_code.load(), 0);
}

TEST(Pushf, ProbeOnPushfReadsNoTF) { check_pushf(Kind::int3, true, uprobe::XolMode::jump_back); }
TEST(Pushf, ProbeOnPushfReadsNoTFSingleStepXol) { check_pushf(Kind::int3, true, uprobe::XolMode::single_step); }
TEST(Pushf, Int3ProbeBeforePushf) { check_pushf(Kind::int3, false, uprobe::XolMode::jump_back); }
TEST(Pushf, OptimizedProbeBeforePushf) { check_pushf(Kind::optimized, false, uprobe::XolMode::jump_back); }

}  // namespace
