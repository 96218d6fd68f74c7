// SPDX-License-Identifier: MIT
// Group 7: consumers (several on one probe, filter, Action::remove,
// recursion), unregister restoring the file's bytes, and every refusal of the
// registration API with its error code, a what() naming path and offset, and
// nothing changed in the process.
// Group 8: probes on libc (labs) and on the test shared library.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <cerrno>
#include <string>
#include <thread>
#include <tuple>

#include "common.hpp"
#include "fixtures.hpp"
#include "testlib/testlib.h"

using namespace coretest;
using uprobe::Action;
using uprobe::Errc;
using uprobe::Regs;

namespace {

pid_t this_tid() { return static_cast<pid_t>(::gettid()); }

std::uint64_t file_size(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<std::uint64_t>(st.st_size);
}

// ------------------------------------------------------- consumers ----

TEST(Consumers, ThreeOnOneProbeThenUnregisterOne) {
  const std::string exe = self_exe();
  uprobe::FileOffset fo = uprobe::resolve_address(fx_addr(fx_nop5));
  Counter c1, c2, c3;
  uprobe::Uprobe* p1 = uprobe::register_uprobe(fx_addr(fx_nop5), c1);
  uprobe::Uprobe* p2 = uprobe::register_uprobe(fo.path, fo.offset, c2);
  uprobe::Uprobe* p3 = uprobe::register_uprobe("/proc/self/exe", fo.offset, c3);
  EXPECT_EQ(p1, p2) << "same (dev, ino, offset) must be the same probe";
  EXPECT_EQ(p1, p3) << "same (dev, ino, offset) through /proc/self/exe must be the same probe";
  EXPECT_EQ(uprobe::probe_info(p1).consumers, 3u);
  EXPECT_EQ(uprobe::probe_info(p1).sites, 1u);
  for (std::uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(fx_nop5(i, 0), i + 2);
  EXPECT_EQ(c1.hits.load(), 1000u);
  EXPECT_EQ(c2.hits.load(), 1000u);
  EXPECT_EQ(c3.hits.load(), 1000u);
  uprobe::unregister_uprobe(p2, c2);
  EXPECT_EQ(uprobe::probe_info(p1).consumers, 2u);
  EXPECT_EQ(uprobe::probe_info(p1).mode, uprobe::ProbeMode::optimized_nop5);
  EXPECT_EQ(*static_cast<const std::uint8_t*>(fx_addr(fx_nop5)), 0xE9);
  for (std::uint64_t i = 0; i < 500; ++i) ASSERT_EQ(fx_nop5(i, 0), i + 2);
  EXPECT_EQ(c1.hits.load(), 1500u);
  EXPECT_EQ(c2.hits.load(), 1000u);
  EXPECT_EQ(c3.hits.load(), 1500u);
  uprobe::unregister_uprobe(p1, c1);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(fx_nop5(i, 0), i + 2);
  EXPECT_EQ(c1.hits.load(), 1500u);
  EXPECT_EQ(c3.hits.load(), 1600u);
  uprobe::unregister_uprobe(p3, c3);
  EXPECT_EQ(hex_bytes(mem_bytes(fx_addr(fx_nop5), 10)), hex_bytes(file_bytes(exe, fo.offset, 10)));
}

struct FilterConsumer : uprobe::Consumer {
  pid_t only = 0;
  std::atomic<std::uint64_t> filter_calls{0}, hits{0}, wrong_tid{0};
  bool filter(pid_t tid) override {
    filter_calls.fetch_add(1);
    return tid == only;
  }
  Action handler(Regs&) override {
    hits.fetch_add(1);
    if (this_tid() != only) wrong_tid.fetch_add(1);
    return Action::keep;
  }
};

TEST(Consumers, FilterAdmitsOnlyOneThread) {
  FilterConsumer f;
  f.only = this_tid();
  Counter all;
  uprobe::Attachment af(fx_addr(fx_nop9), f);
  uprobe::Attachment aa(fx_addr(fx_nop9), all);
  std::atomic<int> other_wrong{0};
  std::thread t([&] {
    for (std::uint64_t i = 0; i < 700; ++i) other_wrong += fx_nop9(i, 0) != i + 3;
  });
  int wrong = 0;
  for (std::uint64_t i = 0; i < 300; ++i) wrong += fx_nop9(i, 0) != i + 3;
  t.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(other_wrong.load(), 0);
  EXPECT_EQ(f.hits.load(), 300u) << "filtered consumer's handler must run for its thread only";
  EXPECT_EQ(f.wrong_tid.load(), 0u);
  EXPECT_EQ(all.hits.load(), 1000u);
  EXPECT_EQ(f.filter_calls.load(), 1000u) << "filter() is documented to be called on every hit";
}

struct RemoveAfter : uprobe::Consumer {
  std::uint64_t after;  // return remove on this hit number
  std::atomic<std::uint64_t> hits{0};
  explicit RemoveAfter(std::uint64_t n) : after(n) {}
  Action handler(Regs&) override {
    std::uint64_t n = hits.fetch_add(1) + 1;
    return n >= after ? Action::remove : Action::keep;
  }
};

TEST(Consumers, ActionRemoveStopsThatConsumerOnly) {
  RemoveAfter r(5);
  Counter k;
  uprobe::Attachment ar(fx_addr(fx_nop1), r);
  uprobe::Attachment ak(fx_addr(fx_nop1), k);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(fx_nop1(i, 0), i + 1);
  EXPECT_EQ(r.hits.load(), 5u) << "a consumer that said remove was called again";
  EXPECT_EQ(k.hits.load(), 100u);
  EXPECT_EQ(*static_cast<const std::uint8_t*>(fx_addr(fx_nop1)), 0xCC) << "one consumer still wants hits";
  uprobe::ProbeInfo info = uprobe::probe_info(ar.probe());
  EXPECT_EQ(info.consumers, 2u) << "the registration stays until unregister";
  EXPECT_EQ(info.sites, 1u);
}

TEST(Consumers, ActionRemoveByAllRestoresTheOriginalBytes) {
  const std::string exe = self_exe();
  auto sym = elf_symbol(exe, "fx_push_rbp");
  ASSERT_TRUE(sym);
  const auto disk = file_bytes(exe, sym->file_offset, sym->size);
  RemoveAfter r1(3), r2(3);
  uprobe::Attachment a1(fx_addr(fx_push_rbp), r1);
  uprobe::Attachment a2(fx_addr(fx_push_rbp), r2);
  const uprobe::Stats s0 = uprobe::stats();
  for (std::uint64_t i = 0; i < 3; ++i) ASSERT_EQ(fx_push_rbp(i, 0), 3 * i + 7);
  EXPECT_EQ(r1.hits.load(), 3u);
  EXPECT_EQ(r2.hits.load(), 3u);
  // Removal must take the site out of the text; allow a deferred removal a moment.
  bool immediate = mem_bytes(fx_addr(fx_push_rbp), sym->size) == disk;
  for (int w = 0; w < 200 && mem_bytes(fx_addr(fx_push_rbp), sym->size) != disk; ++w) ::usleep(10000);
  EXPECT_EQ(hex_bytes(mem_bytes(fx_addr(fx_push_rbp), sym->size)), hex_bytes(disk))
      << "all consumers said remove: the original bytes must be back";
  if (!immediate) std::printf("[ info ] site restored only after a delay\n");
  EXPECT_EQ(uprobe::probe_info(a1.probe()).sites, 0u);
  EXPECT_EQ(uprobe::probe_info(a1.probe()).consumers, 2u);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(fx_push_rbp(i, 0), 3 * i + 7);
  EXPECT_EQ(r1.hits.load(), 3u);
  EXPECT_EQ(r2.hits.load(), 3u);
  EXPECT_EQ(stats_delta(s0, uprobe::stats()).hits, 3u);
  a1.detach();
  a2.detach();
  // Registered anew: called again.
  RemoveAfter again(1000000);
  {
    uprobe::Attachment a3(fx_addr(fx_push_rbp), again);
    for (std::uint64_t i = 0; i < 10; ++i) ASSERT_EQ(fx_push_rbp(i, 0), 3 * i + 7);
    EXPECT_EQ(again.hits.load(), 10u);
  }
  EXPECT_EQ(hex_bytes(mem_bytes(fx_addr(fx_push_rbp), sym->size)), hex_bytes(disk));
}

TEST(Consumers, SingleConsumerRemoveThenReRegister) {
  RemoveAfter r(1);
  uprobe::Uprobe* p = uprobe::register_uprobe(fx_addr(fx_jmp32), r);
  for (std::uint64_t i = 0; i < 50; ++i) ASSERT_EQ(fx_jmp32(i, 0), i + 8);
  EXPECT_EQ(r.hits.load(), 1u);
  uprobe::unregister_uprobe(p, r);
  RemoveAfter r2(1000000);
  uprobe::Uprobe* q = uprobe::register_uprobe(fx_addr(fx_jmp32), r2);
  for (std::uint64_t i = 0; i < 50; ++i) ASSERT_EQ(fx_jmp32(i, 0), i + 8);
  EXPECT_EQ(r2.hits.load(), 50u);
  uprobe::unregister_uprobe(q, r2);
}

struct Nested : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0}, wrong{0};
  Action handler(Regs&) override {
    hits.fetch_add(1);
    // fx_nop1 is probed too: this hit must be a counted miss, not a handler call.
    if (fx_nop1(41, 0) != 42) wrong.fetch_add(1);
    return Action::keep;
  }
};

