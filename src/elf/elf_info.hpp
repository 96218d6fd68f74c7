// SPDX-License-Identifier: MIT
#pragma once
// What the registry needs to know about an ELF file to accept a probe offset:
// its executable PT_LOAD ranges and its function bounds, from the one ELF
// model (elf_image.hpp: .symtab, .dynsym, the debug file's .symtab, the
// .eh_frame FDEs) and its cache. This header only adapts the registry's
// calls (an open file, an error string instead of an exception).

#include <sys/stat.h>

#include <memory>
#include <string>

#include "elf_image.hpp"

namespace uprobe::detail {

using ElfInfo = ElfImage;

/// The ELF image (load_elf_image()) of the open file `fd` at `path`, `st`
/// its fstat(). Returns nullptr with `why` set when the file is not a 64-bit
/// x86-64 executable or shared object.
/// Thread-safety: any thread (the image cache's mutex).
std::shared_ptr<const ElfInfo> elf_info(int fd, const std::string& path, const struct stat& st, std::string& why);

}  // namespace uprobe::detail
