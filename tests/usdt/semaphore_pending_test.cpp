// SPDX-License-Identifier: MIT
// Cases C-07 (USDT semaphore reference counting, register_uprobe with a
// ref_ctr_offset) and C-11 (a pending probe on a library loaded later,
// unloaded and reloaded). Expectations come from outside the library: the
// semaphores' addresses from the fixtures themselves, file offsets and
// mappings from /proc/self/maps, function addresses from dlsym(), original
// bytes from the file.
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>

#include "common.hpp"
#include "fixtures/c07_fixtures.h"
#include "uprobe/symbols.hpp"
#include "uprobe/usdt.hpp"
#include "proc_text.hpp"

#include <sys/sysmacros.h>

using namespace usdttest;
using uprobe::Errc;
using uprobe::usdt::Probe;

namespace {

// ------------------------------------------------------------ helpers ----

/// One line of /proc/self/maps.
struct MapLine {
  std::uintptr_t start = 0, end = 0;
  std::string perms;
  std::uint64_t pgoff = 0;
  unsigned maj = 0, min = 0;
  std::uint64_t ino = 0;
  std::string path;
};

/// The mappings (libuprobe's copied pages shown as their files': proc_text.hpp read_maps()).
std::vector<MapLine> maps() {
  std::vector<MapLine> out;
  for (const uprobe_test::MapLine& l : uprobe_test::read_maps())
    out.push_back(MapLine{l.start, l.end, l.perms, l.offset, major(l.dev), minor(l.dev), static_cast<std::uint64_t>(l.ino),
                          l.path});
  return out;
}

/// Every mapping of `path` (by st_dev/st_ino, or by name).
std::vector<MapLine> mappings_of(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  std::vector<MapLine> out;
  for (const MapLine& m : maps()) {
    bool same_file = m.ino == st.st_ino && m.maj == major(st.st_dev) && m.min == minor(st.st_dev);
    if (same_file || m.path == path || (!m.path.empty() && m.path[0] == '/' && canonical(m.path) == path))
      out.push_back(m);
  }
  return out;
}

std::string describe(const std::vector<MapLine>& v) {
  std::ostringstream os;
  for (const MapLine& m : v)
    os << std::hex << m.start << "-" << m.end << " " << m.perms << " " << m.pgoff << std::dec << " " << m.path << "\n";
  return os.str();
}

std::optional<MapLine> mapping_at(std::uintptr_t a) {
  for (const MapLine& m : maps())
    if (a >= m.start && a < m.end) return m;
  return std::nullopt;
}

template <typename T>
T sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  EXPECT_NE(p, nullptr) << name << ": " << dlerror();
  return reinterpret_cast<T>(p);
}

