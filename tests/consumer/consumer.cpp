// A program using an installed libuprobe (C++; CMake: find_package(uprobe)).
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <uprobe/uprobe.hpp>

extern "C" __attribute__((noinline)) long triple(long x) {
  asm volatile("");  // keep the calls: probes count real executions
  return 3 * x;
}

struct Counter : uprobe::Consumer {
  std::atomic<long> hits{0}, arg_sum{0};
  uprobe::Action handler(uprobe::Regs& regs) override {  // signal context: async-signal-safe only
    hits.fetch_add(1, std::memory_order_relaxed);
    arg_sum.fetch_add(static_cast<long>(regs.arg(0)), std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

int main() {
  Counter mine, libc;
  long sum = 0;
  try {
    // One of our functions, by address; libc's getppid() by (file, offset).
    // dlsym(RTLD_NEXT) gives libc's code even where &getppid is a PLT stub.
    uprobe::Attachment a(reinterpret_cast<const void*>(&triple), mine);
    uprobe::FileOffset where = uprobe::resolve_address(dlsym(RTLD_NEXT, "getppid"));
    uprobe::Attachment b(where.path, where.offset, libc);
    for (long i = 1; i <= 10; ++i) sum += triple(i);
    for (int i = 0; i < 7; ++i) getppid();
  } catch (const uprobe::Error& e) {  // what(): path, offset and reason
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  triple(1), getppid();  // detached: not counted
  bool refused = false;
  try {
    uprobe::register_uprobe("/proc/self/exe", 1ull << 40, mine);
  } catch (const uprobe::Error& e) {
    refused = e.code() == uprobe::Errc::bad_offset;
  }
  std::printf("triple: %ld hits (arguments sum %ld), getppid: %ld hits, bad offset refused: %d\n",
              mine.hits.load(), mine.arg_sum.load(), libc.hits.load(), refused);
  return mine.hits == 10 && mine.arg_sum == 55 && libc.hits == 7 && sum == 165 && refused ? 0 : 1;
}
