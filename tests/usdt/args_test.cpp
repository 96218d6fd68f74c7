// SPDX-License-Identifier: MIT
// The USDT argument parser and evaluator without probes: every accepted form
// with its exact fields, evaluation against synthetic registers and memory,
// a table of malformed specs with their messages, and a robustness run over
// mutated and random inputs.
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <type_traits>

#include "uprobe/usdt.hpp"

using uprobe::Regs;
using uprobe::usdt::Arg;
using uprobe::usdt::ArgKind;
using uprobe::usdt::ArgSpec;
using uprobe::usdt::MemoryAccess;
using uprobe::usdt::ParseContext;
using uprobe::usdt::parse_args;
using uprobe::usdt::Reg;

namespace {

static_assert(sizeof(Arg) == 16, "an argument stays compact");
static_assert(std::is_trivially_copyable_v<ArgSpec>, "an ArgSpec is copied into handlers as is");

Regs regs_pattern() {
  Regs r{};
  r.rax = 0x80f1e2d3c4b5a697;
  r.rbx = 0x1122334455667788;
  r.rcx = 0xfedcba9876543210;
  r.rdx = 0x0123456789abcdef;
  r.rsi = 0xa5a5a5a5a5a5a5a5;
  r.rdi = 0x5a5a5a5a5a5a5a5a;
  r.rbp = 0xdeadbeef;
  r.rsp = 0x7ffc0000f000;
  r.r8 = 0xffffffffffffff80;
  r.r9 = 0x8000000080008080;
  r.r10 = 0x10;
  r.r11 = 0x1234;
  r.r12 = 0x7fffffff;
  r.r13 = 0x8000000000000000;
  r.r14 = 0xcafef00d12345678;
  r.r15 = 0xffff;
  r.rip = 0x555555554000;
  return r;
}

ArgSpec parse_ok(const std::string& text, const ParseContext& ctx = {}) {
  auto r = parse_args(text, ctx);
  EXPECT_TRUE(r.ok()) << text << ": " << r.error;
  return r.args;
}

Arg one(const std::string& text, const ParseContext& ctx = {}) {
  ArgSpec s = parse_ok(text, ctx);
  EXPECT_EQ(s.count(), 1u) << text;
  return s[0];
}

std::uint64_t eval(const std::string& text, const Regs& r, const ParseContext& ctx = {}) {
  ArgSpec s = parse_ok(text, ctx);
  std::uint64_t v = 0;
  EXPECT_TRUE(s.read(0, r, v)) << text;
  std::uint64_t d = 0;
  EXPECT_TRUE(s.read(0, r, d, MemoryAccess::direct)) << text;
  EXPECT_EQ(v, d) << text;
  return v;
}

template <typename T>
std::uint64_t sx(T v) {
  return static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
}

TEST(UsdtParse, EveryRegisterName) {
  const Regs r = regs_pattern();
  struct {
    const char* spec;
    std::uint64_t want;
  } cases[] = {
      {"-1@%al", sx(std::int8_t(0x97))}, {"1@%ah", 0xa6}, {"-2@%ax", sx(std::int16_t(0xa697))},
      {"4@%eax", 0xc4b5a697}, {"-8@%rax", 0x80f1e2d3c4b5a697}, {"-1@%bh", 0x77}, {"1@%ch", 0x32},
      {"-1@%dh", sx(std::int8_t(0xcd))}, {"-1@%sil", sx(std::int8_t(0xa5))}, {"2@%si", 0xa5a5},
      {"1@%dil", 0x5a}, {"-4@%edi", 0x5a5a5a5a}, {"-1@%bpl", sx(std::int8_t(0xef))}, {"2@%bp", 0xbeef},
      {"-4@%ebp", sx(std::int32_t(0xdeadbeef))}, {"1@%spl", 0x00}, {"2@%sp", 0xf000}, {"8@%rsp", 0x7ffc0000f000},
      {"-1@%r8b", sx(std::int8_t(-128))}, {"2@%r8w", 0xff80}, {"4@%r8d", 0xffffff80}, {"-8@%r8", sx(-128)},
      {"-2@%r9w", sx(std::int16_t(0x8080))}, {"-4@%r9d", sx(std::int32_t(0x80008080))}, {"1@%r10b", 0x10},
      {"2@%r11w", 0x1234}, {"4@%r12d", 0x7fffffff}, {"8@%r13", 0x8000000000000000},
      {"-4@%r14d", 0x12345678}, {"-2@%r15w", sx(-1)}, {"-1@%r15b", sx(-1)}, {"8@%r15", 0xffff},
      {"8@%rip", 0x555555554000}, {"4@%EAX", 0xc4b5a697},
  };
  for (const auto& c : cases) EXPECT_EQ(eval(c.spec, r), c.want) << c.spec;
  Arg ah = one("1@%ah");
  EXPECT_EQ(ah.kind, ArgKind::reg);
  EXPECT_EQ(ah.base, Reg::ah);
  EXPECT_EQ(ah.width, 1);
  Arg r9d = one("-4@%r9d");
  EXPECT_EQ(r9d.base, Reg::r9);
  EXPECT_EQ(r9d.width, 4);
  EXPECT_EQ(r9d.size, -4);
  EXPECT_TRUE(r9d.is_signed());
}

TEST(UsdtParse, Constants) {
  const Regs r = regs_pattern();
  struct {
    const char* spec;
    std::uint64_t want;
  } cases[] = {
      {"-4@$-7", sx(-7)}, {"4@$42", 42}, {"-8@$-9223372036854775808", sx(INT64_MIN)},
      {"8@$0xffffffffffffffff", UINT64_MAX}, {"8@$18446744073709551615", UINT64_MAX}, {"1@$255", 255},
      {"1@$-6", 250}, {"-1@$-128", sx(-128)}, {"-2@$0x7fff", 0x7fff}, {"8@$010", 8}, {"-2@$-1", sx(-1)},
      {"8@$0", 0}, {"4@$0X1F", 31}, {"-4@$+5", 5}, {"$3", 3},
  };
  for (const auto& c : cases) EXPECT_EQ(eval(c.spec, r), c.want) << c.spec;
  Arg a = one("-4@$-7");
  EXPECT_EQ(a.kind, ArgKind::constant);
  EXPECT_EQ(a.disp, -7);
  EXPECT_FALSE(a.pc_relative);
}

TEST(UsdtParse, MemoryOperands) {
  alignas(16) std::uint8_t buf[64];
  for (int i = 0; i < 64; ++i) buf[i] = static_cast<std::uint8_t>(0xf0 + i);
  Regs r{};
  r.rsi = reinterpret_cast<std::uintptr_t>(buf);
  r.rcx = 2;
  r.rbx = 1;
  r.rsp = reinterpret_cast<std::uintptr_t>(buf + 32);
  auto at = [&](int off, int n) {
    std::uint64_t v = 0;
    std::memcpy(&v, buf + off, static_cast<std::size_t>(n));
    return v;
  };
  EXPECT_EQ(eval("8@(%rsi)", r), at(0, 8));
  EXPECT_EQ(eval("4@4(%rsi)", r), at(4, 4));
  EXPECT_EQ(eval("-1@3(%rsi)", r), sx(static_cast<std::int8_t>(at(3, 1))));
  EXPECT_EQ(eval("-4@-8(%rsp)", r), sx(static_cast<std::int32_t>(at(24, 4))));
  EXPECT_EQ(eval("2@(%rsi,%rcx)", r), at(2, 2));
  EXPECT_EQ(eval("4@(%rsi,%rcx,4)", r), at(8, 4));
  EXPECT_EQ(eval("8@16(%rsi,%rbx,8)", r), at(24, 8));
  EXPECT_EQ(eval("2@0x10(%rsi,%rcx,2)", r), at(20, 2));
  EXPECT_EQ(eval("8@-8+16(%rsi)", r), at(8, 8));
  Arg m = one("8@16(%rsi,%rbx,8)");
  EXPECT_EQ(m.kind, ArgKind::memory);
  EXPECT_EQ(m.base, Reg::rsi);
  EXPECT_EQ(m.index, Reg::rbx);
  EXPECT_EQ(m.scale, 8);
  EXPECT_EQ(m.disp, 16);
  // No base: index*scale + disp.
  Regs ri{};
  ri.rax = 3;
  const auto base = reinterpret_cast<std::uintptr_t>(buf);
  EXPECT_EQ(eval("8@" + std::to_string(base) + "(,%rax,8)", ri), at(24, 8));
  // Absolute address.
  EXPECT_EQ(eval("4@" + std::to_string(base + 4), ri), at(4, 4));
  // N(%rip): the probe address + N.
  Regs rr{};
  rr.rip = base;
  EXPECT_EQ(eval("8@16(%rip)", rr), at(16, 8));
  Arg rip = one("8@16(%rip)");
  EXPECT_EQ(rip.base, Reg::rip);
  EXPECT_FALSE(rip.pc_relative);
}

TEST(UsdtParse, SymbolOperandsAreRelativeToTheSite) {
  // Link-time: the site at 0x1000, `counter` at 0x4010, `.LC0` unknown.
  ParseContext ctx;
  ctx.pc = 0x1000;
  ctx.lookup = [](std::string_view n) -> std::optional<std::uint64_t> {
    if (n == "counter") return 0x4010;
    if (n == "counter.0") return 0x4020;
    if (n == "_ZN2ns3varE") return 0x4030;
    return std::nullopt;
  };
  Arg a = one("-4@counter(%rip)", ctx);
  EXPECT_EQ(a.kind, ArgKind::memory);
  EXPECT_TRUE(a.pc_relative);
  EXPECT_EQ(a.base, Reg::none);
  EXPECT_EQ(a.disp, 0x3010);
  EXPECT_EQ(one("-8@counter+8(%rip)", ctx).disp, 0x3018);
  EXPECT_EQ(one("-8@8+counter(%rip)", ctx).disp, 0x3018);
  EXPECT_EQ(one("-8@counter-16(%rip)", ctx).disp, 0x3000);
  EXPECT_EQ(one("4@counter.0(%rip)", ctx).disp, 0x3020);
  EXPECT_EQ(one("8@_ZN2ns3varE(%rip)", ctx).disp, 0x3030);
  Arg c = one("8@$counter", ctx);
  EXPECT_EQ(c.kind, ArgKind::constant);
  EXPECT_TRUE(c.pc_relative);
  Arg idx = one("8@counter(,%rax,8)", ctx);
  EXPECT_TRUE(idx.pc_relative);
  EXPECT_EQ(idx.index, Reg::rax);

  // Loaded 0x7f0000000000 higher: rip at the site is 0x7f0000001000.
  alignas(8) std::int32_t cell[8] = {-77, 0, 0, 0, 5, 0, 0, 0};
  const auto cell_rt = reinterpret_cast<std::uintptr_t>(cell);
  ParseContext real;  // `counter` is wherever `cell` is, relative to a fake site
  real.pc = 0x1000;
  real.lookup = [&](std::string_view) -> std::optional<std::uint64_t> { return 0x1000 + 0x40; };
  Regs r{};
  r.rip = cell_rt - 0x40;
  EXPECT_EQ(eval("-4@counter(%rip)", r, real), sx(-77));
  EXPECT_EQ(eval("-4@counter+16(%rip)", r, real), 5u);
  EXPECT_EQ(eval("8@$counter", r, real), cell_rt);
  r.rax = 4;
  EXPECT_EQ(eval("-4@counter(,%rax,4)", r, real), 5u);

  auto bad = parse_args("8@.LC0(%rip)", ctx);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.error.find("`.LC0' is not in the file's symbol tables"), std::string::npos) << bad.error;
  auto nolookup = parse_args("8@counter(%rip)");
  EXPECT_FALSE(nolookup.ok());
}

