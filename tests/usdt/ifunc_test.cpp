// SPDX-License-Identifier: MIT
// GNU indirect functions (STT_GNU_IFUNC): resolve_location() gives the
// implementation the dynamic linker bound the name to in this process (not
// the resolver, which runs only when the name is bound), and probe_info()
// says so. Expectations come from outside the library: the binding from
// dlsym()/dlvsym() on a handle the test opens itself, and (not under a
// sanitizer, which interposes strlen) the address this PIE's own GOT holds
// for strlen; hits are counted by argument, so only the test's own calls
// count.
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "common.hpp"
#include "uprobe/symbols.hpp"

// An IFUNC of the main program (exported: -Wl,--export-dynamic-symbol):
// its resolver picks the second implementation.
extern "C" {
__attribute__((noinline, used)) int ifx_main_a(int x) {
  asm volatile("");
  return x * 3;
}
__attribute__((noinline, used)) int ifx_main_b(int x) {
  asm volatile("");
  return x * 5;
}
using IfxFn = int (*)(int);
__attribute__((used)) static IfxFn ifx_main_resolver() { return ifx_main_b; }
__attribute__((visibility("default"))) int ifx_main(int) __attribute__((ifunc("ifx_main_resolver")));
}

using namespace usdttest;

namespace {

std::string libc_path() {
  Dl_info di;
  EXPECT_NE(dladdr(reinterpret_cast<const void*>(&::labs), &di), 0);
  return canonical(di.dli_fname);
}

/// Counts the calling test's calls of a string function: hits whose first
/// argument is `marker` (libc itself may call strlen from any thread).
struct MarkerCounter : uprobe::Consumer {
  const char* marker = nullptr;
  std::atomic<std::uint64_t> hits{0}, all{0}, bad_rip{0};
  std::uint64_t want_rip = 0;
  uprobe::Action handler(uprobe::Regs& regs) override {
    all.fetch_add(1, std::memory_order_relaxed);
    if (regs.rdi != reinterpret_cast<std::uint64_t>(marker)) return uprobe::Action::keep;
    hits.fetch_add(1, std::memory_order_relaxed);
    if (regs.rip != want_rip) bad_rip.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

/// The full names of the exported IFUNCs of `path` that `h` binds to `impl`,
/// in .dynsym order: what probe_info() lists.
std::string ifuncs_bound_to(const std::string& path, void* h, const void* impl) {
  std::string names;
  for (const uprobe::Symbol& s : uprobe::read_symbols(path)) {
    if (!s.dynamic || s.type != STT_GNU_IFUNC) continue;
    void* b = s.version.empty() ? dlsym(h, s.name.c_str()) : dlvsym(h, s.name.c_str(), s.version.c_str());
    if (b == impl) names += (names.empty() ? "" : ", ") + s.full_name();
  }
  return names;
}

std::size_t (*volatile g_strlen)(const char*) = nullptr;
const char* volatile g_text = nullptr;

TEST(Ifunc, LibcStrlenIsTheBoundImplementation) {
  const std::string libc = libc_path();
  void* h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr);
  void* impl = dlsym(h, "strlen");
  ASSERT_NE(impl, nullptr);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // Without a sanitizer's interceptor, this PIE's calls of strlen are bound
  // to the same address (its GOT entry: what &strlen reads).
  EXPECT_EQ(reinterpret_cast<void*>(&::strlen), impl);
#endif
  const uprobe::Symbol sym = uprobe::find_symbol(libc, "strlen");
  ASSERT_EQ(sym.type, STT_GNU_IFUNC);

  const auto locs = uprobe::resolve_location("libc:strlen");
  ASSERT_EQ(locs.size(), 1u);
  const uprobe::Location& l = locs[0];
  EXPECT_EQ(l.path, libc);
  EXPECT_EQ(l.symbol, sym.full_name());
  EXPECT_EQ(l.symbol_offset, 0u);
  EXPECT_TRUE(l.ifunc);
  EXPECT_TRUE(l.ifunc_bound);
  EXPECT_EQ(l.ifunc_resolver, sym.offset);
  EXPECT_NE(l.offset, sym.offset) << "the resolver, not the implementation";
  const auto maps = maps_offset(impl);
  ASSERT_TRUE(maps.has_value());
  EXPECT_EQ(maps->path, libc);
  EXPECT_EQ(l.offset, maps->offset) << "dlsym(strlen) is at file offset " << hex(maps->offset);
  EXPECT_EQ(l.address, reinterpret_cast<std::uint64_t>(impl) - load_bias(impl));
  EXPECT_EQ(uprobe::runtime_addresses(l.path, l.offset),
            std::vector<std::uintptr_t>{reinterpret_cast<std::uintptr_t>(impl)});
  // The implementation by name where the file has a .symtab (Debian's
  // libc.so.6 has none: then it has no name, and is shown by offset).
  const auto at = uprobe::symbol_at(libc, l.offset);
  std::string shown;
  if (at && at->offset == l.offset) {
    EXPECT_EQ(l.implementation, at->full_name());
    EXPECT_EQ(l.implementation.rfind("__strlen_", 0), 0u) << l.implementation << " (glibc's naming)";
    shown = l.implementation;
  } else {
    EXPECT_EQ(l.implementation, "");
    shown = "offset " + hex(l.offset);
  }
  // The plain symbol lookups still describe the symbol itself.
  EXPECT_EQ(uprobe::resolve_symbol(libc, "strlen").offset, l.offset);
  EXPECT_EQ(uprobe::resolve_symbol(libc, "strlen", 4).offset, sym.offset + 4) << "SYMBOL+OFF is in the resolver";
  EXPECT_FALSE(uprobe::resolve_symbol(libc, "strlen", 4).ifunc_bound);

  // A probe there counts every call, through the PLT and through dlsym's pointer.
  static const char text[] = "seventeen letters";
  MarkerCounter c;
  c.marker = text;
  c.want_rip = reinterpret_cast<std::uint64_t>(impl);
  g_text = text;
  g_strlen = reinterpret_cast<std::size_t (*)(const char*)>(impl);
  std::size_t sum = 0;
  {
    uprobe::Attachment a(l.path, l.offset, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.symbol, at ? at->full_name() + (l.offset > at->offset ? "+" + hex(l.offset - at->offset) : "") : "");
    EXPECT_EQ(info.ifunc, "IFUNC " + ifuncs_bound_to(libc, h, impl) + " -> " + shown);
    EXPECT_NE(info.ifunc.find(sym.full_name()), std::string::npos) << info.ifunc;
    for (int i = 0; i < 500; ++i) sum += std::strlen(g_text);
    for (int i = 0; i < 500; ++i) sum += g_strlen(g_text);
  }
  EXPECT_EQ(sum, 1000u * 17);
  EXPECT_EQ(c.hits.load(), 1000u);
  EXPECT_EQ(c.bad_rip.load(), 0u);

  // A probe at the resolver sees none of them, and probe_info() says why.
  MarkerCounter r;
  r.marker = text;
  {
    uprobe::Attachment a(l.path, l.ifunc_resolver, r);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.ifunc, "resolver of IFUNC strlen (bound to " + shown + ": a probe here sees no calls)");
    EXPECT_EQ(info.symbol, uprobe::symbol_at(libc, l.ifunc_resolver)->full_name());
    EXPECT_EQ(info.symbol.rfind("strlen", 0), 0u) << info.symbol;
    for (int i = 0; i < 100; ++i) sum += std::strlen(g_text);
  }
  EXPECT_EQ(r.all.load(), 0u);
  dlclose(h);
}

/// The separate debug file of the loaded libc.so.6 by its build-id (the
/// NT_GNU_BUILD_ID note of its PT_NOTE segments, read from memory), if one is
/// installed (Debian: libc6-dbg); "" otherwise.
std::string libc_debug_file() {
  struct Found {
    std::string path;
  } found;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t, void* p) {
        if (!info->dlpi_name || !std::strstr(info->dlpi_name, "/libc.so.6")) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE) continue;
          const auto* n = reinterpret_cast<const std::uint8_t*>(info->dlpi_addr + ph.p_vaddr);
          for (std::size_t at = 0; at + 12 <= ph.p_memsz;) {
            std::uint32_t namesz, descsz, type;
            std::memcpy(&namesz, n + at, 4);
            std::memcpy(&descsz, n + at + 4, 4);
            std::memcpy(&type, n + at + 8, 4);
            const std::size_t name = at + 12, desc = name + ((namesz + 3) & ~3u);
            if (type == NT_GNU_BUILD_ID && namesz == 4 && std::memcmp(n + name, "GNU", 4) == 0 && descsz > 1) {
              std::string hexid;
              char b[3];
              for (std::uint32_t k = 0; k < descsz; ++k) {
                std::snprintf(b, sizeof b, "%02x", n[desc + k]);
                hexid += b;
              }
              static_cast<Found*>(p)->path =
                  "/usr/lib/debug/.build-id/" + hexid.substr(0, 2) + "/" + hexid.substr(2) + ".debug";
              return 1;
            }
            at = desc + ((descsz + 3) & ~3u);
          }
        }
        return 1;
      },
      &found);
  struct stat st;
  return !found.path.empty() && ::stat(found.path.c_str(), &st) == 0 ? found.path : std::string();
}

