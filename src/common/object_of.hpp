// SPDX-License-Identifier: MIT
#pragma once
// object_of(): the loaded object holding an address, without a symbol scan.

#include <dlfcn.h>
#include <link.h>

namespace uprobe::detail {

/// The link map of the object (the program, a library, the dynamic linker)
/// whose mapping holds `addr`; nullptr when none does. glibc's
/// _dl_find_object() (2.35: a lock-free binary search over the objects'
/// address ranges) where it exists, else dladdr1(RTLD_DL_LINKMAP), which
/// also scans the object's dynamic symbols for the nearest one (20-40 us
/// for libc's, on every call; libuprobe's and uprobe-trace's agent's start
/// made eight such calls). Its l_name is dladdr()'s dli_fname ("" for the
/// program). Thread-safe.
inline struct link_map* object_of(const void* addr) noexcept {
#if defined(DLFO_EH_SEGMENT_TYPE)
  struct dl_find_object o;
  if (_dl_find_object(const_cast<void*>(addr), &o) == 0) return o.dlfo_link_map;
#endif
  Dl_info di;
  struct link_map* lm = nullptr;
  return dladdr1(addr, &di, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) ? lm : nullptr;
}

}  // namespace uprobe::detail
