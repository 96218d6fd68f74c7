// SPDX-License-Identifier: MIT
#pragma once
// A read-only model of an ELF file for symbol, address and USDT resolution:
// its PT_LOAD segments, every defined symbol of .symtab and .dynsym (with
// GNU symbol versions), its .dynamic strings (SONAME, RPATH, RUNPATH) and its
// .note.stapsdt notes. Read with libelf, copied out, and cached per
// (dev, ino, size, mtime). Not used on the hit path.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "uprobe/symbols.hpp"

namespace uprobe::detail {

struct LoadSegment {
  std::uint64_t offset = 0, vaddr = 0, filesz = 0, memsz = 0;
  std::uint32_t flags = 0;  ///< PF_R / PF_W / PF_X
  bool executable() const noexcept;
};

/// One NT_STAPSDT note, fields as written in the file.
struct StapsdtNote {
  std::uint64_t pc = 0, base = 0, semaphore = 0;
  std::string provider, name, args;
};

struct ElfImage {
  dev_t dev = 0;
  ino_t ino = 0;
  std::uint16_t type = 0;  ///< ET_EXEC or ET_DYN
  std::vector<LoadSegment> loads;
  std::vector<Symbol> symbols;  ///< defined symbols, .symtab entries first
  bool has_symtab = false;
  bool has_dynsym = false;
  std::string soname;
  std::vector<std::string> rpath, runpath;  ///< split at ':', unexpanded
  std::optional<std::uint64_t> stapsdt_base;  ///< sh_addr of .stapsdt.base
  bool has_stapsdt_section = false;
  std::vector<StapsdtNote> notes;
  std::size_t malformed_notes = 0;

  /// The PT_LOAD whose file bytes hold link-time address `vaddr`, or nullptr.
  const LoadSegment* segment_of_vaddr(std::uint64_t vaddr) const noexcept;
  /// The PT_LOAD whose file bytes hold file offset `off` (executable first), or nullptr.
  const LoadSegment* segment_of_offset(std::uint64_t off) const noexcept;
};

/// Reads (or returns the cached) image of `path`.
/// @throws uprobe::Error: file_not_found (cannot open/stat), not_executable
/// (not a 64-bit x86-64 ET_EXEC/ET_DYN ELF file).
/// Thread-safety: any thread (internal mutex).
std::shared_ptr<const ElfImage> load_elf_image(const std::string& path);

/// "0x1234".
std::string hex_str(std::uint64_t v);

}  // namespace uprobe::detail