/// `n` bytes of `path` at file offset `off`.
std::vector<std::uint8_t> file_bytes(const std::string& path, std::uint64_t off, std::size_t n) {
  std::vector<std::uint8_t> v(n);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  EXPECT_EQ(::pread(fd, v.data(), n, static_cast<off_t>(off)), static_cast<ssize_t>(n));
  ::close(fd);
  return v;
}

// The implementation strlen is bound to has no symbol in Debian's libc.so.6
// (no .symtab) but an .eh_frame FDE (and, with libc6-dbg, a debug-file
// symbol): its entry takes the optimized jump, every call is a hit, and its
// bytes are the file's again after the detach.
TEST(Ifunc, LibcStrlenImplementationTakesTheJump) {
  const std::string libc = libc_path();
  void* h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr);
  void* impl = dlsym(h, "strlen");
  ASSERT_NE(impl, nullptr);
  const auto locs = uprobe::resolve_location("libc:strlen");
  ASSERT_EQ(locs.size(), 1u);
  const uprobe::Location& l = locs[0];
  ASSERT_TRUE(l.ifunc_bound);
  const std::vector<std::uint8_t> file = file_bytes(libc, l.offset, 16);
  ASSERT_EQ(std::memcmp(impl, file.data(), file.size()), 0);
  static const char text[] = "seventeen letters";
  MarkerCounter c;
  c.marker = text;
  c.want_rip = reinterpret_cast<std::uint64_t>(impl);
  g_text = text;
  g_strlen = reinterpret_cast<std::size_t (*)(const char*)>(impl);
  std::size_t sum = 0;
  const std::string source = libc_debug_file().empty() ? "eh_frame " : "debuginfo ";
  {
    uprobe::Attachment a(l.path, l.offset, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_entry) << info.why_not_optimized;
    EXPECT_GE(info.displaced, 5u);
    EXPECT_EQ(info.bounds.rfind(source + hex(l.offset) + "+0x", 0), 0u) << info.bounds;
    EXPECT_NE(std::memcmp(impl, file.data(), 5), 0) << "no jump written";
    for (int i = 0; i < 500; ++i) sum += std::strlen(g_text);
    for (int i = 0; i < 500; ++i) sum += g_strlen(g_text);
  }
  EXPECT_EQ(sum, 1000u * 17);
  EXPECT_EQ(c.hits.load(), 1000u);
  EXPECT_EQ(c.bad_rip.load(), 0u);
  EXPECT_EQ(std::memcmp(impl, file.data(), file.size()), 0) << "bytes not restored";
  dlclose(h);
}

