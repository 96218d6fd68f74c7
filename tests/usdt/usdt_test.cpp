// SPDX-License-Identifier: MIT
// USDT notes of this executable (fixtures built with Debian's <sys/sdt.h> in C
// and assembler, and with uprobe/usdt_probe.h in C and C++) and of real
// programs (python3.11, PostgreSQL). Expectations come from readelf and from
// labels at the probe sites (/proc/self/maps), not from the library; every
// argument form is then evaluated LIVE in a consumer registered at the site
// and compared with the value passed.
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <glob.h>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "common.hpp"
#include "fixtures/fixtures.h"
#include "uprobe/symbols.hpp"
#include "uprobe/usdt.hpp"

using namespace usdttest;
using uprobe::Errc;
using uprobe::usdt::ArgKind;
using uprobe::usdt::Probe;

namespace {

// ------------------------------------------------------------ helpers ----

std::uint64_t maps_off(const void* a) {
  auto m = maps_offset(a);
  EXPECT_TRUE(m.has_value());
  return m ? m->offset : 0;
}

template <typename T>
std::uint64_t sx(T v) {  // what a signed SIZE@ reads: sign-extended to 64 bits
  return static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
}

std::vector<Probe> sites(const char* provider, const char* name) {
  return uprobe::usdt::find(self_exe(), provider, name);
}

Probe one_site(const char* provider, const char* name) {
  auto v = sites(provider, name);
  EXPECT_EQ(v.size(), 1u) << provider << ":" << name;
  return v.empty() ? Probe{} : v[0];
}

// Evaluates every argument of one site at each hit.
struct ArgRecorder : uprobe::Consumer {
  uprobe::usdt::ArgSpec spec;
  std::atomic<std::uint64_t> hits{0};
  std::uint64_t vals[uprobe::usdt::kMaxArgs]{};
  bool ok[uprobe::usdt::kMaxArgs]{};
  std::uint64_t rip = 0, rsp = 0;
  explicit ArgRecorder(const Probe& p) : spec(uprobe::usdt::require_args(p)) {}
  uprobe::Action handler(uprobe::Regs& r) override {
    for (unsigned i = 0; i < spec.count(); ++i) ok[i] = spec.read(i, r, vals[i]);
    rip = r.rip;
    rsp = r.rsp;
    hits.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

// Attaches to `p`, runs `call`, and checks one hit at the site with `want`.
void expect_args(const Probe& p, const std::function<void()>& call, const std::vector<std::uint64_t>& want,
                 ArgRecorder* out = nullptr) {
  ArgRecorder rec(p);
  ASSERT_EQ(rec.spec.count(), want.size()) << p.full_name() << ": " << p.args_text;
  {
    uprobe::Attachment at(p.path, p.offset, rec);
    call();
  }
  ASSERT_EQ(rec.hits.load(), 1u) << p.full_name();
  const auto site = uprobe::runtime_addresses(p.path, p.offset);
  ASSERT_EQ(site.size(), 1u);
  EXPECT_EQ(rec.rip, site[0]);
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(rec.ok[i]) << p.full_name() << " arg " << i;
    EXPECT_EQ(rec.vals[i], want[i]) << p.full_name() << " arg #" << i + 1 << " `"
                                    << uprobe::usdt::format_arg(rec.spec[static_cast<unsigned>(i)]) << "' of `"
                                    << p.args_text << "'";
  }
  if (out) {
    std::memcpy(out->vals, rec.vals, sizeof rec.vals);
    out->rip = rec.rip;
    out->rsp = rec.rsp;
  }
}

// readelf's view: notes, PT_LOADs, sections.
struct RNote {
  std::string provider, name, args;
  std::uint64_t pc = 0, base = 0, sema = 0;
};
struct RSeg {
  std::uint64_t offset, vaddr, filesz;
  bool exec;
};
struct RElf {
  std::vector<RNote> notes;
  std::vector<RSeg> loads;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> sections;  // name -> (addr, offset)
};

RElf readelf(const std::string& path) {
  RElf r;
#ifdef USDT_READELF
  std::istringstream notes(run(std::string(USDT_READELF) + " -n -W '" + path + "' 2>/dev/null"));
  std::string line;
  bool in_stapsdt = false;
  while (std::getline(notes, line)) {
    if (line.find("Displaying notes found in:") != std::string::npos) in_stapsdt = line.find(".note.stapsdt") != std::string::npos;
    if (!in_stapsdt) continue;
    auto field = [&](const char* key) -> std::optional<std::string> {
      auto k = line.find(key);
      if (k == std::string::npos) return std::nullopt;
      std::string v = line.substr(k + std::strlen(key));
      return v;
    };
    if (auto v = field("Provider: ")) {
      r.notes.push_back({});
      r.notes.back().provider = *v;
    } else if (auto v2 = field("Name: ")) {
      r.notes.back().name = *v2;
    } else if (line.find("Location: ") != std::string::npos) {
      std::sscanf(line.c_str(), " Location: %lx, Base: %lx, Semaphore: %lx", &r.notes.back().pc, &r.notes.back().base,
                  &r.notes.back().sema);
    } else if (line.find("Arguments:") != std::string::npos) {
      auto k = line.find("Arguments:") + 10;
      std::string a = line.substr(k);
      if (!a.empty() && a[0] == ' ') a.erase(0, 1);
      r.notes.back().args = a;
    }
  }
  std::istringstream ph(run(std::string(USDT_READELF) + " -l -W '" + path + "' 2>/dev/null"));
  while (std::getline(ph, line)) {
    std::istringstream ls(line);
    std::string type, off, va, pa, fs, ms, rest;
    ls >> type;
    if (type != "LOAD") continue;
    ls >> off >> va >> pa >> fs >> ms;
    std::getline(ls, rest);
    r.loads.push_back({std::stoull(off, nullptr, 16), std::stoull(va, nullptr, 16), std::stoull(fs, nullptr, 16),
                       rest.find('E') != std::string::npos});
  }
  std::istringstream sh(run(std::string(USDT_READELF) + " -S -W '" + path + "' 2>/dev/null"));
  while (std::getline(sh, line)) {
    auto rb = line.find(']');
    if (line.find('[') == std::string::npos || rb == std::string::npos) continue;
    std::istringstream ls(line.substr(rb + 1));
    std::string name, type, addr, off;
    ls >> name >> type >> addr >> off;
    if (name.empty() || addr.empty()) continue;
    try {
      r.sections[name] = {std::stoull(addr, nullptr, 16), std::stoull(off, nullptr, 16)};
    } catch (...) {
    }
  }
#else
  (void)path;
#endif
  return r;
}

std::optional<std::uint64_t> to_offset(const RElf& r, std::uint64_t vaddr, bool* exec = nullptr) {
  for (const RSeg& s : r.loads)
    if (vaddr >= s.vaddr && vaddr < s.vaddr + s.filesz) {
      if (exec) *exec = s.exec;
      return vaddr - s.vaddr + s.offset;
    }
  return std::nullopt;
}

// Every note of `path` as readelf prints it, with offsets computed from
// readelf's program headers, must equal what the library read.
void expect_matches_readelf(const std::string& path, const std::vector<Probe>& probes) {
#ifndef USDT_READELF
  GTEST_SKIP() << "readelf not found";
#endif
  RElf r = readelf(path);
  ASSERT_EQ(r.notes.size(), probes.size()) << path;
  ASSERT_FALSE(r.loads.empty());
  auto base_sec = r.sections.find(".stapsdt.base");
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const Probe& p = probes[i];
    const RNote& n = r.notes[i];
    SCOPED_TRACE(p.full_name() + " #" + std::to_string(i));
    EXPECT_EQ(p.provider, n.provider);
    EXPECT_EQ(p.name, n.name);
    EXPECT_EQ(p.note_pc, n.pc);
    EXPECT_EQ(p.note_base, n.base);
    EXPECT_EQ(p.note_semaphore, n.sema);
    EXPECT_EQ(p.args_text, n.args);
    std::uint64_t pc = n.pc;
    if (base_sec != r.sections.end()) pc += base_sec->second.first - n.base;
    EXPECT_EQ(p.pc, pc);
    bool exec = false;
    auto off = to_offset(r, pc, &exec);
    ASSERT_TRUE(off.has_value());
    EXPECT_TRUE(exec);
    EXPECT_EQ(p.offset, *off);
    EXPECT_TRUE(p.error.empty()) << p.error;
    if (p.full_name() != "sdtfx:dup") {
      EXPECT_TRUE(p.args_error.empty()) << p.args_error;
    }
    if (n.sema) {
      auto so = to_offset(r, n.sema, &exec);
      ASSERT_TRUE(so.has_value());
      EXPECT_FALSE(exec);
      EXPECT_EQ(p.semaphore_offset, *so);
      // And through the section headers: the semaphore lies in .probes.
      auto probes_sec = r.sections.find(".probes");
      ASSERT_NE(probes_sec, r.sections.end());
      EXPECT_EQ(p.semaphore_offset, n.sema - probes_sec->second.first + probes_sec->second.second);
    } else {
      EXPECT_EQ(p.semaphore_offset, 0u);
    }
  }
}

// -------------------------------------------------------- this file's notes ----

TEST(UsdtNotes, EveryNoteMatchesReadelf) {
  auto all = uprobe::usdt::probes(self_exe());
#ifdef USDT_HAVE_SDT_H
  EXPECT_GE(all.size(), 20u);
#endif
  expect_matches_readelf(self_exe(), all);
  // Every site holds a nop in the file: 90 (sys/sdt.h) or 0f 1f 44 00 00 (ours).
  for (const Probe& p : all) {
    auto b = file_bytes(p.path, p.offset, 5);
    const bool ours = p.provider.rfind("ours", 0) == 0;
    if (ours) {
      EXPECT_EQ(b, (std::vector<std::uint8_t>{0x0f, 0x1f, 0x44, 0x00, 0x00})) << p.full_name();
    } else {
      EXPECT_EQ(b[0], 0x90) << p.full_name();
    }
  }
}

TEST(UsdtNotes, OursUsesFiveByteNopsAndTheSdtLayout) {
  Probe z = one_site("oursc", "zero");
  EXPECT_EQ(z.args_text, "");
  EXPECT_EQ(z.args.count(), 0u);
  EXPECT_FALSE(z.has_semaphore());
  const auto rt = uprobe::runtime_addresses(z.path, z.offset);
  ASSERT_EQ(rt.size(), 1u);
  const auto* code = reinterpret_cast<const std::uint8_t*>(rt[0]);
  EXPECT_EQ(std::vector<std::uint8_t>(code, code + 5), (std::vector<std::uint8_t>{0x0f, 0x1f, 0x44, 0x00, 0x00}));
  // The site lies inside oursc_zero.
  const auto fn = reinterpret_cast<std::uintptr_t>(&oursc_zero);
  EXPECT_GE(rt[0], fn);
  EXPECT_LT(rt[0], fn + 16);
  ArgRecorder rec(z);
  {
    uprobe::Attachment at(z.path, z.offset, rec);
    for (int i = 0; i < 10; ++i) oursc_zero();
  }
  EXPECT_EQ(rec.hits.load(), 10u);
  EXPECT_EQ(rec.rip, rt[0]);
}

#ifdef USDT_HAVE_SDT_H

TEST(UsdtNotes, AsmSitesAreAtTheirLabels) {
  struct {
    const char* name;
    const void* label;
  } cases[] = {{"regs_a", asmfx_regs_a_site}, {"regs_b", asmfx_regs_b_site}, {"regs_c", asmfx_regs_c_site},
               {"regs_d", asmfx_regs_d_site}, {"regs_e", asmfx_regs_e_site}, {"consts", asmfx_consts_site},
               {"mem", asmfx_mem_site},       {"mem2", asmfx_mem2_site}};
  for (const auto& c : cases) {
    Probe p = one_site("asmfx", c.name);
    EXPECT_EQ(p.offset, maps_off(c.label)) << c.name;
    EXPECT_EQ(p.provider, "asmfx");
    EXPECT_EQ(p.semaphore, 0u);
    EXPECT_EQ(p.semaphore_offset, 0u);
    EXPECT_EQ(p.pc, reinterpret_cast<std::uintptr_t>(c.label) - load_bias(c.label));
  }
}

TEST(UsdtNotes, OneProbeTwoSites) {
  auto v = sites("asmfx", "twice");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].offset, maps_off(asmfx_twice_site1));
  EXPECT_EQ(v[1].offset, maps_off(asmfx_twice_site2));
  EXPECT_EQ(v[0].args_text, "-4@%eax");
  EXPECT_EQ(v[1].args_text, "8@%rax");
  ArgRecorder r0(v[0]), r1(v[1]);
  {
    uprobe::Attachment a0(v[0].path, v[0].offset, r0), a1(v[1].path, v[1].offset, r1);
    for (int i = 0; i < 3; ++i) asmfx_twice();
  }
  EXPECT_EQ(r0.hits.load(), 3u);
  EXPECT_EQ(r1.hits.load(), 3u);
  EXPECT_EQ(r0.vals[0], 1u);
  EXPECT_EQ(r1.vals[0], 2u);
  // The same through the spec forms.
  EXPECT_EQ(uprobe::usdt::find(self_exe() + ":asmfx:twice").size(), 2u);
  EXPECT_EQ(uprobe::usdt::find(self_exe() + ":twice").size(), 2u);
  EXPECT_EQ(uprobe::usdt::find(self_exe(), "asm*", "tw?ce").size(), 2u);
  // Inlined into two functions (sys/sdt.h from C).
  auto m = sites("sdtfx", "multi");
  ASSERT_EQ(m.size(), 2u);
  ArgRecorder ra(m[0]), rb(m[1]);
  {
    uprobe::Attachment a0(m[0].path, m[0].offset, ra), a1(m[1].path, m[1].offset, rb);
    sdtfx_multi_a(5);
    sdtfx_multi_b(5);
  }
  EXPECT_EQ(ra.hits.load() + rb.hits.load(), 2u);
  std::set<std::uint64_t> got{ra.vals[0], rb.vals[0]};
  EXPECT_EQ(got, (std::set<std::uint64_t>{5, 10}));
}