TEST(UsdtParse, SizesFloatsAndSizeless) {
  Arg f8 = one("8f@%rax");
  EXPECT_TRUE(f8.is_float);
  EXPECT_EQ(f8.bytes(), 8u);
  EXPECT_FALSE(f8.is_signed());
  Arg f4 = one("4f@-20(%rbp)");
  EXPECT_TRUE(f4.is_float);
  EXPECT_EQ(f4.kind, ArgKind::memory);
  // Float bits are returned unextended.
  Regs r{};
  r.rax = 0xffffffffbfc00000;  // low half: -1.5f
  EXPECT_EQ(eval("4f@%eax", r), 0xbfc00000u);
  // Without SIZE@ (sdt v1/v2): unsigned, the register's width or 8 bytes.
  Arg s = one("%eax");
  EXPECT_EQ(s.size, 4);
  EXPECT_EQ(one("%r10").size, 8);
  EXPECT_EQ(one("-4(%rbp)").size, 8);
  EXPECT_EQ(one("$5").size, 8);
  // xmm: parses, cannot be read.
  auto x = parse_args("8f@%xmm1");
  ASSERT_TRUE(x.ok()) << x.error;
  std::uint64_t v = 7;
  EXPECT_FALSE(x.args.read(0, r, v));
  EXPECT_EQ(v, 7u);
  EXPECT_EQ(x.args[0].base, Reg::xmm);
  EXPECT_EQ(x.args[0].disp, 1);
}

