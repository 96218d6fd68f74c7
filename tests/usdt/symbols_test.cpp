// SPDX-License-Identifier: MIT
// Symbol and address resolution in this executable, built in several layouts
// (USDT_VARIANT: pie, nopie at 0x1000000, shifted (ld.bfd, text vaddr-offset
// != first segment's), lld, stripped). Expected offsets come from
// /proc/self/maps and the load bias from dladdr1, not from the library; every
// resolved offset is then probed: the handler must see rip == the runtime
// address of the symbol (+OFF), once per call.
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <dlfcn.h>

#include <algorithm>
#include <cstring>

#include "common.hpp"
#include "uprobe/symbols.hpp"

using namespace usdttest;
using uprobe::Errc;

extern "C" {
long fx_sym_body(long);
long fx_sym_label0(long);
long fx_sym_notype(long);
long fx_call_local(long);
long fx_glob_one(long);
long fx_glob_two(long);
long fx_glob_three(long);
long fx_glob_alias(long);
long fx_shadow(long);
extern unsigned long fx_data_obj;
}

namespace {

#if defined(USDT_VARIANT_stripped)
constexpr bool kStripped = true;
#else
constexpr bool kStripped = false;
#endif

template <typename F>
const void* addr(F* f) {
  return reinterpret_cast<const void*>(f);
}

std::uint64_t maps_off(const void* a) {
  auto m = maps_offset(a);
  EXPECT_TRUE(m.has_value());
  if (!m) return 0;
  EXPECT_EQ(m->path, self_exe());
  return m->offset;
}

// Probes `loc`, runs `call` n times, expects n hits at `expect_ip`.
void expect_probe_hits(const uprobe::Location& loc, const void* expect_ip, const std::function<void()>& call, int n = 100) {
  RipRecorder rec;
  {
    uprobe::Attachment at(loc.path, loc.offset, rec);
    for (int i = 0; i < n; ++i) call();
  }
  EXPECT_EQ(rec.hits.load(), static_cast<std::uint64_t>(n)) << loc.symbol << " at " << hex(loc.offset);
  EXPECT_EQ(rec.last_rip.load(), reinterpret_cast<std::uint64_t>(expect_ip)) << loc.symbol;
}

std::string spec(const std::string& what) { return self_exe() + ":" + what; }

uprobe::Location one(const std::string& what) {
  auto v = uprobe::resolve_location(spec(what));
  EXPECT_EQ(v.size(), 1u) << what;
  return v.empty() ? uprobe::Location{} : v[0];
}

TEST(Layout, SegmentsAreWhatTheVariantPromises) {
  std::vector<Seg> segs = main_program_loads();
  ASSERT_GE(segs.size(), 2u);
  const Seg* text = nullptr;
  for (const Seg& s : segs)
    if (s.exec) text = &s;
  ASSERT_NE(text, nullptr);
  const std::uintptr_t bias = load_bias(addr(fx_sym_body));
  const std::string v = USDT_VARIANT;
  if (v == "nopie") {
    EXPECT_EQ(bias, 0u);
    EXPECT_EQ(segs[0].vaddr, 0x1000000u);
    EXPECT_NE(text->vaddr, text->offset);
  } else {
    EXPECT_NE(bias, 0u) << "a PIE is loaded at a non-zero bias";
  }
  if (v == "lld" || v == "shifted") {
    EXPECT_NE(text->vaddr, text->offset);
    EXPECT_NE(text->vaddr - text->offset, segs[0].vaddr - segs[0].offset)
        << "the text segment must be shifted relative to the first segment";
  }
  // Our reader agrees with the loaded program headers.
  for (const Seg& s : segs) {
    if (s.filesz == 0) continue;
    EXPECT_EQ(uprobe::address_to_offset(self_exe(), s.vaddr), s.offset);
    EXPECT_EQ(uprobe::offset_to_address(self_exe(), s.offset + s.filesz - 1), s.vaddr + s.filesz - 1);
  }
}

TEST(Symbols, FunctionEntry) {
  if (kStripped) {
    expect_error([] { uprobe::resolve_location(spec("fx_sym_body")); }, Errc::bad_offset,
                 {self_exe(), "fx_sym_body", "stripped"});
    return;
  }
  uprobe::Location l = one("fx_sym_body");
  EXPECT_EQ(l.path, self_exe());
  EXPECT_EQ(l.offset, maps_off(addr(fx_sym_body)));
  EXPECT_EQ(l.address, reinterpret_cast<std::uintptr_t>(addr(fx_sym_body)) - load_bias(addr(fx_sym_body)));
  EXPECT_EQ(l.symbol, "fx_sym_body");
  EXPECT_EQ(l.symbol_offset, 0u);
  expect_probe_hits(l, addr(fx_sym_body), [] { ASSERT_EQ(fx_sym_body(41), 42); });

  uprobe::Symbol s = uprobe::find_symbol(self_exe(), "fx_sym_body");
  EXPECT_EQ(s.size, 6u);
  EXPECT_EQ(s.offset, l.offset);
  EXPECT_TRUE(s.executable);
  EXPECT_FALSE(s.dynamic);
}

TEST(Symbols, SymbolPlusOffset) {
  if (kStripped) GTEST_SKIP() << "no symbols in a stripped executable";
  const auto* base = static_cast<const std::uint8_t*>(addr(fx_sym_body));
  uprobe::Location l4 = one("fx_sym_body+4");
  EXPECT_EQ(l4.offset, maps_off(base) + 4);
  EXPECT_EQ(l4.symbol_offset, 4u);
  expect_probe_hits(l4, base + 4, [] { ASSERT_EQ(fx_sym_body(1), 2); });
  uprobe::Location l5 = one("fx_sym_body+0x5");
  expect_probe_hits(l5, base + 5, [] { ASSERT_EQ(fx_sym_body(2), 3); });
  // Past the end of the 6-byte symbol.
  expect_error([] { one("fx_sym_body+6"); }, Errc::bad_offset, {"fx_sym_body+0x6", "outside", "size 6"});
  // Inside the 4-byte lea: the resolver accepts it (it lies in the symbol),
  // the registration refuses it.
  uprobe::Location l2 = one("fx_sym_body+2");
  RipRecorder rec;
  expect_error([&] { uprobe::register_uprobe(l2.path, l2.offset, rec); }, Errc::mid_instruction, {hex(l2.offset)});
}

TEST(Symbols, SizeZeroSymbol) {
  if (kStripped) GTEST_SKIP() << "no symbols in a stripped executable";
  uprobe::Symbol s = uprobe::find_symbol(self_exe(), "fx_sym_label0");
  EXPECT_EQ(s.size, 0u);
  uprobe::Location l = one("fx_sym_label0");
  EXPECT_EQ(l.offset, maps_off(addr(fx_sym_label0)));
  expect_probe_hits(l, addr(fx_sym_label0), [] { ASSERT_EQ(fx_sym_label0(1), 3); });
  expect_error([] { one("fx_sym_label0+1"); }, Errc::bad_offset, {"fx_sym_label0+0x1", "size 0"});
}

TEST(Symbols, NoTypeAndLocalSymbols) {
  if (kStripped) {
    expect_error([] { one("fx_sym_notype"); }, Errc::bad_offset, {"fx_sym_notype"});
    return;
  }
  uprobe::Location n = one("fx_sym_notype");
  EXPECT_EQ(n.offset, maps_off(addr(fx_sym_notype)));
  expect_probe_hits(n, addr(fx_sym_notype), [] { ASSERT_EQ(fx_sym_notype(1), 4); });

  uprobe::Symbol ls = uprobe::find_symbol(self_exe(), "fx_sym_local");
  EXPECT_EQ(ls.binding, 0 /* STB_LOCAL */);
  uprobe::Location l = one("fx_sym_local");
  // Called through fx_call_local, a `jmp fx_sym_local`: decode its target.
  const auto* j = static_cast<const std::uint8_t*>(addr(fx_call_local));
  std::uintptr_t target = 0;
  if (j[0] == 0xeb) {
    target = reinterpret_cast<std::uintptr_t>(j) + 2 + static_cast<std::int8_t>(j[1]);
  } else {
    ASSERT_EQ(j[0], 0xe9);
    std::int32_t rel;
    std::memcpy(&rel, j + 1, 4);
    target = reinterpret_cast<std::uintptr_t>(j) + 5 + rel;
  }
  EXPECT_EQ(maps_off(reinterpret_cast<const void*>(target)), l.offset);
  expect_probe_hits(l, reinterpret_cast<const void*>(target), [] { ASSERT_EQ(fx_call_local(1), 5); });
}

TEST(Symbols, GlobReturnsEveryMatchOncePerAddress) {
  if (kStripped) {
    expect_error([] { uprobe::resolve_location(spec("fx_glob_*")); }, Errc::bad_offset, {"fx_glob_*", "stripped"});
    return;
  }
  auto v = uprobe::resolve_location(spec("fx_glob_*"));
  ASSERT_EQ(v.size(), 3u) << "fx_glob_alias shares fx_glob_one's address";
  EXPECT_EQ(v[0].symbol, "fx_glob_one");
  EXPECT_EQ(v[1].symbol, "fx_glob_two");
  EXPECT_EQ(v[2].symbol, "fx_glob_three");
  EXPECT_LT(v[0].offset, v[1].offset);
  EXPECT_LT(v[1].offset, v[2].offset);
  EXPECT_EQ(addr(fx_glob_alias), addr(fx_glob_one));
  long (*fns[])(long) = {fx_glob_one, fx_glob_two, fx_glob_three};
  long adds[] = {10, 20, 30};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(v[i].offset, maps_off(addr(fns[i])));
    expect_probe_hits(v[i], addr(fns[i]), [&] { ASSERT_EQ(fns[i](1), 1 + adds[i]); }, 10 + i);
  }
  // All three attached at once: one hit each per call.
  RipRecorder r[3];
  {
    uprobe::Attachment a0(v[0].path, v[0].offset, r[0]), a1(v[1].path, v[1].offset, r[1]),
        a2(v[2].path, v[2].offset, r[2]);
    for (int k = 0; k < 7; ++k)
      for (auto* f : fns) f(k);
  }
  for (auto& rr : r) EXPECT_EQ(rr.hits.load(), 7u);
  EXPECT_EQ(uprobe::resolve_location(spec("fx_glob_t*")).size(), 2u);
  auto m = uprobe::match_symbols(self_exe(), "fx_glob_?n*");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].name, "fx_glob_one");
  expect_error([] { uprobe::resolve_location(spec("fx_nomatch_*")); }, Errc::bad_offset, {"fx_nomatch_*"});
}

