// SPDX-License-Identifier: MIT
// Optimized function-entry probes: the jump displaces the first
// instructions, which run relocated in a window slot (rip-relative operands,
// Jcc, jmp, call, jmp *mem re-encoded); exact hits through the stub, return
// values, the original return address a displaced call pushes, every GPR and
// the flags at the entry, uretprobes armed from the stub; entries that must
// stay int3 and why; Config::optimize_entries; a thread stopped inside the
// window blocks the conversion until it leaves; detach restores every byte.

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "opt_common.hpp"
#include "uprobe/batch.hpp"

extern "C" {
std::uint64_t ent_rz_hot(std::uint64_t, std::uint64_t);
void ent_rz_cold();
std::uint64_t ent_frame(std::uint64_t, std::uint64_t);
std::uint64_t ent_sub(std::uint64_t, std::uint64_t);
std::uint64_t ent_riprel(std::uint64_t);
std::uint64_t ent_jcc(std::uint64_t);
std::uint64_t ent_jcc_mid(std::uint64_t, std::uint64_t);
std::uint64_t ent_call(std::uint64_t, std::uint64_t);
extern const std::uint8_t ent_call_ret[];
extern std::uint64_t ent_seen_ret;
std::uint64_t ent_jmp(std::uint64_t, std::uint64_t);
std::uint64_t ent_jmp_ind(std::uint64_t, std::uint64_t);
std::uint64_t ent_short();
std::uint64_t ent_c04(std::uint64_t, std::uint64_t);
std::uint64_t ent_syscall();
std::uint64_t ent_ret(std::uint64_t);
std::uint64_t ent_pad_ret(std::uint64_t);
std::uint64_t ent_pad_jmp(std::uint64_t, std::uint64_t);
std::uint64_t ent_ret_last(const std::uint64_t*);
std::uint64_t ent_neigh_pcpy(std::uint64_t, std::uint64_t);
std::uint64_t ent_neigh_cpy(std::uint64_t, std::uint64_t);
std::uint64_t ent_neigh_tail(std::uint64_t, std::uint64_t);
std::uint64_t ent_neigh_target(std::uint64_t, std::uint64_t);
void ent_leaf();
std::uint64_t ent_load(const std::uint64_t*);
extern const std::uint8_t ent_load_fault[];
void ent_regs_driver(const std::uint64_t* in, std::uint64_t* out);
double ent_fadd(double, double);
}

using namespace opttest;
using uprobe::Action;
using uprobe::Regs;

namespace {

constexpr int kCalls = 1000;

/// Counts entries and returns; checks rip at entry and the return value.
struct EntryCounter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, rets{0}, bad{0};
  std::uint64_t expect_ip;
  std::uint64_t last_ret = 0;
  explicit EntryCounter(std::uint64_t ip, bool ret = false)
      : uprobe::Consumer(ret ? uprobe::Callbacks::entry_and_ret : uprobe::Callbacks::entry), expect_ip(ip) {}
  Action handler(Regs& regs) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    if (regs.rip != expect_ip) bad.fetch_add(1, std::memory_order_relaxed);
    return Action::keep;
  }
  void ret_handler(Regs& regs, std::uint64_t func) override {
    rets.fetch_add(1, std::memory_order_relaxed);
    if (func != expect_ip) bad.fetch_add(1, std::memory_order_relaxed);
    last_ret = regs.rax;
  }
};