TEST(UsdtParse, ManyArgumentsAndBlanks) {
  auto r = parse_args("  -4@%esi\t-4@-24(%rbp)  -4@%ecx 2@%ax 8@%rdx  ");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.args.count(), 5u);
  EXPECT_TRUE(parse_args("").ok());
  EXPECT_EQ(parse_args("   ").args.count(), 0u);
  std::string twelve;
  for (int i = 0; i < 12; ++i) twelve += "8@$" + std::to_string(i) + " ";
  auto t = parse_args(twelve);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.args.count(), 12u);
  Regs regs{};
  for (unsigned i = 0; i < 12; ++i) EXPECT_EQ(t.args.value(i, regs), i);
  EXPECT_EQ(t.args.value(12, regs), 0u);
  auto thirteen = parse_args(twelve + "8@$12");
  EXPECT_FALSE(thirteen.ok());
  EXPECT_EQ(thirteen.error_arg, 13u);
  EXPECT_NE(thirteen.error.find("more than 12"), std::string::npos);
}

TEST(UsdtParse, FormatRoundTrips) {
  for (const char* s : {"-4@%esi", "1@%ah", "-8@-24(%rbp)", "4@(%rsi,%rcx,4)", "8@16(%rip)", "-4@$-7", "8f@%rax",
                        "2@(,%rbx,2)"}) {
    Arg a = one(s);
    std::string f = uprobe::usdt::format_arg(a);
    Arg b = one(f);
    EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << s << " -> " << f;
  }
  EXPECT_EQ(uprobe::usdt::format_arg(one("-8@-24(%rbp)")), "-8@-24(%rbp)");
  EXPECT_EQ(uprobe::usdt::format_arg(one("1@%ah")), "1@%ah");
}

