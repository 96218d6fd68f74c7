// SPDX-License-Identifier: MIT
// Resolving and probing an exported function of a library whose debug file is
// installed reads the library's own tables only (elf_image.hpp: ImageDepth):
// Debian's libc with libc6-dbg, whose debug file's 10,000 symbols were most of
// a traced process's attach. Watched through this program's own open(),
// which libuprobe's calls bind to: the debug file is opened only when a name
// needs it. And the locations are exactly those the debug file's symbols
// would give: every exported function of libc, resolved in a fresh process
// (a fork child: a fresh image cache) against find_symbol() here.

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
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

TEST(Depth, ProbingAnExportedFunctionNeverOpensTheDebugFile) {
  if (!libc_debug_installed()) GTEST_SKIP() << "libc's debug file is not installed: apt-get install libc6-dbg";
  EXPECT_EQ(in_child([] {
              const unsigned before = g_debug_opens.load();
              const auto locs = uprobe::resolve_location("libc:malloc");
              if (locs.size() != 1 || locs[0].symbol.rfind("malloc", 0) != 0) return 1;
              usdttest::RipRecorder c;
              void* (*volatile call)(std::size_t) = &std::malloc;
              {
                uprobe::Attachment a(locs[0].path, locs[0].offset, c);
                for (int i = 0; i < 100; ++i) std::free(call(16 + i));
              }
              if (c.hits.load() < 100) return 2;
              if (g_debug_opens.load() != before) return 3;  // the debug file was read
              // A name only the debug file has: read then (what this watch sees).
              (void)uprobe::find_symbol(libc_path(), "__strlen_sse2");
              return g_debug_opens.load() > before ? 0 : 4;
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

}  // namespace
