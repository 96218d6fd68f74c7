// SPDX-License-Identifier: MIT
// Register state at an optimized mid-function nop5: every GPR, the flags
// (CF PF AF ZF SF DF OF), mxcsr, the x87 control word, xmm0-15, the ymm upper
// halves and zmm0-31/k0-k7 where the CPU has them survive a hit exactly as in
// the unprobed run: with a default consumer (vector state saved) even when
// the handler clobbers every vector register, mxcsr and the x87 control word;
// with a consumer that declared set_vector_state_unused() and does integer
// work only. What the handler sees (GPRs, rip, rsp, flags); what its writes
// do (rax/rdi, rip redirect).

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "int_consumers.hpp"
#include "opt_common.hpp"

using namespace opttest;
using uprobe::Action;
using uprobe::Regs;

namespace {

// ------------------------------------------------------------ levels ----

enum class Level { sse, avx, avx512 };

const char* level_name(Level l) { return l == Level::sse ? "sse" : l == Level::avx ? "avx" : "avx512"; }

bool cpu_has(Level l) {
  __builtin_cpu_init();
  switch (l) {
    case Level::sse: return true;
    case Level::avx: return __builtin_cpu_supports("avx");
    case Level::avx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }
  return false;
}

std::uint64_t (*level_fn(Level l))() {
  return l == Level::sse ? opt_state_sse : l == Level::avx ? opt_state_avx : opt_state_avx512;
}
std::uint64_t level_site(Level l) {
  return l == Level::sse ? opt_state_sse_site : l == Level::avx ? opt_state_avx_site : opt_state_avx512_site;
}
const void* level_site_addr(Level l) { return at(level_fn(l), level_site(l)); }

constexpr std::uint64_t kFlagsSet = 0xcd5;  // CF PF AF ZF SF DF OF (the fixture sets all of them)
constexpr std::uint32_t kMxcsrIn = 0xbfe0;  // FTZ, round-down, all masks, DAZ, PE
constexpr std::uint16_t kFcwIn = 0x0c7f;    // x87: round toward zero, single precision

std::uint64_t mix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void fill_input(std::uint64_t seed) {
  std::memset(&opt_state_in, 0, sizeof opt_state_in);
  std::uint64_t s = seed;
  for (int n = 0; n < 16; ++n)
    opt_state_in.gpr[n] = n == 4 ? 0 : (0x5a00000000000000ull | std::uint64_t(n) << 40 | (mix(s) & 0xffffff0000ull) | n);
  opt_state_in.mxcsr = kMxcsrIn;
  opt_state_in.fcw = kFcwIn;
  for (auto& k : opt_state_in.k) k = mix(s);
  for (auto& v : opt_state_in.vec)
    for (std::size_t i = 0; i < sizeof v; i += 8) {
      const std::uint64_t w = mix(s);
      std::memcpy(v + i, &w, 8);
    }
}

OptState run_level(Level l) {
  std::memset(&opt_state_out, 0, sizeof opt_state_out);
  opt_rsp_at_site = 0;
  EXPECT_EQ(level_fn(l)(), 0u);
  return opt_state_out;
}

const char* kGprNames[16] = {"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
                             "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15"};

/// "" if `got` equals `want` in everything level `l` stores; else the differences.
std::string diff_state(Level l, const OptState& want, const OptState& got) {
  std::string d;
  int n_diffs = 0;
  auto add = [&](const std::string& s) {
    if (n_diffs++ < 12) d += s + "; ";
  };
  for (int n = 0; n < 16; ++n)
    if (want.gpr[n] != got.gpr[n]) add(std::string(kGprNames[n]) + " " + hex(got.gpr[n]) + " want " + hex(want.gpr[n]));
  if (want.rflags != got.rflags) add("rflags " + hex(got.rflags) + " want " + hex(want.rflags));
  if (want.mxcsr != got.mxcsr) add("mxcsr " + hex(got.mxcsr) + " want " + hex(want.mxcsr));
  if (want.fcw != got.fcw) add("x87 cw " + hex(got.fcw) + " want " + hex(want.fcw));
  const int nregs = l == Level::avx512 ? 32 : 16;
  const std::size_t width = l == Level::sse ? 16 : l == Level::avx ? 32 : 64;
  const char* prefix = l == Level::sse ? "xmm" : l == Level::avx ? "ymm" : "zmm";
  for (int n = 0; n < nregs; ++n)
    for (std::size_t b = 0; b < width; ++b)
      if (want.vec[n][b] != got.vec[n][b]) {
        add(std::string(prefix) + std::to_string(n) + " byte " + std::to_string(b) + " " + hex(got.vec[n][b]) +
            " want " + hex(want.vec[n][b]));
        break;
      }
  if (l == Level::avx512)
    for (int k = 0; k < 8; ++k)
      if (want.k[k] != got.k[k])  // (append: GCC 12's false -Wrestrict on "literal" + std::string, PR 105329)
        add(std::string("k").append(std::to_string(k)).append(" ").append(hex(got.k[k])).append(" want ").append(
            hex(want.k[k])));
  if (n_diffs > 12) d += "(" + std::to_string(n_diffs - 12) + " more)";
  return d;
}

/// Sanity of the unprobed run: the fixture stores what it loaded.
void check_fixture(Level l, const OptState& out) {
  for (int n = 0; n < 16; ++n)
    if (n != 4) {
      ASSERT_EQ(hex(out.gpr[n]), hex(opt_state_in.gpr[n])) << kGprNames[n];
    }
  ASSERT_EQ(hex(out.rflags & kFlagsSet), hex(kFlagsSet));
  ASSERT_EQ(hex(out.mxcsr), hex(kMxcsrIn));
  ASSERT_EQ(hex(out.fcw), hex(kFcwIn));
  ASSERT_EQ(out.gpr[4], opt_rsp_at_site);
  const std::size_t width = l == Level::sse ? 16 : l == Level::avx ? 32 : 64;
  for (int n = 0; n < (l == Level::avx512 ? 32 : 16); ++n)
    ASSERT_EQ(std::memcmp(out.vec[n], opt_state_in.vec[n], width), 0) << "vector register " << n;
  if (l == Level::avx512)
    for (int k = 0; k < 8; ++k) {
      ASSERT_EQ(hex(out.k[k]), hex(opt_state_in.k[k])) << "k" << k;
    }
}

// ---------------------------------------------------- hostile handler ----

alignas(64) std::uint8_t g_big[2][1 << 16];

__attribute__((noinline)) void clobber_libc_and_fp(unsigned salt) {
  void* (*volatile ms)(void*, int, std::size_t) = &std::memset;
  void* (*volatile mc)(void*, const void*, std::size_t) = &std::memcpy;
  ms(g_big[0], static_cast<int>(salt & 0xff), sizeof g_big[0]);
  mc(g_big[1], g_big[0], sizeof g_big[0]);
  volatile double d = salt + 0.25;
  d = std::sqrt(d) * std::sin(d) + std::exp(d / 1e6) / 3.0;
  volatile long double ld = d;
  ld = ld * 3.0L / 7.0L + 1e-300L;
}

__attribute__((noinline)) void clobber_sse() {
  asm volatile(
      "pcmpeqd %%xmm0,%%xmm0\n pcmpeqd %%xmm1,%%xmm1\n pcmpeqd %%xmm2,%%xmm2\n pcmpeqd %%xmm3,%%xmm3\n"
      "pcmpeqd %%xmm4,%%xmm4\n pcmpeqd %%xmm5,%%xmm5\n pcmpeqd %%xmm6,%%xmm6\n pcmpeqd %%xmm7,%%xmm7\n"
      "pcmpeqd %%xmm8,%%xmm8\n pcmpeqd %%xmm9,%%xmm9\n pcmpeqd %%xmm10,%%xmm10\n pcmpeqd %%xmm11,%%xmm11\n"
      "pcmpeqd %%xmm12,%%xmm12\n pcmpeqd %%xmm13,%%xmm13\n pcmpeqd %%xmm14,%%xmm14\n pcmpeqd %%xmm15,%%xmm15\n" ::
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12", "xmm13", "xmm14", "xmm15");
}

__attribute__((noinline, target("avx2"))) void clobber_avx2() {
  asm volatile(
      "vpcmpeqd %%ymm0,%%ymm0,%%ymm0\n vpcmpeqd %%ymm1,%%ymm1,%%ymm1\n vpcmpeqd %%ymm2,%%ymm2,%%ymm2\n"
      "vpcmpeqd %%ymm3,%%ymm3,%%ymm3\n vpcmpeqd %%ymm4,%%ymm4,%%ymm4\n vpcmpeqd %%ymm5,%%ymm5,%%ymm5\n"
      "vpcmpeqd %%ymm6,%%ymm6,%%ymm6\n vpcmpeqd %%ymm7,%%ymm7,%%ymm7\n vpcmpeqd %%ymm8,%%ymm8,%%ymm8\n"
      "vpcmpeqd %%ymm9,%%ymm9,%%ymm9\n vpcmpeqd %%ymm10,%%ymm10,%%ymm10\n vpcmpeqd %%ymm11,%%ymm11,%%ymm11\n"
      "vpcmpeqd %%ymm12,%%ymm12,%%ymm12\n vpcmpeqd %%ymm13,%%ymm13,%%ymm13\n vpcmpeqd %%ymm14,%%ymm14,%%ymm14\n"
      "vpcmpeqd %%ymm15,%%ymm15,%%ymm15\n" ::
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12", "xmm13", "xmm14", "xmm15");
}

__attribute__((noinline, target("avx512f,avx512bw"))) void clobber_avx512() {
  asm volatile(
#define Z(n) "vpternlogd $0xff,%%zmm" #n ",%%zmm" #n ",%%zmm" #n "\n"
      Z(0) Z(1) Z(2) Z(3) Z(4) Z(5) Z(6) Z(7) Z(8) Z(9) Z(10) Z(11) Z(12) Z(13) Z(14) Z(15) Z(16) Z(17) Z(18) Z(19)
          Z(20) Z(21) Z(22) Z(23) Z(24) Z(25) Z(26) Z(27) Z(28) Z(29) Z(30) Z(31)
#undef Z
      "mov $-1, %%rax\n kmovq %%rax,%%k0\n kmovq %%rax,%%k1\n kmovq %%rax,%%k2\n kmovq %%rax,%%k3\n"
      "kmovq %%rax,%%k4\n kmovq %%rax,%%k5\n kmovq %%rax,%%k6\n kmovq %%rax,%%k7\n" ::
          : "rax", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
            "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "k0", "k1", "k2", "k3",
            "k4", "k5", "k6", "k7");
}

__attribute__((noinline)) void clobber_controls() {
  const std::uint32_t mx = 0x7f80;  // round toward zero, all masks, no DAZ/FTZ
  const std::uint16_t cw = 0x027f;  // x87: double precision, round to nearest
  asm volatile("ldmxcsr %0\n fldcw %1" : : "m"(mx), "m"(cw));
}

/// A default consumer (vector state saved) whose handler clobbers everything it can.
struct Clobberer : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Regs seen{};
  Action handler(Regs& r) override {
    const std::uint64_t h = hits.fetch_add(1) + 1;
    seen = r;
    clobber_libc_and_fp(static_cast<unsigned>(h));
    clobber_sse();
    if (cpu_has(Level::avx)) clobber_avx2();
    if (cpu_has(Level::avx512)) clobber_avx512();
    clobber_controls();
    return Action::keep;
  }
};

/// A consumer that *claims* it uses no vector state but clobbers xmm0-15
/// (to observe whether the stub saves the state).
struct LyingClobberer : uprobe::Consumer {
  LyingClobberer() { set_vector_state_unused(); }
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs&) override {
    hits.fetch_add(1);
    clobber_sse();
    return Action::keep;
  }
};

/// A default consumer whose handler calls through a pointer the analysis of
/// its code cannot follow (arch::analyze_clobbers()): the full state is saved.
void opaque_noop() {}
void (*volatile g_opaque)() = opaque_noop;
struct OpaqueCounter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs&) override {
    hits.fetch_add(1);
    g_opaque();
    return Action::keep;
  }
};