TEST(Consumers, ProbeHitInsideHandlerIsACountedMiss) {
  Nested outer;
  Counter inner;
  uprobe::Attachment ao(fx_addr(fx_nop2), outer);
  uprobe::Attachment ai(fx_addr(fx_nop1), inner);
  const uprobe::Stats s0 = uprobe::stats();
  std::optional<testsupport::RecursionMissCount> missed(std::in_place);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(fx_nop2(i, 0), i + 6);
  uprobe::Stats d = stats_delta(s0, uprobe::stats());
  EXPECT_EQ(outer.hits.load(), 100u);
  EXPECT_EQ(outer.wrong.load(), 0u);
  EXPECT_EQ(inner.hits.load(), 0u) << "a probe hit inside a handler must not run consumers";
  EXPECT_EQ(d.recursion_misses, 100u) << stats_str(d);
  // The RecursionMissHook was told of each (the int3 path), with the probe missed.
  EXPECT_EQ(missed->calls(), 100u);
  EXPECT_EQ(missed->last_probe(), ai.probe());
  missed.reset();
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_EQ(fx_nop1(i, 0), i + 1);
  EXPECT_EQ(inner.hits.load(), 10u);
}

// ------------------------------------------------ restore & refusals ----

TEST(Unregister, RestoresTheExactFileBytes) {
  struct F {
    const char* sym;
    const void* fn;
    std::uint64_t site;
    fx_fn call;
  };
  const F fs[] = {{"fx_nop1", fx_addr(fx_nop1), fx_nop1_site, fx_nop1},
                  {"fx_push_r12", fx_addr(fx_push_r12), fx_push_r12_site, fx_push_r12},
                  {"fx_jcc8_l", fx_addr(fx_jcc8_l), fx_jcc8_l_site, fx_jcc8_l},
                  {"fx_jcc32_g", fx_addr(fx_jcc32_g), fx_jcc32_g_site, fx_jcc32_g},
                  {"fx_rip_load", fx_addr(fx_rip_load), fx_rip_load_site, fx_rip_load},
                  {"fx_movl_imm_rip", fx_addr(fx_movl_imm_rip), fx_movl_imm_rip_site, fx_movl_imm_rip},
                  {"fx_xadd", fx_addr(fx_xadd), fx_xadd_site, fx_xadd}};
  for (const F& f : fs) {
    SCOPED_TRACE(f.sym);
    const void* site = fx_at(f.fn, f.site);
    uprobe::FileOffset fo = uprobe::resolve_address(f.fn);
    auto sym = elf_symbol(self_exe(), f.sym);
    ASSERT_TRUE(sym);
    const auto disk = file_bytes(fo.path, fo.offset, sym->size);
    ASSERT_EQ(hex_bytes(mem_bytes(f.fn, sym->size)), hex_bytes(disk));
    auto map_before = mapping_of(site);
    ASSERT_TRUE(map_before);
    Counter c;
    uprobe::Uprobe* p = uprobe::register_uprobe(site, c);
    auto map_during = mapping_of(site);
    ASSERT_TRUE(map_during);
    EXPECT_FALSE(map_during->perms.find('w') != std::string::npos && map_during->perms.find('x') != std::string::npos)
        << "text mapping is writable and executable while attached: " << map_during->perms;
    for (std::uint64_t i = 0; i < 20; ++i) f.call(i, i + 1);
    EXPECT_EQ(c.hits.load(), 20u);
    uprobe::unregister_uprobe(p, c);
    EXPECT_EQ(hex_bytes(mem_bytes(f.fn, sym->size)), hex_bytes(disk));
    auto map_after = mapping_of(site);
    ASSERT_TRUE(map_after);
    EXPECT_EQ(map_after->perms, map_before->perms);
  }
}

