// SPDX-License-Identifier: MIT
#pragma once
// The .eh_frame walk of the ELF image (func_index.cpp): one entry at a time,
// as libdw's dwarf_next_cfi() reads it.

#include <elfutils/libdw.h>
#include <libelf.h>

namespace uprobe::detail {

/// The entry of .eh_frame `data` (of an ELF file whose e_ident is `ident`)
/// at offset `off`, read as dwarf_next_cfi(ident, data, true, off, &next,
/// &entry) reads it, with the same answer: a well-formed FDE (32-bit length,
/// inside the section, its CIE pointer inside what precedes it) is taken
/// here, with the checks libdw makes of it (of an FDE, libdw reads only its
/// length and CIE pointer); anything else (a CIE, the terminator, a 64-bit
/// length, a malformed entry) is left to libdw. Returns 0 (an entry, `next`
/// past it), 1 (the end) or -1 (invalid).
int next_cfi_entry(const char* ident, Elf_Data* data, Dwarf_Off off, Dwarf_Off& next, Dwarf_CFI_Entry& entry);

}  // namespace uprobe::detail