void check_seen(Level l, const Regs& s) {
  const std::uint64_t want[16] = {s.rax, s.rcx, s.rdx, s.rbx, 0,     s.rbp, s.rsi, s.rdi,
                                  s.r8,  s.r9,  s.r10, s.r11, s.r12, s.r13, s.r14, s.r15};
  for (int n = 0; n < 16; ++n)
    if (n != 4) {
      EXPECT_EQ(hex(want[n]), hex(opt_state_in.gpr[n])) << "handler saw " << kGprNames[n];
    }
  EXPECT_EQ(hex(s.rip), hex(reinterpret_cast<std::uint64_t>(level_site_addr(l)))) << "rip != the nop5 address";
  EXPECT_EQ(hex(s.rsp), hex(opt_rsp_at_site)) << "rsp != rsp at the site";
  EXPECT_EQ(hex(s.rflags & kFlagsSet), hex(kFlagsSet)) << "handler saw rflags " << hex(s.rflags);
}

constexpr int kRounds = 200;

/// For each seed: unprobed reference first, then attach `c` (mode by
/// Config::optimize) and require the same output. `seen` returns the Regs the
/// consumer recorded (checked when not null).
void run_state_check(Level l, bool optimize, uprobe::Consumer& c, const std::function<std::uint64_t()>& hits,
                     const std::function<const Regs*()>& seen, uprobe::Consumer* also = nullptr) {
  if (!cpu_has(l)) GTEST_SKIP() << level_name(l) << " not supported by this CPU";
  ConfigGuard g;
  set_optimize(optimize);
  std::vector<OptState> ref(kRounds);
  for (int i = 0; i < kRounds; ++i) {
    fill_input(static_cast<std::uint64_t>(i) * 7919 + 1);
    ref[static_cast<std::size_t>(i)] = run_level(l);
    ASSERT_NO_FATAL_FAILURE(check_fixture(l, ref[static_cast<std::size_t>(i)])) << "unprobed run, round " << i;
  }
  const std::uint64_t h0 = hits();
  const uprobe::Stats s0 = uprobe::stats();
  uprobe::Attachment extra;
  if (also) extra = uprobe::Attachment(level_site_addr(l), *also);
  uprobe::Attachment a(level_site_addr(l), c);
  const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
  ASSERT_EQ(info.mode, optimize ? uprobe::ProbeMode::optimized_nop5 : uprobe::ProbeMode::int3) << info.why_not_optimized;
  if (optimize) {
    EXPECT_EQ(check_jump_into_xol(level_site_addr(l)), "");
  }
  int bad = 0;
  std::string first;
  for (int i = 0; i < kRounds; ++i) {
    fill_input(static_cast<std::uint64_t>(i) * 7919 + 1);
    const OptState got = run_level(l);
    std::string d = diff_state(l, ref[static_cast<std::size_t>(i)], got);
    if (got.gpr[4] != opt_rsp_at_site) d += "rsp after the site != rsp before it; ";
    if (!d.empty() && bad++ == 0) first = "round " + std::to_string(i) + ": " + d;
    if (seen && seen() && i == kRounds - 1) check_seen(l, *seen());
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(bad, 0) << "state after the probed site differs from the unprobed run in " << bad << "/" << kRounds
                    << " rounds; first: " << first;
  EXPECT_EQ(hits() - h0, static_cast<std::uint64_t>(kRounds));
  EXPECT_EQ(d.optimized, optimize ? static_cast<std::uint64_t>(kRounds) : 0u) << stats_str(d);
}

class VectorState : public ::testing::TestWithParam<std::tuple<Level, bool>> {};

TEST_P(VectorState, DefaultConsumerClobberingHandler) {
  const auto [l, optimize] = GetParam();
  Clobberer c;
  run_state_check(l, optimize, c, [&] { return c.hits.load(); }, [&] { return &c.seen; });
}

TEST_P(VectorState, UnusedVectorStateIntegerOnlyConsumer) {
  const auto [l, optimize] = GetParam();
  IntRecorder c;
  run_state_check(l, optimize, c, [&] { return c.hits.load(); }, [&] { return &c.seen; });
}

TEST_P(VectorState, UnusedPlusDefaultConsumer) {
  const auto [l, optimize] = GetParam();
  if (!cpu_has(l)) GTEST_SKIP();
  // Both on one probe: the state is saved because one consumer needs it.
  IntCounter quiet;
  Clobberer c;
  run_state_check(l, optimize, c, [&] { return c.hits.load(); }, [&] { return &c.seen; }, &quiet);
  EXPECT_EQ(quiet.hits.load(), static_cast<std::uint64_t>(kRounds));
}

INSTANTIATE_TEST_SUITE_P(Levels, VectorState,
                         ::testing::Combine(::testing::Values(Level::sse, Level::avx, Level::avx512),
                                            ::testing::Values(true, false)),
                         [](const ::testing::TestParamInfo<std::tuple<Level, bool>>& i) {
                           return std::string(level_name(std::get<0>(i.param))) +
                                  (std::get<1>(i.param) ? "_optimized" : "_int3");
                         });

// A ThreadSanitizer build of libuprobe always saves the vector state
// (set_vector_state_unused() is ignored: the TSan runtime uses SSE registers).
#if defined(__SANITIZE_THREAD__)
constexpr bool kVectorStateAlwaysSaved = true;
#else
constexpr bool kVectorStateAlwaysSaved = false;
#endif
// A consumer's code is read as the compiler made it (arch::analyze_clobbers()),
// except in sanitizer builds, whose instrumentation calls the runtime.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kCodeReadAsIs = false;
#else
constexpr bool kCodeReadAsIs = true;
#endif

// The stub's "save vector state" flag follows the consumer set: a consumer
// that declares set_vector_state_unused() but clobbers xmm0-15 shows whether
// the state was saved (all-ones in the output) or not.
TEST(Vector, SaveFlagFollowsConsumerSet) {
  const Level l = Level::sse;
  fill_input(42);
  const OptState ref = run_level(l);
  ASSERT_NO_FATAL_FAILURE(check_fixture(l, ref));
  OptState clobbered = ref;
  for (int n = 0; n < 16; ++n) std::memset(clobbered.vec[n], 0xff, 16);

  LyingClobberer liar;
  uprobe::Attachment a(level_site_addr(l), liar);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_nop5);
  fill_input(42);
  const OptState& unsaved = kVectorStateAlwaysSaved ? ref : clobbered;
  EXPECT_EQ(diff_state(l, unsaved, run_level(l)), "") << "only unused-state consumers: the state is not saved"
                                                      << (kVectorStateAlwaysSaved ? " (TSan build: saved)" : "");
  {
    OpaqueCounter normal;
    uprobe::Attachment b(level_site_addr(l), normal);
    fill_input(42);
    EXPECT_EQ(diff_state(l, ref, run_level(l)), "")
        << "a default consumer whose code cannot be read joined: the state must be saved";
    EXPECT_EQ(normal.hits.load(), 1u);
  }
  fill_input(42);
  EXPECT_EQ(diff_state(l, unsaved, run_level(l)), "") << "the default consumer left: no save again";
  {
    // A default consumer whose code is read at registration (integer work
    // only, no call): what it can clobber is saved, nothing of the vector
    // registers, so the liar's clobbering shows (the MXCSR is kept). Under
    // ASan its code calls the sanitizer runtime: not read, the state is saved.
    Counter reads_as_integer_only;
    uprobe::Attachment b(level_site_addr(l), reads_as_integer_only);
    fill_input(42);
    EXPECT_EQ(diff_state(l, kCodeReadAsIs ? unsaved : ref, run_level(l)), "")
        << "a default consumer whose code touches no vector register joined: "
        << (kCodeReadAsIs ? "none saved" : "(sanitizer build: its code is not read) saved");
    EXPECT_EQ(reads_as_integer_only.hits.load(), 1u);
  }
  EXPECT_EQ(liar.hits.load(), 4u);
}