TEST(UsdtNotes, AmbiguousSymbolOperandIsRefusedNotGuessed) {
  // Two files define a static sdtfx_dup_static; each note names it.
  auto v = sites("sdtfx", "dup");
  ASSERT_EQ(v.size(), 2u);
  for (const Probe& p : v) {
    EXPECT_EQ(p.args_text, "-4@sdtfx_dup_static(%rip)");
    EXPECT_NE(p.args_error.find("argument #1 `-4@sdtfx_dup_static(%rip)': symbol `sdtfx_dup_static'"),
              std::string::npos)
        << p.args_error;
    EXPECT_TRUE(p.error.empty());
    EXPECT_EQ(file_bytes(p.path, p.offset, 1)[0], 0x90);
    expect_error([&] { uprobe::usdt::require_args(p); }, Errc::bad_offset, {p.path, "sdtfx:dup", hex(p.offset)});
  }
  // The sites themselves are still probeable.
  RipRecorder r0, r1;
  {
    uprobe::Attachment a0(v[0].path, v[0].offset, r0), a1(v[1].path, v[1].offset, r1);
    sdtfx_dup_set_a(1);
    sdtfx_dup_set_b(2);
    sdtfx_dup_a();
    sdtfx_dup_b();
  }
  EXPECT_EQ(r0.hits.load() + r1.hits.load(), 2u);
  EXPECT_EQ(r0.hits.load(), 1u);
}

