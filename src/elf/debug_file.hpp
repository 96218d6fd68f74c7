// SPDX-License-Identifier: MIT
#pragma once
/// @file debug_file.hpp
/// The separate debug file of an image, found by build-id in the system's
/// debug directory (where Debian's -dbg packages install them):
/// build_id_hex(), debug_file_path() (elf_image.cpp reads its .symtab at
/// ImageDepth::with_debug_file) and debug_file_refines() (declared in
/// elf_image.hpp: a scan of the function bounds of a deferred debug file),
/// defined in debug_file.cpp.

#include <libelf.h>

#include <string>

namespace uprobe::detail {

/// The build-id of `e` (NT_GNU_BUILD_ID) as lowercase hex, "" when none.
std::string build_id_hex(Elf* e);

/// Where the debug file of build-id `id` (build_id_hex()) would be: its
/// name in the system's debug directory; "" for no build-id.
std::string debug_file_path(const std::string& id);

}  // namespace uprobe::detail