/// Attaches at `fn`, expects optimized-entry with `displaced` bytes, runs
/// `run(i)` kCalls times ("" or a mismatch), checks exact hits (all through
/// the stub), then detaches and compares the function with its file.
void check_entry(const void* fn, std::size_t fn_len, unsigned displaced, const std::function<std::string(int)>& run,
                 bool with_ret = false) {
  const std::vector<std::uint8_t> file_fn = file_bytes_at(fn, fn_len);
  ASSERT_EQ(hex_bytes(mem(fn, fn_len)), hex_bytes(file_fn));
  EntryCounter c(reinterpret_cast<std::uint64_t>(fn), with_ret);
  const uprobe::Stats s0 = uprobe::stats();
  uprobe::Uprobe* p = uprobe::register_uprobe(fn, c);
  const uprobe::ProbeInfo info = uprobe::probe_info(p);
  EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_entry) << "why: " << info.why_not_optimized;
  EXPECT_EQ(info.displaced, displaced);
  EXPECT_EQ(check_jump_into_xol(fn), "");
  EXPECT_TRUE(rwx_mappings().empty());
  {
    const auto now = mem(fn, fn_len);
    for (std::size_t k = 5; k < fn_len; ++k) EXPECT_EQ(hex(now[k]), hex(file_fn[k])) << "byte " << k << " changed";
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
  EXPECT_EQ(c.rets.load(), with_ret ? static_cast<std::uint64_t>(kCalls) : 0u);
  EXPECT_EQ(c.bad.load(), 0u);
  EXPECT_EQ(d.hits, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
  EXPECT_EQ(d.optimized, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
  uprobe::unregister_uprobe(p, c);
  EXPECT_EQ(hex_bytes(mem(fn, fn_len)), hex_bytes(file_fn)) << "function bytes not restored";
  for (int i = 0; i < 5; ++i) (void)run(i);
  EXPECT_EQ(c.hits.load(), static_cast<std::uint64_t>(kCalls)) << "hit after detach";
}

std::string expect_eq(std::uint64_t got, std::uint64_t want) {
  return got == want ? "" : "got " + hex(got) + ", want " + hex(want);
}

// An entry probe writes nothing below the stack pointer: ent_rz_cold is
// entered by a jump with a and b in the red zone (the stub once wrote its
// resume address at rsp - 16 at every entry hit: a + b came out wrong).
TEST(Entry, DataBelowTheStackPointerAtTheEntryIsKept) {
  check_entry(vaddr(ent_rz_cold), 11, 5, [](int i) { return expect_eq(ent_rz_hot(i, 1000), i + 1000u); });
}

TEST(Entry, FramePrologueWithEndbr) {
  check_entry(vaddr(ent_frame), 16, 5, [](int i) { return expect_eq(ent_frame(i, 3 * i), 7u * i); });
}

TEST(Entry, SubRspAndStore) {
  check_entry(vaddr(ent_sub), 20, 8, [](int i) { return expect_eq(ent_sub(i, 1000), i + 1000u); });
}

TEST(Entry, RipRelativeLoadIsReaimed) {
  check_entry(vaddr(ent_riprel), 11, 7, [](int i) { return expect_eq(ent_riprel(i), 0x1234567u + i); });
}

TEST(Entry, JccAsLastDisplacedInstruction) {
  check_entry(vaddr(ent_jcc), 14, 5, [](int i) { return expect_eq(ent_jcc(i % 3), i % 3 ? i % 3 + 1 : 77); });
}

TEST(Entry, JccInTheMiddleOfTheWindow) {
  check_entry(vaddr(ent_jcc_mid), 16, 7,
              [](int i) { return expect_eq(ent_jcc_mid(i % 4, 10), i % 4 ? i % 4 + 10 : 99); });
}

TEST(Entry, DisplacedCallPushesTheOriginalReturnAddress) {
  check_entry(vaddr(ent_call), 12, 8, [](int i) {
    ent_seen_ret = 0;
    std::string r = expect_eq(ent_call(i, 5), 3u * i + 5);
    if (r.empty()) r = expect_eq(ent_seen_ret, reinterpret_cast<std::uint64_t>(ent_call_ret));
    return r;
  });
}

TEST(Entry, FunctionsOwnJumpIsDisplaced) {
  check_entry(vaddr(ent_jmp), 5, 5, [](int i) { return expect_eq(ent_jmp(i, 2), i + 2u); });
}

// A function shorter than the jump whose last instruction never falls
// through (ret, jmp): the window covers the nop filler after it, up to the
// next function (16 bytes checked: the function and its filler are the
// file's again after the detach).
TEST(Entry, ShortFunctionWindowCoversTheFillerAfterIt) {
  check_entry(vaddr(ent_pad_ret), 16, 5, [](int i) { return expect_eq(ent_pad_ret(i), i + 1u); });
  check_entry(vaddr(ent_pad_jmp), 16, 5, [](int i) { return expect_eq(ent_pad_jmp(i, 3), i + 3u); });
}

// A return as the last displaced instruction runs from the slot.
TEST(Entry, ReturnAsTheLastDisplacedInstruction) {
  std::uint64_t v[2] = {0, 0};
  check_entry(vaddr(ent_ret_last), 5, 5, [&v](int i) {
    v[1] = static_cast<std::uint64_t>(i) * 7;
    return expect_eq(ent_ret_last(v), i * 7u);
  });
}

// A neighbour's jump to the entry itself (a tail call) is no obstacle: the
// calls through it (odd i) are hits too, as exact as the direct ones.
TEST(Entry, NeighbourTailCallToTheEntry) {
  check_entry(vaddr(ent_neigh_target), 7, 6, [](int i) {
    return i % 2 ? expect_eq(ent_neigh_tail(i, 2), i + 3u) : expect_eq(ent_neigh_target(i, 2), i + 2u);
  });
}

// The reason names the neighbour and the target it jumps to.
TEST(Entry, NeighbourBranchIntoTheWindowIsNamed) {
  NoPunnedGuard no_pun;  // the window's refusal, not the punned jump that takes over
  EntryCounter c(addr(ent_neigh_cpy));
  uprobe::Attachment a(vaddr(ent_neigh_cpy), c);
  const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
  EXPECT_EQ(info.mode, uprobe::ProbeMode::int3);
  EXPECT_NE(info.why_not_optimized.find("bounds from symtab): the instruction at +0x6 (jmp "), std::string::npos)
      << info.why_not_optimized;
  EXPECT_NE(info.why_not_optimized.find("branches to the window's +0x3, inside the 6 bytes the jump displaces"),
            std::string::npos)
      << info.why_not_optimized;
  const auto m = mapping_of(addr(ent_neigh_cpy));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(info.bounds, "symtab " + hex(m->offset + addr(ent_neigh_cpy) - m->start) + "+0x7");
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(ent_neigh_cpy(i, 1), i + 1u);
    EXPECT_EQ(ent_neigh_pcpy(i, 1), 2u * i + 1u);
  }
  EXPECT_EQ(c.hits.load(), 10u);
}

// The file's neighbour index outlives a transaction (validate.cpp): single
// registrations after a batch swept the neighbours, and after one another,
// answer from it exactly as a first sweep does, refusal and reason included,
// and an entry no neighbour branches into still takes its jump.
TEST(Entry, NeighbourIndexKeptAcrossTransactionsGivesTheSameAnswers) {
  NoPunnedGuard no_pun;  // the window's refusal, not the punned jump that takes over
  EntryCounter c(addr(ent_neigh_cpy)), target(addr(ent_neigh_target));
  {
    const std::vector<uprobe::ProbeRequest> reqs = {uprobe::ProbeRequest::at(vaddr(ent_neigh_cpy), c),
                                                    uprobe::ProbeRequest::at(vaddr(ent_neigh_target), target)};
    const auto res = uprobe::register_uprobes(reqs);
    ASSERT_TRUE(res[0] && res[1]);
    EXPECT_EQ(res[0].mode, uprobe::ProbeMode::int3);
    EXPECT_EQ(res[1].mode, uprobe::ProbeMode::optimized_entry);
    for (const auto& e : uprobe::unregister_uprobes(
             std::vector<uprobe::ProbeConsumer>{{res[0].probe, &c}, {res[1].probe, &target}}))
      EXPECT_FALSE(e);
  }
  for (int round = 0; round < 3; ++round) {
    uprobe::Attachment a(vaddr(ent_neigh_cpy), c), b(vaddr(ent_neigh_target), target);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.mode, uprobe::ProbeMode::int3) << round;
    EXPECT_NE(info.why_not_optimized.find("bounds from symtab): the instruction at +0x6 (jmp "), std::string::npos)
        << round << ": " << info.why_not_optimized;
    EXPECT_NE(info.why_not_optimized.find("branches to the window's +0x3, inside the 6 bytes the jump displaces"),
              std::string::npos)
        << round << ": " << info.why_not_optimized;
    EXPECT_EQ(uprobe::probe_info(b.probe()).mode, uprobe::ProbeMode::optimized_entry) << round;
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(ent_neigh_cpy(i, 1), i + 1u);
      EXPECT_EQ(ent_neigh_target(i, 2), i + 2u);
    }
  }
  EXPECT_EQ(c.hits.load(), 30u);
  EXPECT_EQ(target.hits.load(), 30u);
}