// fork(): the child keeps the parent's probes (and their stubs). A change the
// parent makes afterwards to its own consumer set (here: the default consumer
// leaves, only a set_vector_state_unused() consumer stays, so the parent's
// stub stops saving vector state) must not change the child's stub: the
// child's default consumer still needs the state saved.
TEST(Fork, ParentConsumerChangeDoesNotReachChildStub) {
  const Level l = Level::sse;
  fill_input(7);
  const OptState ref = run_level(l);
  ASSERT_NO_FATAL_FAILURE(check_fixture(l, ref));
  Clobberer c;
  uprobe::Uprobe* p = uprobe::register_uprobe(level_site_addr(l), c);
  ASSERT_EQ(uprobe::probe_info(p).mode, uprobe::ProbeMode::optimized_nop5);
  fill_input(7);
  ASSERT_EQ(diff_state(l, ref, run_level(l)), "");
  int p2c[2], c2p[2];
  ASSERT_EQ(::pipe(p2c), 0);
  ASSERT_EQ(::pipe(c2p), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char b;
    if (::read(p2c[0], &b, 1) != 1) ::_exit(2);
    fill_input(7);
    const std::string d = diff_state(l, ref, run_level(l));
    const std::uint64_t hits = c.hits.load();
    (void)!::write(c2p[1], &hits, sizeof hits);
    const std::uint32_t n = static_cast<std::uint32_t>(d.size());
    (void)!::write(c2p[1], &n, sizeof n);
    (void)!::write(c2p[1], d.data(), n);
    ::_exit(0);
  }
  IntCounter quiet;
  uprobe::Uprobe* q = uprobe::register_uprobe(level_site_addr(l), quiet);
  ASSERT_EQ(q, p);
  uprobe::unregister_uprobe(p, c);
  ASSERT_EQ(::write(p2c[1], "x", 1), 1);
  std::uint64_t child_hits = 0;
  std::uint32_t n = 0;
  ASSERT_EQ(::read(c2p[0], &child_hits, sizeof child_hits), static_cast<ssize_t>(sizeof child_hits));
  ASSERT_EQ(::read(c2p[0], &n, sizeof n), static_cast<ssize_t>(sizeof n));
  std::string d(n, '\0');
  std::size_t got = 0;
  while (got < n) {
    const ssize_t k = ::read(c2p[0], d.data() + got, n - got);
    if (k <= 0) break;
    got += static_cast<std::size_t>(k);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(child_hits, 2u) << "the child's consumer: one hit before fork, one in the child";
  EXPECT_EQ(d, "") << "in the child, the default consumer's hit no longer preserved the vector state";
  for (int fd : {p2c[0], p2c[1], c2p[0], c2p[1]}) ::close(fd);
  uprobe::unregister_uprobe(q, quiet);
}

// A session consumer with set_vector_state_unused() at an optimized function
// entry: the function's floating-point arguments (xmm0-7) must arrive intact.
void check_fargs(uprobe::Consumer& c, const std::function<std::uint64_t()>& entries,
                 const std::function<std::uint64_t()>& returns, std::uint64_t want_returns) {
  uprobe::Attachment a(vaddr(opt_fargs), c);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_nop5);
  const uprobe::Stats s0 = uprobe::stats();
  int bad = 0;
  std::string first;
  for (int i = 0; i < 1000; ++i) {
    const double base = i * 1.0625;
    const double args[8] = {base + 0.5, base + 1.5, base + 2.5, base + 3.5, base + 4.5, base + 5.5, base + 6.5, -base};
    std::memset(opt_fargs_out, 0, sizeof opt_fargs_out);
    const double r = opt_fargs(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7]);
    for (int k = 0; k < 8; ++k) {
      double got;
      std::memcpy(&got, opt_fargs_out + 16 * k, 8);
      if (std::memcmp(&got, &args[k], 8) != 0 && bad++ < 8) {
        std::uint64_t bits;
        std::memcpy(&bits, opt_fargs_out + 16 * k, 8);
        first += "call " + std::to_string(i) + ": xmm" + std::to_string(k) + " = " + std::to_string(got) +
                 " (bits " + hex(bits) + "), want " + std::to_string(args[k]) + "; ";
      }
    }
    if (r != args[0] + args[7] && bad++ < 8)
      first += "call " + std::to_string(i) + ": returned " + std::to_string(r) + "; ";
  }
  const uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(bad, 0) << "floating-point arguments clobbered at the optimized entry; first: " << first;
  EXPECT_EQ(entries(), 1000u);
  EXPECT_EQ(returns(), want_returns);
  EXPECT_EQ(d.optimized, 1000u) << stats_str(d);
  EXPECT_EQ(d.return_hits, want_returns) << stats_str(d);
}