TEST(UsdtParse, MalformedSpecsGiveClearErrors) {
  struct {
    const char* spec;
    unsigned arg;
    const char* message;
  } cases[] = {
      {"3@%eax", 1, "size 3 is not 1, 2, 4 or 8"},
      {"-16@%eax", 1, "size -16 is not 1, 2, 4 or 8"},
      {"123456@%eax", 1, "size is not 1, 2, 4 or 8"},
      {"2f@%eax", 1, "floating-point size 2"},
      {"4@", 1, "missing operand after `@'"},
      {"@%eax", 1, "missing size before `@'"},
      {"4@%", 1, "expected a register name"},
      {"4@%foo", 1, "unknown register `%foo'"},
      {"4@%xmm16", 1, "unknown register `%xmm16'"},
      {"4@%eaxx", 1, "unknown register `%eaxx'"},
      {"4@%averyveryverylongregistername", 1, "unknown register"},
      {"4@$", 1, "missing value after `$'"},
      {"4@$0x", 1, "expected hex digits after 0x"},
      {"4@$09", 1, "digit `9' in an octal number"},
      {"8@$18446744073709551616", 1, "number out of 64-bit range"},
      {"8@$5x", 1, "unexpected `x' after the operand"},
      {"4@(%eax)", 1, "base register `%eax' is not a 64-bit register"},
      {"4@(%xmm0)", 1, "base register `%xmm' is not a 64-bit register"},
      {"4@(%rax,%esi)", 1, "index register `%esi' is not a 64-bit index register"},
      {"4@(%rax,%rsp)", 1, "index register `%rsp'"},
      {"4@(%rip,%rax)", 1, "%rip cannot be combined"},
      {"4@(%rax,%rbx,3)", 1, "scale is not 1, 2, 4 or 8"},
      {"4@(%rax,%rbx,16)", 1, "scale is not 1, 2, 4 or 8"},
      {"4@(%rax,%rbx,)", 1, "expected a scale"},
      {"4@(%rax,)", 1, "expected an index register"},
      {"4@(%rax", 1, "missing `)'"},
      {"4@(%rax))", 1, "unexpected `)' after the operand"},
      {"4@()", 1, "empty memory operand"},
      {"4@8(%rax)x", 1, "unexpected `x' after the operand"},
      {"4@*8(%rax)", 1, "unexpected `*'"},
      {"4@-(%rax)", 1, "expected a number or a symbol before `('"},
      {"4@unknown_sym(%rip)", 1, "symbol `unknown_sym' is not in the file's symbol tables"},
      {"4@foo@GOTPCREL(%rip)", 1, "relocation operators"},
      {"4@foo+bar(%rip)", 1, "more than one symbol"},
      {"4@-foo(%rip)", 1, "negated symbol"},
      {"-4@%eax 4@%nope", 2, "argument #2 `4@%nope': unknown register `%nope'"},
      {"8@$1 8@$2 3@$3", 3, "argument #3"},
  };
  ParseContext ctx;
  ctx.lookup = [](std::string_view n) -> std::optional<std::uint64_t> {
    if (n == "foo" || n == "bar") return 0x1000;
    return std::nullopt;
  };
  for (const auto& c : cases) {
    auto r = parse_args(c.spec, ctx);
    EXPECT_FALSE(r.ok()) << c.spec;
    EXPECT_EQ(r.error_arg, c.arg) << c.spec;
    EXPECT_NE(r.error.find(c.message), std::string::npos) << c.spec << " -> " << r.error;
    EXPECT_NE(r.error.find("argument #"), std::string::npos) << r.error;
  }
  // Long junk is cut in the message.
  auto r = parse_args(std::string(4096, 'z'));
  EXPECT_FALSE(r.ok());
  EXPECT_LT(r.error.size(), 200u);
}