/// The same entry with punned jumps on (the default): its first
/// instruction (3 bytes, memcpy's `mov %rdi,%rax` shape) takes a punned
/// jump whose rel32 keeps the bytes the neighbour jumps to; both functions
/// compute right and the entry counts exactly, with return probes too.
TEST(Entry, NeighbourBranchIntoTheWindowTakesAPunnedJump) {
  const std::vector<std::uint8_t> file = file_bytes_at(vaddr(ent_neigh_cpy), 7);
  EntryCounter c(addr(ent_neigh_cpy), true);
  {
    uprobe::Attachment a(vaddr(ent_neigh_cpy), c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    // Padded only where every page of B2's range is mapped (the heap may lie there).
    ASSERT_EQ(info.mode, punned_form_here(vaddr(ent_neigh_cpy), 3, info.mode)) << info.why_not_optimized;
    EXPECT_EQ(info.displaced, 3u);
    EXPECT_EQ(check_jump_into_xol(vaddr(ent_neigh_cpy)), "");
    const auto now = mem(vaddr(ent_neigh_cpy), 7);
    for (std::size_t k = 3; k < 7; ++k) EXPECT_EQ(hex(now[k]), hex(file[k])) << "byte " << k;
    for (int i = 0; i < 100; ++i) {
      ASSERT_EQ(ent_neigh_cpy(i, 1), i + 1u);
      ASSERT_EQ(ent_neigh_pcpy(i, 1), 2u * i + 1u);
    }
  }
  EXPECT_EQ(c.hits.load(), 100u);
  EXPECT_EQ(c.rets.load(), 100u);
  EXPECT_EQ(c.last_ret, 100u);
  EXPECT_EQ(c.bad.load(), 0u);
  EXPECT_EQ(hex_bytes(mem(vaddr(ent_neigh_cpy), 7)), hex_bytes(file));
}

// In a batch the neighbours are checked through one index per neighbour
// (validate.cpp): the same refusal, with the same reason, and the same
// acceptance of the entries no neighbour branches into.
TEST(Entry, NeighbourBranchIntoTheWindowIsNamedInABatch) {
  NoPunnedGuard no_pun;  // the window's refusal, not the punned jump that takes over
  EntryCounter c(addr(ent_neigh_cpy)), target(addr(ent_neigh_target)), load(addr(ent_load));
  const std::vector<uprobe::ProbeRequest> reqs = {uprobe::ProbeRequest::at(vaddr(ent_neigh_cpy), c),
                                                  uprobe::ProbeRequest::at(vaddr(ent_neigh_target), target),
                                                  uprobe::ProbeRequest::at(vaddr(ent_load), load)};
  const auto res = uprobe::register_uprobes(reqs);
  ASSERT_TRUE(res[0] && res[1] && res[2]);
  EXPECT_EQ(res[0].mode, uprobe::ProbeMode::int3);
  const uprobe::ProbeInfo info = uprobe::probe_info(res[0].probe);
  EXPECT_EQ(info.mode, uprobe::ProbeMode::int3);
  EXPECT_NE(info.why_not_optimized.find("bounds from symtab): the instruction at +0x6 (jmp "), std::string::npos)
      << info.why_not_optimized;
  EXPECT_NE(info.why_not_optimized.find("branches to the window's +0x3, inside the 6 bytes the jump displaces"),
            std::string::npos)
      << info.why_not_optimized;
  EXPECT_EQ(res[1].mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(res[1].probe).why_not_optimized;
  EXPECT_EQ(res[2].mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(res[2].probe).why_not_optimized;
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(ent_neigh_cpy(i, 1), i + 1u);
    EXPECT_EQ(ent_neigh_target(i, 2), i + 2u);
  }
  std::uint64_t x = 3;
  EXPECT_EQ(ent_load(&x), 3u);
  EXPECT_EQ(c.hits.load(), 10u);
  EXPECT_EQ(target.hits.load(), 10u);
  EXPECT_EQ(load.hits.load(), 1u);
  for (const auto& e : uprobe::unregister_uprobes(std::vector<uprobe::ProbeConsumer>{
           {res[0].probe, &c}, {res[1].probe, &target}, {res[2].probe, &load}}))
    EXPECT_FALSE(e);
}

// ProbeDetail::state is the full answer without the symbol, bounds and
// IFUNC fields: every other field equal, those three empty.
TEST(Entry, ProbeInfoOfTheStateOnlyLeavesOutTheFileFields) {
  EntryCounter c(addr(ent_neigh_cpy));
  uprobe::Attachment a(vaddr(ent_neigh_cpy), c);
  const uprobe::ProbeInfo full = uprobe::probe_info(a.probe(), uprobe::ProbeDetail::full);
  const uprobe::ProbeInfo state = uprobe::probe_info(a.probe(), uprobe::ProbeDetail::state);
  const auto m = mapping_of(addr(ent_neigh_cpy));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(full.bounds, "symtab " + hex(m->offset + addr(ent_neigh_cpy) - m->start) + "+0x7");
  EXPECT_EQ(full.symbol, "ent_neigh_cpy");
  EXPECT_EQ(state.bounds, "");
  EXPECT_EQ(state.symbol, "");
  EXPECT_EQ(state.ifunc, "");
  EXPECT_EQ(state.where.path, full.where.path);
  EXPECT_EQ(state.where.offset, full.where.offset);
  EXPECT_EQ(state.where.dev, full.where.dev);
  EXPECT_EQ(state.where.ino, full.where.ino);
  // (Its neighbour jumps into its window; padded where B2's pages are all mapped.)
  EXPECT_EQ(state.mode, punned_form_here(vaddr(ent_neigh_cpy), 3, state.mode));
  EXPECT_EQ(state.mode, full.mode);
  EXPECT_EQ(state.displaced, full.displaced);
  EXPECT_EQ(state.why_not_optimized, full.why_not_optimized);
  EXPECT_EQ(state.sites, 1u);
  EXPECT_EQ(state.sites, full.sites);
  EXPECT_EQ(state.consumers, 1u);
  EXPECT_EQ(state.consumers, full.consumers);
  EXPECT_EQ(state.emulated, full.emulated);
  EXPECT_EQ(state.instruction, full.instruction);
  EXPECT_EQ(state.signals_blocked, full.signals_blocked);
  EXPECT_EQ(uprobe::probe_info(a.probe()).bounds, full.bounds);  // probe_info(p) is ProbeDetail::full
}

TEST(Entry, IndirectTailJumpThroughRipRelativePointer) {
  check_entry(vaddr(ent_jmp_ind), 6, 6, [](int i) { return expect_eq(ent_jmp_ind(i, 9), i + 9u); });
}

TEST(Entry, ReturnProbeArmedFromTheStub) {
  check_entry(vaddr(ent_frame), 16, 5, [](int i) { return expect_eq(ent_frame(i, 1), i + 2u); }, true);
}

TEST(Entry, EveryGeneralRegisterAndFlagsSurvive) {
  struct RegCheck : uprobe::Consumer {
    std::uint64_t seen[16] = {};
    std::atomic<int> hits{0};
    Action handler(Regs& r) override {
      const std::uint64_t v[16] = {r.rax, r.rcx, r.rdx, r.rbx, r.rbp, r.rsi, r.rdi, r.r8,
                                   r.r9,  r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rflags};
      std::memcpy(seen, v, sizeof v);
      hits.fetch_add(1);
      return Action::keep;
    }
  } c;
  uprobe::Attachment a(vaddr(ent_leaf), c);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(a.probe()).why_not_optimized;
  for (std::uint64_t flags : {0x202ull, 0x2d7ull /* CF PF AF ZF SF */, 0xa03ull /* CF OF */}) {
    std::uint64_t in[17], out[17];
    for (int k = 0; k < 15; ++k) in[k] = 0x1111111111111111ull * (k + 1) ^ 0x0123456789abcdefull;
    in[15] = 0;
    in[16] = flags;
    std::memset(out, 0, sizeof out);
    const int before = c.hits.load();
    ent_regs_driver(in, out);
    ASSERT_EQ(c.hits.load(), before + 1);
    for (int k = 0; k < 15; ++k) {
      EXPECT_EQ(hex(out[k]), hex(in[k])) << "register " << k << " after the call";
      EXPECT_EQ(hex(c.seen[k]), hex(in[k])) << "register " << k << " seen by the handler";
    }
    EXPECT_EQ(hex(out[16] & 0xcd5), hex(flags & 0xcd5)) << "flags after the call";
    EXPECT_EQ(hex(c.seen[15] & 0xcd5), hex(flags & 0xcd5)) << "flags seen by the handler";
  }
}

/// A consumer that computes with doubles, AVX locals and snprintf("%f") on an
/// optimized entry whose displaced addsd reads xmm0/xmm1: the arguments
/// survive (the stub saves the vector state for consumers that use it).
TEST(Entry, VectorArgumentsSurviveAFloatingPointConsumer) {
  struct FloatUser : uprobe::Consumer {
    std::atomic<int> hits{0};
    char text[64] = {};
    Action handler(Regs& r) override {
      alignas(32) volatile double v[4] = {static_cast<double>(r.rsp & 0xff), 1.25, 2.5, 3.75};
      double s = 0;
      for (int i = 0; i < 4; ++i) s += v[i] * 1.5;
      std::snprintf(text, sizeof text, "%f", s);
      hits.fetch_add(1);
      return Action::keep;
    }
  } c;
  uprobe::Attachment a(vaddr(ent_fadd), c);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(a.probe()).why_not_optimized;
  for (int i = 0; i < 1000; ++i) {
    const double x = i * 0.5 + 0.25, y = 1000.0 - i;
    ASSERT_EQ(ent_fadd(x, y), x + y) << i;
  }
  EXPECT_EQ(c.hits.load(), 1000);
  EXPECT_NE(std::string(c.text).find('.'), std::string::npos);
}

/// Entries that stay int3, and the reason each gives.
TEST(Entry, RefusedEntriesStayInt3WithTheReason) {
  NoPunnedGuard no_pun;  // the window's refusal, not the punned jump that takes over
  struct Case {
    const void* fn;
    const char* why;
    std::function<std::string()> run;
  };
  const Case cases[] = {
      {vaddr(ent_short), "shorter than the 5-byte jump", [] { return expect_eq(ent_short(), 0); }},
      {vaddr(ent_c04), "branches to +0x2, inside the", [] { return expect_eq(ent_c04(7, 6), 42); }},
      {vaddr(ent_syscall), "enters the kernel or traps",
       [] { return expect_eq(ent_syscall(), static_cast<std::uint64_t>(getpid())); }},
      {vaddr(ent_ret), "cannot be displaced (a return", [] { return expect_eq(ent_ret(31), 31); }},
      // The neighbour's jump lands at +3, inside the window: it still runs
      // (the int3 is at the entry only) and still returns 2a + b.
      {vaddr(ent_neigh_cpy),
       "a neighbour, ent_neigh_pcpy (file offset ",
       [] {
         const std::string r = expect_eq(ent_neigh_cpy(7, 6), 13);
         return r.empty() ? expect_eq(ent_neigh_pcpy(7, 6), 20) : r;
       }},
  };
  for (const Case& k : cases) {
    EntryCounter c(reinterpret_cast<std::uint64_t>(k.fn));
    uprobe::Attachment a(k.fn, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.mode, uprobe::ProbeMode::int3) << k.why;
    EXPECT_NE(info.why_not_optimized.find(k.why), std::string::npos) << info.why_not_optimized;
    EXPECT_EQ(info.displaced, 0u);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(k.run(), "") << k.why;
    EXPECT_EQ(c.hits.load(), 10u) << k.why;
  }
}

TEST(Entry, OptimizeEntriesSwitch) {
  ConfigGuard g;
  uprobe::Config cfg = uprobe::configuration();
  cfg.optimize_entries = false;
  uprobe::configure(cfg);
  EntryCounter c(addr(ent_frame));
  uprobe::Attachment a(vaddr(ent_frame), c);
  EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::int3);
  EXPECT_NE(uprobe::probe_info(a.probe()).why_not_optimized.find("Config::optimize_entries"), std::string::npos);
  EXPECT_EQ(mem(vaddr(ent_frame), 1)[0], 0xcc);
  // The int3 path runs the whole window from its slot.
  for (int i = 0; i < 100; ++i) ASSERT_EQ(ent_frame(i, i), 3u * i);
  cfg.optimize_entries = true;
  uprobe::configure(cfg);  // converts attached probes
  EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_entry);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(ent_frame(i, i), 3u * i);
  cfg.optimize_entries = false;
  uprobe::configure(cfg);  // back to int3
  EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::int3);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(ent_frame(i, i), 3u * i);
  EXPECT_EQ(c.hits.load(), 300u);
}