struct DefaultSession : uprobe::Consumer {
  DefaultSession() : uprobe::Consumer(uprobe::Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, returns{0};
  Action handler(Regs&) override {
    entries.fetch_add(1);
    return Action::keep;
  }
  void ret_handler(Regs&, std::uint64_t) override { returns.fetch_add(1); }
};

TEST(Vector, FloatArgsSurviveDefaultSessionConsumer) {
  DefaultSession c;
  check_fargs(c, [&] { return c.entries.load(); }, [&] { return c.returns.load(); }, 1000);
}

TEST(Vector, FloatArgsSurviveUnusedStateSessionConsumer) {
  IntSession c;
  c.func = addr(opt_fargs);
  check_fargs(c, [&] { return c.entries.load(); }, [&] { return c.returns.load(); }, 1000);
  EXPECT_EQ(c.bad_cookie.load(), 0u);
  EXPECT_EQ(c.bad_func.load(), 0u);
}

TEST(Vector, FloatArgsSurviveUnusedStateEntryConsumer) {
  IntCounter c;
  check_fargs(c, [&] { return c.hits.load(); }, [] { return std::uint64_t{0}; }, 0);
}

// -------------------------------------------------- what the handler sees ----

TEST(Regs, SeenAtOptimizedSite) {
  const Level l = Level::sse;
  IntRecorder c;
  uprobe::Attachment a(level_site_addr(l), c);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_nop5);
  for (int i = 0; i < 1000; ++i) {
    fill_input(static_cast<std::uint64_t>(i) + 99);
    const OptState out = run_level(l);
    ASSERT_EQ(c.hits.load(), static_cast<std::uint64_t>(i + 1));
    ASSERT_NE(opt_rsp_at_site, 0u);
    ASSERT_EQ(out.gpr[4], opt_rsp_at_site);
    SCOPED_TRACE("call " + std::to_string(i));
    check_seen(l, c.seen);
    if (::testing::Test::HasFailure()) break;
  }
}

