// SPDX-License-Identifier: MIT
// Library names as users write them (path, soname, short name), resolved
// against what the dynamic linker loaded in this process; libraries not
// loaded; versioned symbols (a fixture library with a version script, its
// stripped copy, glibc's memcpy). End to end: probes at the resolved offsets
// must see rip == dlsym()/dlvsym()'s address.
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <cstdlib>
#include <set>

#include "common.hpp"
#include "uprobe/symbols.hpp"

using namespace usdttest;
using uprobe::Errc;
using uprobe::LibrarySearch;

namespace {

using IntFn = int (*)(int);

void expect_hits_at(const uprobe::Location& loc, const void* ip, const std::function<void()>& call, int n = 50) {
  RipRecorder rec;
  {
    uprobe::Attachment at(loc.path, loc.offset, rec);
    for (int i = 0; i < n; ++i) call();
  }
  EXPECT_EQ(rec.hits.load(), static_cast<std::uint64_t>(n)) << loc.path << ":" << loc.symbol;
  EXPECT_EQ(rec.last_rip.load(), reinterpret_cast<std::uint64_t>(ip)) << loc.path << ":" << loc.symbol;
}

std::string libc_path() {
  Dl_info di;
  EXPECT_NE(dladdr(reinterpret_cast<const void*>(&::labs), &di), 0);
  return canonical(di.dli_fname);
}

TEST(Libraries, LoadedObjectsMainProgramFirst) {
  auto objs = uprobe::loaded_objects();
  ASSERT_GE(objs.size(), 2u);
  EXPECT_EQ(objs[0].name, "");
  EXPECT_EQ(objs[0].path, self_exe());
  EXPECT_EQ(objs[0].base, load_bias(reinterpret_cast<const void*>(&libc_path)));
  bool libc = false;
  for (const auto& o : objs) {
    EXPECT_EQ(o.path, canonical(o.path));
    EXPECT_NE(o.path.find('/'), std::string::npos);
    if (o.path == libc_path()) {
      libc = true;
      EXPECT_EQ(o.base, load_bias(reinterpret_cast<const void*>(&::labs)));
    }
    EXPECT_EQ(o.path.find("vdso"), std::string::npos);
  }
  EXPECT_TRUE(libc);
}

TEST(Libraries, LibcByPathSonameAndShortName) {
  const std::string libc = libc_path();
  EXPECT_EQ(uprobe::resolve_library("libc"), libc);
  EXPECT_EQ(uprobe::resolve_library("libc.so.6"), libc);
  EXPECT_EQ(uprobe::resolve_library(libc), libc);
  EXPECT_EQ(uprobe::resolve_library("/lib/x86_64-linux-gnu/libc.so.6"), libc);
  // Short names are prefixes up to ".so": "lib" alone or "libc.s" are not names.
  expect_error([] { uprobe::resolve_library("libc.s"); }, Errc::file_not_found, {"libc.s", "not loaded"});
  const void* labs_rt = dlsym(RTLD_DEFAULT, "labs");
  ASSERT_NE(labs_rt, nullptr);
  for (const char* spec : {"libc:labs", "libc.so.6:labs"}) {
    auto v = uprobe::resolve_location(spec);
    ASSERT_EQ(v.size(), 1u);
    EXPECT_EQ(v[0].path, libc);
    auto m = maps_offset(labs_rt);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(v[0].offset, m->offset);
    EXPECT_EQ(v[0].symbol, "labs@@GLIBC_2.2.5");
    // Called through a pointer: the compiler would expand ::labs() inline.
    long (*volatile fn)(long) = reinterpret_cast<long (*)(long)>(const_cast<void*>(labs_rt));
    expect_hits_at(v[0], labs_rt, [&] { ASSERT_EQ(fn(-5), 5); });
  }
}

TEST(Libraries, GlobOverLibcReportsAliasesOnce) {
  auto v = uprobe::resolve_location("libc:str*");
  ASSERT_GT(v.size(), 10u);
  std::set<std::uint64_t> offs;
  for (const auto& l : v) {
    EXPECT_EQ(l.symbol.rfind("str", 0), 0u) << l.symbol;
    offs.insert(l.offset);
  }
  EXPECT_EQ(offs.size(), v.size()) << "one location per address";
  // strrchr and its alias rindex: one location, named by the shorter name.
  const std::string libc = libc_path();
  EXPECT_EQ(uprobe::find_symbol(libc, "rindex").offset, uprobe::find_symbol(libc, "strrchr").offset);
  auto both = uprobe::match_symbols(libc, "[rs][it][nr]*[rx]");
  std::vector<std::string> names;
  for (const auto& s : both) names.push_back(s.name);
  const auto rr = uprobe::find_symbol(libc, "strrchr").offset;
  int at_rr = 0;
  for (const auto& s : both) at_rr += s.offset == rr;
  EXPECT_EQ(at_rr, 1) << ::testing::PrintToString(names);
  EXPECT_EQ(uprobe::find_symbol(libc, "strlen").type, STT_GNU_IFUNC);
}

TEST(Libraries, MainProgramByFileName) {
  const std::string exe = self_exe();
  const std::string base = exe.substr(exe.rfind('/') + 1);
  EXPECT_EQ(uprobe::resolve_library(base), exe);
  EXPECT_EQ(uprobe::resolve_library("/proc/self/exe"), exe);
}

TEST(Libraries, NotLoadedThenSearchPathThenLoaded) {
  const std::string lazy = canonical(USDTFIX_LAZY_PATH);
  expect_error([] { uprobe::resolve_library("libusdtfix_lazy"); }, Errc::file_not_found,
               {"libusdtfix_lazy", "not loaded", "search_path"});
  expect_error([] { uprobe::resolve_location("libusdtfix_lazy:usdtfix_lazy_fn"); }, Errc::file_not_found,
               {"libusdtfix_lazy", "not loaded"});
  // The executable's RUNPATH holds the fixture directory: found as dlopen() would.
  EXPECT_EQ(uprobe::resolve_library("libusdtfix_lazy", LibrarySearch::search_path), lazy);
  EXPECT_EQ(uprobe::resolve_library("libusdtfix_lazy.so", LibrarySearch::search_path), lazy);
  auto pending = uprobe::resolve_location("libusdtfix_lazy:usdtfix_lazy_fn", LibrarySearch::search_path);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_TRUE(uprobe::runtime_addresses(lazy, pending[0].offset).empty()) << "not mapped yet";
  expect_error([] { uprobe::resolve_library("libusdtfix_nonexistent", LibrarySearch::search_path); },
               Errc::file_not_found, {"libusdtfix_nonexistent", "search path"});

  void* h = dlopen("libusdtfix_lazy.so", RTLD_NOW);
  ASSERT_NE(h, nullptr) << dlerror();
  auto fn = reinterpret_cast<IntFn>(dlsym(h, "usdtfix_lazy_fn"));
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(uprobe::resolve_library("libusdtfix_lazy"), lazy);
  auto v = uprobe::resolve_location("libusdtfix_lazy:usdtfix_lazy_fn");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].offset, pending[0].offset);
  auto where = uprobe::runtime_addresses(lazy, v[0].offset);
  ASSERT_EQ(where.size(), 1u);
  EXPECT_EQ(where[0], reinterpret_cast<std::uintptr_t>(fn));
  expect_hits_at(v[0], reinterpret_cast<const void*>(fn), [&] { ASSERT_EQ(fn(3), 21); });
}