/// A thread that keeps running (never blocks in the kernel) cannot be
/// observed: the entry stays int3 (and works) until it can be.
TEST(Entry, RunningThreadDefersTheConversion) {
  std::atomic<int> phase{0};
  std::thread spinner([&] {
    phase.store(1);
    while (phase.load() == 1) {
    }
  });
  while (phase.load() != 1) {
  }
  EntryCounter c(addr(ent_sub));
  uprobe::Attachment a(vaddr(ent_sub), c);
  uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
  EXPECT_EQ(info.mode, uprobe::ProbeMode::int3);
  EXPECT_NE(info.why_not_optimized.find("kept running for 2 ms"), std::string::npos) << info.why_not_optimized;
  EXPECT_EQ(mem(vaddr(ent_sub), 1)[0], 0xcc);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(ent_sub(i, 1), i + 1u);
  phase.store(2);
  spinner.join();
  // The next attach retries, and now every other thread is observable.
  EntryCounter c2(addr(ent_sub));
  uprobe::Attachment a2(vaddr(ent_sub), c2);
  EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(a.probe()).why_not_optimized;
  for (int i = 0; i < 50; ++i) ASSERT_EQ(ent_sub(i, 1), i + 1u);
  EXPECT_EQ(c.hits.load(), 100u);
  EXPECT_EQ(c2.hits.load(), 50u);
}