TEST(UsdtArgs, AsmEveryRegisterWidthLive) {
  expect_args(one_site("asmfx", "regs_a"), asmfx_regs,
              {sx(std::int8_t(0x97)), 0xa6, sx(std::int16_t(0xa697)), 0xc4b5a697, 0x80f1e2d3c4b5a697, 0x88,
               sx(std::int8_t(0x77)), 0x7788, sx(std::int32_t(0x55667788)), 0x1122334455667788, 0x10, 0x32});
  expect_args(one_site("asmfx", "regs_b"), asmfx_regs,
              {0x3210, sx(std::int32_t(0x76543210)), 0xfedcba9876543210, 0xef, sx(std::int8_t(0xcd)),
               sx(std::int16_t(0xcdef)), 0x89abcdef, 0x0123456789abcdef, sx(std::int8_t(0xa5)), 0xa5a5,
               sx(std::int32_t(0xa5a5a5a5)), 0xa5a5a5a5a5a5a5a5});
  // regs_c: rsp is whatever it is at the site; check it against the Regs.
  Probe c = one_site("asmfx", "regs_c");
  ArgRecorder rc(c);
  {
    uprobe::Attachment at(c.path, c.offset, rc);
    asmfx_regs();
  }
  ASSERT_EQ(rc.hits.load(), 1u);
  const std::vector<std::uint64_t> want_c = {0x5a,          0x5a5a,
                                             0x5a5a5a5a,    0x5a5a5a5a5a5a5a5a,
                                             sx(std::int8_t(0xef)), 0xbeef,
                                             sx(std::int32_t(0xdeadbeef)), 0xdeadbeef,
                                             rc.rsp & 0xff, rc.rsp & 0xffff,
                                             rc.rsp & 0xffffffff, rc.rsp};
  for (unsigned i = 0; i < 12; ++i) EXPECT_EQ(rc.vals[i], want_c[i]) << "regs_c arg #" << i + 1;
  EXPECT_EQ(rc.rsp % 8, 0u);
  expect_args(one_site("asmfx", "regs_d"), asmfx_regs,
              {sx(std::int8_t(-128)), 0xff80, 0xffffff80, sx(std::int64_t(-128)), sx(std::int8_t(0x80)),
               sx(std::int16_t(0x8080)), sx(std::int32_t(0x80008080)), 0x8000000080008080, 0x10, 0x1234, 0x7fffffff,
               0x8000000000000000});
  expect_args(one_site("asmfx", "regs_e"), asmfx_regs,
              {0xcafef00d12345678, 0xffff, sx(std::int32_t(0x12345678)), sx(std::int16_t(-1)), sx(std::int8_t(-1)),
               reinterpret_cast<std::uintptr_t>(asmfx_regs_e_site)});
}