TEST(Versions, VersionedSymbolsEndToEnd) {
  void* h = dlopen(USDTFIX_VER_PATH, RTLD_NOW);
  ASSERT_NE(h, nullptr) << dlerror();
  const std::string lib = canonical(USDTFIX_VER_PATH);
  auto v1 = reinterpret_cast<IntFn>(dlvsym(h, "vfunc", "VERS_1"));
  auto v2 = reinterpret_cast<IntFn>(dlvsym(h, "vfunc", "VERS_2"));
  auto dflt = reinterpret_cast<IntFn>(dlsym(h, "vfunc"));
  ASSERT_TRUE(v1 && v2 && dflt);
  ASSERT_NE(v1, v2);
  EXPECT_EQ(dflt, v2);

  // Names as users write them: soname, short name, file name.
  EXPECT_EQ(uprobe::resolve_library("libusdtfix_ver"), lib);
  EXPECT_EQ(uprobe::resolve_library("libusdtfix_ver.so.1"), lib);

  struct Case {
    const char* spec;
    IntFn ip;
    const char* shown;
  } cases[] = {
      {"libusdtfix_ver:vfunc@VERS_1", v1, "vfunc@VERS_1"},
      {"libusdtfix_ver:vfunc@VERS_2", v2, "vfunc@@VERS_2"},
      {"libusdtfix_ver:vfunc@@VERS_2", v2, "vfunc@@VERS_2"},
      {"libusdtfix_ver.so.1:vfunc", v2, "vfunc@@VERS_2"},
  };
  for (const Case& c : cases) {
    auto loc = uprobe::resolve_location(c.spec);
    ASSERT_EQ(loc.size(), 1u) << c.spec;
    EXPECT_EQ(loc[0].symbol, c.shown) << c.spec;
    auto m = maps_offset(reinterpret_cast<const void*>(c.ip));
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(loc[0].offset, m->offset) << c.spec;
    IntFn f = c.ip;
    expect_hits_at(loc[0], reinterpret_cast<const void*>(f), [&] { (void)f(1); });
  }
  auto plain = uprobe::find_symbol(lib, "plain");
  EXPECT_EQ(plain.full_name(), "plain@@VERS_1");
  expect_error([&] { uprobe::find_symbol(lib, "vfunc@@VERS_1"); }, Errc::bad_offset,
               {lib, "vfunc@@VERS_1", "vfunc@VERS_1", "vfunc@@VERS_2"});
  expect_error([&] { uprobe::find_symbol(lib, "vfunc@VERS_9"); }, Errc::bad_offset, {"vfunc@VERS_9"});
  // A glob over full names sees the versions.
  auto g = uprobe::match_symbols(lib, "vfunc@*");
  ASSERT_EQ(g.size(), 2u);
}

