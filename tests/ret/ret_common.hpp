// SPDX-License-Identifier: MIT
#pragma once
/// @file ret_common.hpp
/// Shared declarations and helpers of the return-probe suites: the assembly
/// fixtures (ret_fixtures.S), the frame-pointer fixtures (fp_fixtures.cpp),
/// models, VmRSS, stats deltas and a config guard.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "uprobe/config.hpp"
#include "uprobe/uprobe.hpp"

struct RtPair {
  std::uint64_t lo, hi;
};

extern "C" {
std::uint64_t rt_call(const void* fn, std::uint64_t a, std::uint64_t b, std::uint64_t rax_in, std::uint64_t rdx_in);
/// rt_call under another name, declared returning rax:rdx.
RtPair rt_call_pair(const void* fn, std::uint64_t a, std::uint64_t b, std::uint64_t rax_in, std::uint64_t rdx_in);
extern std::uint64_t rt_call_rsp;
extern const std::uint64_t rt_call_ret_off, rt_call_alt_off;

std::uint64_t rt_simple_add(std::uint64_t, std::uint64_t);
std::uint64_t rt_ac_callee(std::uint64_t);
std::uint64_t rt_ac_caller(std::uint64_t);
std::uint64_t rt_df_callee(std::uint64_t);
std::uint64_t rt_df_caller(std::uint64_t);
std::uint64_t rt_flags_callee(std::uint64_t, std::uint64_t);
std::uint64_t rt_flags_caller(std::uint64_t, std::uint64_t);
std::uint64_t rt_mul3_add(std::uint64_t, std::uint64_t);
std::uint64_t rt_fact(std::uint64_t);
extern const std::uint64_t rt_fact_mid_off, rt_fact_rs_off;
std::uint64_t rt_fib(std::uint64_t);
extern const std::uint64_t rt_fib_rs1_off, rt_fib_rs2_off;
std::uint64_t rt_sum(std::uint64_t);
std::uint64_t rt_deep(std::uint64_t);  // n + 1, n + 1 invocations deep; the innermost calls rt_deep_bottom()
void rt_deep_bottom();
std::uint64_t rt_tail_a(std::uint64_t);
std::uint64_t rt_tail_b(std::uint64_t);
std::uint64_t rt_tail_c(std::uint64_t);
std::uint64_t rt_tail_j(std::uint64_t);
void rt_c05a();
void rt_c05b();
std::uint64_t rt_c05b_next(std::uint64_t);
void rt_c05c();
void rt_c05d();
extern const std::uint64_t rt_c05d_off1, rt_c05d_off2, rt_c05d_off3;
double rt_ret_double(std::int64_t);
RtPair rt_ret_pair(std::uint64_t, std::uint64_t);

// fp_fixtures.cpp (built with -fno-omit-frame-pointer): fp_inner walks the
// rbp chain, storing up to n return addresses (innermost first); fp_mid and
// fp_outer call it (fp_outer -> fp_mid -> fp_inner). Result: walked + 1100.
int fp_inner(void** out, int n);
int fp_mid(void** out, int n);
int fp_outer(void** out, int n);
extern void** fp_raw_out;
extern int fp_fixed;
}

namespace rettest {

template <typename F>
inline std::uint64_t addr(F* fn) {
  return reinterpret_cast<std::uint64_t>(fn);
}
template <typename F>
inline const void* vaddr(F* fn) {
  return reinterpret_cast<const void*>(fn);
}
template <typename F>
inline const void* at(F* fn, std::uint64_t off) {
  return reinterpret_cast<const std::uint8_t*>(fn) + off;
}

/// rt_call's return site (the instruction after its call).
inline std::uint64_t call_site() { return addr(rt_call) + rt_call_ret_off; }

inline std::uint64_t fib_model(std::uint64_t n) {
  std::uint64_t a = 0, b = 1;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t t = a + b;
    a = b;
    b = t;
  }
  return a;
}
/// Invocations of fib(k) made by one call of fib(n) (k <= n).
inline std::uint64_t fib_calls_of(std::uint64_t n, std::uint64_t k) {
  // memo by recursion on n (small n only)
  if (k > n) return 0;
  if (k == n) return 1;
  if (n < 2) return 0;
  return fib_calls_of(n - 1, k) + fib_calls_of(n - 2, k);
}
inline std::uint64_t fib_calls(std::uint64_t n) { return n < 2 ? 1 : 1 + fib_calls(n - 1) + fib_calls(n - 2); }
inline std::uint64_t fact_model(std::uint64_t n) {
  std::uint64_t r = 1;
  for (std::uint64_t i = 2; i <= n; ++i) r *= i;
  return r;
}

/// VmRSS of this process in kB.
inline long vmrss_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

inline uprobe::Stats delta(const uprobe::Stats& a, const uprobe::Stats& b) { return b - a; }

inline std::string str(const uprobe::Stats& s) {
  std::ostringstream os;
  os << "hits=" << s.hits << " recursion_misses=" << s.recursion_misses << " return_hits=" << s.return_hits
     << " return_misses=" << s.return_misses << " return_dropped=" << s.return_dropped;
  return os.str();
}

/// Restores the configuration when it goes out of scope.
struct ConfigGuard {
  uprobe::Config saved = uprobe::configuration();
  ~ConfigGuard() { uprobe::configure(saved); }
};

/// Configurations the value tests run under.
enum class Mode { def, freelist, global_lock, freelist_global, no_emulate, single_step, locked_lookup };

inline const char* mode_name(Mode m) {
  switch (m) {
    case Mode::def: return "default";
    case Mode::freelist: return "ri_pool_freelist";
    case Mode::global_lock: return "ri_lock_global";
    case Mode::freelist_global: return "freelist_and_global";
    case Mode::no_emulate: return "no_emulate";
    case Mode::single_step: return "single_step";
    case Mode::locked_lookup: return "locked_lookup";
  }
  return "?";
}

inline void PrintTo(Mode m, std::ostream* os) { *os << mode_name(m); }

inline uprobe::Config config_for(Mode m) {
  uprobe::Config c;  // defaults
  switch (m) {
    case Mode::def: break;
    case Mode::freelist: c.ri_pool = uprobe::RiPool::freelist; break;
    case Mode::global_lock: c.ri_lock = uprobe::RiLock::global; break;
    case Mode::freelist_global:
      c.ri_pool = uprobe::RiPool::freelist;
      c.ri_lock = uprobe::RiLock::global;
      break;
    case Mode::no_emulate: c.emulate = false; break;
    case Mode::single_step: c.xol = uprobe::XolMode::single_step; break;
    case Mode::locked_lookup: c.lookup = uprobe::LookupMode::locked; break;
  }
  return c;
}

inline std::string hexs(std::uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

inline double as_double(const std::uint8_t* p) {
  double d;
  std::memcpy(&d, p, sizeof d);
  return d;
}

/// One ret_handler call, as recorded by Recorder.
struct RetRec {
  std::uint64_t func, rax, rdx, rip, rsp, cookie;
  const void* who;
};

/// A log of ret_handler calls (single-threaded use; AS-safe append).
template <std::size_t N>
struct RetLog {
  RetRec rec[N];
  std::atomic<std::size_t> n{0};
  void add(const RetRec& r) {
    std::size_t i = n.fetch_add(1, std::memory_order_relaxed);
    if (i < N) rec[i] = r;
  }
  std::size_t size() const { return n.load() < N ? n.load() : N; }
  void clear() { n.store(0); }
};

}  // namespace rettest