TEST(UsdtArgs, AsmConstantsLive) {
  expect_args(one_site("asmfx", "consts"), asmfx_consts,
              {sx(-7), 42, sx(INT64_MIN), UINT64_MAX, 255, sx(-128), 0x7fff, 8, sx(std::int16_t(-1)), 0,
               2147483647});
}

TEST(UsdtArgs, AsmMemoryAndSymbolsLive) {
  Probe mem = one_site("asmfx", "mem");
  // The symbol operands were resolved at parse time, relative to the site.
  EXPECT_TRUE(mem.args[7].pc_relative);
  EXPECT_EQ(mem.args[7].base, uprobe::usdt::Reg::none);
  EXPECT_TRUE(mem.args[10].pc_relative);  // asmfx_local_data: a local symbol
  expect_args(mem, asmfx_mem,
              {sx(-10), 0x11223344, 0x8000000000000001, sx(std::int16_t(-2)), 1, 0x1234, 0x44, 0x8000000000000001,
               sx(-10), 0x1234, 0x0123456789abcdef, 0x5566});
  Probe mem2 = one_site("asmfx", "mem2");
  std::uint64_t at_ip16;
  std::memcpy(&at_ip16, asmfx_mem2_site + 16, 8);
  const auto data = reinterpret_cast<std::uintptr_t>(asmfx_data);
  expect_args(mem2, asmfx_mem,
              {data, data + 8, 0x7788abcd1234fffe, at_ip16, 0x11223344, 0x8000000000000001, sx(std::int16_t(-2)),
               0x5566});
}

