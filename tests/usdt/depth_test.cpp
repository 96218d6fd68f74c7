// SPDX-License-Identifier: MIT
// Resolving and probing an exported function of a library whose debug file is
// installed reads the library's own tables (elf_image.hpp: ImageDepth), and
// for the registry's check only the debug file's function bounds
// (debug_file_refines()), no image with its symbols: Debian's libc with
// libc6-dbg, whose debug file's 10,000 symbols were most of a traced
// process's attach. Watched through this program's own open(), which
// libuprobe's calls bind to. And the locations are exactly those the debug file's symbols
// would give: every exported function of libc, resolved in a fresh process
// (a fork child: a fresh image cache) against find_symbol() here.

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <uprobe/symbols.hpp>
#include <uprobe/uprobe.hpp>

#include "common.hpp"

namespace {
std::atomic<unsigned> g_debug_opens{0};

int counted_open(const char* path, int flags, va_list ap) {
  mode_t mode = 0;
  if (flags & (O_CREAT | O_TMPFILE)) mode = va_arg(ap, mode_t);
  if (path && std::strncmp(path, "/usr/lib/debug/", 15) == 0) g_debug_opens.fetch_add(1);
  return static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, flags, mode));
}
}  // namespace

// (This program's definitions come first in every lookup: libuprobe's
// open() calls are these.)
extern "C" int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const int fd = counted_open(path, flags, ap);
  va_end(ap);
  return fd;
}
extern "C" int open64(const char* path, int flags, ...) noexcept __attribute__((alias("open")));

