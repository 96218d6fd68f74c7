// SPDX-License-Identifier: MIT
// tests/life/dl_lock_test.cpp's program: `life_dl_lock_child LIB WAIT_MS`.
// Thread B dlopen()s LIB (dl_lock_lib), whose constructor runs with the
// dynamic linker's lock held and calls dl_lock_in_constructor() (below): it
// waits there (up to WAIT_MS) while the main thread makes the process's
// first registrations (an entry probe, a return probe, a refused one: the
// first exception the process throws), hits them and unregisters them; then
// it dlopen()s libm (a nested dlopen: libuprobe's resync of the address
// space), registers a probe itself, from the constructor, and hits it.
// Prints one line:
//   "elfutils_at_start=1 a_done_while_locked=1 a_hits=2 a_ret=22 a_refused=1 ctor_hits=1"
// (elfutils_at_start: libelf mapped before any registration; 0 in the
// variant built with dl_lock_defer.cpp, which defers it as uprobe-trace's
// agent does, and starts B by C11's thrd_create(): the main thread's first
// ELF read must load it, which waits for B's lock -- outside the registry
// mutex, so a_done_while_locked=0.)
// A registration that asks the dynamic linker with libuprobe's registry
// mutex held waits for B's lock there, and B's registration then waits for
// the mutex forever (a bug report: dlsym() in the first check of a target,
// a thread_local's destructor registration, elfutils' first lookups).

#include <dlfcn.h>
#include <threads.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "uprobe/uprobe.hpp"

extern "C" __attribute__((noipa, visibility("default"))) int dl_lock_work(int x) {
  asm volatile("");
  return x * 3 + 1;
}
extern "C" __attribute__((noipa, visibility("default"))) int dl_lock_ctor_work(int x) {
  asm volatile("");
  return x + 1;
}

namespace {

std::atomic<bool> g_in_ctor{false};
int g_wait_ms = 10000;
std::atomic<bool> g_a_done{false};
bool g_a_done_while_locked = false;
long g_ctor_hits = -1;

struct Count final : uprobe::Consumer {
  std::atomic<long> hits{0};
  uprobe::Action handler(uprobe::Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

struct Ret final : uprobe::Consumer {
  Ret() : uprobe::Consumer(uprobe::Callbacks::ret) {}
  std::atomic<long> last{-1};
  void ret_handler(uprobe::Regs& regs, std::uint64_t) override { last.store(static_cast<long>(regs.rax)); }
};

bool wait_for(const std::atomic<bool>& flag, int ms) {
  for (int i = 0; i < ms && !flag.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return flag.load();
}

}  // namespace

/// Called by dl_lock_lib's constructor (this thread holds the dynamic linker's lock).
extern "C" __attribute__((visibility("default"))) void dl_lock_in_constructor() {
  g_in_ctor.store(true);
  g_a_done_while_locked = wait_for(g_a_done, g_wait_ms);
  if (!dlopen("libm.so.6", RTLD_NOW)) std::fprintf(stderr, "nested dlopen: %s\n", dlerror());
  try {
    static Count c;
    uprobe::Uprobe* up = uprobe::register_uprobe(reinterpret_cast<const void*>(&dl_lock_ctor_work), c);
    volatile int v = dl_lock_ctor_work(1);
    (void)v;
    uprobe::unregister_uprobe(up, c);
    g_ctor_hits = c.hits.load();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "constructor: %s\n", e.what());
  }
}

/// Whether libelf is mapped in this process.
bool libelf_mapped() {
  std::FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return false;
  char line[512];
  bool found = false;
  while (std::fgets(line, sizeof line, f)) found = found || std::strstr(line, "/libelf") != nullptr;
  std::fclose(f);
  return found;
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  g_wait_ms = std::atoi(argv[2]);
  const bool elfutils_at_start = libelf_mapped();
#ifdef DL_LOCK_C11_THREAD
  // B by C11's thrd_create() (the deferred variant): glibc starts it without
  // the pthread_create() that libuprobe interposes (a bug report: the
  // deferred load was decided by that interposer having run).
  thrd_t b;
  if (thrd_create(
          &b,
          [](void* lib) -> int {
            if (!dlopen(static_cast<const char*>(lib), RTLD_NOW)) std::fprintf(stderr, "dlopen: %s\n", dlerror());
            return 0;
          },
          argv[1]) != thrd_success)
    return 3;
#else
  std::thread b([&] {
    if (!dlopen(argv[1], RTLD_NOW)) std::fprintf(stderr, "dlopen: %s\n", dlerror());
  });
#endif
  long a_hits = -1, a_ret = -1;
  int a_refused = 0;
  if (wait_for(g_in_ctor, 30000)) {
    try {
      Count c;
      Ret r;
      uprobe::Uprobe* up = uprobe::register_uprobe(reinterpret_cast<const void*>(&dl_lock_work), c);
      uprobe::Uprobe* rp = uprobe::register_uprobe(reinterpret_cast<const void*>(&dl_lock_work), r);
      volatile int v = dl_lock_work(7);
      v = dl_lock_work(7);
      (void)v;
      uprobe::unregister_uprobe(rp, r);
      uprobe::unregister_uprobe(up, c);
      a_hits = c.hits.load();
      a_ret = r.last.load();
      try {  // (getpid: glibc's pthread_kill calls it with every signal blocked)
        uprobe::register_uprobe(reinterpret_cast<const void*>(&getpid), c);
      } catch (const uprobe::Error& e) {
        a_refused = e.code() == uprobe::Errc::forbidden_target;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "main: %s\n", e.what());
    }
  }
  g_a_done.store(true);
#ifdef DL_LOCK_C11_THREAD
  thrd_join(b, nullptr);
#else
  b.join();
#endif
  std::printf("elfutils_at_start=%d a_done_while_locked=%d a_hits=%ld a_ret=%ld a_refused=%d ctor_hits=%ld\n",
              elfutils_at_start ? 1 : 0, g_a_done_while_locked ? 1 : 0, a_hits, a_ret, a_refused, g_ctor_hits);
  return 0;
}