/// Runs a request that must be refused and checks that every executable
/// mapping is byte-for-byte and permission-for-permission unchanged.
template <typename F>
std::string refused(F fn, Errc code, const std::string& path, std::uint64_t off, const char* what_for) {
  ExecSnapshot snap = snapshot_exec();
  std::string w = expect_error(fn, code, path, off, what_for);
  EXPECT_EQ(diff_exec(snap), "") << what_for << ": the process's code changed on a refused request";
  return w;
}

/// Warms the library up (first registration may initialise it), so that
/// "nothing changed" compares like with like.
void warm_up() {
  Counter c;
  uprobe::Attachment a(fx_addr(fx_nop2), c);
  EXPECT_EQ(fx_nop2(1, 0), 7u);
}

TEST(Refusals, SameConsumerTwiceIsAConflict) {
  Counter c;
  uprobe::FileOffset fo = uprobe::resolve_address(fx_addr(fx_nop1));
  uprobe::Uprobe* p = uprobe::register_uprobe(fx_addr(fx_nop1), c);
  const auto during = mem_bytes(fx_addr(fx_nop1), 6);
  refused([&] { uprobe::register_uprobe(fx_addr(fx_nop1), c); }, Errc::conflict, fo.path, fo.offset,
          "same consumer, same address");
  refused([&] { uprobe::register_uprobe(fo.path, fo.offset, c); }, Errc::conflict, fo.path, fo.offset,
          "same consumer, same (path, offset)");
  EXPECT_EQ(hex_bytes(mem_bytes(fx_addr(fx_nop1), 6)), hex_bytes(during));
  EXPECT_EQ(uprobe::probe_info(p).consumers, 1u);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_EQ(fx_nop1(i, 0), i + 1);
  EXPECT_EQ(c.hits.load(), 100u) << "exactly one call per hit after the refused duplicate";
  Counter other;
  refused([&] { uprobe::unregister_uprobe(p, other); }, Errc::conflict, fo.path, fo.offset,
          "unregister a consumer that is not registered");
  uprobe::unregister_uprobe(p, c);
}