// With libc's debug file installed (libc6-dbg), a function that neither
// .dynsym nor (absent) .symtab names is probed by name, with the size the
// debug file gives: __strlen_sse2, which every x86-64 CPU can run.
TEST(Ifunc, LibcStaticFunctionByNameFromTheDebugFile) {
  const std::string debug = libc_debug_file();
  if (debug.empty())
    GTEST_SKIP() << "libc's debug file (/usr/lib/debug/.build-id/...) is not installed: apt-get install libc6-dbg";
  const std::string libc = libc_path();
  const uprobe::Symbol sym = uprobe::find_symbol(libc, "__strlen_sse2");
  EXPECT_FALSE(sym.dynamic);
  EXPECT_EQ(sym.type, STT_FUNC);
  ASSERT_GT(sym.size, 16u);
  for (const uprobe::Symbol& s : uprobe::read_symbols(libc))
    EXPECT_FALSE(s.dynamic && s.name == "__strlen_sse2") << "exported after all";
  const auto locs = uprobe::resolve_location("libc:__strlen_sse2");
  ASSERT_EQ(locs.size(), 1u);
  EXPECT_EQ(locs[0].offset, sym.offset);
  EXPECT_EQ(locs[0].symbol, "__strlen_sse2");
  const auto addrs = uprobe::runtime_addresses(libc, sym.offset);
  ASSERT_EQ(addrs.size(), 1u);
  const auto fn = reinterpret_cast<std::size_t (*)(const char*)>(addrs[0]);
  static const char text[] = "twenty-one characters";
  MarkerCounter c;
  c.marker = text;
  c.want_rip = addrs[0];
  const std::vector<std::uint8_t> file = file_bytes(libc, sym.offset, 16);
  std::size_t sum = 0;
  {
    uprobe::Attachment a(libc, sym.offset, c);
    const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
    EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_entry) << info.why_not_optimized;
    EXPECT_EQ(info.symbol, "__strlen_sse2");
    EXPECT_EQ(info.bounds, "debuginfo " + hex(sym.offset) + "+" + hex(sym.size));
    for (int i = 0; i < 300; ++i) sum += fn(text);
  }
  EXPECT_EQ(sum, 300u * 21);
  EXPECT_EQ(c.hits.load(), 300u);
  EXPECT_EQ(c.bad_rip.load(), 0u);
  EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(addrs[0]), file.data(), file.size()), 0);
}

