// SPDX-License-Identifier: MIT
// What each variant installs before its producers start: nothing, the raw
// SIGTRAP handler of the floor, a counting uprobe or uretprobe consumer, or a
// kernel uprobe counted by perf.

#include <signal.h>
#include <unistd.h>

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
// runtime's sigaction flags (src/interpose/signals.cpp). Nothing of libuprobe is
// registered or started in this process.
void floor_handler(int, siginfo_t*, void*) { count_hit(); }

}  // namespace

// ---- trampoline-floor: the C function its stub calls (targets.S).
extern "C" __attribute__((noinline)) void bench_trampoline_floor_entry(std::uint64_t*, const void*) { count_hit(); }

namespace {

class SigtrapHook final : public Hook {
 public:
  bool install(std::string& error) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = floor_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (__sigaction(SIGTRAP, &sa, &old_) != 0) {
      error = std::string("sigaction(SIGTRAP): ") + std::strerror(errno);
      return false;
    }
    installed_ = true;
    struct sigaction now {};
    if (__sigaction(SIGTRAP, nullptr, &now) != 0 || now.sa_sigaction != floor_handler) {
      error = "the raw SIGTRAP handler did not stick";
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

// ---- uprobe-* / uretprobe-*: the counting consumers (--consumer) live in
// plain_consumers.cpp (plain, the default) and consumers.cpp (gpr).

class ProbeHook final : public Hook {
 public:
  explicit ProbeHook(uprobe::Consumer& consumer) : consumer_(consumer) {}

  bool install(const Variant& v, const Options& o, std::string& error) {
    try {
      if (!o.switches.empty()) uprobe::configure(apply(o.switches, uprobe::configuration()));
      const uprobe::Config effective = uprobe::configuration();
      config = describe(effective);
      std::fprintf(text_out(), "Config: %s\n", config.c_str());
      std::fprintf(text_out(), "Consumer: %s\n", consumer_description(o.consumer));
      const std::string ignored = ignored_switches(o.switches, effective);
      if (!ignored.empty())
        std::fprintf(text_out(), "Note: this libuprobe ignores %s (uprobe::configuration() reports otherwise)\n",
                     ignored.c_str());
      kind_ = v.kind;
      const void* address = probe_site(v);
      base_ = uprobe::stats();  // the process's counters so far (--cycles runs several variants)
      probe_ = uprobe::register_uprobe(address, consumer_);
      const uprobe::ProbeInfo info = uprobe::probe_info(probe_);
      const std::string how = info.mode != uprobe::ProbeMode::int3 ? uprobe::to_string(info.mode) : info.emulated ? "int3, emulated" : "int3, out of line";
      std::fprintf(text_out(), "Probe: %s+0x%" PRIx64 " (%p): '%s', %s%s\n", info.where.path.c_str(),
                   info.where.offset, address, info.instruction.c_str(), how.c_str(),
                   v.kind == Kind::uretprobe ? ", return probe" : "");
      // What an optimized hit preserves around the consumer (ProbeInfo).
      std::fprintf(text_out(), "Saved around the consumer: %s\n",
                   (v.kind == Kind::uretprobe ? info.return_state : info.entry_state).c_str());
      return true;
    } catch (const std::exception& e) {
      error = std::string("cannot probe ") + v.name + ": " + e.what();
      return false;
    }
  }

  bool check(std::uint64_t counted) override {
    // This variant's run only, as `counted` is: uprobe::stats() counts over
    // the process, which --cycles shares between its variants.
    const uprobe::Stats s = uprobe::stats() - base_;
    std::fprintf(text_out(),
                 "Probe stats: hits %" PRIu64 ", counted %" PRIu64 ", optimized %" PRIu64 ", emulated %" PRIu64
                 ", out_of_line %" PRIu64 ", locked_lookups %" PRIu64 ", restarts %" PRIu64
                 ", recursion_misses %" PRIu64 "\n",
                 s.hits, counted, s.optimized, s.emulated, s.out_of_line, s.locked_lookups, s.restarts,
                 s.recursion_misses);
#if defined(UPROBE_HAS_URETPROBE)
    if (kind_ == Kind::uretprobe)
      std::fprintf(text_out(), "Return stats: return_hits %" PRIu64 ", return_misses %" PRIu64
                   ", return_dropped %" PRIu64 "\n", s.return_hits, s.return_misses, s.return_dropped);
#endif
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
  uprobe::Consumer& consumer_;  // a static of install_hook: outlives the registration
  uprobe::Uprobe* probe_ = nullptr;
  Kind kind_ = Kind::uprobe;
  uprobe::Stats base_;  // uprobe::stats() when the probe was registered
};

// ---- kernel-*: the kernel's uprobe (or uretprobe) on the same target,
// counted by a perf event of the uprobe PMU.
class KernelHook final : public Hook {
 public:
  bool install(const Variant& v, std::string& error, bool& skipped) {
    kernel::Location& where = where_;
    if (!kernel::locate(probe_site(v), where, error)) return false;
    fd_ = kernel::open_uprobe(where, v.kind == Kind::kernel_uretprobe, error);
    if (fd_ < 0) {
      skipped = true;  // not permitted / not supported here: not a failure of the bench
      return false;
    }
    std::fprintf(text_out(), "Kernel probe: %s+0x%llx, %s, perf uprobe PMU (counting)\n", where.path.c_str(),
                 static_cast<unsigned long long>(where.offset),
                 v.kind == Kind::kernel_uretprobe ? "uretprobe" : "uprobe");
    return true;
  }
  std::uint64_t hits(int producers) override {
    (void)producers;
    return kernel::read_count(fd_);
  }
  bool check(std::uint64_t counted) override {
    const std::uint64_t k = kernel::read_count(fd_);
    std::fprintf(text_out(), "Kernel stats: perf count %" PRIu64 ", counted calls %" PRIu64 "\n", k, counted);
    if (counted == 0 || k != counted) {
      std::fprintf(stderr,
                   "uprobe-bench: ERROR: the kernel counted %" PRIu64 " hits for %" PRIu64 " calls of the target\n",
                   k, counted);
      return false;
    }
    return true;
  }
  ~KernelHook() override {
    if (fd_ >= 0) close(fd_);
  }

 private:
  // The event's config1 points at where_.path, and the kernel reads it again
  // each time the event is inherited by a new thread: it lives with the event.
  kernel::Location where_;
  int fd_ = -1;
};

}  // namespace

std::unique_ptr<Hook> install_hook(const Variant& v, const Options& o, std::string& error, bool& skipped) {
  skipped = false;
  switch (v.kind) {
    case Kind::count_call:
    case Kind::count_syscall:
    case Kind::trampoline:  // the site jumps into its stub by itself
      return std::make_unique<Hook>();
    case Kind::sigtrap: {
      auto h = std::make_unique<SigtrapHook>();
      return h->install(error) ? std::move(h) : nullptr;
    }
    case Kind::uprobe: {
      auto h = std::make_unique<ProbeHook>(consumer_of(o.consumer, false));
      return h->install(v, o, error) ? std::move(h) : nullptr;
    }
    case Kind::uretprobe: {
#if defined(UPROBE_HAS_URETPROBE)
      auto h = std::make_unique<ProbeHook>(consumer_of(o.consumer, true));
      return h->install(v, o, error) ? std::move(h) : nullptr;
#else
      skipped = true;
      error = "this libuprobe has no return probes (UPROBE_HAS_URETPROBE is not defined)";
      return nullptr;
#endif
    }
    case Kind::kernel_uprobe:
    case Kind::kernel_uretprobe: {
      auto h = std::make_unique<KernelHook>();
      return h->install(v, error, skipped) ? std::move(h) : nullptr;
    }
  }
  return nullptr;
}

}  // namespace bench
