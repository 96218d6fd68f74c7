// SPDX-License-Identifier: MIT
// Group 2: instructions run out of line (a relocated copy + jump back, and the
// kernel-faithful single-step mode): rip-relative loads, stores, compares,
// immediates after the displacement, call/jmp *mem(%rip) (may be emulated),
// SSE moves to and from memory, flags producers/consumers, stack adjusts,
// lock xadd on a global, push mem, pushf, a popf that turns on alignment
// checking.

#include <unistd.h>

#include <cstring>

#include "runner.hpp"

using namespace coretest;

namespace {

ClassCase xcase(const char* name, const char* sym, const void* fn, std::uint64_t site, fx_fn call,
                std::function<std::uint64_t(std::uint64_t, std::uint64_t)> model,
                std::function<Args(int)> args = default_args, Cont cont = Cont::out_of_line) {
  ClassCase c;
  c.name = name;
  c.symbol = sym;
  c.fn = fn;
  c.site = site;
  c.call = call;
  c.model = std::move(model);
  c.args = std::move(args);
  c.cont = cont;
  return c;
}

#define XCASE(f, ...) xcase(#f + 3, #f, fx_addr(f), f##_site, f, __VA_ARGS__)

std::uint64_t dbits(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
double bitsd(std::uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

alignas(16) std::uint8_t g_src[32];
alignas(16) std::uint8_t g_dst[32];
std::uint8_t g_rep[128];  // rep movsb: source [0, 64), destination [64, 128); repne scasb: [0, 32)

void fill_src(int i) {
  for (int k = 0; k < 32; ++k) g_src[k] = static_cast<std::uint8_t>(i * 31 + k * 7 + 1);
  std::memset(g_dst, 0, sizeof g_dst);
}
// src/dst at a misaligned offset (movdqu): +3 / +5.
Args unaligned_ptrs(int) {
  return {reinterpret_cast<std::uint64_t>(g_src + 3), reinterpret_cast<std::uint64_t>(g_dst + 5)};
}
std::string check_copy(int, std::uint64_t) {
  if (std::memcmp(g_dst + 5, g_src + 3, 16) != 0) return "dst != src after the 16-byte copy";
  for (int k = 0; k < 5; ++k)
    if (g_dst[k]) return "byte before dst written";
  for (int k = 21; k < 32; ++k)
    if (g_dst[k]) return "byte after dst written";
  return "";
}

std::vector<ClassCase> cases() {
  std::vector<ClassCase> v;
  v.push_back(XCASE(fx_movabs, [](auto a, auto) { return a ^ 0x1122334455667788ull; }));
  v.push_back(XCASE(fx_mov_r10, [](auto a, auto) { return a + 0x1234; }));
  v.push_back(XCASE(fx_rip_load, [](auto a, auto) { return fx_var + a; }));
  {
    ClassCase c = XCASE(fx_rip_store, [](auto a, auto) { return a + 1; });
    c.pre = [](int) { fx_store = 0xdeaddeaddeaddeadull; };
    c.post = [](int i, std::uint64_t) -> std::string {
      return fx_store == default_args(i).a ? "" : "fx_store = " + hex(fx_store);
    };
    v.push_back(c);
  }
  v.push_back(XCASE(fx_rip_lea, [](auto a, auto) { return reinterpret_cast<std::uint64_t>(&fx_var) + a; }));
  {
    ClassCase c = XCASE(fx_rip_cmp, [](auto, auto) -> std::uint64_t { return fx_flag == 0 ? 222 : 111; });
    c.pre = [](int i) { fx_flag = (i % 3 == 0) ? 0 : static_cast<std::uint64_t>(i); };
    v.push_back(c);
  }
  v.push_back(XCASE(fx_call_riprel, [](auto a, auto) { return a + 0x5151 + 1; }, default_args, Cont::either));
  v.push_back(XCASE(fx_jmp_riprel, [](auto a, auto) { return a + 0x5252; }, default_args, Cont::either));
  v.push_back(XCASE(fx_movsd_bits, [](auto a, auto) { return dbits(3.25) + a; }));
  v.push_back(XCASE(
      fx_addsd_rip, [](auto a, auto) { return dbits(bitsd(a) + 3.25); },
      [](int i) { return Args{dbits(i * 0.5 - 100.0), 0}; }));
  {
    ClassCase c = XCASE(fx_movdqu_load, [](auto, auto) -> std::uint64_t { return 1; }, unaligned_ptrs);
    c.pre = fill_src;
    c.post = check_copy;
    v.push_back(c);
  }
  {
    ClassCase c = XCASE(fx_movdqu_store, [](auto, auto) -> std::uint64_t { return 2; }, unaligned_ptrs);
    c.pre = fill_src;
    c.post = check_copy;
    v.push_back(c);
  }
  {
    ClassCase c = XCASE(
        fx_movaps_load_rip, [](auto, auto) -> std::uint64_t { return 3; },
        [](int) { return Args{reinterpret_cast<std::uint64_t>(g_dst), 0}; });
    c.pre = [](int) { std::memset(g_dst, 0, sizeof g_dst); };
    c.post = [](int, std::uint64_t) -> std::string {
      return std::memcmp(g_dst, fx_vec16, 16) == 0 ? "" : "dst != fx_vec16";
    };
    v.push_back(c);
  }
  {
    ClassCase c = XCASE(
        fx_movaps_store_rip, [](auto, auto) -> std::uint64_t { return 4; },
        [](int) { return Args{reinterpret_cast<std::uint64_t>(g_src), 0}; });
    c.pre = [](int i) {
      fill_src(i);
      fx_vecout[0] = fx_vecout[1] = 0;
    };
    c.post = [](int, std::uint64_t) -> std::string {
      return std::memcmp(fx_vecout, g_src, 16) == 0 ? "" : "fx_vecout != src";
    };
    v.push_back(c);
  }
  v.push_back(XCASE(
      fx_add_imm,
      [](auto a, auto) {
        std::uint64_t s = a + 0x1000;
        return s ^ (s < a ? ~0ull : 0ull);
      },
      [](int i) {
        Args x = mixed_args(i);
        if (i % 4 == 0) x.a = 0xfffffffffffff800ull + static_cast<std::uint64_t>(i % 64);  // carries
        return x;
      }));
  v.push_back(XCASE(fx_add_flags, [](auto a, auto b) { return add_flags(a, b) ^ (a + b); }, mixed_args));
  v.push_back(XCASE(fx_imul, [](auto a, auto b) { return a * b; }, mixed_args));
  v.push_back(XCASE(fx_xchg, [](auto a, auto b) { return 2 * b - a; }));
  v.push_back(XCASE(
      fx_cmov,
      [](auto a, auto b) -> std::uint64_t {
        return static_cast<std::int64_t>(a) < static_cast<std::int64_t>(b) ? b : a;
      },
      mixed_args));
  v.push_back(XCASE(fx_sub_rsp, [](auto a, auto b) { return a + b; }));
  v.push_back(XCASE(fx_mov_rsp_rbp, [](auto a, auto) { return a; }));
  {
    ClassCase c = XCASE(fx_xadd, [](auto, auto b) { return b; });
    c.pre = [](int i) { fx_ctr = default_args(i).b; };
    c.post = [](int i, std::uint64_t) -> std::string {
      Args a = default_args(i);
      return fx_ctr == a.a + a.b ? "" : "fx_ctr = " + hex(fx_ctr);
    };
    v.push_back(c);
  }
  {
    ClassCase c = XCASE(fx_movl_imm_rip, [](auto a, auto) { return a + 0x5a5a5a5a; });
    c.pre = [](int) { fx_store32 = 0; };
    c.post = [](int, std::uint64_t) -> std::string {
      return fx_store32 == 0x5a5a5a5au ? "" : "fx_store32 = " + hex(fx_store32);
    };
    v.push_back(c);
  }
  v.push_back(XCASE(fx_rip_r9, [](auto a, auto) { return a + fx_var; }));
  v.push_back(XCASE(fx_movzb_rip, [](auto a, auto) { return a + 0xab; }));
  v.push_back(XCASE(fx_push_rip, [](auto a, auto) { return a + fx_var; }));
  v.push_back(XCASE(fx_pushf, [](auto a, auto b) { return sub_flags(a, b); }, mixed_args));
  // Found by tests/fuzz (fuzz_xol): the copy of a popf that sets AC must not
  // fault on its own jump back.
  v.push_back(XCASE(fx_popf_ac, [](auto a, auto b) { return a + b; }));
  v.push_back(XCASE(fx_ac_on, [](auto a, auto b) { return a + b; }));
  // rep string instructions: single-stepped, the copy traps after every
  // iteration with rip at itself (0..31 bytes; 0 and 1: no repeat).
  {
    ClassCase c = XCASE(
        fx_rep_movsb, [](auto a, auto) -> std::uint64_t { return a & 31; },
        [](int i) { return Args{static_cast<std::uint64_t>(i) * 5 + (i % 3), reinterpret_cast<std::uint64_t>(g_rep)}; });
    c.pre = [](int i) {
      for (int k = 0; k < 64; ++k) g_rep[k] = static_cast<std::uint8_t>(i * 7 + k + 1);
      std::memset(g_rep + 64, 0, 64);
    };
    c.post = [](int i, std::uint64_t) -> std::string {
      const std::size_t n = (static_cast<std::uint64_t>(i) * 5 + (i % 3)) & 31;
      if (std::memcmp(g_rep + 64, g_rep, n) != 0) return "dst != src";
      for (std::size_t k = 64 + n; k < 128; ++k)
        if (g_rep[k]) return "byte " + std::to_string(k - 64) + " past the copy written";
      return "";
    };
    v.push_back(c);
  }
  {
    ClassCase c = XCASE(
        fx_repne_scasb,
        [](auto a, auto) -> std::uint64_t {
          const std::uint64_t v = a & 0xff;
          return v >= 1 && v <= 32 ? (32 - v) * 2 + 1 : 0;
        },
        [](int i) { return Args{static_cast<std::uint64_t>(i % 40), reinterpret_cast<std::uint64_t>(g_rep)}; });
    c.pre = [](int) {
      for (int k = 0; k < 32; ++k) g_rep[k] = static_cast<std::uint8_t>(k + 1);
    };
    v.push_back(c);
  }
  // A system call: the kernel's return swallows the step of the copy (the
  // trap comes after the jump back).
  v.push_back(XCASE(fx_syscall, [](auto a, auto) { return static_cast<std::uint64_t>(::getppid()) + a; }));
  // Emulated even with emulation off: a call's pushed return address and a
  // rip-relative target would be counted from the slot.
  for (ClassCase& c : v)
    c.cont_no_emulate = c.name == "call_riprel" || c.name == "jmp_riprel" ? Cont::emulated : Cont::out_of_line;
  return v;
}

class OutOfLine : public testing::TestWithParam<std::tuple<ClassCase, Mode>> {};

TEST_P(OutOfLine, ThousandCallsExact) { run_class_case(std::get<0>(GetParam()), std::get<1>(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Class, OutOfLine,
                         testing::Combine(testing::ValuesIn(cases()),
                                          testing::Values(Mode::def, Mode::single_step, Mode::entry_opt, Mode::punned,
                                                          Mode::padded, Mode::evicted, Mode::single_step_no_emulate)),
                         case_name);

}  // namespace
