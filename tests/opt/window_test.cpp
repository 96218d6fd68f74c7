// SPDX-License-Identifier: MIT
// Sites inside a function (Config::optimize_windows): the jump displaces the
// instructions from the site on, which run relocated in a window slot, as an
// entry's do (issue 16: the kprobes optimizer's rules at any instruction).
// Optimized: exact hits through the stub, the registers the consumer sees at
// the site, the function's results, only the window's first 5 bytes changed
// and every byte restored at detach. Refused (int3, with the reason): a
// branch in the function into the window, a PIC jump-table entry there, a
// label address stored in data (a computed goto), an indirect call before the
// window's last instruction, exception landing pads, a neighbour's branch. Every refused site
// still counts every call exactly and the function still computes right.

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>

#include "opt_common.hpp"

extern "C" {
std::uint64_t win_mid(std::uint64_t, std::uint64_t);
std::uint64_t win_rip(std::uint64_t, std::uint64_t);
std::uint64_t win_jcc(std::uint64_t, std::uint64_t);
std::uint64_t win_call_last(std::uint64_t, std::uint64_t);
std::uint64_t win_call_inside(std::uint64_t);
std::uint64_t win_icall_reg(std::uint64_t, std::uint64_t);
std::uint64_t win_icall_rip(std::uint64_t);
std::uint64_t win_icall_rsp(std::uint64_t, std::uint64_t);
std::uint64_t win_loop(std::uint64_t);
std::uint64_t win_table(std::uint64_t, std::uint64_t);
std::uint64_t win_goto(std::uint64_t, std::uint64_t);
std::uint64_t win_lsda(std::uint64_t, std::uint64_t);
std::uint64_t win_neigh_a(std::uint64_t, std::uint64_t);
std::uint64_t win_neigh_b(std::uint64_t, std::uint64_t);
extern const std::uint64_t win_mid_site, win_rip_site, win_jcc_site, win_call_last_site, win_call_inside_site,
    win_loop_site, win_loop_target, win_table_site, win_table_case1, win_goto_site, win_goto_label1, win_lsda_site, win_lsda_b1,
    win_neigh_a_site, win_icall_reg_site, win_icall_rip_site, win_icall_rsp_site;
}

using namespace opttest;

namespace {

constexpr int kCalls = 1000;

/// Counts hits at `ip`, keeps the registers of the last one.
struct SiteCounter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, bad_ip{0};
  std::uint64_t expect_ip;
  uprobe::Regs last{};
  explicit SiteCounter(std::uint64_t ip) : expect_ip(ip) {}
  uprobe::Action handler(uprobe::Regs& regs) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    if (regs.rip != expect_ip) bad_ip.fetch_add(1, std::memory_order_relaxed);
    last = regs;
    return uprobe::Action::keep;
  }
};

std::string expect_eq(std::uint64_t got, std::uint64_t want) {
  return got == want ? "" : "got " + hex(got) + ", want " + hex(want);
}