TEST(Versions, StrippedLibraryUsesDynsymVersions) {
  const std::string full = canonical(USDTFIX_VER_PATH);
  const std::string stripped = canonical(USDTFIX_VER_STRIPPED_PATH);
  auto s1 = uprobe::find_symbol(stripped, "vfunc@VERS_1");
  EXPECT_TRUE(s1.dynamic);
  EXPECT_TRUE(s1.hidden_version);
  EXPECT_EQ(s1.offset, uprobe::find_symbol(full, "vfunc@VERS_1").offset);
  auto s2 = uprobe::find_symbol(stripped, "vfunc");
  EXPECT_EQ(s2.full_name(), "vfunc@@VERS_2");
  EXPECT_EQ(s2.offset, uprobe::find_symbol(full, "vfunc@@VERS_2").offset);
  // Local implementation names are only in the .symtab that strip removed.
  expect_error([&] { uprobe::find_symbol(stripped, "usdtfix_vfunc_v1"); }, Errc::bad_offset,
               {stripped, "usdtfix_vfunc_v1", "no .symtab"});
  EXPECT_EQ(uprobe::find_symbol(full, "usdtfix_vfunc_v1").offset, s1.offset);

  // Load the stripped copy too (another inode, same soname) and probe it.
  void* h = dlopen(USDTFIX_VER_STRIPPED_PATH, RTLD_NOW);
  ASSERT_NE(h, nullptr) << dlerror();
  auto v1 = reinterpret_cast<IntFn>(dlvsym(h, "vfunc", "VERS_1"));
  ASSERT_NE(v1, nullptr);
  auto loc = uprobe::resolve_location(stripped + ":vfunc@VERS_1");
  ASSERT_EQ(loc.size(), 1u);
  expect_hits_at(loc[0], reinterpret_cast<const void*>(v1), [&] { ASSERT_EQ(v1(1), 2); });

  // Both copies loaded: the soname names two objects.
  void* h1 = dlopen(USDTFIX_VER_PATH, RTLD_NOW);
  ASSERT_NE(h1, nullptr);
  expect_error([] { uprobe::resolve_library("libusdtfix_ver.so.1"); }, Errc::conflict,
               {"libusdtfix_ver.so.1", "several", full, stripped});
  EXPECT_EQ(uprobe::resolve_library("libusdtfix_ver"), full);
  EXPECT_EQ(uprobe::resolve_library("libusdtfix_ver_stripped.so"), stripped);
}

TEST(Versions, GlibcMemcpyVersions) {
  const std::string libc = libc_path();
  auto v214 = uprobe::resolve_location("libc:memcpy@GLIBC_2.14");
  auto v225 = uprobe::resolve_location("libc:memcpy@GLIBC_2.2.5");
  auto plain = uprobe::resolve_location("libc:memcpy");
  ASSERT_EQ(v214.size(), 1u);
  ASSERT_EQ(v225.size(), 1u);
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_NE(v214[0].offset, v225[0].offset);
  EXPECT_EQ(plain[0].offset, v214[0].offset);
  EXPECT_EQ(v214[0].symbol, "memcpy@@GLIBC_2.14");
  EXPECT_EQ(v225[0].symbol, "memcpy@GLIBC_2.2.5");
  // memcpy@@GLIBC_2.14 is an IFUNC: the offset is the implementation the
  // dynamic linker bound it to (dlvsym's answer), not its resolver.
  EXPECT_EQ(uprobe::find_symbol(libc, "memcpy@@GLIBC_2.14").type, STT_GNU_IFUNC);
  EXPECT_EQ(uprobe::find_symbol(libc, "memcpy@GLIBC_2.2.5").type, STT_FUNC);
  EXPECT_TRUE(v214[0].ifunc_bound);
  EXPECT_EQ(v214[0].ifunc_resolver, uprobe::find_symbol(libc, "memcpy@@GLIBC_2.14").offset);
  EXPECT_FALSE(v225[0].ifunc);
  EXPECT_EQ(v225[0].offset, uprobe::find_symbol(libc, "memcpy@GLIBC_2.2.5").offset);
  void* h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr);
  void* impl = dlvsym(h, "memcpy", "GLIBC_2.14");
  dlclose(h);
  const auto m = maps_offset(impl);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(v214[0].offset, m->offset);
}

}  // namespace
