// SPDX-License-Identifier: MIT
#pragma once
/// @file common.hpp
/// Helpers shared by the end-to-end suites: an independent ELF symbol reader
/// (to compute file offsets without the library), /proc/self/maps lookups,
/// file and memory byte snapshots, counting consumers, error checks.

#include <gtest/gtest.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "uprobe/config.hpp"
#include "stats_delta.hpp"
#include "uprobe/uprobe.hpp"

namespace coretest {

/// A symbol of an ELF file: its value (link-time address), size and the file
/// offset of its first byte (through the PT_LOAD that holds it).
struct ElfSym {
  std::uint64_t value = 0;
  std::uint64_t size = 0;
  std::uint64_t file_offset = 0;
};

/// Looks `name` up in .symtab (then .dynsym) of `path`; nullopt if absent.
std::optional<ElfSym> elf_symbol(const std::string& path, const std::string& name);

/// realpath(/proc/self/exe).
std::string self_exe();

/// `len` bytes of `path` at `offset` (fails the test on a short read).
std::vector<std::uint8_t> file_bytes(const std::string& path, std::uint64_t offset, std::size_t len);

/// A copy of `len` bytes of this process's memory at `addr`.
std::vector<std::uint8_t> mem_bytes(const void* addr, std::size_t len);

/// One line of /proc/self/maps.
struct Mapping {
  std::uintptr_t start = 0, end = 0;
  std::string perms;
  std::uint64_t offset = 0;
  std::string path;
};

/// The mapping that holds `addr`.
std::optional<Mapping> mapping_of(const void* addr);

/// Snapshot of a whole mapping's bytes and permissions (to prove a refused
/// request changed nothing).
struct MappingSnapshot {
  Mapping map;
  std::vector<std::uint8_t> bytes;
};
MappingSnapshot snapshot_mapping(const void* addr);
/// Empty string if `now` equals `before`; otherwise a description of the first difference.
std::string diff_snapshot(const MappingSnapshot& before);

/// Snapshot of every executable mapping (list, permissions and bytes), for
/// "not a single byte of the process's code changes".
struct ExecSnapshot {
  std::vector<MappingSnapshot> maps;
};
ExecSnapshot snapshot_exec();
/// Empty if every executable mapping is unchanged; else the differences.
std::string diff_exec(const ExecSnapshot& before);

/// Hex rendering of bytes, for messages.
std::string hex_bytes(const std::vector<std::uint8_t>& v);
std::string hex(std::uint64_t v);

/// True if `text` names `off` in decimal or in hex (0x..., any case).
bool names_offset(const std::string& text, std::uint64_t off);

/// Counts hits; optionally checks regs.rip against an expected address.
struct Counter : uprobe::Consumer {
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> bad_ip{0};
  std::uint64_t expect_ip = 0;
  uprobe::Action handler(uprobe::Regs& regs) override {
    hits.fetch_add(1, std::memory_order_relaxed);
    if (expect_ip != 0 && regs.rip != expect_ip) bad_ip.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

/// Stats difference b - a, field by field.
using testsupport::stats_delta;  // tests/support/stats_delta.hpp
using testsupport::stats_str;

/// Restores the default configuration when it goes out of scope.
struct ConfigGuard {
  uprobe::Config saved = uprobe::configuration();
  ~ConfigGuard() { uprobe::configure(saved); }
};

/// Runs `fn`, expects uprobe::Error with `code`, `path()` == path, `offset()`
/// == offset and a what() naming both. Returns the what() (empty on failure).
template <typename F>
std::string expect_error(F&& fn, uprobe::Errc code, const std::string& path, std::uint64_t offset,
                         const char* what_for) {
  try {
    fn();
  } catch (const uprobe::Error& e) {
    std::string w = e.what();
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << what_for << ": what() = " << w;
    EXPECT_EQ(e.path(), path) << what_for << ": what() = " << w;
    EXPECT_EQ(e.offset(), offset) << what_for << ": what() = " << w;
    EXPECT_NE(w.find(path), std::string::npos) << what_for << ": what() does not name the path " << path
                                                << ": " << w;
    EXPECT_TRUE(names_offset(w, offset))
        << what_for << ": what() does not name the offset " << offset << " (" << hex(offset) << "): " << w;
    return w;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what_for << ": expected uprobe::Error, got std::exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << what_for << ": expected uprobe::Error (code " << static_cast<int>(code)
                << "), nothing was thrown";
  return {};
}

}  // namespace coretest