// ------------------------------------------------------ handler writes ----

struct Writer : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, bad_seen{0};
  std::uint64_t a = 0, b = 0;
  Action handler(Regs& r) override {
    hits.fetch_add(1);
    if (r.rax != a + b || r.rdi != a || r.rsi != b) bad_seen.fetch_add(1);
    r.rax = r.rax * 7 + 1;
    r.rdi = r.rdi ^ 0x5555;
    return Action::keep;
  }
};

TEST(Regs, HandlerWritesRaxRdi) {
  ConfigGuard g;
  ASSERT_EQ(opt_hw_site, 4u);
  for (bool optimize : {true, false}) {
    SCOPED_TRACE(optimize ? "optimized" : "int3");
    set_optimize(optimize);
    Writer w;
    uprobe::Attachment a(at(opt_hw, opt_hw_site), w);
    ASSERT_EQ(uprobe::probe_info(a.probe()).mode, optimize ? uprobe::ProbeMode::optimized_nop5 : uprobe::ProbeMode::int3);
    const uprobe::Stats s0 = uprobe::stats();
    for (std::uint64_t i = 0; i < 1000; ++i) {
      w.a = i * 0x1234567 + 1;
      w.b = ~i;
      const std::uint64_t want = 2 * ((w.a + w.b) * 7 + 1) + (w.a ^ 0x5555);
      ASSERT_EQ(hex(opt_hw(w.a, w.b)), hex(want)) << "call " << i;
    }
    const uprobe::Stats d = stats_delta(s0, uprobe::stats());
    EXPECT_EQ(w.hits.load(), 1000u);
    EXPECT_EQ(w.bad_seen.load(), 0u);
    EXPECT_EQ(d.optimized, optimize ? 1000u : 0u) << stats_str(d);
  }
}