// The main program's own (exported) IFUNC: the dynamic linker's lookup from
// the main program's handle.
TEST(Ifunc, MainProgramIfunc) {
  const std::string exe = self_exe();
  void* h = dlopen(nullptr, RTLD_LAZY);
  ASSERT_NE(h, nullptr);
  auto fn = reinterpret_cast<IfxFn>(dlsym(h, "ifx_main"));
  ASSERT_EQ(fn, &ifx_main_b);
  const auto locs = uprobe::resolve_location(exe + ":ifx_main");
  ASSERT_EQ(locs.size(), 1u);
  EXPECT_TRUE(locs[0].ifunc);
  EXPECT_TRUE(locs[0].ifunc_bound);
  EXPECT_EQ(locs[0].ifunc_resolver, uprobe::find_symbol(exe, "ifx_main_resolver").offset);
  EXPECT_EQ(locs[0].offset, uprobe::find_symbol(exe, "ifx_main_b").offset);
  EXPECT_EQ(locs[0].implementation, "ifx_main_b");
  RipRecorder rec;
  int sum = 0;
  {
    uprobe::Attachment a(locs[0].path, locs[0].offset, rec);
    EXPECT_EQ(uprobe::probe_info(a.probe()).ifunc, "IFUNC ifx_main -> ifx_main_b");
    EXPECT_EQ(uprobe::probe_info(a.probe()).symbol, "ifx_main_b");
    for (int i = 0; i < 100; ++i) sum += ifx_main(i);
  }
  EXPECT_EQ(sum, 5 * 4950);
  EXPECT_EQ(rec.hits.load(), 100u);
  EXPECT_EQ(rec.last_rip.load(), reinterpret_cast<std::uint64_t>(&ifx_main_b));
}