TEST(UsdtArgs, SdtFromCLive) {
  // The compiler chose these operands; the values must be right whatever they are.
  expect_args(one_site("sdtfx", "consts"), sdtfx_consts, {42, sx(-7), 0x1122334455667788, 200});
  static const char str[] = "hi";
  expect_args(one_site("sdtfx", "regs"), [] { sdtfx_regs(-5, 60000, -100000, -(1LL << 40), 250, str); },
              {sx(-5), 60000, sx(-100000), sx(-(1LL << 40)), 250, reinterpret_cast<std::uintptr_t>(str)});
  static const std::int32_t arr[4] = {-1, -2, -3, -4};
  expect_args(one_site("sdtfx", "mem"), [] { sdtfx_mem(arr, 2); }, {sx(-2), sx(-3), sx(-1)});
  const std::int64_t next = sdtfx_globals() + 1;
  expect_args(one_site("sdtfx", "globals"), [] { sdtfx_globals(); },
              {0x12345678, 0x1122334455667788, sx(-99), static_cast<std::uint64_t>(next)});
  sdtfx_global = -1;
  sdtfx_struct.b = -2;
  expect_args(one_site("sdtfx", "globals"), [] { sdtfx_globals(); },
              {sx(-1), sx(-2), sx(-99), static_cast<std::uint64_t>(next + 1)});
  expect_args(one_site("sdtfx", "stack"), [] { sdtfx_stack(-1, 1LL << 62, 7); }, {sx(-1), 1ull << 62, 7});
  const double d = -2.75;
  const float f = 1.5f;
  std::uint64_t dbits = 0;
  std::uint32_t fbits = 0;
  std::memcpy(&dbits, &d, 8);
  std::memcpy(&fbits, &f, 4);
  Probe fp = one_site("sdtfx", "fp");
  EXPECT_TRUE(fp.args[0].is_float);
  EXPECT_EQ(fp.args[0].bytes(), 8u);
  EXPECT_TRUE(fp.args[1].is_float);
  EXPECT_EQ(fp.args[1].bytes(), 4u);
  expect_args(fp, [&] { sdtfx_double(d, f); }, {dbits, fbits});

  // The C fixtures made the compiler use every operand kind.
  std::set<std::string> kinds;
  for (const Probe& p : uprobe::usdt::probes(self_exe())) {
    if (p.provider != "sdtfx") continue;
    for (unsigned i = 0; i < p.args.count(); ++i) {
      const auto& a = p.args[i];
      if (a.kind == ArgKind::constant) kinds.insert("const");
      if (a.kind == ArgKind::reg) kinds.insert("reg");
      if (a.kind == ArgKind::memory && a.pc_relative) kinds.insert("symbol");
      if (a.kind == ArgKind::memory && a.index != uprobe::usdt::Reg::none) kinds.insert("index");
      if (a.kind == ArgKind::memory && a.base == uprobe::usdt::Reg::rsp) kinds.insert("stack");
      if (a.is_float) kinds.insert("float");
    }
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"const", "reg", "symbol", "index", "stack", "float"}));
}