/// With Config::sample_signal, a running thread is sampled (a real-time
/// signal whose handler records where it was) and the entry converts at once.
TEST(Entry, SampleSignalObservesARunningThread) {
  ConfigGuard g;
  uprobe::Config cfg = uprobe::configuration();
  cfg.sample_signal = SIGRTMAX;
  uprobe::configure(cfg);
  EXPECT_EQ(uprobe::configuration().sample_signal, SIGRTMAX);
  std::atomic<int> phase{0};
  std::atomic<std::uint64_t> wrong{0};
  std::thread spinner([&] {
    phase.store(1);
    while (phase.load() == 1)
      if (ent_sub(1, 2) != 3) wrong.fetch_add(1);
  });
  while (phase.load() != 1) {
  }
  // The spinner calls ent_sub without pause: a sample may find it inside
  // the window (or handling the int3 there), which defers the conversion to
  // the next attach. A few attaches convert it.
  EntryCounter c(addr(ent_sub));
  {
    uprobe::Attachment a(vaddr(ent_sub), c);
    std::vector<std::unique_ptr<EntryCounter>> more;
    std::vector<uprobe::Attachment> extra;
    for (int i = 0; i < 200 && uprobe::probe_info(a.probe()).mode != uprobe::ProbeMode::optimized_entry; ++i) {
      if (i >= 8) extra.clear();  // keep the consumer count small; each attach is one more try
      more.push_back(std::make_unique<EntryCounter>(addr(ent_sub)));
      extra.emplace_back(vaddr(ent_sub), *more.back());
    }
    EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(a.probe()).why_not_optimized;
    const std::uint64_t h = c.hits.load();
    while (c.hits.load() < h + 1000) {
    }
  }
  phase.store(2);
  spinner.join();
  EXPECT_EQ(wrong.load(), 0u) << "a wrong result while the entry was converted under a running caller";
  // Only real-time signals without a handler of the program.
  cfg.sample_signal = SIGUSR1;
  EXPECT_THROW(uprobe::configure(cfg), std::invalid_argument);
  EXPECT_EQ(uprobe::configuration().sample_signal, SIGRTMAX);
}

