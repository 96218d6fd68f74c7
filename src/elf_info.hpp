// SPDX-License-Identifier: MIT
#pragma once
// What the registry needs to know about an ELF file to accept a probe offset:
// its executable PT_LOAD ranges and its function symbols (.symtab and
// .dynsym), read with libelf and cached per (dev, ino, size, mtime).

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace uprobe::detail {

struct ExecSegment {
  std::uint64_t offset = 0, filesz = 0, vaddr = 0;
};

struct FuncSym {
  std::string name;
  std::uint64_t file_offset = 0;  ///< where the function starts in the file
  std::uint64_t size = 0;
};

struct ElfInfo {
  std::vector<ExecSegment> exec;  ///< executable PT_LOAD segments
  std::vector<FuncSym> funcs;     ///< sized STT_FUNC / STT_GNU_IFUNC symbols in executable segments, by file_offset
  std::vector<std::uint64_t> reach;  ///< reach[i]: the largest end (file_offset + size) of funcs[0..i]

  /// The executable segment holding file offset `off`, or nullptr.
  const ExecSegment* exec_segment(std::uint64_t off) const noexcept;
  /// The sized function whose bytes hold file offset `off`, or nullptr.
  const FuncSym* enclosing_function(std::uint64_t off) const noexcept;
};

/// Reads (or returns the cached) ElfInfo of the open file `fd` at `path`.
/// Returns nullptr with `why` set when the file is not a 64-bit ELF file.
/// Not thread-safe: caller holds the registry mutex.
std::shared_ptr<const ElfInfo> elf_info(int fd, const std::string& path, const struct stat& st, std::string& why);

}  // namespace uprobe::detail