TEST(Symbols, AmbiguousLocalsAndShadowing) {
  if (kStripped) GTEST_SKIP() << "no symbols in a stripped executable";
  expect_error([] { one("fx_dup_local"); }, Errc::conflict, {self_exe(), "fx_dup_local", "ambiguous"});
  uprobe::Location l = one("fx_shadow");
  EXPECT_EQ(l.offset, maps_off(addr(fx_shadow)));
  expect_probe_hits(l, addr(fx_shadow), [] { ASSERT_EQ(fx_shadow(0), 50); });
}

TEST(Symbols, DataIsNotCode) {
  if (kStripped) GTEST_SKIP() << "no symbols in a stripped executable";
  expect_error([] { one("fx_data_obj"); }, Errc::not_executable, {"fx_data_obj", "OBJECT", "not code"});
  uprobe::Symbol s = uprobe::find_symbol(self_exe(), "fx_data_obj");
  EXPECT_EQ(s.offset, maps_off(&fx_data_obj));
  auto where = uprobe::runtime_addresses(self_exe(), s.offset);
  ASSERT_EQ(where.size(), 1u);
  EXPECT_EQ(where[0], reinterpret_cast<std::uintptr_t>(&fx_data_obj));
  EXPECT_EQ(*reinterpret_cast<const unsigned long*>(where[0]), 0x1122334455667788ul);
}