/// A thread stopped inside ent_load's window: its load at +1 waits on a page
/// that userfaultfd holds until release() fills it with 41.
class StoppedInEntLoad {
 public:
  /// False (with the reason) when userfaultfd cannot be used here.
  bool start(std::string& why) {
    uffd_ = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY));
    if (uffd_ < 0) return why = std::string("userfaultfd unavailable: ") + std::strerror(errno), false;
    uffdio_api api{};
    api.api = UFFD_API;
    if (ioctl(uffd_, UFFDIO_API, &api) != 0) return why = std::string("UFFDIO_API: ") + std::strerror(errno), false;
    page_ = sysconf(_SC_PAGESIZE);
    area_ = mmap(nullptr, static_cast<std::size_t>(page_), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area_ == MAP_FAILED) return why = "mmap failed", false;
    uffdio_register reg{};
    reg.range.start = reinterpret_cast<std::uint64_t>(area_);
    reg.range.len = static_cast<std::uint64_t>(page_);
    reg.mode = UFFDIO_REGISTER_MODE_MISSING;
    if (ioctl(uffd_, UFFDIO_REGISTER, &reg) != 0) return why = std::string("UFFDIO_REGISTER: ") + std::strerror(errno), false;
    thread_ = std::thread([this] { loaded_.store(ent_load(static_cast<const std::uint64_t*>(area_)) + 1); });
    pollfd pfd{uffd_, POLLIN, 0};
    if (poll(&pfd, 1, 5000) != 1) return why = "the thread never faulted", false;
    uffd_msg msg{};
    if (read(uffd_, &msg, sizeof msg) != static_cast<ssize_t>(sizeof msg) || msg.event != UFFD_EVENT_PAGEFAULT)
      return why = "no page-fault event", false;
    return true;
  }
  /// Lets the thread finish its load; the value it returns (41 + 1).
  std::uint64_t release() {
    alignas(64) static std::uint8_t src[65536];
    std::memset(src, 0, sizeof src);
    const std::uint64_t v = 41;
    std::memcpy(src, &v, sizeof v);
    uffdio_copy cp{};
    cp.dst = reinterpret_cast<std::uint64_t>(area_);
    cp.src = reinterpret_cast<std::uint64_t>(src);
    cp.len = static_cast<std::uint64_t>(page_);
    EXPECT_EQ(ioctl(uffd_, UFFDIO_COPY, &cp), 0) << std::strerror(errno);
    thread_.join();
    return loaded_.load();
  }
  ~StoppedInEntLoad() {
    if (thread_.joinable()) release();
    if (area_ && area_ != MAP_FAILED) munmap(area_, static_cast<std::size_t>(page_));
    if (uffd_ >= 0) close(uffd_);
  }

 private:
  int uffd_ = -1;
  long page_ = 0;
  void* area_ = nullptr;
  std::thread thread_;
  std::atomic<std::uint64_t> loaded_{0};
};

