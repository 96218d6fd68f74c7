// SPDX-License-Identifier: MIT
#pragma once
// What the registry needs to know about an ELF file to accept a probe offset:
// its executable PT_LOAD ranges and its function bounds, from the one ELF
// model (elf_image.hpp: .symtab, .dynsym, the debug file's .symtab, the
// .eh_frame FDEs) and its cache. This header only adapts the registry's
// calls (an open file, an error string instead of an exception) and says
// which depth of image each question needs.

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>

#include "elf_image.hpp"

namespace uprobe::detail {

using ElfInfo = ElfImage;

/// The ELF image (load_elf_image()) of the open file `fd` at `path`, `st`
/// its fstat(), at ImageDepth::file_tables: the file's own symbols and its
/// FDEs, which bound every function the compiler emitted unwind tables for
/// (the registry's sweeps, windows and neighbours need bounds, not names);
/// function_at() goes deeper where a name is missing. Returns nullptr with
/// `why` set when the file is not a 64-bit x86-64 executable or shared
/// object.
/// Thread-safety: any thread (the image cache's mutex).
std::shared_ptr<const ElfInfo> elf_info(int fd, const std::string& path, const struct stat& st, std::string& why,
                                        ImageDepth depth = ImageDepth::file_tables);

/// The function whose bounds hold file offset `offset`
/// (ElfImage::enclosing_function()), from `info`. Where `info` left its
/// debug file's symbols out (ElfImage::debug_deferred) and its own tables do
/// not settle it, from the image with them, which then replaces `info` for
/// the caller's later questions too: the answer is always the one of that
/// image. The own tables settle it with a symbol of theirs that no function
/// of the debug file refines (debug_file_refines(): a scan of its function
/// bounds, no image); not with an FDE's unnamed bounds (a local function,
/// whose name only the debug file has), nor where no function holds the
/// offset. `fd`, `path`, `st` as for elf_info(). nullptr when no function
/// holds the offset.
/// Thread-safety: any thread.
const FuncSym* function_at(std::shared_ptr<const ElfInfo>& info, int fd, const std::string& path,
                           const struct stat& st, std::uint64_t offset);

}  // namespace uprobe::detail