TEST(Refusals, MissingFile) {
  warm_up();
  Counter c;
  const std::string path = "/nonexistent/libuprobe-core-test/none.so";
  refused([&] { uprobe::register_uprobe(path, 0x40, c); }, Errc::file_not_found, path, 0x40, "missing file");
  try {
    uprobe::register_uprobe(path, 0x40, c);
    ADD_FAILURE() << "a missing file was accepted";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(e.sys_errno(), ENOENT);
  }
  // The errno says why a path cannot be probed: ENOTDIR, EISDIR; 0 when no
  // system call failed.
  for (const auto& [p, code, err] : {std::tuple<std::string, Errc, int>{"/proc/self/exe/x", Errc::file_not_found, ENOTDIR},
                                     {"/tmp", Errc::not_executable, EISDIR},
                                     {"/dev/null", Errc::not_executable, 0}}) {
    try {
      uprobe::register_uprobe(p, 0, c);
      ADD_FAILURE() << p << " was accepted";
    } catch (const uprobe::Error& e) {
      EXPECT_EQ(e.code(), code) << p << ": " << e.what();
      EXPECT_EQ(e.sys_errno(), err) << p << ": " << e.what();
    }
  }
}

TEST(Refusals, OffsetPastEndOfFile) {
  warm_up();
  Counter c;
  const std::string exe = self_exe();
  const std::uint64_t size = file_size(exe);
  for (std::uint64_t off : {size, size + 1, size + 0x1000, std::uint64_t(1) << 40}) {
    refused([&] { uprobe::register_uprobe(exe, off, c); }, Errc::bad_offset, exe, off, "offset past EOF");
  }
}