/// A thread stopped inside the window (on a load that userfaultfd holds at
/// +1) blocks the conversion; once it has left, the next attach converts.
TEST(Entry, ThreadStoppedInsideTheWindowBlocksTheConversion) {
  StoppedInEntLoad stopped;
  std::string why;
  if (!stopped.start(why)) GTEST_SKIP() << why;

  EntryCounter c(addr(ent_load));
  uprobe::Attachment a(vaddr(ent_load), c);
  uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
  EXPECT_EQ(info.mode, uprobe::ProbeMode::int3);
  EXPECT_NE(info.why_not_optimized.find("is stopped at " + hex(reinterpret_cast<std::uint64_t>(ent_load_fault))),
            std::string::npos)
      << "the reason should name the thread's address " << hex(reinterpret_cast<std::uint64_t>(ent_load_fault))
      << ": " << info.why_not_optimized;
  EXPECT_EQ(mem(vaddr(ent_load), 5), file_bytes_at(vaddr(ent_load), 5).size() ? [] {
    auto v = file_bytes_at(vaddr(ent_load), 5);
    v[0] = 0xcc;
    return v;
  }() : std::vector<std::uint8_t>{}) << "bytes 1..4 must be untouched while the thread is inside";

  // Let the thread finish its load (the page now holds 41).
  EXPECT_EQ(stopped.release(), 42u);

  EntryCounter c2(addr(ent_load));
  uprobe::Attachment a2(vaddr(ent_load), c2);
  EXPECT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(a.probe()).why_not_optimized;
  std::uint64_t x = 5;
  EXPECT_EQ(ent_load(&x), 5u);
  EXPECT_EQ(c.hits.load(), 1u);  // the thread that faulted entered before the probe
  EXPECT_EQ(c2.hits.load(), 1u);
}