// GPR and flag writes at the optimized site of the all-state fixture.
struct FlagWriter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs& r) override {
    hits.fetch_add(1);
    r.r10 = 0x0123456789abcdefull;
    r.rbx = 0xfedcba9876543210ull;
    r.rflags ^= 0x41;  // CF and ZF
    return Action::keep;
  }
};

TEST(Regs, GprAndFlagWrites) {
  ConfigGuard g;
  const Level l = Level::sse;
  for (bool optimize : {true, false}) {
    SCOPED_TRACE(optimize ? "optimized" : "int3");
    set_optimize(optimize);
    fill_input(5);
    const OptState ref = run_level(l);
    OptState want = ref;
    want.gpr[10] = 0x0123456789abcdefull;
    want.gpr[3] = 0xfedcba9876543210ull;
    want.rflags ^= 0x41;
    FlagWriter w;
    uprobe::Attachment a(level_site_addr(l), w);
    ASSERT_EQ(uprobe::probe_info(a.probe()).mode, optimize ? uprobe::ProbeMode::optimized_nop5 : uprobe::ProbeMode::int3);
    for (int i = 0; i < 100; ++i) {
      fill_input(5);
      ASSERT_EQ(diff_state(l, want, run_level(l)), "") << "call " << i;
    }
    EXPECT_EQ(w.hits.load(), 100u);
  }
}

