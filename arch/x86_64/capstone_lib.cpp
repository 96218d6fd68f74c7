// SPDX-License-Identifier: MIT
/// @file capstone_lib.cpp
/// Capstone's functions through the shared library loaded on first use
/// (capstone_lib.hpp says why).

#include "capstone_lib.hpp"

#include "arch.hpp"
#include "next_symbol.hpp"  // (src/common: header-only)

#include <dlfcn.h>

#define UPROBE_STR2(x) #x
#define UPROBE_STR(x) UPROBE_STR2(x)

// (Default visibility: a definition in the program or in another library
// must bind; weak: none is fine.)
extern "C" {
__attribute__((weak, visibility("default"))) extern const int uprobe_decoder_on_demand;
}

namespace uprobe::arch::capstone {
namespace {

constexpr const char kSoname[] = "libcapstone.so." UPROBE_STR(CS_API_MAJOR);

struct Api {
  decltype(&::cs_open) open = nullptr;
  decltype(&::cs_option) option = nullptr;
  decltype(&::cs_malloc) malloc_insn = nullptr;
  decltype(&::cs_free) free_insn = nullptr;
  decltype(&::cs_close) close = nullptr;
  decltype(&::cs_disasm_iter) disasm_iter = nullptr;
  decltype(&::cs_regs_access) regs_access = nullptr;
  std::string error;
};

template <typename F>
void bind(void* lib, const char* name, F& f, std::string& error) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f && error.empty()) error = std::string(kSoname) + " has no " + name;
}

Api load() {
  Api a;
  // libc's dlopen (libuprobe interposes dlopen() to resync probes: not
  // wanted for its own decoder), wherever libuprobe sits in the search order.
  using DlopenFn = void* (*)(const char*, int);
  auto real_dlopen = reinterpret_cast<DlopenFn>(uprobe::detail::libc_symbol("dlopen"));
  void* lib = real_dlopen ? real_dlopen(kSoname, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!lib) {
    const char* why = dlerror();
    a.error = std::string("Capstone (") + kSoname + ") cannot be loaded: " + (why ? why : "no dlopen");
    return a;
  }
  bind(lib, "cs_open", a.open, a.error);
  bind(lib, "cs_option", a.option, a.error);
  bind(lib, "cs_malloc", a.malloc_insn, a.error);
  bind(lib, "cs_free", a.free_insn, a.error);
  bind(lib, "cs_close", a.close, a.error);
  bind(lib, "cs_disasm_iter", a.disasm_iter, a.error);
  bind(lib, "cs_regs_access", a.regs_access, a.error);
  return a;  // (never dlclose()d: its handles live in thread_local decoders)
}

const Api& api() noexcept {
  static const Api& a = *new const Api(load());  // never destroyed (decoders of exiting threads)
  return a;
}

/// Loaded with libuprobe, as a linked library would be: a request refused
/// later changes nothing in the process, not even its list of mappings.
/// Unless the program (or a library loaded with it) defines
/// `extern "C" const int uprobe_decoder_on_demand = 1;` (uprobe-trace's
/// command line and agent do): then at the first analysis.
__attribute__((constructor)) void load_with_libuprobe() {
  if (&uprobe_decoder_on_demand != nullptr && uprobe_decoder_on_demand) return;
  (void)api();
}

}  // namespace

cs_err open(cs_arch arch, cs_mode mode, csh* handle) noexcept {
  const Api& a = api();
  if (!a.error.empty()) return CS_ERR_HANDLE;
  return a.open(arch, mode, handle);
}
cs_err option(csh handle, cs_opt_type type, size_t value) noexcept { return api().option(handle, type, value); }
cs_insn* malloc_insn(csh handle) noexcept { return api().malloc_insn(handle); }
void free_insn(cs_insn* insn, size_t count) noexcept { api().free_insn(insn, count); }
cs_err close(csh* handle) noexcept { return api().close(handle); }
bool disasm_iter(csh handle, const uint8_t** code, size_t* size, uint64_t* address, cs_insn* insn) noexcept {
  return api().disasm_iter(handle, code, size, address, insn);
}
cs_err regs_access(csh handle, const cs_insn* insn, cs_regs regs_read, uint8_t* regs_read_count, cs_regs regs_write,
                   uint8_t* regs_write_count) noexcept {
  return api().regs_access(handle, insn, regs_read, regs_read_count, regs_write, regs_write_count);
}

}  // namespace uprobe::arch::capstone

namespace uprobe::arch {

const std::string& load_decoder() noexcept { return capstone::api().error; }

}  // namespace uprobe::arch
