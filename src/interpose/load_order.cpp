// SPDX-License-Identifier: MIT
// Where libuprobe sits in the search order (load_order.hpp).

#include "load_order.hpp"

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <link.h>

#include "object_of.hpp"

namespace uprobe::detail {

bool interposers_in_front() noexcept {
  static const bool in_front = [] {
    const struct link_map* self = object_of(reinterpret_cast<const void*>(&interposers_in_front));
    const struct link_map* libc = object_of(reinterpret_cast<const void*>(&gnu_get_libc_version));
    if (!self || !libc) return true;  // (not found: nothing to compare, as before)
    // Loaded into a namespace of its own (dlmopen): the program's calls go
    // to the libc of the base namespace, which libuprobe never stands before.
    Lmid_t ns = LM_ID_BASE;
    if (dlinfo(const_cast<struct link_map*>(self), RTLD_DI_LMID, &ns) == 0 && ns != LM_ID_BASE) return false;
    // The link maps of the main namespace, in load order: the order of the
    // global scope that symbol lookups search (the program, LD_PRELOAD, then
    // the dependencies breadth first, then what dlopen(RTLD_GLOBAL) adds).
    const struct link_map* m = self;
    while (m->l_prev) m = m->l_prev;
    for (; m; m = m->l_next) {
      if (m == self) return true;
      if (m == libc) return false;
    }
    return true;
  }();
  return in_front;
}

}  // namespace uprobe::detail
