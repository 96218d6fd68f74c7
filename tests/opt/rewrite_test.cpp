// SPDX-License-Identifier: MIT
// A library rewritten in place between a dlclose() and the next dlopen()
// (`cp -p`, `rsync --inplace -t`: the same inode, size and mtime): what
// libuprobe derived from the old content (its ELF image, the neighbour
// index, the data references) must not answer for the new one. A helper
// found the neighbour index answering for the old bytes: fa optimized while
// fb jumps into the bytes its jump displaced, and fb's call died (SIGILL).

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "opt_common.hpp"

using opttest::NoPunnedGuard;
using opttest::Counter;

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Writes `bytes` over `path` in place (same inode) and sets its mtime to a
/// fixed time, as `cp -p` does.
void rewrite_in_place(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  const timespec times[2] = {{1700000000, 0}, {1700000000, 0}};
  ASSERT_EQ(::futimens(fd, times), 0);
  ::close(fd);
}

struct Loaded {
  void* h = nullptr;
  std::uint64_t (*fa)(std::uint64_t, std::uint64_t) = nullptr;
  std::uint64_t (*fb)(std::uint64_t, std::uint64_t) = nullptr;
  explicit Loaded(const std::string& path) {
    h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    fa = reinterpret_cast<decltype(fa)>(::dlsym(h, "fa"));
    fb = reinterpret_cast<decltype(fb)>(::dlsym(h, "fb"));
  }
  ~Loaded() {
    if (h) ::dlclose(h);
  }
};

}  // namespace

TEST(Rewrite, ALibraryRewrittenInPlaceWithItsMtimeKeptIsAnalysedAgain) {
  NoPunnedGuard no_pun;  // the window's refusal, not the punned jump that takes over
  const std::string entry = read_file(OPT_REWRITE_ENTRY), into = read_file(OPT_REWRITE_INTO);
  ASSERT_FALSE(entry.empty());
  ASSERT_EQ(entry.size(), into.size()) << "the two builds must have one size (rewrite_lib.S)";
  ASSERT_NE(entry, into);
  char dir[] = "/tmp/uprobe-rewrite-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string lib = std::string(dir) + "/librewrite.so";

  struct stat first {};
  for (int round = 0; round < 2; ++round) {
    const bool into_window = round == 1;
    rewrite_in_place(lib, into_window ? into : entry);
    struct stat st {};
    ASSERT_EQ(::stat(lib.c_str(), &st), 0);
    if (round == 0) first = st;
    // The rewrite keeps what a cache keyed by the file's identity would see.
    EXPECT_EQ(st.st_ino, first.st_ino);
    EXPECT_EQ(st.st_size, first.st_size);
    EXPECT_EQ(st.st_mtim.tv_sec, first.st_mtim.tv_sec);
    Loaded l(lib);
    ASSERT_TRUE(l.h && l.fa && l.fb) << ::dlerror();
    Counter c(reinterpret_cast<std::uint64_t>(l.fa));
    {
      uprobe::Attachment a(reinterpret_cast<const void*>(l.fa), c);
      const uprobe::ProbeInfo info = uprobe::probe_info(a.probe());
      if (into_window) {
        EXPECT_EQ(info.mode, uprobe::ProbeMode::int3);
        EXPECT_NE(info.why_not_optimized.find("a neighbour, fb"), std::string::npos) << info.why_not_optimized;
        EXPECT_NE(info.why_not_optimized.find("branches to the window's +0x3"), std::string::npos)
            << info.why_not_optimized;
      } else {
        EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_entry) << info.why_not_optimized;
      }
      for (std::uint64_t i = 0; i < 10; ++i) {
        EXPECT_EQ(l.fa(i, 1), i + 1);
        // fb(i, 1): 2i, then fa's add from its second instruction (into) or its entry (i + 1).
        EXPECT_EQ(l.fb(i, 1), into_window ? 2 * i + 1 : i + 1);
      }
    }
    // fa's own calls, and fb's tail calls to fa's entry in the first build.
    EXPECT_EQ(c.hits.load(), into_window ? 10u : 20u);
    EXPECT_EQ(c.bad_ip.load(), 0u);
  }
  ::unlink(lib.c_str());
  ::rmdir(dir);
}
