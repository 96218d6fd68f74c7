// SPDX-License-Identifier: MIT
// arch::call_preserving(), directly, under both strategies on one machine
// (PreserveStrategy::wide, what AMD uses; in_use, what every other CPU with
// xgetbv(1) uses), for each SaveMode at xmm, ymm and zmm width (skipped only
// where the CPU lacks AVX / AVX-512): a callback that clobbers every vector
// register, k0-k7, the MXCSR and the x87 control word, fills the whole x87
// stack and raises x87 exceptions must leave exactly what the mode promises
// (entry: xmm/ymm/zmm0-15, MXCSR, x87 control word; ret: also the x87
// stack with its tags and TOP; full: everything, zmm16-31 and k0-7 too,
// condition codes included, and the x87 initial configuration when that is
// where it was); the callback starts with the default floating-point
// environment and an empty x87 stack; in_use leaves clean upper halves
// clean (XINUSE).

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "arch.hpp"

namespace {

struct alignas(64) State {
  std::uint8_t vec[32][64];
  std::uint64_t k[8];
  std::uint32_t mxcsr;
  std::uint16_t fcw;
  std::uint16_t fsw;
  std::uint32_t depth;
  std::uint32_t flags;
  std::uint8_t st[3][16];
  alignas(64) std::uint8_t fx[512];
};
static_assert(offsetof(State, fx) == 2176 && sizeof(State) == 2688);

}  // namespace

extern "C" {
extern State preserve_in, preserve_out;
extern std::uint32_t preserve_xinuse[2];
extern std::uint32_t preserve_has_xgetbv1;
void preserve_run_0(uprobe::arch::SaveMode, void (*)(void*), void*);
void preserve_run_1(uprobe::arch::SaveMode, void (*)(void*), void*);
void preserve_run_2(uprobe::arch::SaveMode, void (*)(void*), void*);
}

namespace {

using uprobe::arch::PreserveStrategy;
using uprobe::arch::SaveMode;

constexpr std::uint32_t kRaisePe = 1, kX87Init = 2, kCleanUppers = 4;
constexpr std::uint32_t kYmmInUse = 1u << 2, kZmmHiInUse = 1u << 6;

bool has_avx() { return __builtin_cpu_supports("avx"); }
bool has_avx512() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"); }
bool has_xgetbv1() {
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0xd), "c"(1));
  return a & (1u << 2);
}

std::uint64_t mix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void fill(std::uint64_t seed, std::uint32_t depth, std::uint32_t flags, std::uint16_t fcw = 0x0c7f) {
  std::memset(&preserve_in, 0, sizeof preserve_in);
  std::uint64_t s = seed;
  for (auto& v : preserve_in.vec)
    for (std::size_t i = 0; i < sizeof v; i += 8) {
      const std::uint64_t w = mix(s);
      std::memcpy(v + i, &w, 8);
    }
  for (auto& k : preserve_in.k) k = mix(s);
  preserve_in.mxcsr = 0xbfe0 | 0x11;  // FTZ, round down, DAZ, masks; PE, UE, IE raised
  preserve_in.fcw = fcw;
  preserve_in.depth = depth;
  preserve_in.flags = flags;
  for (auto& st : preserve_in.st) {
    const long double v = static_cast<long double>(mix(s) % 1000003) / 7.0L - 3.0L;
    std::memcpy(st, &v, 10);
  }
}

// ---- the callbacks

struct Seen {
  int calls = 0;
  std::uint32_t mxcsr = 0;
  std::uint16_t fcw = 0, fsw = 0;
  std::uint8_t tags = 0xff;
};

void read_env(Seen& s) {
  alignas(16) std::uint8_t fx[512];
  asm volatile("fxsave64 %0\n stmxcsr %1\n fnstcw %2\n fnstsw %3" : "=m"(fx), "=m"(s.mxcsr), "=m"(s.fcw), "=m"(s.fsw));
  s.tags = fx[4];
  ++s.calls;
}

void nothing(void* p) { read_env(*static_cast<Seen*>(p)); }