TEST(Symbols, RawAddressAndFileOffset) {
  const std::uintptr_t bias = load_bias(addr(fx_sym_body));
  const std::uintptr_t rt = reinterpret_cast<std::uintptr_t>(addr(fx_sym_body));
  const std::uint64_t vaddr = rt - bias;
  const std::uint64_t off = maps_off(addr(fx_sym_body));
  EXPECT_EQ(uprobe::address_to_offset(self_exe(), vaddr), off);
  EXPECT_EQ(uprobe::offset_to_address(self_exe(), off), vaddr);

  uprobe::Location a = one(hex(vaddr));
  EXPECT_EQ(a.offset, off);
  EXPECT_EQ(a.address, vaddr);
  EXPECT_TRUE(a.symbol.empty());
  expect_probe_hits(a, addr(fx_sym_body), [] { ASSERT_EQ(fx_sym_body(5), 6); });

  uprobe::Location o = one("+" + hex(off + 4));
  EXPECT_EQ(o.offset, off + 4);
  EXPECT_EQ(o.address, vaddr + 4);
  expect_probe_hits(o, reinterpret_cast<const void*>(rt + 4), [] { ASSERT_EQ(fx_sym_body(5), 6); });
  // Decimal forms.
  EXPECT_EQ(one(std::to_string(vaddr)).offset, off);
  EXPECT_EQ(one("+" + std::to_string(off)).offset, off);

  auto where = uprobe::runtime_addresses(self_exe(), off);
  ASSERT_EQ(where.size(), 1u);
  EXPECT_EQ(where[0], rt);

  // The ELF header is mapped but not code; far addresses are in no segment.
  expect_error([] { one("+0x0"); }, Errc::not_executable, {"not code"});
  expect_error([] { one("0x7fffffffff00"); }, Errc::bad_offset, {"0x7fffffffff00", "PT_LOAD"});
  expect_error([] { one("+0x7fffffff"); }, Errc::bad_offset, {"PT_LOAD"});
}

