// SPDX-License-Identifier: MIT
// Group 1: one fixture per emulated instruction class (nops, endbr64, push,
// jmp/call rel, Jcc rel8/rel32 for all 16 conditions, jrcxz/jecxz/loop*,
// ret/rep ret/ret imm16, indirect jmp/call through registers and memory).
// Default config: exactly 1000 emulations; emulate=false: the same results
// and hits however the runtime continues.

#include "runner.hpp"

using namespace coretest;

namespace {

#define SITE_OF(f) f##_site

ClassCase simple(const char* name, const char* sym, const void* fn, std::uint64_t site, fx_fn call,
                 std::function<std::uint64_t(std::uint64_t, std::uint64_t)> model,
                 std::function<Args(int)> args = default_args) {
  ClassCase c;
  c.name = name;
  c.symbol = sym;
  c.fn = fn;
  c.site = site;
  c.call = call;
  c.model = std::move(model);
  c.args = std::move(args);
  c.cont = Cont::emulated;
  return c;
}

#define CASE(f, model) simple(#f + 3, #f, fx_addr(f), SITE_OF(f), f, model)
#define CASE_ARGS(f, model, args) simple(#f + 3, #f, fx_addr(f), SITE_OF(f), f, model, args)

// Values that exercise every flag of a 64-bit compare; 31 * 31 pairs.
const std::uint64_t kEdge[] = {0,
                               1,
                               2,
                               3,
                               5,
                               0x7f,
                               0x80,
                               0xff,
                               0x100,
                               0x7fffffff,
                               0x80000000,
                               0xffffffff,
                               0x100000000,
                               0x7fffffffffffffff,
                               0x8000000000000000,
                               0x8000000000000001,
                               0xffffffffffffffff,
                               0xfffffffffffffffe,
                               0xffffffffffffff80,
                               0xffffffffffffff7f,
                               0x5555555555555555,
                               0xaaaaaaaaaaaaaaaa,
                               42,
                               43,
                               0x1000,
                               0x0f0f,
                               0x3,
                               0x12345678,
                               0xdeadbeefcafef00d,
                               0x0101010101010101,
                               0x7ffffffffffffffe};
constexpr int kNumEdge = sizeof kEdge / sizeof kEdge[0];

Args edge_args(int i) { return {kEdge[i % kNumEdge], kEdge[(i / kNumEdge) % kNumEdge]}; }

bool cc_eval(int code, std::uint64_t a, std::uint64_t b) {
  std::uint64_t f = sub_flags(a, b);
  bool cf = f & 1, pf = f & 4, zf = f & 0x40, sf = f & 0x80, of = f & 0x800;
  bool v = false;
  switch (code >> 1) {
    case 0: v = of; break;
    case 1: v = cf; break;
    case 2: v = zf; break;
    case 3: v = cf || zf; break;
    case 4: v = sf; break;
    case 5: v = pf; break;
    case 6: v = sf != of; break;
    case 7: v = zf || sf != of; break;
  }
  return (code & 1) ? !v : v;
}

ClassCase jcc(const char* name, const char* sym, fx_fn f, std::uint64_t site, int code) {
  ClassCase c = simple(name, sym, fx_addr(f), site, f,
                       [code](std::uint64_t a, std::uint64_t b) -> std::uint64_t { return cc_eval(code, a, b); },
                       edge_args);
  return c;
}

// rcx-driven inputs for jrcxz/jecxz/loop*: a mix of 0, 1, 2, 2^32, 2^32 + 1, large.
Args rcx_args(int i) {
  static const std::uint64_t as[] = {0, 1, 2, 3, 0x100000000, 0x100000001, 0xffffffff00000000, 7};
  static const std::uint64_t bs[] = {5, 4, 6};
  return {as[i % 8], bs[(i / 8) % 3]};
}

std::vector<ClassCase> cases() {
  std::vector<ClassCase> v;
  v.push_back(CASE(fx_nop1, [](auto a, auto) { return a + 1; }));
  v.push_back(CASE(fx_nop2, [](auto a, auto) { return a + 6; }));
  v.push_back(CASE(fx_nop5, [](auto a, auto) { return a + 2; }));
  v.push_back(CASE(fx_nop9, [](auto a, auto) { return a + 3; }));
  v.push_back(CASE(fx_endbr, [](auto a, auto) { return a + 4; }));
  v.push_back(CASE(fx_push_rbp, [](auto a, auto) { return 3 * a + 7; }));
  v.push_back(CASE(fx_push_r12, [](auto a, auto b) { return a * b + 5; }));
  v.push_back(CASE(fx_push_rdi, [](auto a, auto b) { return a ^ b; }));
  v.push_back(CASE(fx_jmp8, [](auto a, auto) { return a + 5; }));
  v.push_back(CASE(fx_jmp32, [](auto a, auto) { return a + 8; }));
  v.push_back(CASE(fx_jmp8_back, [](auto a, auto) { return a + 12; }));
  v.push_back(CASE(fx_call32, [](auto a, auto) { return 2 * a + 9; }));
  v.push_back(CASE(fx_call32_mid, [](auto a, auto) { return 3 * a + 1; }));
#define JCC(cc, code)                                                   \
  v.push_back(jcc("jcc8_" #cc, "fx_jcc8_" #cc, fx_jcc8_##cc, fx_jcc8_##cc##_site, code)); \
  v.push_back(jcc("jcc32_" #cc, "fx_jcc32_" #cc, fx_jcc32_##cc, fx_jcc32_##cc##_site, code));
  JCC(o, 0) JCC(no, 1) JCC(b, 2) JCC(ae, 3) JCC(e, 4) JCC(ne, 5) JCC(be, 6) JCC(a, 7)
  JCC(s, 8) JCC(ns, 9) JCC(p, 10) JCC(np, 11) JCC(l, 12) JCC(ge, 13) JCC(le, 14) JCC(g, 15)
#undef JCC
  v.push_back(CASE_ARGS(fx_jrcxz, [](auto a, auto) -> std::uint64_t { return a == 0 ? 100 : 200; }, rcx_args));
  v.push_back(CASE_ARGS(
      fx_jecxz, [](auto a, auto) -> std::uint64_t { return static_cast<std::uint32_t>(a) == 0 ? 100 : 200; },
      rcx_args));
  v.push_back(CASE_ARGS(
      fx_loop,
      [](auto a, auto) -> std::uint64_t {
        std::uint64_t c = a - 1;
        return c != 0 ? c + 1000 : c + 2000;
      },
      rcx_args));
  v.push_back(CASE_ARGS(
      fx_loope,
      [](auto a, auto b) -> std::uint64_t {
        std::uint64_t c = a - 1;
        return (c != 0 && b == 5) ? c + 1000 : c + 2000;
      },
      rcx_args));
  v.push_back(CASE_ARGS(
      fx_loopne,
      [](auto a, auto b) -> std::uint64_t {
        std::uint64_t c = a - 1;
        return (c != 0 && b != 5) ? c + 1000 : c + 2000;
      },
      rcx_args));
  // ret / rep ret / ret $16 at offset 0 of a leaf, called through an asm caller.
  v.push_back(simple("ret0", "fx_ret0", fx_addr(fx_ret0), fx_ret0_site, fx_ret0_caller,
                     [](auto a, auto) { return a + 1; }));
  v.push_back(simple("repret", "fx_repret", fx_addr(fx_repret), fx_repret_site, fx_repret_caller,
                     [](auto a, auto) { return a + 2; }));
  v.push_back(simple("retimm16", "fx_retimm", fx_addr(fx_retimm), fx_retimm_site, fx_retimm_caller,
                     [](auto a, auto) { return a + 7; }));
  v.push_back(CASE(fx_jmp_rax, [](auto a, auto) { return a + 11; }));
  v.push_back(CASE(fx_call_rax, [](auto a, auto) { return 3 * a + 1; }));
  v.push_back(CASE(fx_call_r11, [](auto a, auto) { return 3 * a + 1; }));
  v.push_back(CASE(fx_jmp_tab, [](auto a, auto) { return a + 100 * (1 + (a & 3)); }));
  v.push_back(CASE(fx_call_mem, [](auto a, auto) { return 3 * a + 2; }));
  // With emulation off, only the branches whose copy would count from the
  // slot (relative targets, a call's pushed return address) stay emulated;
  // the others run from their slot, single-stepped in single_step mode.
  for (ClassCase& c : v) {
    const bool relative = c.name.rfind("jmp8", 0) == 0 || c.name == "jmp32" || c.name.rfind("call", 0) == 0 ||
                          c.name.rfind("jcc", 0) == 0 || c.name == "jrcxz" || c.name == "jecxz" ||
                          c.name.rfind("loop", 0) == 0;
    c.cont_no_emulate = relative ? Cont::emulated : Cont::out_of_line;
  }
  return v;
}

class Emulated : public testing::TestWithParam<std::tuple<ClassCase, Mode>> {};

TEST_P(Emulated, ThousandCallsExact) { run_class_case(std::get<0>(GetParam()), std::get<1>(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Class, Emulated,
                         testing::Combine(testing::ValuesIn(cases()),
                                          testing::Values(Mode::def, Mode::no_emulate, Mode::entry_opt, Mode::punned,
                                                          Mode::padded, Mode::evicted, Mode::single_step_no_emulate)),
                         case_name);

// Both outcomes of every Jcc occur with the edge inputs (so "taken" and "not
// taken" are both exercised under the probe).
TEST(EmulatedInputs, EveryJccSeesBothOutcomes) {
  for (int code = 0; code < 16; ++code) {
    int taken = 0;
    for (int i = 0; i < kCalls; ++i) {
      Args a = edge_args(i);
      taken += cc_eval(code, a.a, a.b);
    }
    EXPECT_GT(taken, 0) << "condition " << code;
    EXPECT_LT(taken, kCalls) << "condition " << code;
  }
}

// The same cases under the locked lookup, for a few representatives.
std::vector<ClassCase> locked_cases() {
  std::vector<ClassCase> v;
  for (auto& c : cases())
    if (c.name == "nop1" || c.name == "push_rbp" || c.name == "call32" || c.name == "jcc8_l" ||
        c.name == "retimm16")
      v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Lookup, Emulated,
                         testing::Combine(testing::ValuesIn(locked_cases()), testing::Values(Mode::locked)),
                         case_name);

}  // namespace