__attribute__((target("avx512f,avx512bw"))) void clobber_zmm() {
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

__attribute__((target("avx2"))) void clobber_ymm() {
  asm volatile(
#define Y(n) "vpcmpeqd %%ymm" #n ",%%ymm" #n ",%%ymm" #n "\n"
      Y(0) Y(1) Y(2) Y(3) Y(4) Y(5) Y(6) Y(7) Y(8) Y(9) Y(10) Y(11) Y(12) Y(13) Y(14) Y(15)
#undef Y
      ::
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12", "xmm13", "xmm14", "xmm15");
}

/// Clobbers everything a compiled function may: every vector register at
/// full width (upper halves left dirty), k0-k7, the MXCSR and the x87
/// control word; fills and empties the whole x87 stack; raises ZE.
void hostile(void* p) {
  read_env(*static_cast<Seen*>(p));
  if (has_avx512())
    clobber_zmm();
  else if (has_avx())
    clobber_ymm();
  else
    asm volatile("pcmpeqd %%xmm0,%%xmm0\n pcmpeqd %%xmm7,%%xmm7\n pcmpeqd %%xmm15,%%xmm15" ::: "xmm0", "xmm7", "xmm15");
  const std::uint32_t mx = 0x7f80 | 0x3f;
  const std::uint16_t cw = 0x027f;
  asm volatile(
      "fld1\n fld1\n fld1\n fld1\n fld1\n fld1\n fld1\n fld1\n"
      "fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n fstp %%st(0)\n"
      "fstp %%st(0)\n fld1\n fldz\n fdivrp\n fstp %%st(0)\n ldmxcsr %0\n fldcw %1"
      :
      : "m"(mx), "m"(cw)
      : "memory");
}

std::string hexs(const std::uint8_t* p, std::size_t n) {
  std::string out;
  char b[4];
  for (std::size_t i = n; i-- > 0;) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    out += b;
  }
  return out;
}

/// Differences of `got` from `want` in what `mode` promises at `level`.
std::string diff(int level, SaveMode mode, const State& want, const State& got) {
  std::string d;
  // zmm16-31 and k0-7 only where everything is kept (SaveMode::entry, in arch.hpp).
  const int regs = level == 2 && mode == SaveMode::full ? 32 : 16;
  const std::size_t width = level == 0 ? 16 : level == 1 ? 32 : 64;
  char b[96];
  for (int r = 0; r < regs; ++r)
    if (std::memcmp(want.vec[r], got.vec[r], width) != 0) {
      std::snprintf(b, sizeof b, "v%d ", r);
      d.append(b).append(hexs(got.vec[r], width)).append(" want ").append(hexs(want.vec[r], width)).append("; ");
    }
  if (level == 2 && mode == SaveMode::full)
    for (int k = 0; k < 8; ++k)
      if (want.k[k] != got.k[k]) {
        std::snprintf(b, sizeof b, "k%d %#llx want %#llx; ", k, static_cast<unsigned long long>(got.k[k]),
                      static_cast<unsigned long long>(want.k[k]));
        d += b;
      }
  if (want.mxcsr != got.mxcsr) {
    std::snprintf(b, sizeof b, "mxcsr %#x want %#x; ", got.mxcsr, want.mxcsr);
    d += b;
  }
  if (want.fcw != got.fcw) {
    std::snprintf(b, sizeof b, "fcw %#x want %#x; ", got.fcw, want.fcw);
    d += b;
  }
  if (mode == SaveMode::entry) return d;
  const std::uint16_t mask = mode == SaveMode::full ? 0xffff : 0x3800;  // ret: TOP (the ABI keeps no status word)
  if ((want.fsw & mask) != (got.fsw & mask)) {
    std::snprintf(b, sizeof b, "fsw %#x want %#x; ", got.fsw, want.fsw);
    d += b;
  }
  if (want.fx[4] != got.fx[4]) {
    std::snprintf(b, sizeof b, "tags %#x want %#x; ", got.fx[4], want.fx[4]);
    d += b;
  }
  const unsigned top = (want.fsw >> 11) & 7;
  for (unsigned i = 0; i < 8; ++i)
    if ((want.fx[4] & (1u << ((top + i) & 7))) && std::memcmp(want.fx + 32 + 16 * i, got.fx + 32 + 16 * i, 10) != 0) {
      std::snprintf(b, sizeof b, "st%u ", i);
      d.append(b).append(hexs(got.fx + 32 + 16 * i, 10)).append(" want ").append(hexs(want.fx + 32 + 16 * i, 10));
      d += "; ";
    }
  return d;
}

void (*const kRun[3])(SaveMode, void (*)(void*), void*) = {preserve_run_0, preserve_run_1, preserve_run_2};

struct Restore {
  PreserveStrategy saved = uprobe::arch::preserve_strategy();
  ~Restore() { uprobe::arch::set_preserve_strategy(saved); }
};

class Preserve : public ::testing::TestWithParam<std::tuple<PreserveStrategy, int, SaveMode>> {
 protected:
  Restore restore;
  PreserveStrategy strategy = PreserveStrategy::wide;
  int level = 0;
  SaveMode mode = SaveMode::entry;
  void SetUp() override {
    std::tie(strategy, level, mode) = GetParam();
    if (level == 1 && !has_avx()) GTEST_SKIP() << "no AVX";
    if (level == 2 && !has_avx512()) GTEST_SKIP() << "no AVX-512";
    preserve_has_xgetbv1 = has_xgetbv1();
    if (strategy == PreserveStrategy::in_use && !preserve_has_xgetbv1) GTEST_SKIP() << "no xgetbv(1)";
    ASSERT_TRUE(uprobe::arch::set_preserve_strategy(strategy));
  }
  /// x87 values a mode may find: none at an entry, up to 2 at a return, 3 elsewhere.
  std::uint32_t depth(int i) const {
    return mode == SaveMode::entry ? 0 : mode == SaveMode::ret ? static_cast<std::uint32_t>(i % 3)
                                                               : static_cast<std::uint32_t>(i % 4);
  }
};

TEST_P(Preserve, HostileCallbackLeavesWhatTheModePromises) {
  for (int i = 0; i < 24; ++i) {
    fill(static_cast<std::uint64_t>(i) * 31 + static_cast<std::uint64_t>(level), depth(i), i % 2 ? kRaisePe : 0);
    Seen quiet;
    kRun[level](mode, nothing, &quiet);
    const State ref = preserve_out;
    ASSERT_EQ(quiet.calls, 1);
    // The quiet run: what was loaded, untouched.
    State loaded = preserve_in;
    loaded.fsw = ref.fsw;
    std::memcpy(loaded.fx, ref.fx, sizeof loaded.fx);
    ASSERT_EQ(diff(level, SaveMode::entry, loaded, ref), "") << "round " << i << ", no-op callback";
    const unsigned top = (ref.fsw >> 11) & 7;
    ASSERT_EQ(top, (8 - depth(i)) & 7) << "round " << i;
    for (unsigned k = 0; k < depth(i); ++k)
      ASSERT_EQ(hexs(ref.fx + 32 + 16 * k, 10), hexs(preserve_in.st[k], 10)) << "round " << i << " st" << k;
    Seen seen;
    kRun[level](mode, hostile, &seen);
    EXPECT_EQ(diff(level, mode, ref, preserve_out), "") << "round " << i << " (" << depth(i) << " x87 values)";
    for (const Seen* s : {&quiet, &seen}) {
      EXPECT_EQ(s->mxcsr & ~0x3fu, 0x1f80u) << "round " << i << ": the MXCSR controls";
      EXPECT_EQ(s->fcw, 0x037fu) << "round " << i;
      EXPECT_EQ((s->fsw >> 11) & 7, 0u) << "round " << i << ": the callback's x87 stack is not empty";
      EXPECT_EQ(s->tags, 0u) << "round " << i << ": the callback's x87 stack is not empty";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, Preserve,
    ::testing::Combine(::testing::Values(PreserveStrategy::wide, PreserveStrategy::in_use), ::testing::Values(0, 1, 2),
                       ::testing::Values(SaveMode::entry, SaveMode::ret, SaveMode::full)),
    [](const ::testing::TestParamInfo<std::tuple<PreserveStrategy, int, SaveMode>>& i) {
      const SaveMode m = std::get<2>(i.param);
      return std::string(std::get<0>(i.param) == PreserveStrategy::wide ? "wide" : "in_use") + "_" +
             (std::get<1>(i.param) == 0 ? "xmm" : std::get<1>(i.param) == 1 ? "ymm" : "zmm") + "_" +
             (m == SaveMode::entry ? "entry" : m == SaveMode::ret ? "ret" : "full");
    });

// in_use: upper halves that were clean are clean again after a callback that
// dirtied them (vzeroupper), and zmm state not in use before is not left in
// use (no 512-bit state where the program had none).
TEST(PreserveHygiene, InUseLeavesCleanUpperHalvesClean) {
  if (!has_avx() || !has_xgetbv1()) GTEST_SKIP() << "no AVX or no xgetbv(1)";
  Restore restore;
  preserve_has_xgetbv1 = 1;
  ASSERT_TRUE(uprobe::arch::set_preserve_strategy(PreserveStrategy::in_use));
  for (SaveMode mode : {SaveMode::entry, SaveMode::ret, SaveMode::full}) {
    fill(7, 0, 0);
    preserve_in.flags = kCleanUppers;
    Seen seen;
    preserve_run_0(mode, hostile, &seen);
    EXPECT_EQ(preserve_xinuse[0] & (kYmmInUse | kZmmHiInUse), 0u) << "the fixture's vzeroupper";
    EXPECT_EQ(preserve_xinuse[1] & (kYmmInUse | kZmmHiInUse), 0u)
        << "mode " << static_cast<int>(mode) << ": upper halves left dirty, XINUSE " << std::hex << preserve_xinuse[1];
    {
      State want = preserve_in;
      want.fsw = preserve_out.fsw;
      std::memcpy(want.fx, preserve_out.fx, sizeof want.fx);
      EXPECT_EQ(diff(0, SaveMode::entry, want, preserve_out), "") << "mode " << static_cast<int>(mode);
    }
    if (has_avx512()) {
      fill(9, 0, 0);
      preserve_in.flags = kCleanUppers;
      preserve_run_1(mode, hostile, &seen);  // ymm in use, zmm upper halves clean
      EXPECT_EQ(preserve_xinuse[1] & kZmmHiInUse, 0u)
          << "mode " << static_cast<int>(mode) << ": zmm upper halves left in use, XINUSE " << std::hex
          << preserve_xinuse[1];
      State want = preserve_in;
      want.fsw = preserve_out.fsw;
      std::memcpy(want.fx, preserve_out.fx, sizeof want.fx);
      EXPECT_EQ(diff(1, SaveMode::entry, want, preserve_out), "") << "mode " << static_cast<int>(mode);
    }
  }
}

// full, the x87 state in its initial configuration (XINUSE bit 0 clear): a
// callback that used x87 (values pushed and popped, ZE raised, another
// control word) leaves the initial configuration behind.
TEST(PreserveHygiene, FullRestoresTheX87InitialConfiguration) {
  if (!has_xgetbv1()) GTEST_SKIP() << "no xgetbv(1)";
  Restore restore;
  preserve_has_xgetbv1 = 1;
  for (PreserveStrategy s : {PreserveStrategy::wide, PreserveStrategy::in_use}) {
    ASSERT_TRUE(uprobe::arch::set_preserve_strategy(s));
    fill(3, 0, kX87Init, 0x037f);
    Seen seen;
    preserve_run_0(SaveMode::full, hostile, &seen);
    if (preserve_xinuse[0] & 1) GTEST_SKIP() << "this CPU does not report the x87 initial configuration";
    EXPECT_EQ(preserve_out.fsw, 0u);
    EXPECT_EQ(preserve_out.fcw, 0x037fu);
    EXPECT_EQ(preserve_out.fx[4], 0u) << "x87 tags";
    EXPECT_EQ(preserve_out.mxcsr, preserve_in.mxcsr);
    EXPECT_EQ(seen.calls, 1);
  }
}

}  // namespace

namespace {

// returns_true_only(): `return true;` as compilers emit it (GCC's mov $1,%eax,
// clang's mov $1,%al, with endbr64, with rep ret), and nothing else.
TEST(ReturnsTrueOnly, RecognizesOnlyReturnTrue) {
  const std::uint8_t gcc[] = {0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3};
  const std::uint8_t clang[] = {0xb0, 0x01, 0xc3};
  const std::uint8_t ibt[] = {0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 0x01, 0x00, 0x00, 0x00, 0xc3};
  const std::uint8_t repret[] = {0xb8, 0x01, 0x00, 0x00, 0x00, 0xf3, 0xc3};
  for (const std::uint8_t* yes : {gcc, clang, ibt, repret}) EXPECT_TRUE(uprobe::arch::returns_true_only(yes));
  const std::uint8_t ret_false[] = {0x31, 0xc0, 0xc3};                        // xor %eax,%eax; ret
  const std::uint8_t two[] = {0xb8, 0x02, 0x00, 0x00, 0x00, 0xc3};            // return 2
  const std::uint8_t more[] = {0xb8, 0x01, 0x00, 0x00, 0x00, 0x90, 0xc3};     // then a nop
  const std::uint8_t sse[] = {0x66, 0x0f, 0xef, 0xc0, 0xb0, 0x01, 0xc3};      // pxor first
  const std::uint8_t jmp[] = {0xf3, 0x0f, 0x1e, 0xfa, 0xe9, 0x00, 0x00, 0x00, 0x00};
  const std::uint8_t rep_other[] = {0xb0, 0x01, 0xf3, 0x90};                  // pause, not ret
  for (const std::uint8_t* no : {ret_false, two, more, sse, jmp, rep_other})
    EXPECT_FALSE(uprobe::arch::returns_true_only(no));
}

}  // namespace