/// Attaches at fn+site, expects optimized-window with `displaced` bytes,
/// runs `run(i)` kCalls times ("" or a mismatch), checks exact hits (all
/// through the stub) and `regs_ok` on the last hit's registers, then detaches
/// and compares the bytes around the site with the file.
void check_window(const void* fn, std::uint64_t site, unsigned displaced, const std::function<std::string(int)>& run,
                  const std::function<std::string(const uprobe::Regs&)>& regs_ok) {
  const void* at_site = at(fn, site);
  const std::size_t len = static_cast<std::size_t>(site + 32);  // the function and what follows it
  const std::vector<std::uint8_t> file = file_bytes_at(fn, len);
  ASSERT_EQ(hex_bytes(mem(fn, len)), hex_bytes(file));
  SiteCounter c(reinterpret_cast<std::uint64_t>(at_site));
  const uprobe::Stats s0 = uprobe::stats();
  uprobe::Uprobe* p = uprobe::register_uprobe(at_site, c);
  const uprobe::ProbeInfo info = uprobe::probe_info(p);
  EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_window) << "why: " << info.why_not_optimized;
  EXPECT_EQ(info.displaced, displaced);
  EXPECT_EQ(check_jump_into_xol(at_site), "");
  EXPECT_TRUE(rwx_mappings().empty());
  {
    const auto now = mem(fn, len);
    for (std::size_t k = 0; k < len; ++k) {
      if (k >= site && k < site + 5) continue;  // the jump
      EXPECT_EQ(hex(now[k]), hex(file[k])) << "byte " << k << " changed";
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
  EXPECT_EQ(regs_ok(c.last), "");
  EXPECT_EQ(d.hits, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
  EXPECT_EQ(d.optimized, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
  uprobe::unregister_uprobe(p, c);
  EXPECT_EQ(hex_bytes(mem(fn, len)), hex_bytes(file)) << "function bytes not restored";
  for (int i = 0; i < 5; ++i) (void)run(i);
  EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls)) << "hit after detach";
}

const auto kAnyRegs = [](const uprobe::Regs&) { return std::string(); };

TEST(Window, MidFunctionArithmetic) {
  // The last call is (999, 7): at the site rax = 3 * 999, rdi = 999, rsi = 7.
  check_window(vaddr(win_mid), win_mid_site, 7, [](int i) { return expect_eq(win_mid(i, 7), (3u * i + 7) ^ 5); },
               [](const uprobe::Regs& r) {
                 std::string e = expect_eq(r.rax, 3 * 999);
                 if (e.empty()) e = expect_eq(r.rdi, 999);
                 if (e.empty()) e = expect_eq(r.rsi, 7);
                 return e;
               });
}

TEST(Window, RipRelativeLoadRelocated) {
  check_window(vaddr(win_rip), win_rip_site, 7, [](int i) { return expect_eq(win_rip(i, 2 * i), 3u * i + 0x5000); },
               [](const uprobe::Regs& r) { return expect_eq(r.rax, 3 * 999); });
}

TEST(Window, ConditionalBranchRelocated) {
  check_window(vaddr(win_jcc), win_jcc_site, 5,
               [](int i) { return expect_eq(win_jcc(i % 3 ? i : 0, 5), i % 3 ? i + 5u : 77u); },
               [](const uprobe::Regs& r) { return expect_eq(r.rdx, 5); });
}

TEST(Window, CallAsTheLastDisplacedInstruction) {
  check_window(vaddr(win_call_last), win_call_last_site, 5,
               [](int i) { return expect_eq(win_call_last(i, 100), 2u * (i + 1) + 100); },
               [](const uprobe::Regs& r) { return expect_eq(r.rbx, 100); });
}

// An indirect call as the window's last instruction runs relocated as push
// <operand>; push (%rsp); movl x2; lea; jmp *-8(%rsp): the callee
// (win_retaddr) returns the return address it saw, which each fixture
// subtracts from the address after its call, so the results are exact only
// when the callee saw the original return address.
TEST(Window, IndirectCallThroughARegisterAsTheLastDisplacedInstruction) {
  check_window(vaddr(win_icall_reg), win_icall_reg_site, 5,
               [](int i) { return expect_eq(win_icall_reg(i, 100), i + 100u); },
               [](const uprobe::Regs& r) { return expect_eq(r.rbx, 100); });
}

TEST(Window, IndirectCallThroughARipRelativePointerIsItsOwnWindow) {
  check_window(vaddr(win_icall_rip), win_icall_rip_site, 6,
               [](int i) { return expect_eq(win_icall_rip(i), static_cast<std::uint64_t>(i)); },
               [](const uprobe::Regs& r) { return expect_eq(r.rbx, 999); });
}

TEST(Window, IndirectCallThroughTheStackTakesAPunnedJump) {
  const void* site = at(vaddr(win_icall_rsp), win_icall_rsp_site);
  const std::vector<std::uint8_t> file = file_bytes_at(site, 16);
  ASSERT_EQ(hex_bytes(std::vector<std::uint8_t>(file.begin(), file.begin() + 4)), "ff 54 24 08");
  SiteCounter c(reinterpret_cast<std::uint64_t>(site));
  const uprobe::Stats s0 = uprobe::stats();
  {
    uprobe::Attachment a(site, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    ASSERT_EQ(info.mode, uprobe::ProbeMode::optimized_punned) << info.why_not_optimized;
    EXPECT_EQ(info.displaced, 4u);
    EXPECT_EQ(check_jump_into_xol(site), "");
    const std::vector<std::uint8_t> now = mem(site, 16);
    EXPECT_EQ(now[0], 0xe9);
    for (std::size_t i = 4; i < 16; ++i) EXPECT_EQ(hex(now[i]), hex(file[i])) << "byte " << i << " changed";
    for (int i = 0; i < kCalls; ++i) ASSERT_EQ(expect_eq(win_icall_rsp(i, 7), i + 7u), "") << "call " << i;
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(c.bad_ip.load(), 0u);
  EXPECT_EQ(d.optimized, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
  // At the site rsp points at a, the function pointer above it.
  EXPECT_EQ(c.last.rdi, 999u);
  EXPECT_EQ(hex_bytes(mem(site, 16)), hex_bytes(file)) << "bytes not restored";
}

TEST(Window, AnInstructionAsLongAsTheJumpIsItsOwnWindow) {
  // In a function the window checks refuse as a whole (landing pads): only
  // the instruction's own bytes change.
  check_window(vaddr(win_lsda), win_lsda_b1, 6,
               [](int i) { return expect_eq(win_lsda(i, 7), ((3u * i + 7) ^ 5) + 0x1000); },
               [](const uprobe::Regs& r) { return expect_eq(r.rax, (3u * 999 + 7) ^ 5); });
}

/// The sites where no window applies, the reason each gives, and how each
/// runs.
struct NoWindowCase {
  const void* site;
  std::string why;
  std::function<std::string(int)> run;
  unsigned len;  ///< the instruction's length (a punned jump displaces it alone)
};

std::vector<NoWindowCase> no_window_cases() {
  return {
      {at(win_loop, win_loop_site), "branches to +" + hex(win_loop_target) + ", inside the",
       [](int i) { return expect_eq(win_loop(i + 1), (i + 1u) * (i + 2u) / 2); }, 3},
      {at(win_table, win_table_site), "entry 1 of the jump table at ",
       [](int i) { return expect_eq(win_table(i % 3, 10), i % 3 == 0 ? 10u : i % 3 == 1 ? 12u : 0u); }, 2},
      {at(win_goto, win_goto_site), "the file's data holds the address win_goto+" + hex(win_goto_label1),
       [](int i) { return expect_eq(win_goto(i % 2, 10), i % 2 ? 12u : 10u); }, 2},
      {at(win_call_inside, win_call_inside_site), "the branch `call rdx` at +0x",
       [](int i) { return expect_eq(win_call_inside(i), 2u * (i + 1)); }, 2},
      {at(win_lsda, win_lsda_site), "win_lsda has exception landing pads",
       [](int i) { return expect_eq(win_lsda(i, 7), ((3u * i + 7) ^ 5) + 0x1000); }, 3},
      {at(win_neigh_a, win_neigh_a_site), "a neighbour, win_neigh_b (file offset ",
       [](int i) {
         const std::string r = expect_eq(win_neigh_a(i, 6), 2u * i + 6);
         return r.empty() ? expect_eq(win_neigh_b(i, 6), i + 7u) : r;
       },
       3},
  };
}

/// Hits expected at `site` over calls 0 .. n-1 of its case: win_table's
/// site runs for case 0 only, win_goto's for label 0 only, win_neigh_a's
/// once per call pair (the neighbour enters past it).
std::uint64_t expected_hits(const void* site, int n) {
  std::uint64_t want = 0;
  for (int i = 0; i < n; ++i) {
    if (site == at(win_table, win_table_site)) want += i % 3 == 0;
    else if (site == at(win_goto, win_goto_site)) want += i % 2 == 0;
    else ++want;
  }
  return want;
}

/// With punned jumps off, the sites where no window applies stay int3 and
/// say why.
TEST(Window, RefusedSitesStayInt3WithTheReason) {
  ASSERT_EQ(win_table_case1, win_table_site + 2);
  ASSERT_EQ(win_goto_label1, win_goto_site + 2);
  ConfigGuard g;
  uprobe::Config cfg = uprobe::configuration();
  cfg.optimize_punned = false;
  uprobe::configure(cfg);
  for (const NoWindowCase& k : no_window_cases()) {
    SiteCounter c(reinterpret_cast<std::uint64_t>(k.site));
    uprobe::Attachment a(k.site, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.mode, uprobe::ProbeMode::int3) << k.why;
    EXPECT_NE(info.why_not_optimized.find(k.why), std::string::npos) << info.why_not_optimized;
    EXPECT_NE(info.why_not_optimized.find("Config::optimize_punned"), std::string::npos) << info.why_not_optimized;
    EXPECT_EQ(info.displaced, 0u);
    EXPECT_EQ(mem(k.site, 1)[0], 0xcc);
    for (int i = 0; i < 30; ++i) EXPECT_EQ(k.run(i), "") << k.why;
    EXPECT_EQ(c.hits.load(), expected_hits(k.site, 30)) << k.why;
    EXPECT_EQ(c.bad_ip.load(), 0u) << k.why;
  }
}

/// The same sites take a punned jump (E9Patch's B2): byte 0 is the jump's,
/// the instruction's other bytes the free low bytes of its rel32, the bytes
/// after the instruction unchanged (a branch lands there and runs them as
/// before); the jump lands in a hop in XOL memory; exact hits and results;
/// every byte restored at detach.
TEST(Window, PunnedJumpWhereNoWindowApplies) {
  for (const NoWindowCase& k : no_window_cases()) {
    SCOPED_TRACE(k.why);
    const std::vector<std::uint8_t> file = file_bytes_at(k.site, 16);
    SiteCounter c(reinterpret_cast<std::uint64_t>(k.site));
    const uprobe::Stats s0 = uprobe::stats();
    {
      uprobe::Attachment a(k.site, c);
      const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
      // (Padded only where every page of B2's range is mapped: the heap may lie there.)
      ASSERT_EQ(info.mode, punned_form_here(k.site, k.len, info.mode)) << info.why_not_optimized;
      EXPECT_EQ(info.displaced, k.len);
      EXPECT_EQ(check_jump_into_xol(k.site), "");
      EXPECT_TRUE(rwx_mappings().empty());
      const std::vector<std::uint8_t> now = mem(k.site, 16);
      const std::size_t pad = info.mode == uprobe::ProbeMode::optimized_padded ? 1 : 0;  // (ES, when padded)
      if (pad) {
        EXPECT_EQ(now[0], 0x26);
      }
      EXPECT_EQ(now[pad], 0xe9);
      for (std::size_t i = k.len; i < 16; ++i) EXPECT_EQ(hex(now[i]), hex(file[i])) << "byte " << i << " changed";
      for (int i = 0; i < kCalls; ++i) ASSERT_EQ(k.run(i), "") << "call " << i;
    }
    const uprobe::Stats d = stats_delta(s0, uprobe::stats());
    EXPECT_EQ(c.hits.load(), expected_hits(k.site, kCalls));
    EXPECT_EQ(c.bad_ip.load(), 0u);
    EXPECT_EQ(d.optimized, expected_hits(k.site, kCalls)) << stats_str(d);
    EXPECT_EQ(hex_bytes(mem(k.site, 16)), hex_bytes(file)) << "bytes not restored";
  }
}

TEST(Window, OptimizeWindowsSwitch) {
  ConfigGuard g;
  uprobe::Config cfg = uprobe::configuration();
  cfg.optimize_windows = false;
  uprobe::configure(cfg);
  const void* site = at(win_mid, win_mid_site);
  SiteCounter c(reinterpret_cast<std::uint64_t>(site));
  uprobe::Attachment a(site, c);
  EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::int3);
  EXPECT_NE(uprobe::probe_info(a.probe()).why_not_optimized.find("Config::optimize_windows"), std::string::npos)
      << uprobe::probe_info(a.probe()).why_not_optimized;
  EXPECT_EQ(mem(site, 1)[0], 0xcc);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(win_mid(i, 1), (3u * i + 1) ^ 5);
  cfg.optimize_windows = true;
  uprobe::configure(cfg);  // converts attached probes
  EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_window)
      << uprobe::probe_info(a.probe()).why_not_optimized;
  EXPECT_EQ(check_jump_into_xol(site), "");
  for (int i = 0; i < 100; ++i) ASSERT_EQ(win_mid(i, 1), (3u * i + 1) ^ 5);
  cfg.optimize_windows = false;
  uprobe::configure(cfg);  // back to int3
  EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::int3);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(win_mid(i, 1), (3u * i + 1) ^ 5);
  EXPECT_EQ(c.hits.load(), 300u);
  // Entries are not windows: the entry switch leaves this probe alone.
  cfg.optimize_windows = true;
  cfg.optimize_entries = false;
  uprobe::configure(cfg);
  EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_window);
}

