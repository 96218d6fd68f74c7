// SPDX-License-Identifier: MIT
#pragma once
/// @file capstone_lib.hpp
/// Capstone, libuprobe's decoder, through one place. libuprobe.so links
/// Capstone's x86 part only, from Debian's static archive (libcapstone.a),
/// with its symbols hidden (capstone_x86_only.c and CMakeLists.txt): the
/// shared libcapstone.so.4 has all of Capstone's architectures and ~77,000
/// relocations, which cost every process that maps it ~430 page faults
/// (~1.2 ms on a 2-vCPU VM); the x86 part has ~2,000. libuprobe.a, the
/// test archives and the fuzzers link Capstone as the program does
/// (`pkg-config --libs capstone`).
/// The functions mirror Capstone's of the same name (cs_open, ...).
/// Thread-safe as Capstone is (a handle per thread); not async-signal-safe
/// (cs_open allocates), as nothing that decodes is: analysis runs at attach
/// time only.

#include <capstone/capstone.h>

#include <string>

namespace uprobe::arch::capstone {

/// cs_open().
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

/// A Capstone handle with details on, and its instruction buffer: the
/// calling thread's, opened at its first use (detail_decoder()).
class DetailDecoder {
 public:
  DetailDecoder();
  ~DetailDecoder();
  DetailDecoder(const DetailDecoder&) = delete;
  DetailDecoder& operator=(const DetailDecoder&) = delete;
  /// Decodes one instruction of `code` (up to `size` bytes) as if at
  /// `address` (branch targets are absolute); nullptr if undecodable or the
  /// handle could not be opened. The result stays valid until the next call.
  const cs_insn* decode(const uint8_t* code, size_t size, uint64_t address = 0) noexcept;
  csh handle() const noexcept { return handle_; }

 private:
  csh handle_ = 0;
  cs_insn* insn_ = nullptr;
};

/// The calling thread's DetailDecoder.
DetailDecoder& detail_decoder();

}  // namespace uprobe::arch::capstone