// C-07 style, with the semaphore counted by hand through the offset the
// reader computed (the attach-time ref_ctr handling lives in the runtime).
TEST(UsdtSemaphore, SdtSemaphoreOffsetDrivesTheGuardedBranch) {
  Probe p = one_site("sdtfx", "guarded");
  ASSERT_TRUE(p.has_semaphore());
  EXPECT_EQ(p.semaphore_offset, maps_off(&sdtfx_guarded_semaphore));
  auto where = uprobe::runtime_addresses(p.path, p.semaphore_offset);
  ASSERT_EQ(where.size(), 1u);
  ASSERT_EQ(where[0], reinterpret_cast<std::uintptr_t>(&sdtfx_guarded_semaphore));
  auto* sema = reinterpret_cast<volatile unsigned short*>(where[0]);
  ArgRecorder rec(p);
  const std::int64_t side0 = sdtfx_guarded_side_effects;
  {
    uprobe::Attachment at(p.path, p.offset, rec);
    EXPECT_EQ(*sema, 0);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(sdtfx_guarded(i), 0);
    EXPECT_EQ(rec.hits.load(), 0u);
    *sema = static_cast<unsigned short>(*sema + 1);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(sdtfx_guarded(i), 1);
    EXPECT_EQ(rec.hits.load(), 100u);
    EXPECT_EQ(rec.vals[0], 99u);
    *sema = static_cast<unsigned short>(*sema - 1);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(sdtfx_guarded(i), 0);
  }
  EXPECT_EQ(rec.hits.load(), 100u);
  EXPECT_EQ(sdtfx_guarded_side_effects - side0, 100);
}

#endif  // USDT_HAVE_SDT_H

TEST(UsdtArgs, OursFromCLive) {
  Probe p = one_site("oursc", "args");
  static const std::int32_t val = -9;
  const double x = 2.5;
  std::uint64_t xbits;
  std::memcpy(&xbits, &x, 8);
  expect_args(p, [&] { oursc_args(-3, 65000, -70000, -(1LL << 50), &val, x); },
              {sx(-3), 65000, sx(-70000), sx(-(1LL << 50)), reinterpret_cast<std::uintptr_t>(&val), sx(-9), xbits, 77,
               sx(-5), sx(oursc_global), 250, sx(std::int16_t(-300))});
  EXPECT_TRUE(p.args[6].is_float);
}

TEST(UsdtArgs, OursFromCppLive) {
  Probe p = one_site("ourscpp", "args");
  ASSERT_EQ(p.args.count(), 7u) << p.args_text;
  // char, unsigned long, bool, const char*, int[2] (its address), int64_t, enum class : uint8_t.
  EXPECT_EQ(p.args[0].size, std::is_signed_v<char> ? -1 : 1);
  EXPECT_EQ(p.args[1].size, 8);
  EXPECT_EQ(p.args[2].size, 1);
  EXPECT_EQ(p.args[3].size, 8);
  EXPECT_EQ(p.args[4].size, 8);
  EXPECT_EQ(p.args[5].size, -8);
  EXPECT_EQ(p.args[6].size, 1);
  static const char s[] = "xyz";
  ArgRecorder rec(p);
  {
    uprobe::Attachment at(p.path, p.offset, rec);
    ourscpp_args('A', ~0ul - 1, true, s);
  }
  ASSERT_EQ(rec.hits.load(), 1u);
  const std::uint64_t want[] = {static_cast<std::uint64_t>('A'), ~0ul - 1, 1, reinterpret_cast<std::uintptr_t>(s)};
  for (unsigned i = 0; i < 4; ++i) EXPECT_EQ(rec.vals[i], want[i]) << "arg #" << i + 1;
  // The array decays to its address on the caller's stack (gone by now):
  // within 256 bytes of the stack pointer at the probe.
  EXPECT_LT(rec.vals[4] > rec.rsp ? rec.vals[4] - rec.rsp : rec.rsp - rec.vals[4], 256u);
  EXPECT_EQ(rec.vals[5], sx(-1));
  EXPECT_EQ(rec.vals[6], 3u);
}

TEST(UsdtSemaphore, OursSemaphoreOffsetsInCAndCpp) {
  struct {
    const char* provider;
    volatile unsigned short* sema;
    std::function<int()> call;
  } cases[] = {{"oursc", &oursc_guarded_semaphore, [] { return oursc_guarded(41); }},
               {"ourscpp", &ourscpp_guarded_semaphore, [] { return ourscpp_guarded(41); }}};
  for (auto& c : cases) {
    Probe p = one_site(c.provider, "guarded");
    ASSERT_TRUE(p.has_semaphore()) << c.provider;
    EXPECT_EQ(p.semaphore_offset, maps_off(const_cast<unsigned short*>(c.sema))) << c.provider;
    auto where = uprobe::runtime_addresses(p.path, p.semaphore_offset);
    ASSERT_EQ(where.size(), 1u);
    EXPECT_EQ(where[0], reinterpret_cast<std::uintptr_t>(c.sema));
    ArgRecorder rec(p);
    {
      uprobe::Attachment at(p.path, p.offset, rec);
      EXPECT_EQ(c.call(), 0);
      *c.sema = 1;
      EXPECT_EQ(c.call(), 1);
      EXPECT_EQ(c.call(), 1);
      *c.sema = 0;
      EXPECT_EQ(c.call(), 0);
    }
    EXPECT_EQ(rec.hits.load(), 2u) << c.provider;
    EXPECT_EQ(rec.vals[0], 41u);
  }
}