/// A probe at the entry and one inside the function, both optimized with
/// their own windows: both count exactly and the function computes right.
TEST(Window, ProbeInsideAnotherWindow) {
  SiteCounter ce(addr(win_mid)), cm(addr(win_mid) + win_mid_site);
  uprobe::Attachment e(vaddr(win_mid), ce);
  uprobe::Attachment m(at(win_mid, win_mid_site), cm);
  const uprobe::ProbeInfo ie = uprobe::probe_info(e.probe()), im = uprobe::probe_info(m.probe());
  EXPECT_EQ(ie.mode, uprobe::ProbeMode::optimized_entry) << ie.why_not_optimized;
  EXPECT_EQ(ie.displaced, 7u);
  EXPECT_EQ(im.mode, uprobe::ProbeMode::optimized_window) << im.why_not_optimized;
  for (int i = 0; i < 100; ++i) ASSERT_EQ(win_mid(i, 3), (3u * i + 3) ^ 5);
  EXPECT_EQ(ce.hits.load(), 100u);
  EXPECT_EQ(cm.hits.load(), 100u);
  EXPECT_EQ(ce.bad_ip.load() + cm.bad_ip.load(), 0u);
}

}  // namespace

namespace {

/// plan_site() says what an attach would patch, with nothing attached:
/// the same tactic, window length and reason as the probes above get.
TEST(Window, PlanSiteMatchesWhatAnAttachDoes) {
  const uprobe::FileOffset mid = uprobe::resolve_address(vaddr(win_mid));
  uprobe::SitePlan p = uprobe::plan_site(mid.path, mid.offset + win_mid_site);
  EXPECT_EQ(p.tactic, uprobe::ProbeMode::optimized_window) << p.why_int3;
  EXPECT_EQ(p.displaced, 7u);
  EXPECT_EQ(p.instruction, "add rax, rsi");
  EXPECT_EQ(p.why_int3, "");
  p = uprobe::plan_site(mid.path, mid.offset);
  EXPECT_EQ(p.tactic, uprobe::ProbeMode::optimized_entry) << p.why_int3;
  EXPECT_EQ(p.displaced, 7u);
  const uprobe::FileOffset loop = uprobe::resolve_address(vaddr(win_loop));
  p = uprobe::plan_site(loop.path, loop.offset + win_loop_site);
  EXPECT_EQ(p.tactic, uprobe::ProbeMode::optimized_punned);
  EXPECT_EQ(p.displaced, 3u);
  EXPECT_EQ(p.why_int3, "");
  EXPECT_NE(p.why_no_window.find("branches to +" + hex(win_loop_target) + ", inside the"), std::string::npos)
      << p.why_no_window;
  EXPECT_EQ(mem(at(win_loop, win_loop_site), 1), file_bytes_at(at(win_loop, win_loop_site), 1)) << "plan wrote";
  // Inside an instruction: refused as register_uprobe() refuses it.
  try {
    (void)uprobe::plan_site(mid.path, mid.offset + 1);
    ADD_FAILURE() << "an offset inside `mov rax, rdi` was planned";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(e.code(), uprobe::Errc::mid_instruction) << e.what();
  }
}

/// A fork while another thread plans a site (plan_site() runs beside the
/// registry, holding the file's neighbour index while it sweeps): the child
/// plans and attaches in the same file at once, never waiting on a lock the
/// planning thread took into the fork with it (the ELF image cache's, the
/// neighbour index's, ...: each cache starts afresh in a child). The locks
/// are held for a small part of each plan: with both CPUs busy, 9 of 25 runs
/// had a child stuck on the image cache's (SIGALRM) before; on a quiet
/// machine it rarely reproduces.
TEST(Window, ForkWhileAnotherThreadPlansLeavesTheChildFree) {
  const uprobe::FileOffset mid = uprobe::resolve_address(vaddr(win_mid));
  std::atomic<bool> stop{false};
  std::atomic<unsigned long> plans{0};
  std::thread planner([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      (void)uprobe::plan_site(mid.path, mid.offset + win_mid_site);
      plans.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (plans.load() < 10) std::this_thread::yield();
  int bad = 0;
  std::string first;
  for (int i = 0; i < 100; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::alarm(10);  // a child stuck on an inherited lock ends with SIGALRM
      const uprobe::SitePlan p = uprobe::plan_site(mid.path, mid.offset + win_mid_site);
      if (p.tactic != uprobe::ProbeMode::optimized_window) ::_exit(3);
      Counter c(addr(win_mid));
      {
        uprobe::Attachment a(vaddr(win_mid), c);
        if (uprobe::probe_info(a.probe()).mode != uprobe::ProbeMode::optimized_entry) ::_exit(4);
      }
      ::_exit(0);
    }
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && bad++ == 0)
      first = WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st))
                              : "exit " + std::to_string(WEXITSTATUS(st));
  }
  stop.store(true);
  planner.join();
  EXPECT_EQ(bad, 0) << "first: " << first;
  EXPECT_GT(plans.load(), 10u);
}

