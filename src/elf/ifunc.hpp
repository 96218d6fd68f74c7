// SPDX-License-Identifier: MIT
#pragma once
// GNU indirect functions (STT_GNU_IFUNC): which implementation the dynamic
// linker binds each exported IFUNC of a loaded file to in this process, as
// glibc's dlsym()/dlvsym() answer (they run the resolver, as the dynamic
// linker does for a relocation). One place for every user: resolve_symbol()
// and resolve_location() (symbols.hpp), probe_info() (uprobe.hpp), and
// through them uprobe-trace. Not used on the hit path.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "uprobe/symbols.hpp"

namespace uprobe::detail {

/// One exported IFUNC and the implementation it is bound to here.
struct IfuncBinding {
  Symbol ifunc;               ///< the .dynsym IFUNC symbol (st_value: its resolver)
  std::string impl_path;      ///< canonical path of the file holding the implementation
  std::uint64_t impl_offset;  ///< the implementation's file offset in impl_path
  dev_t impl_dev;             ///< st_dev of impl_path
  ino_t impl_ino;             ///< st_ino of impl_path
  std::uint64_t impl_address = 0;  ///< its link-time address (offset_to_address(impl_path, impl_offset))
  /// The code symbol starting there (symbol_at(impl_path, impl_offset),
  /// full_name()), "" when the symbol holding it starts elsewhere or none does.
  std::string implementation;
};

/// Every exported (.dynsym) STT_GNU_IFUNC symbol of `path` whose binding the
/// dynamic linker gives in this process, with that binding. Empty when the
/// file is not loaded here (nothing was bound yet). Cached per file while the
/// object the dynamic linker loaded stays (same name and load address: found
/// again through dl_iterate_phdr, no system call but the stat of `path`): a
/// resolver's choice does not change while it stays loaded. Opens no file but the ELF image; calls libc's own dlopen(RTLD_NOLOAD)
/// and dlclose (not libuprobe's interposed ones), so the registry mutex may
/// be held. Not async-signal-safe; not from a probe handler.
/// Returned shared, not copied (probe_info() asks once per probe: copying
/// every binding's strings each time was thousands of memcpy calls per
/// attach of a whole library, traps while memcpy's implementation is int3).
/// Never null. Thread-safety: any thread (internal mutex).
std::shared_ptr<const std::vector<IfuncBinding>> ifunc_bindings(const std::string& path);

}  // namespace uprobe::detail