TEST(UsdtFind, ErrorsNameTheFileAndTheProbe) {
  expect_error([] { uprobe::usdt::find(self_exe(), "nope", "nothing"); }, Errc::bad_offset,
               {self_exe(), "nope:nothing", "oursc:args"});
  expect_error([] { uprobe::usdt::find(self_exe() + ":nothing"); }, Errc::bad_offset, {"*:nothing"});
  expect_error([] { uprobe::usdt::find("nocolon"); }, Errc::bad_offset, {"malformed"});
  expect_error([] { uprobe::usdt::find("/nonexistent/bin/x:p:n"); }, Errc::file_not_found, {"/nonexistent/bin/x"});
  // guarded exists for several providers.
  expect_error([] { uprobe::usdt::find(self_exe() + ":guarded"); }, Errc::conflict, {"guarded", "ambiguous"});
  // A file without notes.
  EXPECT_TRUE(uprobe::usdt::probes("libuprobe").empty());
  expect_error([] { uprobe::usdt::find("libuprobe", "p", "n"); }, Errc::bad_offset, {"no .note.stapsdt"});
}

// A library that is loaded later: found by name before (search path) and
// after dlopen(), its semaphore and its rip-relative argument resolved
// against its own load bias.
TEST(UsdtLibrary, ProbesOfADlopenedLibrary) {
  const std::string lib = canonical(USDTFIX_LAZY_PATH);
  expect_error([] { uprobe::usdt::find("libusdtfix_lazy:lazyfx:hit"); }, Errc::file_not_found,
               {"libusdtfix_lazy", "not loaded"});
  auto pending = uprobe::usdt::find("libusdtfix_lazy:lazyfx:hit", uprobe::LibrarySearch::search_path);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].path, lib);
  ASSERT_TRUE(pending[0].has_semaphore());
  EXPECT_TRUE(uprobe::runtime_addresses(lib, pending[0].offset).empty());

  void* h = dlopen(USDTFIX_LAZY_PATH, RTLD_NOW);
  ASSERT_NE(h, nullptr) << dlerror();
  auto fn = reinterpret_cast<std::int32_t (*)(std::int32_t)>(dlsym(h, "usdtfix_lazy_probe"));
  auto add = reinterpret_cast<std::int64_t (*)(std::int32_t)>(dlsym(h, "usdtfix_lazy_add"));
  auto* sema = static_cast<volatile unsigned short*>(dlsym(h, "lazyfx_hit_semaphore"));
  ASSERT_NE(fn, nullptr);
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(sema, nullptr) << "the semaphore is hidden";
  auto v = uprobe::usdt::find("libusdtfix_lazy", "lazyfx", "hit");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].offset, pending[0].offset);
  EXPECT_EQ(v[0].semaphore_offset, pending[0].semaphore_offset);
  auto where = uprobe::runtime_addresses(lib, v[0].semaphore_offset);
  ASSERT_EQ(where.size(), 1u);
  auto m = maps_offset(reinterpret_cast<const void*>(where[0]));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->path, lib);
  EXPECT_EQ(m->offset, v[0].semaphore_offset);
  sema = reinterpret_cast<volatile unsigned short*>(where[0]);
  EXPECT_EQ(*sema, 0);

  // The second argument is the library's file-static, read rip-relative.
  ASSERT_EQ(v[0].args.count(), 2u);
  EXPECT_EQ(v[0].args[1].kind, ArgKind::memory) << v[0].args_text;
  EXPECT_TRUE(v[0].args[1].pc_relative) << v[0].args_text;
  ArgRecorder rec(v[0]);
  {
    uprobe::Attachment at(v[0].path, v[0].offset, rec);
    EXPECT_EQ(fn(1), 1);
    EXPECT_EQ(rec.hits.load(), 0u);
    *sema = 1;
    const std::int64_t total = add(-1234);
    EXPECT_EQ(fn(-7), -7);
    *sema = 0;
    EXPECT_EQ(fn(2), 2);
    ASSERT_EQ(rec.hits.load(), 1u);
    EXPECT_EQ(rec.vals[0], sx(-7));
    EXPECT_EQ(rec.vals[1], static_cast<std::uint64_t>(total));
  }

  auto plain = uprobe::usdt::find("libusdtfix_lazy:plain");
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_FALSE(plain[0].has_semaphore());
  expect_args(plain[0], [&] { fn(42); }, {42});
}

// ------------------------------------------------------------ real inputs ----

