// SPDX-License-Identifier: MIT
/// @file capstone_x86_only.c
/// Linked into libuprobe.so (and uprobe-trace's command line) before
/// Debian's libcapstone.a: Capstone's cs.o names each architecture's set-up
/// and option functions in its tables; these hidden definitions of the
/// other architectures' answer CS_ERR_ARCH, so the linker takes no object of
/// theirs from the archive. What remains is Capstone's x86 part, as
/// Capstone's own build makes it with only CAPSTONE_HAS_X86
/// (capstone_lib.hpp says why: ~2,000 relocations instead of ~77,000).
/// Never called by libuprobe (it opens CS_ARCH_X86 only).

#include <capstone/capstone.h>
#include <stddef.h>

struct cs_struct;

#define UPROBE_CS_NOT_LINKED(arch)                                                                \
  __attribute__((visibility("hidden"))) cs_err arch##_global_init(struct cs_struct* ud);        \
  cs_err arch##_global_init(struct cs_struct* ud) {                                             \
    (void)ud;                                                                                   \
    return CS_ERR_ARCH;                                                                         \
  }                                                                                             \
  __attribute__((visibility("hidden"))) cs_err arch##_option(struct cs_struct* handle,          \
                                                             cs_opt_type type, size_t value);   \
  cs_err arch##_option(struct cs_struct* handle, cs_opt_type type, size_t value) {              \
    (void)handle;                                                                               \
    (void)type;                                                                                 \
    (void)value;                                                                                \
    return CS_ERR_ARCH;                                                                         \
  }

UPROBE_CS_NOT_LINKED(ARM)
UPROBE_CS_NOT_LINKED(AArch64)
UPROBE_CS_NOT_LINKED(Mips)
UPROBE_CS_NOT_LINKED(PPC)
UPROBE_CS_NOT_LINKED(Sparc)
UPROBE_CS_NOT_LINKED(SystemZ)
UPROBE_CS_NOT_LINKED(XCore)
UPROBE_CS_NOT_LINKED(M68K)
UPROBE_CS_NOT_LINKED(TMS320C64x)
UPROBE_CS_NOT_LINKED(M680X)
UPROBE_CS_NOT_LINKED(EVM)
