// SPDX-License-Identifier: MIT
#pragma once
/// @file common.hpp
/// Helpers for tests/usdt: expectations computed without the library
/// (/proc/self/maps, dladdr1, dl_iterate_phdr, readelf), a consumer that
/// records rip, error checks.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "uprobe/uprobe.hpp"

namespace usdttest {

/// realpath(/proc/self/exe).
std::string self_exe();

/// realpath(p).
std::string canonical(const std::string& p);

/// The file offset of `addr` through /proc/self/maps (pgoff + addr - start),
/// and the canonical path of the mapped file.
struct MapsOffset {
  std::string path;
  std::uint64_t offset = 0;
};
std::optional<MapsOffset> maps_offset(const void* addr);

/// The load bias (link_map l_addr) of the object holding `addr` (dladdr1).
std::uintptr_t load_bias(const void* addr);

/// The PT_LOAD program headers of the main program as loaded (dl_iterate_phdr).
struct Seg {
  std::uint64_t offset, vaddr, filesz;
  bool exec;
};
std::vector<Seg> main_program_loads();

/// `len` bytes of `path` at `offset`.
std::vector<std::uint8_t> file_bytes(const std::string& path, std::uint64_t offset, std::size_t len);

/// "0x..." for spec strings.
std::string hex(std::uint64_t v);

/// Runs a command and returns its stdout ("" if it cannot run).
std::string run(const std::string& cmd);

/// Expects `fn` to throw uprobe::Error with `code` and a what() holding every
/// string of `parts`.
void expect_error(const std::function<void()>& fn, uprobe::Errc code, std::initializer_list<std::string> parts);

/// Counts hits and records the last rip.
struct RipRecorder : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> last_rip{0};
  uprobe::Action handler(uprobe::Regs& regs) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    last_rip.store(regs.rip, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

}  // namespace usdttest