// The flags at an optimized site: every combination of CF PF AF ZF SF OF,
// with DF clear (the stub's way out restores them by an add and sahf) and
// set (by popfq), is what the handler sees and what the code after the site
// finds; a handler's write of each status flag, and of DF, takes effect.
struct FlagsSeen : uprobe::Consumer {
  std::uint64_t xor_mask = 0;
  std::uint64_t seen = 0;
  std::atomic<std::uint64_t> hits{0};
  FlagsSeen() { set_vector_state_unused(); }
  Action handler(Regs& r) override {
    hits.fetch_add(1);
    seen = r.rflags;
    r.rflags ^= xor_mask;
    return Action::keep;
  }
};

TEST(Regs, EveryStatusFlagCombinationAndItsWrites) {
  ConfigGuard g;
  constexpr std::uint64_t kStatus = 0x8d5;  // CF PF AF ZF SF OF
  constexpr std::uint64_t kDf = 0x400;
  constexpr std::uint64_t kMask = kStatus | kDf;
  auto spread = [](unsigned bits) {  // bit i of `bits` -> the i-th status flag
    static constexpr std::uint64_t kFlag[] = {0x1, 0x4, 0x10, 0x40, 0x80, 0x800};
    std::uint64_t f = 0;
    for (unsigned i = 0; i < 6; ++i)
      if (bits & (1u << i)) f |= kFlag[i];
    return f;
  };
  for (unsigned combo = 0; combo < 128; ++combo) {  // (bit 6: DF)
    const std::uint64_t in = spread(combo & 63) | (combo & 64 ? kDf : 0);
    ASSERT_EQ(hex(opt_flags5(in) & kMask), hex(in)) << "the fixture without a probe";
  }
  FlagsSeen c;
  uprobe::Attachment a(at(opt_flags5, opt_flags5_site), c);
  ASSERT_EQ(uprobe::probe_info(a.probe()).mode, uprobe::ProbeMode::optimized_nop5);
  std::uint64_t calls = 0;
  for (std::uint64_t write : {std::uint64_t{0}, std::uint64_t{0x1}, std::uint64_t{0x4}, std::uint64_t{0x10},
                              std::uint64_t{0x40}, std::uint64_t{0x80}, std::uint64_t{0x800}, kStatus, kDf}) {
    c.xor_mask = write;
    for (unsigned combo = 0; combo < 128; ++combo) {
      const std::uint64_t in = spread(combo & 63) | (combo & 64 ? kDf : 0);
      const std::uint64_t out = opt_flags5(in);
      ++calls;
      ASSERT_EQ(hex(c.seen & kMask), hex(in)) << "the handler's view, flags " << hex(in);
      ASSERT_EQ(hex(out & kMask), hex(in ^ write)) << "after the site, flags " << hex(in) << ", the handler flipped "
                                                   << hex(write);
    }
  }
  EXPECT_EQ(c.hits.load(), calls);
}