/// A batch whose entries include one with a thread stopped inside its window
/// converts the others: only the entry whose window holds the thread stays
/// int3 (with the thread named), and it converts at the next attach once the
/// thread has left.
TEST(Entry, ThreadInsideOneWindowDefersOnlyThatEntryOfABatch) {
  StoppedInEntLoad stopped;
  std::string why;
  if (!stopped.start(why)) GTEST_SKIP() << why;

  EntryCounter on_load(addr(ent_load)), on_sub(addr(ent_sub));
  const std::vector<uprobe::ProbeRequest> reqs = {uprobe::ProbeRequest::at(vaddr(ent_load), on_load),
                                                  uprobe::ProbeRequest::at(vaddr(ent_sub), on_sub)};
  const auto res = uprobe::register_uprobes(reqs);
  ASSERT_TRUE(res[0] && res[1]);
  // Each result names its probe's mode as register_uprobes() left it.
  EXPECT_EQ(res[0].mode, uprobe::ProbeMode::int3);
  EXPECT_EQ(res[1].mode, uprobe::ProbeMode::optimized_entry);
  const uprobe::ProbeInfo load_info = uprobe::probe_info(res[0].probe);
  EXPECT_EQ(load_info.mode, uprobe::ProbeMode::int3);
  EXPECT_NE(load_info.why_not_optimized.find("is stopped at " + hex(reinterpret_cast<std::uint64_t>(ent_load_fault))),
            std::string::npos)
      << load_info.why_not_optimized;
  EXPECT_EQ(uprobe::probe_info(res[1].probe).mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(res[1].probe).why_not_optimized;
  for (int i = 0; i < 20; ++i) ASSERT_EQ(ent_sub(i, 1), i + 1u);
  EXPECT_EQ(on_sub.hits.load(), 20u);

  EXPECT_EQ(stopped.release(), 42u);
  EntryCounter again(addr(ent_load));
  uprobe::Attachment a2(vaddr(ent_load), again);
  EXPECT_EQ(uprobe::probe_info(res[0].probe).mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(res[0].probe).why_not_optimized;
  std::uint64_t x = 7;
  EXPECT_EQ(ent_load(&x), 7u);
  EXPECT_EQ(on_load.hits.load(), 1u);  // the faulted thread entered before the probe
  EXPECT_EQ(again.hits.load(), 1u);
  for (const auto& e : uprobe::unregister_uprobes(std::vector<uprobe::ProbeConsumer>{{res[0].probe, &on_load}, {res[1].probe, &on_sub}}))
    EXPECT_FALSE(e);
}

}  // namespace
