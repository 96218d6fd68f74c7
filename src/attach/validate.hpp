// SPDX-License-Identifier: MIT
#pragma once
// Register-time checks of a probe request (the kernel's prepare_uprobe() and
// arch_uprobe_analyze_insn() plus what only user space can tell: the symbol
// table says where instructions start).

#include <sys/stat.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "arch.hpp"

namespace uprobe::detail {

struct NeighbourCache;  // neighbours.cpp
class VmaSnapshot;     // vma_snapshot.hpp

/// An opened probe target.
struct Target {
  std::string path;
  int fd = -1;
  struct stat st {};
  /// Set by a transaction of more than one request (attach_txn.hpp):
  /// analyze_target() reads code
  /// through a window of the file (a copy: see read_code() in validate.cpp),
  /// one pread() per window instead of one per function.
  bool batch = false;
  mutable std::uint8_t* window = nullptr;  ///< file bytes [window_offset, window_offset + window_size), munmap()ed by ~Target
  mutable std::size_t window_size = 0;
  mutable std::uint64_t window_offset = 0;
  /// The neighbour index of this file's ELF image (neighbours.hpp): per
  /// neighbour function, the targets of its direct branches and rip-relative
  /// leas, swept once for every window around it, in this transaction and
  /// the later ones. Found at the first check; owned by a table that is
  /// never freed, or by `own_neighbour_cache` when that is full.
  mutable NeighbourCache* neighbour_cache = nullptr;
  mutable NeighbourCache* own_neighbour_cache = nullptr;  // (deleted by ~Target)
  Target() = default;
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;
  ~Target();
};

/// The file's bytes [off, off + len): a view of a batch's window of the
/// target's file (no copy; valid until the window is filled again), else
/// read into `scratch` (validate.cpp).
std::span<const std::uint8_t> view_code(const Target& t, std::uint64_t off, std::size_t len,
                                        std::vector<std::uint8_t>& scratch);

/// Opens `path` and checks it is a regular file holding `offset`.
/// @throws uprobe::Error (file_not_found, bad_offset, not_executable).
void open_target(const std::string& path, std::uint64_t offset, Target& out);

/// Checks that `offset` is executable code at an instruction start and that
/// the instruction there can be probed; fills `insn` from the file's bytes.
/// When `plan` is given, also plans how the site is patched: arch::plan()
/// with the file's facts around the offset (function bounds, the filler after
/// a short function, neighbours' branches, data references, landing pads).
/// `function_entry`,
/// when given, is set to whether the offset is the entry of a function the
/// symbol table sizes (an ABI boundary: see arch::SaveMode::entry).
/// @throws uprobe::Error (not_executable, mid_instruction, refused_instruction).
void analyze_target(const Target& t, std::uint64_t offset, arch::Insn& insn, arch::PatchPlan* plan = nullptr,
                    bool* function_entry = nullptr);

/// A return probe needs the return address at *rsp: refuses an offset that
/// the symbol table places inside a function but not at its entry, and the
/// entry of vfork (any symbol there named vfork, __vfork, __libc_vfork),
/// whose child returns first, in the parent's memory and TLS, and would
/// take the parent's return instance, and the exception unwinder's entry
/// points (_Unwind_RaiseException, _Unwind_Resume, _Unwind_Resume_or_Rethrow,
/// _Unwind_ForcedUnwind), which unwind from their own frame: its replaced
/// return address would stop every unwind (std::terminate()).
/// @throws uprobe::Error(refused_instruction).
void check_function_entry(const Target& t, std::uint64_t offset);

}  // namespace uprobe::detail