namespace {

std::string libc_path() {
  char buf[PATH_MAX];
  return ::realpath("/lib/x86_64-linux-gnu/libc.so.6", buf) ? std::string(buf) : std::string();
}

/// Whether libc's debug file is installed: find_symbol() of a function only
/// it names (and this process opened it to answer).
bool libc_debug_installed() {
  try {
    (void)uprobe::find_symbol(libc_path(), "__strlen_sse2");
    return true;
  } catch (const uprobe::Error&) {
    return false;
  }
}

/// Runs `fn` in a fork child (a fresh image cache) and returns its exit
/// status (fn's return value; 99 when it threw).
template <class Fn>
int in_child(Fn fn) {
  const pid_t pid = fork();
  if (pid == 0) {
    int rc = 99;
    try {
      rc = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Depth, ProbingAnExportedFunctionReadsNoImageWithTheDebugFile) {
  if (!libc_debug_installed()) GTEST_SKIP() << "libc's debug file is not installed: apt-get install libc6-dbg";
  EXPECT_EQ(in_child([] {
              const unsigned before = g_debug_opens.load();
              const auto locs = uprobe::resolve_location("libc:malloc");
              if (locs.size() != 1 || locs[0].symbol.rfind("malloc", 0) != 0) return 1;
              if (g_debug_opens.load() != before) return 3;  // resolving: the own tables only
              usdttest::RipRecorder c;
              // libc's own malloc and free: in a sanitized build &std::malloc
              // is the sanitizer's interceptor, which never calls libc's.
              void* const libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
              if (!libc) return 6;
              void* (*volatile call)(std::size_t) = reinterpret_cast<void* (*)(std::size_t)>(dlsym(libc, "malloc"));
              void (*volatile release)(void*) = reinterpret_cast<void (*)(void*)>(dlsym(libc, "free"));
              if (!call || !release) return 6;
              {
                uprobe::Attachment a(locs[0].path, locs[0].offset, c);
                for (int i = 0; i < 100; ++i) release(call(16 + i));
              }
              if (c.hits.load() < 100) return 2;
              // The registry's check scanned the debug file's function bounds
              // (debug_file_refines(): one open), no image with its symbols:
              // a name only it has opens it again now, for that image.
              const unsigned probed = g_debug_opens.load();
              if (probed > before + 1) return 5;
              (void)uprobe::find_symbol(libc_path(), "__strlen_sse2");
              return g_debug_opens.load() > probed ? 0 : 4;
            }),
            0);
}

/// One exported function's location, as the fork child resolved it.
struct Resolved {
  int errc;  // -1: resolved; else the uprobe::Errc thrown
  std::uint64_t offset;
  char symbol[120];
};

TEST(Depth, EveryExportedFunctionOfLibcResolvesAsWithTheDebugFile) {
  if (!libc_debug_installed()) GTEST_SKIP() << "libc's debug file is not installed: apt-get install libc6-dbg";
  const std::string libc = libc_path();
  std::vector<std::string> names;
  for (const uprobe::Symbol& s : uprobe::read_symbols(libc))
    if (s.dynamic && s.type == STT_FUNC && s.executable && s.name.size() < 100) names.push_back(s.full_name());
  ASSERT_GT(names.size(), 2000u);
  auto* out = static_cast<Resolved*>(
      mmap(nullptr, names.size() * sizeof(Resolved), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(out, MAP_FAILED);
  const int rc = in_child([&] {
    const unsigned before = g_debug_opens.load();
    for (std::size_t i = 0; i < names.size(); ++i) {
      Resolved& r = out[i];
      r.errc = -1;
      try {
        const auto locs = uprobe::resolve_location("libc:" + names[i]);
        r.offset = locs.at(0).offset;
        std::snprintf(r.symbol, sizeof r.symbol, "%s", locs.at(0).symbol.c_str());
      } catch (const uprobe::Error& e) {
        r.errc = static_cast<int>(e.code());
      }
    }
    return g_debug_opens.load() == before ? 0 : 5;
  });
  EXPECT_EQ(rc, 0) << "the debug file was read to resolve an exported name";
  // Here, with the debug file's symbols (find_symbol()), the same answers.
  std::size_t same = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    try {
      const uprobe::Symbol s = uprobe::find_symbol(libc, names[i]);
      EXPECT_EQ(out[i].errc, -1) << names[i];
      EXPECT_EQ(out[i].offset, s.offset) << names[i];
      EXPECT_EQ(std::string(out[i].symbol), s.full_name()) << names[i];
      same += out[i].errc == -1 && out[i].offset == s.offset && s.full_name() == out[i].symbol;
    } catch (const uprobe::Error& e) {
      EXPECT_EQ(out[i].errc, static_cast<int>(e.code())) << names[i];
    }
  }
  EXPECT_GT(same, 2000u);
  munmap(out, names.size() * sizeof(Resolved));
}

/// The build-id of `path` as hex ("" when it has none), from its notes.
std::string build_id_of(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::vector<unsigned char> b(1 << 20);
  const ssize_t n = ::read(fd, b.data(), b.size());
  ::close(fd);
  if (n < static_cast<ssize_t>(sizeof(Elf64_Ehdr))) return {};
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(b.data());
  for (int i = 0; i < eh->e_phnum; ++i) {
    const auto* ph = reinterpret_cast<const Elf64_Phdr*>(b.data() + eh->e_phoff + i * sizeof(Elf64_Phdr));
    if (ph->p_type != PT_NOTE || ph->p_offset + ph->p_filesz > static_cast<std::uint64_t>(n)) continue;
    for (std::uint64_t o = ph->p_offset; o + sizeof(Elf64_Nhdr) <= ph->p_offset + ph->p_filesz;) {
      const auto* nh = reinterpret_cast<const Elf64_Nhdr*>(b.data() + o);
      const std::uint64_t desc = o + sizeof(Elf64_Nhdr) + ((nh->n_namesz + 3) & ~3u);
      if (nh->n_type == NT_GNU_BUILD_ID && desc + nh->n_descsz <= static_cast<std::uint64_t>(n)) {
        std::string hex;
        for (unsigned k = 0; k < nh->n_descsz; ++k) {
          char h[3];
          std::snprintf(h, sizeof h, "%02x", b[desc + k]);
          hex += h;
        }
        return hex;
      }
      o = desc + ((nh->n_descsz + 3) & ~3u);
    }
  }
  return {};
}

// Found by an attack on the depths: a name whose every export has a
// non-default version (only foo@DEPTH_1) is not settled by the file's own
// tables: its debug file
// adds a local `foo`, which find_symbol()'s rules prefer (no version beats a
// non-default one). The stripped copy, in a fresh process, resolves `foo` as
// the unstripped file does (and as the image with the debug file does).
TEST(Depth, WhatOnlyTheDebugFileCanSettleIsReadFromIt) {
  const std::string dir = DEPTH_COMPAT_DIR;
  const std::string full = dir + "/libusdtfix_depth_compat.so";
  const std::string stripped = dir + "/libusdtfix_depth_compat_stripped.so";
  const std::string id = build_id_of(stripped);
  ASSERT_GT(id.size(), 2u);
  const std::string ddir = "/usr/lib/debug/.build-id/" + id.substr(0, 2);
  const std::string dbg = ddir + "/" + id.substr(2) + ".debug";
  if (::access("/usr/lib/debug", W_OK) != 0)
    GTEST_SKIP() << "installing a debug file under /usr/lib/debug needs root";
  ::mkdir("/usr/lib/debug/.build-id", 0755);
  ::mkdir(ddir.c_str(), 0755);
  {
    const std::string cmd = "cp '" + dir + "/libusdtfix_depth_compat.debug' '" + dbg + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  const std::uint64_t want = uprobe::find_symbol(full, "foo").offset;  // the local foo (.symtab)
  const std::uint64_t compat = uprobe::find_symbol(full, "foo@DEPTH_1").offset;
  EXPECT_NE(want, compat);
  auto* got = static_cast<std::uint64_t*>(
      mmap(nullptr, 2 * sizeof(std::uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(got, MAP_FAILED);
  int* mode = reinterpret_cast<int*>(got + 1);
  // depth_inner, inside the exported depth_outer in code without CFI: its
  // entry is a function entry (a return probe may be there) by the debug
  // file's symbols, which the file's own tables cannot settle (function_at()).
  const std::uint64_t inner = uprobe::find_symbol(full, "depth_inner").offset;
  EXPECT_GT(inner, uprobe::find_symbol(full, "depth_outer").offset);
  // And where one FDE spans the exported function (CFI): depth_inner2.
  const std::uint64_t inner2 = uprobe::find_symbol(full, "depth_inner2").offset;
  EXPECT_GT(inner2, uprobe::find_symbol(full, "depth_outer2").offset);
  const std::uint64_t big = uprobe::find_symbol(full, "depth_big").offset;
  EXPECT_EQ(uprobe::find_symbol(full, "depth_small").offset, big);
  const int rc = in_child([&] {
    // (First: resolving `foo` reads the debug file, whose image then answers.)
    if (!dlopen(stripped.c_str(), RTLD_NOW)) return 2;
    struct Ret : uprobe::Consumer {
      Ret() : uprobe::Consumer(uprobe::Callbacks::ret) {}
      void ret_handler(uprobe::Regs&, std::uint64_t) override {}
    } ret;
    for (const std::uint64_t at : {inner, inner2}) {
      try {
        uprobe::unregister_uprobe(uprobe::register_uprobe(stripped, at, ret), ret);
      } catch (const uprobe::Error& e) {
        std::fprintf(stderr, "return probe at depth_inner%s: %s\n", at == inner ? "" : "2", e.what());
        return 3;
      }
    }
    // depth_big's plan is the one of its 3-byte alias's bounds, as in the
    // unstripped file (mode_full, planned there by the parent).
    usdttest::RipRecorder c;
    uprobe::Uprobe* p = uprobe::register_uprobe(stripped, big, c);
    *mode = static_cast<int>(uprobe::probe_info(p, uprobe::ProbeDetail::state).mode);
    uprobe::unregister_uprobe(p, c);
    *got = uprobe::resolve_location(stripped + ":foo").at(0).offset;
    return 0;
  });
  ::unlink(dbg.c_str());
  ::rmdir(ddir.c_str());
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(*got, want) << "foo@DEPTH_1 is at " << compat;
  // The unstripped library's plan at depth_big (its own .symtab).
  ASSERT_NE(dlopen(full.c_str(), RTLD_NOW), nullptr) << dlerror();
  usdttest::RipRecorder c;
  uprobe::Uprobe* p = uprobe::register_uprobe(full, big, c);
  const uprobe::ProbeMode mode_full = uprobe::probe_info(p, uprobe::ProbeDetail::state).mode;
  uprobe::unregister_uprobe(p, c);
  EXPECT_NE(mode_full, uprobe::ProbeMode::optimized_entry) << "depth_small is 3 bytes long";
  EXPECT_EQ(*mode, static_cast<int>(mode_full));
  munmap(got, 2 * sizeof(std::uint64_t));
}

}  // namespace
