// The same against libuprobe.a (uprobe::uprobe_static), whose link
// dependencies come from uprobeConfig.cmake. Probes libc only: linked
// statically, libuprobe's code is part of this executable, and the runtime
// refuses to probe the file that holds its own code.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <uprobe/uprobe.hpp>

struct Counter : uprobe::Consumer {
  std::atomic<long> hits{0};
  uprobe::Action handler(uprobe::Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

int main() {
  Counter libc;
  try {
    uprobe::Attachment a(dlsym(RTLD_NEXT, "getppid"), libc);
    for (int i = 0; i < 7; ++i) getppid();
  } catch (const uprobe::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  getppid();
  std::printf("static: getppid: %ld hits\n", libc.hits.load());
  return libc.hits == 7 ? 0 : 1;
}