// Regs: "Every field is readable and writable from a handler. Writes take
// effect when the thread continues". rsp included.
struct RspWriter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  Action handler(Regs& r) override {
    hits.fetch_add(1);
    r.rsp += 8;
    return Action::keep;
  }
};

TEST(Regs, RspWriteTakesEffect) {
  ConfigGuard g;
  ASSERT_EQ(opt_rspw(1, 2), 2u);
  for (bool optimize : {true, false}) {
    SCOPED_TRACE(optimize ? "optimized" : "int3");
    set_optimize(optimize);
    RspWriter w;
    uprobe::Attachment a(at(opt_rspw, opt_rspw_site), w);
    ASSERT_EQ(uprobe::probe_info(a.probe()).mode, optimize ? uprobe::ProbeMode::optimized_nop5 : uprobe::ProbeMode::int3);
    std::uint64_t ignored = 0;
    for (std::uint64_t i = 0; i < 100; ++i) {
      const std::uint64_t r = opt_rspw(1000 + i, 2000 + i);
      if (r == 2000 + i) ++ignored;
      else EXPECT_EQ(r, 1000 + i) << "call " << i;
    }
    EXPECT_EQ(ignored, 0u) << "the handler's rsp write (+8) was ignored in " << ignored << "/100 calls";
    EXPECT_EQ(w.hits.load(), 100u);
  }
}

struct Redirector : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  std::uint64_t to = 0;
  Action handler(Regs& r) override {
    hits.fetch_add(1);
    r.rip = to;
    return Action::keep;
  }
};

TEST(Regs, RipWriteRedirects) {
  ConfigGuard g;
  for (bool optimize : {true, false}) {
    SCOPED_TRACE(optimize ? "optimized" : "int3");
    set_optimize(optimize);
    Redirector h;
    h.to = reinterpret_cast<std::uint64_t>(at(opt_redir, opt_redir_alt));
    uprobe::Attachment a(at(opt_redir, opt_redir_site), h);
    ASSERT_EQ(uprobe::probe_info(a.probe()).mode, optimize ? uprobe::ProbeMode::optimized_nop5 : uprobe::ProbeMode::int3);
    const uprobe::Stats s0 = uprobe::stats();
    for (std::uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(opt_redir(i * 3), i * 3 + 1000) << "call " << i;
    const uprobe::Stats d = stats_delta(s0, uprobe::stats());
    EXPECT_EQ(h.hits.load(), 1000u);
    EXPECT_EQ(d.hits, 1000u) << stats_str(d);
    EXPECT_EQ(d.optimized, optimize ? 1000u : 0u) << stats_str(d);
    EXPECT_EQ(d.redirected, 1000u) << "Stats::redirected (\"a handler changed rip\"): " << stats_str(d);
    a.detach();
    for (std::uint64_t i = 0; i < 10; ++i) ASSERT_EQ(opt_redir(i), i + 1);
  }
}

}  // namespace
