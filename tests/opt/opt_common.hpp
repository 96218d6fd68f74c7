// SPDX-License-Identifier: MIT
#pragma once
/// @file opt_common.hpp
/// Declarations of the optimized-probe fixtures (opt_fixtures.S) and helpers
/// shared by the tests/opt suites: /proc/self/maps, file bytes through
/// /proc/self/exe, site bytes and jump targets, stats deltas, config guard.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "uprobe/config.hpp"
#include "stats_delta.hpp"
#include "uprobe/uprobe.hpp"

extern "C" {
std::uint64_t opt_entry5(std::uint64_t, std::uint64_t);
std::uint64_t opt_mid5(std::uint64_t, std::uint64_t);
extern const std::uint64_t opt_mid5_site;
std::uint64_t opt_ac5(std::uint64_t);
extern const std::uint64_t opt_ac5_site;
std::uint64_t opt_flags5(std::uint64_t);
extern const std::uint64_t opt_flags5_site;

std::uint64_t opt_nop_0f1f440000(std::uint64_t);
std::uint64_t opt_nop_660f1f0400(std::uint64_t);
std::uint64_t opt_nop_0f1f440012(std::uint64_t);
std::uint64_t opt_nop_660f1f4012(std::uint64_t);
std::uint64_t opt_nop_2e0f1f4012(std::uint64_t);
std::uint64_t opt_nop_6666666690(std::uint64_t);
std::uint64_t opt_nop_660f1f440000(std::uint64_t);
std::uint64_t opt_nop_0f1f4000(std::uint64_t);
std::uint64_t opt_nop_0f1f8000000000(std::uint64_t);

std::uint64_t opt_redzone(std::uint64_t, std::uint64_t);
extern const std::uint64_t opt_redzone_site;
std::uint64_t opt_hw(std::uint64_t, std::uint64_t);
extern const std::uint64_t opt_hw_site;
std::uint64_t opt_redir(std::uint64_t);
extern const std::uint64_t opt_redir_site, opt_redir_alt;
std::uint64_t opt_rspw(std::uint64_t, std::uint64_t);
extern const std::uint64_t opt_rspw_site;
std::uint64_t opt_fact(std::uint64_t);
double opt_fargs(double, double, double, double, double, double, double, double);
extern std::uint8_t opt_fargs_out[128];
std::uint64_t opt_conc(std::uint64_t);
std::uint64_t opt_secc(std::uint64_t);
std::uint64_t opt_remove(std::uint64_t);

std::uint64_t opt_c04a(std::uint64_t);
std::uint64_t opt_c04b(std::uint64_t);
std::uint64_t opt_c04c(std::uint64_t);
extern const std::uint64_t opt_c04a_branch, opt_c04b_target, opt_c04c_target;

std::uint64_t opt_state_sse();
std::uint64_t opt_state_avx();
std::uint64_t opt_state_avx512();
extern const std::uint64_t opt_state_sse_site, opt_state_avx_site, opt_state_avx512_site;

extern const std::uint8_t opt_storm_page[], opt_storm_page_end[];
extern const void* const opt_storm_fns[16];
extern const std::int32_t opt_storm_sites[16][8];
}

/// Layout of opt_state_in / opt_state_out (see opt_fixtures.S).
struct alignas(64) OptState {
  std::uint64_t gpr[16];  ///< rax rcx rdx rbx rsp rbp rsi rdi r8..r15
  std::uint64_t rflags;
  std::uint32_t mxcsr;
  std::uint16_t fcw;
  std::uint16_t pad0;
  std::uint64_t pad1[6];
  std::uint64_t k[8];
  std::uint8_t vec[32][64];
};
static_assert(sizeof(OptState) == 2304);
extern "C" OptState opt_state_in, opt_state_out;
extern "C" std::uint64_t opt_rsp_at_site;

namespace opttest {

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

constexpr std::uint8_t kNop5[5] = {0x0f, 0x1f, 0x44, 0x00, 0x00};

/// One line of /proc/self/maps.
struct Mapping {
  std::uintptr_t start = 0, end = 0;
  std::string perms;
  std::uint64_t offset = 0;
  std::string path;
  std::string line;
};
std::vector<Mapping> read_maps();
std::optional<Mapping> mapping_of(std::uint64_t addr);
/// Lines of /proc/self/maps that are writable and executable at once.
std::vector<std::string> rwx_mappings();

/// `len` bytes of memory at `addr`.
std::vector<std::uint8_t> mem(const void* addr, std::size_t len);
/// The bytes the file behind `addr` holds for [addr, addr+len), read through
/// /proc/self/exe when the mapping is the executable (its own maps lookup:
/// file offset = pgoff + addr - start).
std::vector<std::uint8_t> file_bytes_at(const void* addr, std::size_t len);

/// `want` (a punned jump, B2), or `got` where `got` is the padded form and
/// every page B2's bytes allow for the hop of the `len`-byte instruction at
/// `site` is mapped now (within 1 GiB after the executable, where ASLR may
/// put the heap; uprobe_test::punned_range_taken() over the file's bytes).
/// (A mapped page may still be one of the library's own hop pages, with
/// room: B2 stays possible there, so B2 is accepted always.)
uprobe::ProbeMode punned_form_here(const void* site, std::size_t len, uprobe::ProbeMode got,
                                   uprobe::ProbeMode want = uprobe::ProbeMode::optimized_punned);

/// Hex rendering.
std::string hex(std::uint64_t v);
std::string hex_bytes(const std::vector<std::uint8_t>& v);

/// The redundant prefixes (26, 36, 3e: up to 3) before `jmp rel32` at
/// `site`: a padded punned jump's (E9Patch's T1); 0 when none or no jump.
std::size_t jump_pad(const void* site);

/// If the bytes at `site` are `jmp rel32` (after jump_pad() prefixes), its
/// target; else 0.
std::uint64_t jump_target(const void* site);

/// "" when the site at `site` is `e9 rel32` (after jump_pad() prefixes) into
/// r-x XOL memory (/memfd:libuprobe-xol, not writable); else a description.
std::string check_jump_into_xol(const void* site);

using testsupport::stats_delta;  // tests/support/stats_delta.hpp
using testsupport::stats_str;

/// Restores the configuration when it goes out of scope.
struct ConfigGuard {
  uprobe::Config saved = uprobe::configuration();
  ~ConfigGuard() { uprobe::configure(saved); }
};
void set_optimize(bool on);

/// Config::optimize_punned off while it lives: a window's refusal is seen,
/// not the punned jump that would take over (window_test.cpp), then the
/// configuration is restored.
struct NoPunnedGuard : ConfigGuard {
  NoPunnedGuard() {
    uprobe::Config cfg = saved;
    cfg.optimize_punned = false;
    uprobe::configure(cfg);
  }
};

/// Counts hits, checks rip.
struct Counter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> bad_ip{0};
  std::uint64_t expect_ip = 0;
  explicit Counter(std::uint64_t ip = 0) : expect_ip(ip) {}
  uprobe::Action handler(uprobe::Regs& regs) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    if (expect_ip != 0 && regs.rip != expect_ip) bad_ip.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

}  // namespace opttest
