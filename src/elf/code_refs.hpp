// SPDX-License-Identifier: MIT
#pragma once
// Code addresses that an ELF file's data stores: where an indirect jump may
// land that no instruction of the code names (a computed goto's table of
// label addresses, a jump table of absolute addresses, a function pointer
// to a label). A displacement window must not cover such an address past
// its first byte.

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "elf_image.hpp"

namespace uprobe::detail {

/// The link-time addresses inside an executable PT_LOAD that the file `fd`
/// (at `path`, image `img`) stores in its data, sorted and unique: in a
/// position-independent file (ET_DYN) the addends of its relocations of the
/// type for which `is_relative(type)` is true (the caller's architecture's
/// R_*_RELATIVE: arch::is_relative_reloc()); in a fixed-address executable
/// (ET_EXEC) every 8-byte-aligned quadword of its PT_LOAD file bytes whose
/// value lies in an executable segment (a superset: the check it serves
/// refuses more, never less). Computed once per file (dev, inode) and cached
/// for the life of the process. Returns nullptr with `why` set when the file
/// stores addresses in a form not read here (SHT_REL or SHT_RELR
/// relocations) or cannot be read.
/// Not hot; thread-safe (an internal mutex).
std::shared_ptr<const std::vector<std::uint64_t>> data_code_refs(int fd, const std::string& path,
                                                                 const ElfImage& img,
                                                                 bool (*is_relative)(std::uint32_t type),
                                                                 std::string& why);

}  // namespace uprobe::detail