TEST(Refusals, OffsetOutsideExecutableSegments) {
  warm_up();
  Counter c;
  const std::string exe = self_exe();
  auto ro = elf_symbol(exe, "fx_rodata_word");
  auto rw = elf_symbol(exe, "fx_var");
  ASSERT_TRUE(ro && rw);
  refused([&] { uprobe::register_uprobe(exe, ro->file_offset, c); }, Errc::not_executable, exe, ro->file_offset,
          ".rodata by (path, offset)");
  refused([&] { uprobe::register_uprobe(exe, rw->file_offset, c); }, Errc::not_executable, exe, rw->file_offset,
          ".data by (path, offset)");
  uprobe::FileOffset fro = uprobe::resolve_address(&fx_rodata_word);
  EXPECT_EQ(fro.offset, ro->file_offset);
  refused([&] { uprobe::register_uprobe(&fx_rodata_word, c); }, Errc::not_executable, fro.path, fro.offset,
          ".rodata by address");
  uprobe::FileOffset frw = uprobe::resolve_address(&fx_var);
  EXPECT_EQ(frw.offset, rw->file_offset);
  refused([&] { uprobe::register_uprobe(&fx_var, c); }, Errc::not_executable, frw.path, frw.offset,
          ".data by address");
  // The ELF header (offset 0) is not code either.
  refused([&] { uprobe::register_uprobe(exe, 0, c); }, Errc::not_executable, exe, 0, "ELF header");
}

TEST(Refusals, ExistingInt3AndUndecodableBytes) {
  warm_up();
  Counter c;
  const std::string exe = self_exe();
  auto i3 = elf_symbol(exe, "fx_int3");
  auto bad = elf_symbol(exe, "fx_undecodable");
  ASSERT_TRUE(i3 && bad);
  refused([&] { uprobe::register_uprobe(exe, i3->file_offset, c); }, Errc::refused_instruction, exe,
          i3->file_offset, "int3 in the file, by (path, offset)");
  refused([&] { uprobe::register_uprobe(fx_addr(fx_int3), c); }, Errc::refused_instruction, exe, i3->file_offset,
          "int3 in the file, by address");
  refused([&] { uprobe::register_uprobe(exe, bad->file_offset, c); }, Errc::refused_instruction, exe,
          bad->file_offset, "undecodable byte 0x06");
  EXPECT_EQ(*static_cast<const std::uint8_t*>(fx_addr(fx_int3)), 0xCC);
  EXPECT_EQ(*static_cast<const std::uint8_t*>(fx_addr(fx_undecodable)), 0x06);
}

