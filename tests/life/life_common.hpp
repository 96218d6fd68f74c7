// SPDX-License-Identifier: MIT
#pragma once
/// @file life_common.hpp
/// Declarations of the process-life fixtures (life_fixtures.S) and helpers
/// shared by the tests/life suites: stats deltas, the configuration guard,
/// the probe-kind parameter (int3 or optimized), counting consumers and a
/// fork()ed-child runner that reports through a pipe.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "uprobe/config.hpp"
#include "stats_delta.hpp"
#include "uprobe/uprobe.hpp"

extern "C" {
std::uint64_t lf_add(std::uint64_t, std::uint64_t);
std::uint64_t lf_mul(std::uint64_t, std::uint64_t);
long lf_outer(long);
long lf_outer_body(long);
/// What lf_outer_body(a) runs (a + 1000 when null); set by the tests.
extern long (*g_outer_body)(long);

std::uint64_t lf_int3();
std::uint64_t lf_entry_misalign();

std::uint64_t lf_step_run(std::uint64_t, std::uint64_t);
std::uint64_t lf_step_callee(std::uint64_t);
extern const std::uint64_t lf_step_nop5_site, lf_step_xol_site, lf_step_push_site;
/// The popfq that sets TF and the one that clears it.
extern const std::uint64_t lf_step_on_popf_site, lf_step_off_popf_site;
std::uint64_t lf_step_ret(std::uint64_t, std::uint64_t);
std::uint64_t lf_step_rep(std::uint64_t);
extern const std::uint64_t lf_step_rep_site;
std::uint64_t lf_step_ev(std::uint64_t, std::uint64_t);
extern const std::uint64_t lf_step_ev_site;
extern std::uint8_t lf_rep_buf[128];
std::uint64_t lf_win(std::uint64_t, std::uint64_t);
std::uint64_t lf_step_win(std::uint64_t, std::uint64_t);
std::uint64_t lf_pushf();
extern const std::uint64_t lf_pushf_site;
std::uint64_t lf_step_pushf();

double lf_vec_entry(double);
void lf_ymm_mid(const void* src, void* dst);
extern const std::uint64_t lf_ymm_mid_site;
void lf_ymm_entry_call(const void* src, void* dst);
void lf_ymm_callee();
std::uint64_t lf_xmm_pushed(const void* src, void* dst);
extern const std::uint64_t lf_xmm_pushed_site;
}

namespace lifetest {

template <typename F>
inline const void* vaddr(F* fn) {
  return reinterpret_cast<const void*>(fn);
}
template <typename F>
inline const void* at(F* fn, std::uint64_t off) {
  return reinterpret_cast<const std::uint8_t*>(fn) + off;
}
template <typename F>
inline std::uint64_t addr(F* fn) {
  return reinterpret_cast<std::uint64_t>(fn);
}

/// How a nop5 site is probed: a breakpoint, or a jump into a stub.
enum class Kind { int3, optimized };
inline const char* kind_name(Kind k) { return k == Kind::int3 ? "int3" : "optimized"; }
/// The probe_info() mode a site of this kind reports.
inline uprobe::ProbeMode kind_mode(Kind k) {
  return k == Kind::int3 ? uprobe::ProbeMode::int3 : uprobe::ProbeMode::optimized_nop5;
}

/// Restores the configuration when it goes out of scope.
struct ConfigGuard {
  uprobe::Config saved = uprobe::configuration();
  ~ConfigGuard() { uprobe::configure(saved); }
};
/// Config::optimize for this kind (nop5 sites attached afterwards follow it).
void use_kind(Kind k);

using testsupport::stats_delta;  // tests/support/stats_delta.hpp
using testsupport::stats_str;

/// Entry hits, return hits, bad sessions: a session consumer whose entry
/// stores kTag | rdi in the cookie and whose return checks the tag came back
/// (and, when `adds` is set, that the cookie holds the rdi lf_add still has
/// and rax == rdi + rsi).
struct Session : uprobe::Consumer {
  static constexpr std::uint64_t kTag = 0x5e55ull << 48;
  Session() : uprobe::Consumer(uprobe::Callbacks::entry_and_ret) {}
  std::atomic<std::uint64_t> entries{0}, rets{0}, bad{0};
  bool adds = false;
  uprobe::Action handler(uprobe::Regs& r) override {
    entries.fetch_add(1, std::memory_order_relaxed);
    uprobe::session_cookie() = kTag | (r.rdi & 0xffffffffffffull);
    return uprobe::Action::keep;
  }
  void ret_handler(uprobe::Regs& r, std::uint64_t) override {
    rets.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t c = uprobe::session_cookie();
    if ((c & ~0xffffffffffffull) != kTag) bad.fetch_add(1, std::memory_order_relaxed);
    if (adds && (c != (kTag | (r.rdi & 0xffffffffffffull)) || r.rax != r.rdi + r.rsi))
      bad.fetch_add(1, std::memory_order_relaxed);
  }
};

/// Counts entry hits.
struct Counter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  uprobe::Action handler(uprobe::Regs&) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

/// What a child reports: up to 16 numbers and a message.
struct ChildReport {
  std::uint64_t v[16] = {};
  char msg[256] = {};
};

/// Forks; the child runs body(report) and writes the report to a pipe, then
/// _exit(0)s (an exception becomes msg and exit 3). The parent waits (at
/// most 60 s, then SIGKILL) and returns the wait status; `got` says whether a
/// whole report arrived.
template <typename Body>
int in_child(Body body, ChildReport& out, bool& got);

/// "exited N" / "killed by signal N (name)".
std::string status_str(int status);

/// Writes all of `len` bytes (async-signal-safe).
void write_all(int fd, const void* p, std::size_t len);
/// Reads up to `len` bytes until EOF; returns how many.
std::size_t read_all(int fd, void* p, std::size_t len);
/// Waits for `pid` at most `seconds`, then SIGKILLs it; returns the status.
int wait_child(pid_t pid, int seconds);

/// A global test environment that turns Config::optimize_windows off, for
/// the suites whose sites inside functions are meant to be int3 and
/// out-of-line sites (tests/opt/window_test.cpp covers windows). Register
/// with testing::AddGlobalTestEnvironment(windows_off_environment()).
testing::Environment* windows_off_environment();

}  // namespace lifetest

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

namespace lifetest {
template <typename Body>
int in_child(Body body, ChildReport& out, bool& got) {
  int p[2];
  got = false;
  if (::pipe(p) != 0) return -1;
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::close(p[0]);
    ChildReport r;
    int code = 0;
    try {
      body(r);
    } catch (const std::exception& e) {
      std::snprintf(r.msg, sizeof r.msg, "exception: %s", e.what());
      code = 3;
    }
    write_all(p[1], &r, sizeof r);
    ::_exit(code);
  }
  ::close(p[1]);
  got = read_all(p[0], &out, sizeof out) == sizeof out;
  ::close(p[0]);
  return wait_child(pid, 60);
}
}  // namespace lifetest
