// SPDX-License-Identifier: MIT
#pragma once
// Linear sweeps (sweep.cpp): the instructions of a function one after the
// other, their lengths as Capstone gives them, measured from a table for
// the common encodings and asked of Capstone for the rest. Internal to
// arch/ (window.cpp, disasm.cpp).

#include <cstddef>
#include <cstdint>
#include <string>

namespace uprobe::arch {

/// The length of the instruction at `b` (`n` bytes readable) as Capstone 4
/// decodes it in 64-bit mode, for the encodings the table knows (common
/// prefixes, one- and two-byte opcodes with their ModRM, SIB, displacement
/// and immediate); 0 for any other, which only Capstone can tell (and for
/// bytes too few to hold the instruction). `lea` is set when it is a `lea`
/// (Capstone's X86_INS_LEA); `branch` when it is a direct branch with a
/// rel8 or rel32 (branch_info() finds it relative). Pure; async-signal-safe.
std::size_t known_length(const std::uint8_t* b, std::size_t n, bool& lea, bool& branch) noexcept;

/// One instruction of a sweep.
struct SweepStep {
  std::size_t len = 0;    ///< 0: not decodable (Capstone fails; with `vex`, not a VEX/EVEX form either)
  bool lea = false;       ///< a `lea` (Capstone's X86_INS_LEA)
  bool branch = false;    ///< may be a direct branch: ask branch_info() (false: it is none)
  bool capstone = false;  ///< Capstone was asked (the table does not know the encoding)
};

/// The instruction at `code` (`left` bytes readable) as a Capstone sweep
/// sees it: known_length(), else Capstone's decoding; with `vex`, a VEX or
/// EVEX form Capstone 4 cannot decode is stepped over by vex_length() (none
/// is a branch or a lea; without `vex` it is undecodable, and VEX forms are
/// Capstone's alone). Not async-signal-safe (Capstone); thread-safe (one
/// Capstone handle per thread).
SweepStep sweep_step(const std::uint8_t* code, std::size_t left, bool vex);

/// The length of the VEX- or EVEX-encoded (AVX, AVX-512) instruction at
/// `b`, or 0 when it is not one or is truncated (see sweep.cpp). Pure.
std::size_t vex_length(const std::uint8_t* b, std::size_t n) noexcept;

/// What one decoded instruction of `n` bytes at `b` is as a branch, from its
/// bytes: a direct one (jmp, Jcc, call, loop/jrcxz, xbegin; rel8, rel32, or
/// rel16 after a 66 prefix) with its target at end + rel.
struct BranchInfo {
  bool relative = false;  ///< a direct branch: target = end + rel
  std::int64_t rel = 0;
};
BranchInfo branch_info(const std::uint8_t* b, std::size_t n) noexcept;

/// The target of `lea disp32(%rip), reg` (prefixes 66, 67 and REX, 8d,
/// ModRM mod=00 rm=101, disp32) of `n` bytes at `b`, ending at `end`; false
/// for any other lea. Pure.
bool lea_rip_target(const std::uint8_t* b, std::size_t n, std::uint64_t end, std::uint64_t& target) noexcept;

/// Whether this thread's Capstone handle could be opened (a sweep asks
/// Capstone for what the table does not know). Thread-safe.
bool sweep_available();

/// Capstone's text of the instruction at `code` as if at `address`
/// ("mnemonic op_str", as a sweep's refusal quotes it), "" when it cannot
/// decode it. Not async-signal-safe; thread-safe.
std::string sweep_text(const std::uint8_t* code, std::size_t left, std::uint64_t address);

}  // namespace uprobe::arch