TEST(Refusals, AnonymousMemoryIsNotFileBacked) {
  warm_up();
  Counter c;
  auto heap = std::make_unique<std::uint64_t[]>(64);
  for (const void* addr : {static_cast<const void*>(heap.get()), static_cast<const void*>(&c)}) {
    try {
      uprobe::resolve_address(addr);
      ADD_FAILURE() << "resolve_address of anonymous memory did not throw";
    } catch (const uprobe::Error& e) {
      EXPECT_EQ(e.code(), Errc::not_file_backed) << e.what();
    }
    ExecSnapshot snap = snapshot_exec();
    try {
      uprobe::register_uprobe(addr, c);
      ADD_FAILURE() << "register_uprobe on anonymous memory did not throw";
    } catch (const uprobe::Error& e) {
      EXPECT_EQ(e.code(), Errc::not_file_backed) << e.what();
      EXPECT_FALSE(std::string(e.what()).empty());
    }
    EXPECT_EQ(diff_exec(snap), "");
  }
  try {
    uprobe::register_uprobe(reinterpret_cast<const void*>(std::uintptr_t(16)), c);
    ADD_FAILURE() << "register_uprobe on an unmapped address did not throw";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(e.code(), Errc::not_file_backed) << e.what();
  }
}

TEST(Refusals, LibrarysOwnCodeIsForbidden) {
  warm_up();
  Counter c;
  const void* own = reinterpret_cast<const void*>(&uprobe::stats);
  uprobe::FileOffset fo = uprobe::resolve_address(own);
  EXPECT_NE(fo.path.find("libuprobe"), std::string::npos) << fo.path;
  refused([&] { uprobe::register_uprobe(own, c); }, Errc::forbidden_target, fo.path, fo.offset,
          "libuprobe's own code by address");
  refused([&] { uprobe::register_uprobe(fo.path, fo.offset, c); }, Errc::forbidden_target, fo.path, fo.offset,
          "libuprobe's own code by (path, offset)");
}

struct RegistersFromHandler : uprobe::Consumer {
  std::atomic<int> hits{0}, in_handler_reg{0}, in_handler_unreg{0}, other{0};
  uprobe::Uprobe* self = nullptr;
  Counter victim;
  Action handler(Regs&) override {
    hits.fetch_add(1);
    try {
      uprobe::register_uprobe(fx_addr(fx_nop9), victim);
      other.fetch_add(1);
    } catch (const uprobe::Error& e) {
      (e.code() == Errc::in_handler ? in_handler_reg : other).fetch_add(1);
    }
    try {
      uprobe::unregister_uprobe(self, *this);
      other.fetch_add(1);
    } catch (const uprobe::Error& e) {
      (e.code() == Errc::in_handler ? in_handler_unreg : other).fetch_add(1);
    }
    return Action::keep;
  }
};

TEST(Refusals, RegisteringFromAHandlerIsRefused) {
  const auto nop9_before = mem_bytes(fx_addr(fx_nop9), 13);
  RegistersFromHandler h;
  uprobe::Attachment a(fx_addr(fx_nop5), h);
  h.self = a.probe();
  for (std::uint64_t i = 0; i < 3; ++i) ASSERT_EQ(fx_nop5(i, 0), i + 2);
  EXPECT_EQ(h.hits.load(), 3);
  EXPECT_EQ(h.in_handler_reg.load(), 3);
  EXPECT_EQ(h.in_handler_unreg.load(), 3);
  EXPECT_EQ(h.other.load(), 0);
  EXPECT_EQ(hex_bytes(mem_bytes(fx_addr(fx_nop9), 13)), hex_bytes(nop9_before));
  EXPECT_EQ(uprobe::probe_info(a.probe()).consumers, 1u);
}

TEST(Attachment, MoveAndDetachAreIdempotent) {
  Counter c;
  uprobe::Attachment a(fx_addr(fx_nop1), c);
  uprobe::Attachment b(std::move(a));
  EXPECT_EQ(a.probe(), nullptr);
  ASSERT_NE(b.probe(), nullptr);
  EXPECT_EQ(fx_nop1(1, 0), 2u);
  EXPECT_EQ(c.hits.load(), 1u);
  b.detach();
  b.detach();
  EXPECT_EQ(b.probe(), nullptr);
  EXPECT_EQ(fx_nop1(1, 0), 2u);
  EXPECT_EQ(c.hits.load(), 1u);
}

// ------------------------------------------------------- libraries ----