TEST(UsdtEval, UnreadableMemoryIsAFailureNotACrash) {
  // A page that is mapped then made inaccessible.
  const long pg = ::sysconf(_SC_PAGESIZE);
  void* p = ::mmap(nullptr, static_cast<std::size_t>(pg), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  Regs r{};
  r.rsi = reinterpret_cast<std::uintptr_t>(p);
  ArgSpec s = parse_ok("8@(%rsi) 8@16(%rsi) 4@$1");
  std::uint64_t v = 99;
  errno = 1234;
  EXPECT_FALSE(s.read(0, r, v));
  EXPECT_FALSE(s.read(1, r, v));
  EXPECT_EQ(v, 99u);
  EXPECT_EQ(errno, 1234) << "errno is preserved (handlers run in signal context)";
  EXPECT_TRUE(s.read(2, r, v));
  EXPECT_EQ(v, 1u);
  r.rsi = 0;
  EXPECT_FALSE(s.read(0, r, v));
  ::munmap(p, static_cast<std::size_t>(pg));
}

// The parser will be fuzzed later; here: many mutated and random inputs must
// end in ok or a message, and every accepted spec must evaluate without
// touching memory it was not given (checked reads of address 0..).
TEST(UsdtParse, RobustOnMutatedAndRandomInput) {
  const std::string seeds[] = {"-4@%esi -4@-24(%rbp) -4@%ecx 2@%ax 8@%rdx",
                               "8@16(%rsi,%rbx,8) -1@%ah 4f@%xmm0 8@$-9223372036854775808",
                               "-8@8+sym(%rip) 8@$sym 4@(,%rax,4) 8@0x10(%rip)", "1@$255 2@%r8w 4@%r12d -8@%r15"};
  const std::string alphabet = "0123456789abcdefx-+@$%(),f rsipaxlbhwd8.:_*\t\n";
  std::mt19937_64 rng(12345);
  ParseContext ctx;
  ctx.pc = 0x1000;
  ctx.lookup = [](std::string_view n) -> std::optional<std::uint64_t> {
    if (n == "sym") return 0x2000;
    return std::nullopt;
  };
  Regs regs{};
  std::size_t ok = 0, bad = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    std::string s;
    if (iter % 4 == 0) {
      const std::size_t len = rng() % 64;
      for (std::size_t i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
    } else {
      s = seeds[rng() % 4];
      const int muts = 1 + static_cast<int>(rng() % 4);
      for (int m = 0; m < muts && !s.empty(); ++m) {
        const std::size_t pos = rng() % s.size();
        switch (rng() % 4) {
          case 0: s[pos] = alphabet[rng() % alphabet.size()]; break;
          case 1: s.erase(pos, 1 + rng() % 3); break;
          case 2: s.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
          default: s.insert(pos, s.substr(rng() % s.size(), rng() % 8)); break;
        }
      }
      if (iter % 7 == 0 && !s.empty()) s[rng() % s.size()] = static_cast<char>(rng() % 256);
    }
    auto r = parse_args(s, ctx);
    if (r.ok()) {
      ++ok;
      ASSERT_LE(r.args.count(), 12u);
      for (unsigned i = 0; i < r.args.count(); ++i) {
        std::uint64_t v;
        (void)r.args.read(i, regs, v);  // checked: bad addresses fail
      }
    } else {
      ++bad;
      ASSERT_GE(r.error_arg, 1u) << s;
      ASSERT_LE(r.error_arg, 13u) << s;
      ASSERT_FALSE(r.error.empty());
    }
  }
  EXPECT_GT(ok, 1000u);
  EXPECT_GT(bad, 1000u);
}

}  // namespace