// A library that is not loaded yet has bound nothing: the resolver, as the
// kernel takes it; once dlopen() loaded it, the implementation. A glob names
// the implementation once, by the IFUNC.
TEST(Ifunc, LibraryLoadedLater) {
  const std::string lazy = canonical(USDTFIX_LAZY_PATH);
  const uprobe::Symbol sym = uprobe::find_symbol(lazy, "usdtfix_lazy_ifunc");
  ASSERT_EQ(sym.type, STT_GNU_IFUNC);
  const std::uint64_t impl_a = uprobe::find_symbol(lazy, "lazy_ifunc_a").offset;
  const std::uint64_t impl_b = uprobe::find_symbol(lazy, "lazy_ifunc_b").offset;
  const auto before = uprobe::resolve_location(lazy + ":usdtfix_lazy_ifunc");
  ASSERT_EQ(before.size(), 1u);
  EXPECT_TRUE(before[0].ifunc);
  EXPECT_FALSE(before[0].ifunc_bound);
  EXPECT_EQ(before[0].offset, sym.offset);
  EXPECT_EQ(before[0].ifunc_resolver, sym.offset);
  EXPECT_EQ(before[0].implementation, "");

  void* h = dlopen(USDTFIX_LAZY_PATH, RTLD_NOW);
  ASSERT_NE(h, nullptr);
  auto fn = reinterpret_cast<IfxFn>(dlsym(h, "usdtfix_lazy_ifunc"));
  ASSERT_NE(fn, nullptr);
  const auto after = uprobe::resolve_location("libusdtfix_lazy:usdtfix_lazy_ifunc");
  ASSERT_EQ(after.size(), 1u);
  EXPECT_TRUE(after[0].ifunc_bound);
  EXPECT_EQ(after[0].offset, impl_b);
  EXPECT_EQ(after[0].implementation, "lazy_ifunc_b");
  EXPECT_EQ(uprobe::runtime_addresses(lazy, impl_b), std::vector<std::uintptr_t>{reinterpret_cast<std::uintptr_t>(fn)});
  RipRecorder rec;
  int sum = 0;
  {
    uprobe::Attachment a(after[0].path, after[0].offset, rec);
    EXPECT_EQ(uprobe::probe_info(a.probe()).ifunc, "IFUNC usdtfix_lazy_ifunc -> lazy_ifunc_b");
    for (int i = 0; i < 64; ++i) sum += fn(i);
  }
  EXPECT_EQ(sum, 64 * 2 + 2016);
  EXPECT_EQ(rec.hits.load(), 64u);
  EXPECT_EQ(rec.last_rip.load(), reinterpret_cast<std::uint64_t>(fn));

  const auto glob = uprobe::resolve_location("libusdtfix_lazy:*lazy_ifunc*");
  ASSERT_EQ(glob.size(), 2u);
  std::map<std::uint64_t, std::string> got;
  for (const auto& l : glob) got[l.offset] = l.symbol + (l.ifunc_bound ? " -> " + l.implementation : "");
  EXPECT_EQ(got, (std::map<std::uint64_t, std::string>{{impl_a, "lazy_ifunc_a"},
                                                        {impl_b, "usdtfix_lazy_ifunc -> lazy_ifunc_b"}}));
  dlclose(h);
}

}  // namespace
