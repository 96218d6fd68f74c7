// SPDX-License-Identifier: MIT
/// @file capstone_lib.cpp
/// Capstone's functions, called through one place (capstone_lib.hpp says
/// how libuprobe links it).

#include "capstone_lib.hpp"
#include "thread_object.hpp"

namespace uprobe::arch::capstone {

cs_err open(cs_arch arch, cs_mode mode, csh* handle) noexcept { return ::cs_open(arch, mode, handle); }
cs_err option(csh handle, cs_opt_type type, size_t value) noexcept { return ::cs_option(handle, type, value); }
cs_insn* malloc_insn(csh handle) noexcept { return ::cs_malloc(handle); }
void free_insn(cs_insn* insn, size_t count) noexcept { ::cs_free(insn, count); }
cs_err close(csh* handle) noexcept { return ::cs_close(handle); }
bool disasm_iter(csh handle, const uint8_t** code, size_t* size, uint64_t* address, cs_insn* insn) noexcept {
  return ::cs_disasm_iter(handle, code, size, address, insn);
}
cs_err regs_access(csh handle, const cs_insn* insn, cs_regs regs_read, uint8_t* regs_read_count, cs_regs regs_write,
                   uint8_t* regs_write_count) noexcept {
  return ::cs_regs_access(handle, insn, regs_read, regs_read_count, regs_write, regs_write_count);
}

DetailDecoder::DetailDecoder() {
  if (open(CS_ARCH_X86, CS_MODE_64, &handle_) != CS_ERR_OK) {
    handle_ = 0;
    return;
  }
  option(handle_, CS_OPT_DETAIL, CS_OPT_ON);
  insn_ = malloc_insn(handle_);
}

DetailDecoder::~DetailDecoder() {
  if (insn_ != nullptr) free_insn(insn_, 1);
  if (handle_ != 0) close(&handle_);
}

const cs_insn* DetailDecoder::decode(const uint8_t* code, size_t size, uint64_t address) noexcept {
  if (insn_ == nullptr) return nullptr;
  return disasm_iter(handle_, &code, &size, &address, insn_) ? insn_ : nullptr;
}

DetailDecoder& detail_decoder() { return uprobe::detail::thread_object<DetailDecoder>(); }

}  // namespace uprobe::arch::capstone
