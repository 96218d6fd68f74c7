// SPDX-License-Identifier: MIT
// What each variant installs before its producers start: nothing, the raw
// SIGTRAP handler of the floor, or a counting uprobe consumer.

#include <signal.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "bench.hpp"
#include "uprobe/uprobe.hpp"

// glibc's own sigaction: libuprobe interposes sigaction() for SIGTRAP (once
// its runtime has started, a program's handler becomes the "program action"
// behind the runtime's). The floor must be the kernel's disposition itself.
extern "C" int __sigaction(int, const struct sigaction*, struct sigaction*);

namespace bench {
namespace {

// ---- sigtrap-floor: int3 -> SIGTRAP -> this handler -> sigreturn, with the
// runtime's sigaction flags (src/signals.cpp). Nothing of libuprobe is
// registered or started in this process.
void floor_handler(int, siginfo_t*, void*) { count_hit(); }

class SigtrapHook final : public Hook {
 public:
  bool install() {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = floor_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (__sigaction(SIGTRAP, &sa, &old_) != 0) {
      std::perror("uprobe-bench: sigaction(SIGTRAP)");
      return false;
    }
    installed_ = true;
    struct sigaction now {};
    if (__sigaction(SIGTRAP, nullptr, &now) != 0 || now.sa_sigaction != floor_handler) {
      std::fprintf(stderr, "uprobe-bench: the raw SIGTRAP handler did not stick\n");
      return false;
    }
    return true;
  }
  bool check(std::uint64_t counted) override {
    if (counted != 0) return true;
    std::fprintf(stderr, "uprobe-bench: ERROR: the SIGTRAP handler counted no traps\n");
    return false;
  }
  ~SigtrapHook() override {
    if (installed_) __sigaction(SIGTRAP, &old_, nullptr);
  }

 private:
  struct sigaction old_ {};
  bool installed_ = false;
};

// ---- uprobe-*: a consumer at the target's first byte counts on the hitting
// thread's counter.
class CountingConsumer final : public uprobe::Consumer {
 public:
  uprobe::Action handler(uprobe::Regs& regs) override {
    (void)regs;
    count_hit();
    return uprobe::Action::keep;
  }
};

class ProbeHook final : public Hook {
 public:
  bool install(const Variant& v, const Options& o) {
    try {
      apply_config(o.overrides);
      const void* address = reinterpret_cast<const void*>(v.target);
      probe_ = uprobe::register_uprobe(address, consumer_);
      const uprobe::ProbeInfo info = uprobe::probe_info(probe_);
      std::printf("Probe: %s+0x%" PRIx64 " (%p): '%s', %s\n", info.where.path.c_str(), info.where.offset,
                  address, info.instruction.c_str(), info.emulated ? "emulated" : "out of line");
      return true;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "uprobe-bench: cannot probe %s: %s\n", v.name, e.what());
      return false;
    }
  }

  bool check(std::uint64_t counted) override {
    const uprobe::Stats s = uprobe::stats();
    std::printf("Probe stats: hits %" PRIu64 ", counted %" PRIu64 ", emulated %" PRIu64 ", out_of_line %" PRIu64
                ", locked_lookups %" PRIu64 ", restarts %" PRIu64 ", recursion_misses %" PRIu64 "\n",
                s.hits, counted, s.emulated, s.out_of_line, s.locked_lookups, s.restarts, s.recursion_misses);
    if (counted == 0) {
      std::fprintf(stderr, "uprobe-bench: ERROR: the consumer counted no hits: the target was not probed\n");
      return false;
    }
    if (s.hits < counted) {
      std::fprintf(stderr, "uprobe-bench: ERROR: uprobe::stats().hits %" PRIu64 " < counted hits %" PRIu64 "\n",
                   s.hits, counted);
      return false;
    }
    return true;
  }

  ~ProbeHook() override {
    if (!probe_) return;
    try {
      uprobe::unregister_uprobe(probe_, consumer_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "uprobe-bench: unregister failed: %s\n", e.what());
    }
  }

 private:
  CountingConsumer consumer_;  // outlives the registration (destroyed after ~ProbeHook's body)
  uprobe::Uprobe* probe_ = nullptr;
};

}  // namespace

std::unique_ptr<Hook> install_hook(const Variant& v, const Options& o) {
  switch (v.kind) {
    case Kind::count_call:
    case Kind::count_syscall:
      return std::make_unique<Hook>();
    case Kind::sigtrap: {
      auto h = std::make_unique<SigtrapHook>();
      return h->install() ? std::move(h) : nullptr;
    }
    case Kind::uprobe: {
      auto h = std::make_unique<ProbeHook>();
      return h->install(v, o) ? std::move(h) : nullptr;
    }
  }
  return nullptr;
}

}  // namespace bench