std::vector<std::string> glob_paths(const char* pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern, 0, nullptr, &g) == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return out;
}

void expect_real_probes(const std::string& path, const std::string& provider, std::initializer_list<const char*> names,
                        bool semaphores) {
  auto all = uprobe::usdt::probes(path);
  ASSERT_FALSE(all.empty()) << path;
  std::set<std::string> have;
  for (const Probe& p : all) {
    have.insert(p.full_name());
    EXPECT_TRUE(p.error.empty()) << p.full_name() << ": " << p.error;
    EXPECT_TRUE(p.args_error.empty()) << p.full_name() << " `" << p.args_text << "': " << p.args_error;
    EXPECT_EQ(file_bytes(p.path, p.offset, 1)[0], 0x90) << p.full_name() << " at " << hex(p.offset);
    if (semaphores) {
      EXPECT_TRUE(p.has_semaphore()) << p.full_name();
    }
  }
  for (const char* n : names) EXPECT_TRUE(have.count(provider + ":" + n)) << path << " lacks " << provider << ":" << n;
  expect_matches_readelf(path, all);
}

TEST(UsdtReal, Python311) {
  const std::string py = "/usr/bin/python3.11";
  struct stat st;
  if (::stat(py.c_str(), &st) != 0) GTEST_SKIP() << py << " is not installed";
  expect_real_probes(canonical(py), "python",
                     {"function__entry", "function__return", "line", "gc__start", "gc__done",
                      "import__find__load__start", "import__find__load__done", "audit"},
                     true);
  auto fe = uprobe::usdt::find(py, "python", "function__entry");
  ASSERT_GE(fe.size(), 1u);
  EXPECT_EQ(fe[0].args.count(), 3u);
  // Every site (sys/sdt.h's 1-byte nops) takes a jump (issue 16): a window
  // of the nop and what follows, or a punned jump where a computed goto's
  // label follows the nop (python:line in Debian's 3.11.2-6+deb12u6; in
  // +deb12u9 a jump follows it, and it is a window). Which one depends on the
  // build; that a window never covers a stored code address does not: this
  // non-PIE program stores its computed gotos' labels (opcode_targets[]) as
  // absolute 8-byte words, read here from the whole file, none of which may
  // land past a window's first byte.
  std::ifstream in(canonical(py), std::ios::binary);
  const std::vector<std::uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(file.size(), 1u << 20);
  std::vector<std::uint64_t> stored;
  for (std::size_t at = 0; at + 8 <= file.size(); at += 8) {
    std::uint64_t v;
    std::memcpy(&v, file.data() + at, 8);
    stored.push_back(v);
  }
  std::sort(stored.begin(), stored.end());
  std::size_t windows = 0, punned = 0;
  for (const Probe& p : uprobe::usdt::probes(canonical(py))) {
    const uprobe::SitePlan plan = uprobe::plan_site(p.path, p.offset);
    EXPECT_TRUE(plan.tactic == uprobe::ProbeMode::optimized_window || plan.tactic == uprobe::ProbeMode::optimized_punned)
        << p.full_name() << ": " << plan.tactic << ": " << plan.why_int3;
    if (plan.tactic == uprobe::ProbeMode::optimized_window) {
      ++windows;
      ASSERT_GE(plan.displaced, 5u) << p.full_name();
      const auto inside = std::upper_bound(stored.begin(), stored.end(), p.pc);
      EXPECT_TRUE(inside == stored.end() || *inside >= p.pc + plan.displaced)
          << p.full_name() << ": the file stores " << std::hex << *inside << ", inside its window";
    } else if (plan.tactic == uprobe::ProbeMode::optimized_punned) {
      ++punned;
      EXPECT_FALSE(plan.why_no_window.empty()) << p.full_name() << ": a punned jump where a window applies";
    }
  }
  EXPECT_GT(windows + punned, 0u);
}

TEST(UsdtReal, PostgresServer) {
  auto bins = glob_paths("/usr/lib/postgresql/*/bin/postgres");
  if (bins.empty()) GTEST_SKIP() << "no /usr/lib/postgresql/*/bin/postgres";
  for (const std::string& pg : bins) {
    SCOPED_TRACE(pg);
    expect_real_probes(canonical(pg), "postgresql",
                       {"transaction__start", "transaction__commit", "transaction__abort", "query__start",
                        "query__done", "lwlock__acquire", "lwlock__release", "checkpoint__start", "sort__start"},
                       true);
    auto sorts = uprobe::usdt::find(pg, "postgresql", "sort__start");
    EXPECT_GE(sorts.size(), 2u) << "sort__start has several sites";
    std::set<std::uint64_t> offs;
    for (const Probe& p : sorts) offs.insert(p.offset);
    EXPECT_EQ(offs.size(), sorts.size());
  }
}

}  // namespace
