// SPDX-License-Identifier: MIT
// Reductions of what uprobe-storm found with a library that producers
// dlclose() and dlopen() while its probe is attached: the library unmapped
// and mapped again without libuprobe seeing it in between (here: libc's own
// dlopen/dlclose, bypassing the interposed ones; in the storm: another
// thread's dlclose and dlopen between two resyncs, which gives the same
// layout at the same address).

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "uprobe/symbols.hpp"
#include "uprobe/uprobe.hpp"

namespace {

using DlopenFn = void* (*)(const char*, int);
using DlcloseFn = int (*)(void*);
using Fn = std::uint64_t (*)(std::uint64_t);

/// libc's dlopen and dlclose, not libuprobe's interposed ones.
DlopenFn libc_dlopen() {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  return libc ? reinterpret_cast<DlopenFn>(dlsym(libc, "dlopen")) : nullptr;
}
DlcloseFn libc_dlclose() {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  return libc ? reinterpret_cast<DlcloseFn>(dlsym(libc, "dlclose")) : nullptr;
}

struct Counter : uprobe::Consumer {
  std::atomic<long> hits{0};
  uprobe::Action handler(uprobe::Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

// The file unmapped and mapped again at the same address: the next resync
// must write the breakpoint into the new mapping (it saw the same layout and
// kept the old site, so every later call was lost).
TEST(DlRemap, BreakpointRewrittenAfterUnmapAndRemapAtTheSameAddress) {
  DlopenFn real_open = libc_dlopen();
  DlcloseFn real_close = libc_dlclose();
  ASSERT_TRUE(real_open && real_close);
  ASSERT_NE(real_open, reinterpret_cast<DlopenFn>(&dlopen)) << "expected libuprobe to interpose dlopen";
  void* h = dlopen(STORM_DL_PATH, RTLD_NOW);
  ASSERT_NE(h, nullptr) << dlerror();
  auto fn = reinterpret_cast<Fn>(dlsym(h, "storm_dl_fn"));
  const uprobe::Location loc = uprobe::resolve_symbol(STORM_DL_PATH, "storm_dl_fn");
  Counter c;
  uprobe::Uprobe* p = uprobe::register_uprobe(loc.path, loc.offset, c);
  EXPECT_EQ(fn(1), 6u);
  EXPECT_EQ(c.hits.load(), 1);

  ASSERT_EQ(real_close(h), 0);  // unmapped (nothing else holds it), unseen by libuprobe
  void* h2 = real_open(STORM_DL_PATH, RTLD_NOW);
  ASSERT_NE(h2, nullptr);
  auto fn2 = reinterpret_cast<Fn>(dlsym(h2, "storm_dl_fn"));
  if (fn2 != fn) {
    uprobe::unregister_uprobe(p, c);
    dlclose(h2);
    GTEST_SKIP() << "the library came back at another address";
  }
  EXPECT_EQ(fn2(2), 11u);  // no resync yet: not probed (README: "at the next register/unregister/dlopen")
  // A resync: register and unregister another consumer on the same probe.
  Counter other;
  uprobe::register_uprobe(loc.path, loc.offset, other);
  uprobe::unregister_uprobe(p, other);
  EXPECT_EQ(uprobe::probe_info(p).sites, 1u);
  for (std::uint64_t x = 0; x < 5; ++x) EXPECT_EQ(fn2(x), 5 * x + 1);
  EXPECT_EQ(c.hits.load(), 1 + 5) << "the new mapping did not get the breakpoint";
  uprobe::unregister_uprobe(p, c);
  dlclose(h2);
}

// probe_info() (and every writer) read the site byte of a mapping that was
// unmapped meanwhile: that was a SIGSEGV in libuprobe.
TEST(DlRemap, SiteOfAnUnmappedLibraryIsNotRead) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    DlcloseFn real_close = libc_dlclose();
    void* h = dlopen(STORM_DL_PATH, RTLD_NOW);
    if (!h || !real_close) _exit(2);
    const uprobe::Location loc = uprobe::resolve_symbol(STORM_DL_PATH, "storm_dl_fn");
    Counter c;
    uprobe::Uprobe* p = uprobe::register_uprobe(loc.path, loc.offset, c);
    if (real_close(h) != 0) _exit(3);      // unmapped behind libuprobe's back
    const uprobe::ProbeInfo info = uprobe::probe_info(p);  // reads the site of the vanished mapping
    if (info.mode != uprobe::ProbeMode::int3) _exit(4);
    uprobe::unregister_uprobe(p, c);  // drops the vanished site without a write
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << (WIFSIGNALED(status) ? std::string("killed by ") + strsignal(WTERMSIG(status))
                              : "exit status " + std::to_string(WEXITSTATUS(status)));
}

}  // namespace