/// function_sites() lists the fixtures with their exact instruction starts.
TEST(Window, FunctionSitesListsEveryInstructionStart) {
  const uprobe::FileOffset mid = uprobe::resolve_address(vaddr(win_mid));
  const std::vector<uprobe::FunctionSites> fns = uprobe::function_sites(mid.path);
  auto it = std::find_if(fns.begin(), fns.end(), [&](const uprobe::FunctionSites& f) { return f.name == "win_mid"; });
  ASSERT_NE(it, fns.end());
  EXPECT_EQ(it->offset, mid.offset);
  EXPECT_EQ(it->size, 15u);
  EXPECT_EQ(it->starts, (std::vector<std::uint32_t>{0, 3, 7, 10, 14}));
  EXPECT_TRUE(std::is_sorted(fns.begin(), fns.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; }));
}

/// glibc's signal trampoline (__restore_rt, what the kernel returns to from
/// every handler) has an .eh_frame FDE of a signal frame ('S') that starts one
/// byte before its code, inside the filler before it: a sweep from there
/// decoded out of step and listed +2 (inside its `mov $15, %rax`) as an
/// instruction start, where a probe broke every signal return (SIGILL). Such
/// an FDE bounds no function.
TEST(Window, SignalTrampolineFdeBoundsNoFunction) {
  struct sigaction sa {};
  sa.sa_handler = [](int) {};
  ASSERT_EQ(sigaction(SIGUSR2, &sa, nullptr), 0);
  struct {  // the kernel's struct sigaction (rt_sigaction): glibc's sa_restorer is __restore_rt
    void* handler;
    unsigned long flags;
    void* restorer;
    unsigned long mask;
  } k{};
  ASSERT_EQ(syscall(SYS_rt_sigaction, SIGUSR2, nullptr, &k, 8), 0);
  ASSERT_NE(k.restorer, nullptr);
  signal(SIGUSR2, SIG_DFL);
  const uprobe::FileOffset rt = uprobe::resolve_address(k.restorer);
  ASSERT_NE(rt.path.find("libc.so"), std::string::npos) << rt.path;
  ASSERT_EQ(hex_bytes(mem(k.restorer, 7)), "48 c7 c0 0f 00 00 00") << "mov $15, %rax (rt_sigreturn)";
  for (const uprobe::FunctionSites& f : uprobe::function_sites(rt.path)) {
    EXPECT_NE(f.offset, rt.offset - 1) << "the signal frame's FDE, one byte early";
    if (f.offset <= rt.offset && rt.offset < f.offset + f.size) {
      for (std::uint32_t s : f.starts) {
        EXPECT_TRUE(f.offset + s <= rt.offset || f.offset + s >= rt.offset + 7) << f.name << "+" << s;
      }
    }
  }
}

}  // namespace