struct ThisThreadCounter : Counter {
  pid_t tid = this_tid();
  bool filter(pid_t t) override { return t == tid; }
};

TEST(Libraries, LibcFunctionByAddressAndByFile) {
  long (*volatile fn)(long) = &::labs;
  const void* addr = reinterpret_cast<const void*>(fn);
  uprobe::FileOffset fo = uprobe::resolve_address(addr);
  EXPECT_NE(fo.path.find("libc"), std::string::npos) << fo.path;
  for (int how = 0; how < 2; ++how) {
    SCOPED_TRACE(how == 0 ? "by address" : "by (path, offset) " + fo.path);
    ThisThreadCounter c;
    c.expect_ip = reinterpret_cast<std::uint64_t>(addr);
    uprobe::Attachment a = how == 0 ? uprobe::Attachment(addr, c) : uprobe::Attachment(fo.path, fo.offset, c);
    int wrong = 0;
    for (long i = 0; i < 1000; ++i) wrong += fn(-i) != i;
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(c.hits.load(), 1000u);
    EXPECT_EQ(c.bad_ip.load(), 0u);
  }
  EXPECT_EQ(fn(-5), 5);
}

TEST(Libraries, TestLibraryFunctions) {
  struct F {
    const char* sym;
    const void* fn;
    std::uint64_t site;
  };
  const F fs[] = {{"tl_add", fx_addr(tl_add), 0},
                  {"tl_mix", fx_addr(tl_mix), 0},
                  {"tl_asm", fx_addr(tl_asm), tl_asm_jcc_site},
                  {"tl_asm", fx_addr(tl_asm), tl_asm_load_site}};
  auto model_mix = [](std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = a * 31 + b;
    for (unsigned i = 0; i < (a & 7); ++i) r = (r << 3) ^ (r >> 5) ^ b;
    return r;
  };
  for (const F& f : fs) {
    const void* site = fx_at(f.fn, f.site);
    uprobe::FileOffset fo = uprobe::resolve_address(site);
    SCOPED_TRACE(std::string(f.sym) + "+" + std::to_string(f.site) + " in " + fo.path);
    ASSERT_NE(fo.path.find("libuprobe_core_testlib.so"), std::string::npos) << fo.path;
    auto sym = elf_symbol(fo.path, f.sym);
    ASSERT_TRUE(sym);
    EXPECT_EQ(fo.offset, sym->file_offset + f.site) << "resolve_address vs the library's ELF symbol";
    const auto disk = file_bytes(fo.path, sym->file_offset, sym->size);
    for (int how = 0; how < 2; ++how) {
      SCOPED_TRACE(how == 0 ? "by address" : "by (path, ELF offset)");
      Counter c;
      c.expect_ip = reinterpret_cast<std::uint64_t>(site);
      uprobe::Attachment a = how == 0 ? uprobe::Attachment(site, c)
                                      : uprobe::Attachment(fo.path, sym->file_offset + f.site, c);
      int wrong = 0;
      for (std::uint64_t i = 0; i < 1000; ++i) {
        const std::uint64_t x = i * 3 + 1, y = (i % 2) ? i * 5 : i / 2;
        wrong += tl_add(x, y) != x + y;
        wrong += tl_mix(x, y) != model_mix(x, y);
        wrong += tl_asm(x, y) != (x < y ? y + 7 : 0x10000 + x);
      }
      EXPECT_EQ(wrong, 0);
      // tl_asm's load site runs only when x >= y.
      std::uint64_t expect = 1000;
      if (f.site == tl_asm_load_site && f.fn == fx_addr(tl_asm)) {
        expect = 0;
        for (std::uint64_t i = 0; i < 1000; ++i) expect += !((i * 3 + 1) < ((i % 2) ? i * 5 : i / 2));
      }
      EXPECT_EQ(c.hits.load(), expect);
      EXPECT_EQ(c.bad_ip.load(), 0u);
      a.detach();
      EXPECT_EQ(hex_bytes(mem_bytes(f.fn, sym->size)), hex_bytes(disk));
    }
  }
}

}  // namespace
