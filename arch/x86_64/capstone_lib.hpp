// SPDX-License-Identifier: MIT
#pragma once
/// @file capstone_lib.hpp
/// Capstone, loaded by libuprobe itself rather than linked: its ~77,000
/// relocations cost every process that loads it a few hundred page faults
/// at start-up (several milliseconds on a VM), which a process that never
/// analyses an instruction (uprobe-trace's command line; a traced child
/// whose probes are all in other files) need not pay. By default it is
/// loaded by a constructor of libuprobe (so a refused request never changes
/// the process's mappings); a program that defines
/// `extern "C" const int uprobe_decoder_on_demand = 1;` gets it at the first
/// call of a function here instead. Loaded as `libcapstone.so.<CS_API_MAJOR>`
/// (the major version compiled against) with the dynamic linker's own
/// dlopen() (not libuprobe's interposed one: no probe resync from inside an
/// attach).
/// The functions mirror Capstone's of the same name (cs_open, ...).
/// Thread-safe (the load happens once); not async-signal-safe (dlopen), as
/// nothing that decodes is: analysis runs at attach time only.

#include <capstone/capstone.h>

#include <string>

namespace uprobe::arch::capstone {

/// cs_open(); CS_ERR_HANDLE when Capstone cannot be loaded (arch::load_decoder() says why).
cs_err open(cs_arch arch, cs_mode mode, csh* handle) noexcept;
/// cs_option().
cs_err option(csh handle, cs_opt_type type, size_t value) noexcept;
/// cs_malloc().
cs_insn* malloc_insn(csh handle) noexcept;
/// cs_free().
void free_insn(cs_insn* insn, size_t count) noexcept;
/// cs_close().
cs_err close(csh* handle) noexcept;
/// cs_disasm_iter().
bool disasm_iter(csh handle, const uint8_t** code, size_t* size, uint64_t* address, cs_insn* insn) noexcept;
/// cs_regs_access().
cs_err regs_access(csh handle, const cs_insn* insn, cs_regs regs_read, uint8_t* regs_read_count,
                   cs_regs regs_write, uint8_t* regs_write_count) noexcept;

}  // namespace uprobe::arch::capstone