TEST(Symbols, SymbolAtOffset) {
  if (kStripped) {
    EXPECT_FALSE(uprobe::symbol_at(self_exe(), maps_off(addr(fx_sym_body))).has_value());
    return;
  }
  const std::uint64_t off = maps_off(addr(fx_sym_body));
  auto s = uprobe::symbol_at(self_exe(), off + 4);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->name, "fx_sym_body");
  EXPECT_EQ(s->offset, off);
  auto z = uprobe::symbol_at(self_exe(), maps_off(addr(fx_sym_label0)));
  ASSERT_TRUE(z.has_value());
  EXPECT_EQ(z->name, "fx_sym_label0");
}

TEST(Symbols, MalformedSpecsAndMissingFiles) {
  expect_error([] { uprobe::resolve_location("fx_sym_body"); }, Errc::bad_offset, {"malformed", "fx_sym_body"});
  expect_error([] { uprobe::resolve_location(self_exe() + ":"); }, Errc::bad_offset, {"malformed"});
  expect_error([] { uprobe::resolve_location(":fx_sym_body"); }, Errc::bad_offset, {"malformed"});
  expect_error([] { uprobe::resolve_location(spec("+0xzz")); }, Errc::bad_offset, {"+0xzz"});
  expect_error([] { uprobe::resolve_location(spec("fx_sym_body+zz")); }, Errc::bad_offset, {"fx_sym_body+zz"});
  expect_error([] { uprobe::resolve_location("/nonexistent/dir/libnothing.so:foo"); }, Errc::file_not_found,
               {"/nonexistent/dir/libnothing.so"});
  expect_error([] { uprobe::resolve_location(spec("no_such_symbol_here")); }, Errc::bad_offset,
               {self_exe(), "no_such_symbol_here"});
  expect_error([] { uprobe::resolve_location("/proc/self/status:foo"); }, Errc::not_executable, {"ELF"});
}

}  // namespace