/// Counts hits, sums argument #1 (evaluated live), records every rip.
struct Recorder : uprobe::Consumer {
  Recorder() = default;
  explicit Recorder(const uprobe::usdt::ArgSpec* a) : args(a) {}
  const uprobe::usdt::ArgSpec* args = nullptr;
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::int64_t> arg_sum{0};
  std::atomic<std::uint64_t> bad_rip{0};  // hits whose rip != expected_rip (when set)
  std::atomic<std::uint64_t> expected_rip{0};
  static constexpr unsigned kMax = 64;
  std::uint64_t rips[kMax] = {};
  uprobe::Action handler(uprobe::Regs& regs) override {
    std::uint64_t n = hits.fetch_add(1, std::memory_order_relaxed);
    if (n < kMax) rips[n] = regs.rip;
    std::uint64_t want = expected_rip.load(std::memory_order_relaxed);
    if (want && regs.rip != want) bad_rip.fetch_add(1, std::memory_order_relaxed);
    if (args) arg_sum.fetch_add(static_cast<std::int64_t>(args->value(0, regs)), std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

// ------------------------------------------------------------ C-07 ----

struct Flavour {
  const char* provider;
  volatile unsigned short* sema;
  volatile std::int64_t* side_effects;
  volatile std::int64_t* side_sum;
  int (*fn)(std::int64_t);
  bool nop5;  // uprobe/usdt_probe.h site: must be optimized
};

// Runs fn(base + i) for i in [0, 100); returns the sum of the arguments and
// checks every return value (1: guarded branch taken).
std::int64_t run100(const Flavour& f, std::int64_t base, int want_ret) {
  std::int64_t sum = 0;
  int wrong = 0;
  for (int i = 0; i < 100; ++i) {
    wrong += f.fn(base + i) != want_ret;
    sum += base + i;
  }
  EXPECT_EQ(wrong, 0) << f.provider << ": calls whose guarded branch was " << (want_ret ? "not " : "") << "taken";
  return sum;
}

void semaphore_sequence(const Flavour& f) {
  SCOPED_TRACE(f.provider);
  auto v = uprobe::usdt::find(self_exe(), f.provider, "guarded");
  ASSERT_EQ(v.size(), 1u);
  const Probe& p = v[0];
  ASSERT_TRUE(p.has_semaphore());
  ASSERT_TRUE(p.args_error.empty()) << p.args_error;
  // The offsets against /proc/self/maps; the site's runtime address from the
  // load bias and the link-time pc.
  auto so = maps_offset(const_cast<unsigned short*>(f.sema));
  ASSERT_TRUE(so.has_value());
  EXPECT_EQ(so->path, p.path);
  ASSERT_EQ(p.semaphore_offset, so->offset);
  const std::uint64_t site = load_bias(reinterpret_cast<const void*>(f.fn)) + p.pc;
  auto sm = maps_offset(reinterpret_cast<const void*>(site));
  ASSERT_TRUE(sm.has_value());
  EXPECT_EQ(sm->offset, p.offset);

  Recorder c1(&p.args), c2(&p.args);
  c1.expected_rip = site;
  c2.expected_rip = site;
  const std::int64_t side0 = *f.side_effects, sum0 = *f.side_sum;
  std::int64_t want_c1 = 0, want_c2 = 0, want_side_sum = 0;

  // 0: nobody attached.
  EXPECT_EQ(*f.sema, 0);
  run100(f, 1000, 0);
  EXPECT_EQ(*f.side_effects - side0, 0);

  // 1: c1.
  uprobe::Uprobe* up1 = uprobe::register_uprobe(p.path, p.offset, p.semaphore_offset, c1);
  ASSERT_NE(up1, nullptr);
  EXPECT_EQ(*f.sema, 1) << "after attaching the first consumer";
  auto info = uprobe::probe_info(up1);
  EXPECT_EQ(info.sites, 1u);
  EXPECT_EQ(info.consumers, 1u);
  if (f.nop5) {
    EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << info.why_not_optimized;
  } else {
    EXPECT_NE(info.mode, uprobe::ProbeMode::pending);
  }
  std::int64_t s = run100(f, 2000, 1);
  want_c1 += s;
  want_side_sum += s;
  EXPECT_EQ(c1.hits.load(), 100u);
  EXPECT_EQ(c1.arg_sum.load(), want_c1);

  // 2: c1 + c2.
  uprobe::Uprobe* up2 = uprobe::register_uprobe(p.path, p.offset, p.semaphore_offset, c2);
  EXPECT_EQ(up2, up1) << "one probe per (file, offset)";
  EXPECT_EQ(*f.sema, 2) << "after attaching the second consumer";
  info = uprobe::probe_info(up1);
  EXPECT_EQ(info.consumers, 2u);
  if (f.nop5) {
    EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << info.why_not_optimized;
  }
  s = run100(f, 3000, 1);
  want_c1 += s;
  want_c2 += s;
  want_side_sum += s;
  EXPECT_EQ(c1.hits.load(), 200u);
  EXPECT_EQ(c2.hits.load(), 100u);

  // 1: c2 only.
  uprobe::unregister_uprobe(up1, c1);
  EXPECT_EQ(*f.sema, 1) << "after detaching the first consumer";
  info = uprobe::probe_info(up1);
  EXPECT_EQ(info.consumers, 1u);
  if (f.nop5) {
    EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << info.why_not_optimized;
  }
  s = run100(f, 4000, 1);
  want_c2 += s;
  want_side_sum += s;
  EXPECT_EQ(c1.hits.load(), 200u) << "detached consumer called";
  EXPECT_EQ(c2.hits.load(), 200u);

  // 0: nobody.
  uprobe::unregister_uprobe(up1, c2);
  EXPECT_EQ(*f.sema, 0) << "after detaching the second consumer";
  run100(f, 5000, 0);

  EXPECT_EQ(c1.hits.load(), 200u);
  EXPECT_EQ(c2.hits.load(), 200u);
  EXPECT_EQ(c1.arg_sum.load(), want_c1);
  EXPECT_EQ(c2.arg_sum.load(), want_c2);
  EXPECT_EQ(c1.bad_rip.load(), 0u);
  EXPECT_EQ(c2.bad_rip.load(), 0u);
  // Side effects exactly while the count was non-zero: 3 x 100 calls.
  EXPECT_EQ(*f.side_effects - side0, 300);
  EXPECT_EQ(*f.side_sum - sum0, want_side_sum);
  // The site's bytes are the file's again.
  auto fb = file_bytes(p.path, p.offset, f.nop5 ? 5 : 1);
  EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(site), fb.data(), fb.size()), 0);
}

#ifdef C07_HAVE_SDT_H
TEST(C07_Semaphore, SdtHCountsPerConsumer) {
  semaphore_sequence({"c07sdt", &c07sdt_guarded_semaphore, &c07sdt_side_effects, &c07sdt_side_sum,
                      c07sdt_guarded, false});
}
#endif

TEST(C07_Semaphore, UsdtProbeHCountsPerConsumerOptimized) {
  semaphore_sequence({"c07ours", &c07ours_guarded_semaphore, &c07ours_side_effects, &c07ours_side_sum,
                      c07ours_guarded, true});
}

// All consumers of one probe name the same ref_ctr_offset; a refused request
// changes nothing (count, consumers).
TEST(C07_Semaphore, DifferentRefCtrOffsetIsAConflict) {
  auto v = uprobe::usdt::find(self_exe(), "c07ours", "guarded");
  ASSERT_EQ(v.size(), 1u);
  const Probe& p = v[0];
  volatile unsigned short* sema = &c07ours_guarded_semaphore;
  Recorder c1, c2;
  EXPECT_EQ(*sema, 0);
  uprobe::Uprobe* up = uprobe::register_uprobe(p.path, p.offset, p.semaphore_offset, c1);
  EXPECT_EQ(*sema, 1);
  for (std::uint64_t other : {p.semaphore_offset + 2, std::uint64_t{0}}) {
    SCOPED_TRACE("ref_ctr_offset " + hex(other));
    const std::string why = "the probe's USDT semaphore (ref_ctr_offset) is " + hex(p.semaphore_offset) + ", not " +
                            hex(other);
    if (other == 0)
      expect_error([&] { uprobe::register_uprobe(p.path, p.offset, c2); }, Errc::ref_ctr_conflict, {p.path, why});
    else
      expect_error([&] { uprobe::register_uprobe(p.path, p.offset, other, c2); }, Errc::ref_ctr_conflict,
                   {p.path, why});
    EXPECT_EQ(*sema, 1) << "a refused registration changed the count";
    EXPECT_EQ(uprobe::probe_info(up).consumers, 1u);
    expect_error([&] { uprobe::unregister_uprobe(up, c2); }, Errc::conflict, {});
  }
  EXPECT_EQ(c07ours_guarded(1), 1);
  uprobe::unregister_uprobe(up, c1);
  EXPECT_EQ(*sema, 0);
  EXPECT_EQ(c1.hits.load(), 1u);
  EXPECT_EQ(c2.hits.load(), 0u);

  // The other order: first without a semaphore, then with one.
  up = uprobe::register_uprobe(p.path, p.offset, c1);
  EXPECT_EQ(*sema, 0);
  expect_error([&] { uprobe::register_uprobe(p.path, p.offset, p.semaphore_offset, c2); }, Errc::ref_ctr_conflict,
               {p.path, "the probe's USDT semaphore (ref_ctr_offset) is 0x0, not " + hex(p.semaphore_offset)});
  EXPECT_EQ(*sema, 0) << "a refused registration changed the count";
  EXPECT_EQ(uprobe::probe_info(up).consumers, 1u);
  uprobe::unregister_uprobe(up, c1);
  EXPECT_EQ(*sema, 0);
}

// uprobe::Attachment with a semaphore: counted per attached consumer, back to
// 0 when they detach; another semaphore on the same probe is refused with its
// own code and message, moving no count.
TEST(C07_Semaphore, AttachmentWithRefCtrOffset) {
  auto v = uprobe::usdt::find(self_exe(), "c07ours", "guarded");
  ASSERT_EQ(v.size(), 1u);
  const Probe& p = v[0];
  volatile unsigned short* sema = &c07ours_guarded_semaphore;
  Recorder c1, c2, c3;
  ASSERT_EQ(*sema, 0);
  {
    uprobe::Attachment a(p.path, p.offset, p.semaphore_offset, c1);
    EXPECT_EQ(*sema, 1);
    uprobe::Attachment b(p.path, p.offset, p.semaphore_offset, c2);
    EXPECT_EQ(*sema, 2);
    EXPECT_EQ(a.probe(), b.probe());
    EXPECT_EQ(b.consumer(), &c2);
    try {
      uprobe::Attachment c(p.path, p.offset, p.semaphore_offset + 2, c3);
      ADD_FAILURE() << "another semaphore was accepted";
    } catch (const uprobe::Error& e) {
      EXPECT_EQ(e.code(), Errc::ref_ctr_conflict);
      EXPECT_EQ(std::string(e.what()), "libuprobe: cannot probe " + p.path + " at offset " + hex(p.offset) +
                                           ": the probe's USDT semaphore (ref_ctr_offset) is " +
                                           hex(p.semaphore_offset) + ", not " + hex(p.semaphore_offset + 2));
      EXPECT_EQ(e.path(), p.path);
      EXPECT_EQ(e.offset(), p.offset);
    }
    EXPECT_EQ(*sema, 2) << "a refused attachment moved the count";
    EXPECT_EQ(uprobe::probe_info(a.probe()).consumers, 2u);
    EXPECT_EQ(c07ours_guarded(5), 1) << "the probe's is-enabled check reads the semaphore";
    EXPECT_EQ(c1.hits.load(), 1u);
    EXPECT_EQ(c2.hits.load(), 1u);
    uprobe::Attachment moved(std::move(b));
    EXPECT_EQ(b.probe(), nullptr);
    EXPECT_EQ(*sema, 2);
    moved.detach();
    EXPECT_EQ(*sema, 1);
  }
  EXPECT_EQ(*sema, 0);
  EXPECT_EQ(c07ours_guarded(6), 0);
  EXPECT_EQ(c1.hits.load(), 1u);
  EXPECT_EQ(c2.hits.load(), 1u);
  EXPECT_EQ(c3.hits.load(), 0u);
}

// A semaphore in a library that is mapped only after registration: counted
// when dlopen() maps it, and again (1, not 0 or 2) in the fresh mapping of a
// reload.
TEST(C07_Semaphore, DlopenedLibraryGetsItsCountWhenMapped) {
  const std::string lib = canonical(C07_LIB_PATH);
  ASSERT_TRUE(mappings_of(lib).empty()) << "the fixture library is already loaded";
  struct Case {
    const char* provider = nullptr;
    const char* fn = nullptr;
    const char* sema_fn = nullptr;
    Probe p;
    Recorder rec;
    uprobe::Uprobe* up = nullptr;
  };
  std::vector<std::unique_ptr<Case>> cases;
  auto add = [&](const char* provider, const char* fn, const char* sema_fn) {
    cases.push_back(std::make_unique<Case>());
    cases.back()->provider = provider;
    cases.back()->fn = fn;
    cases.back()->sema_fn = sema_fn;
  };
  add("c07libours", "c07lib_ours", "c07lib_ours_sema");
#ifdef C07_HAVE_SDT_H
  add("c07libsdt", "c07lib_sdt", "c07lib_sdt_sema");
#endif
  for (auto& c : cases) {
    auto v = uprobe::usdt::find(lib, c->provider, "guarded");
    ASSERT_EQ(v.size(), 1u);
    c->p = v[0];
    ASSERT_TRUE(c->p.has_semaphore());
    c->rec.args = &c->p.args;
    c->up = uprobe::register_uprobe(c->p.path, c->p.offset, c->p.semaphore_offset, c->rec);
    auto info = uprobe::probe_info(c->up);
    EXPECT_EQ(info.mode, uprobe::ProbeMode::pending) << c->provider;
    EXPECT_EQ(info.sites, 0u) << c->provider;
  }

  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("load #" + std::to_string(round + 1));
    void* h = dlopen(C07_LIB_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr) << dlerror();
    auto* side = sym<volatile std::int64_t*>(h, "c07lib_side_effects");
    ASSERT_NE(side, nullptr);
    for (auto& c : cases) {
      SCOPED_TRACE(c->provider);
      auto fn = sym<int (*)(std::int64_t)>(h, c->fn);
      auto sema_fn = sym<volatile unsigned short* (*)()>(h, c->sema_fn);
      ASSERT_TRUE(fn && sema_fn);
      volatile unsigned short* sema = sema_fn();
      auto so = maps_offset(const_cast<unsigned short*>(sema));
      ASSERT_TRUE(so.has_value());
      EXPECT_EQ(so->path, lib);
      EXPECT_EQ(so->offset, c->p.semaphore_offset);
      EXPECT_EQ(*sema, 1) << "semaphore of the fresh mapping";
      auto info = uprobe::probe_info(c->up);
      EXPECT_EQ(info.sites, 1u);
      EXPECT_NE(info.mode, uprobe::ProbeMode::pending);
      const std::uint64_t site = load_bias(reinterpret_cast<const void*>(fn)) + c->p.pc;
      c->rec.expected_rip = site;
      const std::int64_t side0 = *side;
      const std::uint64_t hits0 = c->rec.hits.load();
      int taken = 0;
      for (int i = 0; i < 100; ++i) taken += fn(i);
      EXPECT_EQ(taken, 100) << "guarded branch not taken although the probe is attached";
      EXPECT_EQ(*side - side0, taken);
      EXPECT_EQ(c->rec.hits.load() - hits0, 100u);
      EXPECT_EQ(c->rec.bad_rip.load(), 0u);
    }
    if (round == 1) {
      // Detach while mapped: count back to 0, the probe silent.
      for (auto& c : cases) {
        SCOPED_TRACE(c->provider);
        volatile unsigned short* sema = sym<volatile unsigned short* (*)()>(h, c->sema_fn)();
        uprobe::unregister_uprobe(c->up, c->rec);
        c->up = nullptr;
        EXPECT_EQ(*sema, 0);
        auto fn = sym<int (*)(std::int64_t)>(h, c->fn);
        const std::uint64_t hits0 = c->rec.hits.load();
        EXPECT_EQ(fn(7), 0);
        EXPECT_EQ(c->rec.hits.load(), hits0);
      }
    }
    ASSERT_EQ(dlclose(h), 0) << dlerror();
    EXPECT_TRUE(mappings_of(lib).empty()) << "still mapped after dlclose:\n" << describe(mappings_of(lib));
    for (auto& c : cases)
      if (c->up) {
        auto info = uprobe::probe_info(c->up);
        EXPECT_EQ(info.mode, uprobe::ProbeMode::pending) << c->provider;
        EXPECT_EQ(info.sites, 0u) << c->provider;
      }
  }
  for (auto& c : cases) EXPECT_EQ(c->rec.hits.load(), 200u) << c->provider;
}

// ------------------------------------------------------------ C-11 ----

TEST(C11_PendingLibrary, LoadUnloadReuseReload) {
  const std::string lib = canonical(C11_FOO_PATH);
  ASSERT_TRUE(mappings_of(lib).empty()) << "libfoo is already loaded:\n" << describe(mappings_of(lib));

  // Resolved from the name before it is loaded (the search path), and by path.
  auto locs = uprobe::resolve_location("libfoo.so:foo", uprobe::LibrarySearch::search_path);
  ASSERT_EQ(locs.size(), 1u);
  EXPECT_EQ(locs[0].path, lib);
  auto by_path = uprobe::resolve_location(lib + ":foo");
  ASSERT_EQ(by_path.size(), 1u);
  EXPECT_EQ(by_path[0].offset, locs[0].offset);
  const uprobe::Location loc = locs[0];
  const uprobe::Symbol fsym = uprobe::find_symbol(lib, "foo");
  ASSERT_GT(fsym.size, 0u);
  const std::vector<std::uint8_t> orig = file_bytes(lib, loc.offset, fsym.size);
  ASSERT_TRUE(mappings_of(lib).empty()) << "resolving mapped the library:\n" << describe(mappings_of(lib));

  Recorder rec;
  uprobe::Uprobe* up = uprobe::register_uprobe(loc.path, loc.offset, rec);
  ASSERT_NE(up, nullptr);
  auto info = uprobe::probe_info(up);
  EXPECT_EQ(info.mode, uprobe::ProbeMode::pending);
  EXPECT_EQ(info.sites, 0u);
  EXPECT_EQ(info.consumers, 1u);

  // Load #1: 10 hits at foo's address.
  void* h = dlopen(C11_FOO_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  auto foo1 = sym<int (*)(int)>(h, "foo");
  const void* foo1_p = reinterpret_cast<const void*>(foo1);
  ASSERT_NE(foo1, nullptr);
  const auto a1 = reinterpret_cast<std::uintptr_t>(foo1);
  auto mo = maps_offset(foo1_p);
  ASSERT_TRUE(mo.has_value());
  EXPECT_EQ(mo->path, lib);
  EXPECT_EQ(mo->offset, loc.offset);
  info = uprobe::probe_info(up);
  EXPECT_EQ(info.sites, 1u);
  EXPECT_NE(info.mode, uprobe::ProbeMode::pending);
  EXPECT_NE(std::memcmp(foo1_p, orig.data(), std::min<std::size_t>(orig.size(), 5)), 0) << "no probe written at foo";
  auto text1 = mapping_at(a1);
  ASSERT_TRUE(text1.has_value());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(foo1(i), i * 3 + 1);
  ASSERT_EQ(rec.hits.load(), 10u);
  for (unsigned i = 0; i < 10; ++i) EXPECT_EQ(rec.rips[i], a1) << "hit #" << i;

  // Unload: really unmapped, the probe pending again.
  ASSERT_EQ(dlclose(h), 0) << dlerror();
  ASSERT_TRUE(mappings_of(lib).empty()) << "still mapped after dlclose:\n" << describe(mappings_of(lib));
  info = uprobe::probe_info(up);
  EXPECT_EQ(info.mode, uprobe::ProbeMode::pending);
  EXPECT_EQ(info.sites, 0u);

  // Something else at the old text: anonymous RW memory holding a pattern,
  // with foo's original bytes at foo's old address (bytes a stale site would
  // accept as "ours").
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::uintptr_t lo = text1->start, len = text1->end - text1->start;
  void* fixed = ::mmap(reinterpret_cast<void*>(lo), len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (fixed == MAP_FAILED || fixed != reinterpret_cast<void*>(lo)) {
    // Not possible here: use a mapping elsewhere (still checks that nothing writes).
    ADD_FAILURE() << "MAP_FIXED_NOREPLACE at the old text " << hex(lo) << " failed: " << std::strerror(errno);
    if (fixed != MAP_FAILED) ::munmap(fixed, len);
    len = page;
    fixed = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(fixed, MAP_FAILED);
    lo = reinterpret_cast<std::uintptr_t>(fixed);
  }
  std::vector<std::uint8_t> pattern(len);
  for (std::size_t i = 0; i < len; ++i) pattern[i] = static_cast<std::uint8_t>(0xA5 ^ (i * 7));
  if (a1 >= lo && a1 + orig.size() <= lo + len) std::memcpy(&pattern[a1 - lo], orig.data(), orig.size());
  std::memcpy(fixed, pattern.data(), len);
  auto intact = [&](const char* after) {
    EXPECT_EQ(std::memcmp(fixed, pattern.data(), len), 0) << "the reused memory changed after " << after;
    auto m = mapping_at(lo);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->perms, "rw-p") << "protection of the reused memory changed after " << after;
  };
  intact("mmap");
  // Everything that makes the runtime look at the address space again.
  void* other = dlopen(USDTFIX_LAZY_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(other, nullptr) << dlerror();
  intact("dlopen of another library");
  ASSERT_EQ(dlclose(other), 0);
  intact("dlclose of another library");
  Recorder rec2;
  uprobe::Uprobe* up2 = uprobe::register_uprobe(loc.path, loc.offset, rec2);
  EXPECT_EQ(up2, up);
  intact("registering a second consumer");
  info = uprobe::probe_info(up);
  EXPECT_EQ(info.mode, uprobe::ProbeMode::pending);
  EXPECT_EQ(info.sites, 0u);
  EXPECT_EQ(info.consumers, 2u);
  uprobe::unregister_uprobe(up, rec2);
  intact("unregistering the second consumer");
  ASSERT_EQ(::munmap(fixed, len), 0);

  // Load #2: 10 more hits at foo's (possibly new) address.
  h = dlopen(C11_FOO_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  auto foo2 = sym<int (*)(int)>(h, "foo");
  const void* foo2_p = reinterpret_cast<const void*>(foo2);
  ASSERT_NE(foo2, nullptr);
  const auto a2 = reinterpret_cast<std::uintptr_t>(foo2);
  std::cout << "[ info     ] foo at " << hex(a1) << " then " << hex(a2) << "\n";
  mo = maps_offset(foo2_p);
  ASSERT_TRUE(mo.has_value());
  EXPECT_EQ(mo->offset, loc.offset);
  info = uprobe::probe_info(up);
  EXPECT_EQ(info.sites, 1u);
  EXPECT_NE(info.mode, uprobe::ProbeMode::pending);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(foo2(i + 100), (i + 100) * 3 + 1);
  ASSERT_EQ(rec.hits.load(), 20u);
  for (unsigned i = 10; i < 20; ++i) EXPECT_EQ(rec.rips[i], a2) << "hit #" << i;
  EXPECT_EQ(rec2.hits.load(), 0u);

  // Detach: the original bytes are back, in foo and in the whole text mapping.
  EXPECT_NO_THROW(uprobe::unregister_uprobe(up, rec));
  EXPECT_EQ(std::memcmp(foo2_p, orig.data(), orig.size()), 0) << "foo's bytes differ from the file after detach";
  auto text2 = mapping_at(a2);
  ASSERT_TRUE(text2.has_value());
  EXPECT_EQ(text2->perms, "r-xp");
  struct stat st;
  ASSERT_EQ(::stat(lib.c_str(), &st), 0);
  std::uint64_t n = std::min<std::uint64_t>(text2->end - text2->start,
                                            static_cast<std::uint64_t>(st.st_size) - text2->pgoff);
  auto fb = file_bytes(lib, text2->pgoff, n);
  EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(text2->start), fb.data(), n), 0)
      << "the text mapping differs from the file after detach";
  EXPECT_EQ(foo2(5), 16);
  EXPECT_EQ(rec.hits.load(), 20u);
  ASSERT_EQ(dlclose(h), 0) << dlerror();
  EXPECT_TRUE(mappings_of(lib).empty()) << "still mapped after the last dlclose:\n" << describe(mappings_of(lib));
}

}  // namespace
