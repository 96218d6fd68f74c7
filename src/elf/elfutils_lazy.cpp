// SPDX-License-Identifier: MIT
/// @file elfutils_lazy.cpp
/// The libelf and libdw functions libuprobe.so calls, defined here (hidden:
/// src/api/libuprobe.map exports none of them) and forwarded to elfutils'
/// libraries, which libuprobe.so does not name as dependencies: its
/// initializer loads them (dlopen, RTLD_LOCAL; a request refused later maps
/// no new code), unless uprobe::defer_elfutils() was called before it ran:
/// then the first call of one of these loads them, when a file is first read
/// as ELF. uprobe-trace's agent defers: a traced process whose ELF tables an
/// earlier run kept (elf_tables.cpp) reads no file, and no longer maps and
/// relocates libdw, libelf, libz, liblzma and libbz2 as it starts (~0.3 ms of
/// a 2-vCPU VM's process start, and liblzma's cpuid calls, each a trap to the
/// hypervisor there). In libuprobe.so only: libuprobe.a's users and
/// uprobe-trace's command line link elfutils themselves.
///
/// libc's own dlopen, not libuprobe's interposer (which resyncs the probes
/// after a load: the calls here come from inside the registry's work). A
/// probe registered on a function of libelf or libdw before libuprobe loads
/// them is attached at the next dlopen()/dlclose() of the program, as for any
/// library loaded behind the dynamic linker's public entry points.
/// Every read asks elfutils_available() (elf_image.hpp) first: when libelf
/// or libdw cannot be loaded it fails, saying which and why (dlerror()); a
/// read must not go on without libdw (no .eh_frame bounds, no build-id:
/// an offset inside an instruction would pass for an instruction start).
/// Past that check each function here also returns its own failure value
/// (nullptr, -1, EV_NONE, ELF_K_NONE) if its library or symbol is missing.
/// Thread-safe (a race loads a library twice: dlopen counts references, the
/// handle is the same); not async-signal-safe (no hit path reads ELF).

#include <dlfcn.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <gelf.h>
#include <libelf.h>

#include <atomic>
#include <string>
#include <utility>

#include "elf_image.hpp"
#include "next_symbol.hpp"

namespace {

enum Lib : unsigned { kLibelf, kLibdw };
constexpr const char* kSoname[] = {"libelf.so.1", "libdw.so.1"};

/// Library `lib`'s handle, loaded on the first call that succeeds (a failure
/// is not kept: a process out of descriptors now may load it later);
/// nullptr, with `why` (the file and dlerror()'s words, this thread's) when
/// given, when it cannot be loaded.
void* library(Lib lib, std::string* why = nullptr) noexcept {
  static std::atomic<void*> handles[2];
  void* h = handles[lib].load(std::memory_order_acquire);
  if (h) return h;
  const auto open = uprobe::detail::libc_dlopen();
  h = open ? open(kSoname[lib], RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!h) {
    if (why) {
      const char* e = open ? dlerror() : "libc's dlopen not found";
      try {
        *why = std::string("libuprobe cannot load ") + kSoname[lib] + ": " + (e ? e : "unknown error");
      } catch (...) {  // (out of memory: the reason is lost, the failure is not)
      }
    }
    return nullptr;
  }
  handles[lib].store(h, std::memory_order_release);
  return h;
}

// Every function forwarded: X(library, return type, name, parameters,
// arguments, value when missing). elf_errmsg is the one more (below).
#define UPROBE_ELFUTILS_FUNCTIONS(X) \
  X(kLibelf, unsigned int, elf_version, (unsigned int v), (v), EV_NONE) \
  X(kLibelf, Elf*, elf_begin, (int fd, Elf_Cmd cmd, Elf* ref), (fd, cmd, ref), nullptr) \
  X(kLibelf, int, elf_cntl, (Elf * e, Elf_Cmd cmd), (e, cmd), -1) \
  X(kLibelf, int, elf_end, (Elf * e), (e), 0) \
  X(kLibelf, Elf_Data*, elf_getdata, (Elf_Scn * s, Elf_Data* d), (s, d), nullptr) \
  X(kLibelf, Elf_Data*, elf_rawdata, (Elf_Scn * s, Elf_Data* d), (s, d), nullptr) \
  X(kLibelf, char*, elf_getident, (Elf * e, size_t* n), (e, n), nullptr) \
  X(kLibelf, int, elf_getphdrnum, (Elf * e, size_t* n), (e, n), -1) \
  X(kLibelf, Elf_Scn*, elf_getscn, (Elf * e, size_t i), (e, i), nullptr) \
  X(kLibelf, int, elf_getshdrstrndx, (Elf * e, size_t* n), (e, n), -1) \
  X(kLibelf, Elf_Kind, elf_kind, (Elf * e), (e), ELF_K_NONE) \
  X(kLibelf, Elf_Scn*, elf_nextscn, (Elf * e, Elf_Scn* s), (e, s), nullptr) \
  X(kLibelf, char*, elf_strptr, (Elf * e, size_t s, size_t o), (e, s, o), nullptr) \
  X(kLibelf, GElf_Dyn*, gelf_getdyn, (Elf_Data * d, int i, GElf_Dyn* o), (d, i, o), nullptr) \
  X(kLibelf, GElf_Ehdr*, gelf_getehdr, (Elf * e, GElf_Ehdr* o), (e, o), nullptr) \
  X(kLibelf, size_t, gelf_getnote, (Elf_Data * d, size_t off, GElf_Nhdr* n, size_t* name, size_t* desc), (d, off, n, name, desc), 0) \
  X(kLibelf, GElf_Phdr*, gelf_getphdr, (Elf * e, int i, GElf_Phdr* o), (e, i, o), nullptr) \
  X(kLibelf, GElf_Rela*, gelf_getrela, (Elf_Data * d, int i, GElf_Rela* o), (d, i, o), nullptr) \
  X(kLibelf, GElf_Shdr*, gelf_getshdr, (Elf_Scn * s, GElf_Shdr* o), (s, o), nullptr) \
  X(kLibelf, GElf_Sym*, gelf_getsym, (Elf_Data * d, int i, GElf_Sym* o), (d, i, o), nullptr) \
  X(kLibelf, GElf_Verdaux*, gelf_getverdaux, (Elf_Data * d, int i, GElf_Verdaux* o), (d, i, o), nullptr) \
  X(kLibelf, GElf_Verdef*, gelf_getverdef, (Elf_Data * d, int i, GElf_Verdef* o), (d, i, o), nullptr) \
  X(kLibelf, GElf_Versym*, gelf_getversym, (Elf_Data * d, int i, GElf_Versym* o), (d, i, o), nullptr) \
  X(kLibdw, int, dwarf_next_cfi, (const unsigned char e_ident[], Elf_Data* data, bool eh_frame_p, Dwarf_Off offset, Dwarf_Off* next_offset, Dwarf_CFI_Entry* entry), (e_ident, data, eh_frame_p, offset, next_offset, entry), -1) \
  X(kLibdw, ssize_t, dwelf_elf_gnu_build_id, (Elf * e, const void** id), (e, id), -1)

enum Fn : unsigned {
#define UPROBE_ELFUTILS_ENUM(lib, ret, name, params, args, fail) kFn_##name,
  UPROBE_ELFUTILS_FUNCTIONS(UPROBE_ELFUTILS_ENUM) kFn_elf_errmsg,
  kFnCount
#undef UPROBE_ELFUTILS_ENUM
};

struct FnName {
  Lib lib;
  const char* name;
};
constexpr FnName kFnNames[kFnCount] = {
#define UPROBE_ELFUTILS_NAME(lib, ret, name, params, args, fail) {lib, #name},
    UPROBE_ELFUTILS_FUNCTIONS(UPROBE_ELFUTILS_NAME){kLibelf, "elf_errmsg"}
#undef UPROBE_ELFUTILS_NAME
};

/// The functions' addresses, looked up all at once (resolve_all()): a
/// first call's lookup under the registry mutex would wait for the dynamic
/// linker's lock, which a thread in dlopen() holds while a constructor that
/// registers a probe waits for the mutex.
std::atomic<void*> g_fns[kFnCount];

void* resolve(Fn fn) noexcept {
  void* f = g_fns[fn].load(std::memory_order_acquire);
  if (f) return f;
  void* h = library(kFnNames[fn].lib);
  if (!h || !(f = dlsym(h, kFnNames[fn].name))) return nullptr;
  g_fns[fn].store(f, std::memory_order_release);
  return f;
}

/// Loads both libraries and looks every function up; false, with `why`
/// when given, at the first that is missing.
bool resolve_all(std::string* why) noexcept {
  if (!library(kLibelf, why) || !library(kLibdw, why)) return false;
  for (unsigned i = 0; i < kFnCount; ++i)
    if (!resolve(static_cast<Fn>(i))) {
      if (why) {
        try {
          *why = std::string(kSoname[kFnNames[i].lib]) + " has no " + kFnNames[i].name;
        } catch (...) {
        }
      }
      return false;
    }
  return true;
}

/// libuprobe.so's initializer: elfutils now, unless deferred.
__attribute__((constructor)) void load_elfutils_unless_deferred() {
  if (uprobe::detail::g_elfutils_deferred.load(std::memory_order_relaxed)) return;
  resolve_all(nullptr);
}

}  // namespace

namespace uprobe::detail {

bool elfutils_available(std::string& why) noexcept {
  // (Every function the reads call, once: a library without one of them is
  // as unusable as a missing one.)
  static std::atomic<bool> complete{false};
  if (complete.load(std::memory_order_acquire)) return true;
  if (!resolve_all(&why)) return false;
  complete.store(true, std::memory_order_release);
  return true;
}

}  // namespace uprobe::detail

// The forwarders: `fail` when the library or the function is not there.
#define UPROBE_ELFUTILS_FORWARDER(lib, ret, name, params, args, fail)    \
  extern "C" ret name params {                                          \
    auto* f = reinterpret_cast<decltype(&::name)>(resolve(kFn_##name)); \
    if (!f) return fail;                                                \
    return f args;                                                      \
  }
UPROBE_ELFUTILS_FUNCTIONS(UPROBE_ELFUTILS_FORWARDER)
#undef UPROBE_ELFUTILS_FORWARDER

// elf_errmsg(): libelf's, or that it is not there (the reads ask
// elfutils_available() first, which says why).
extern "C" const char* elf_errmsg(int error) {
  auto* f = reinterpret_cast<decltype(&::elf_errmsg)>(resolve(kFn_elf_errmsg));
  return f ? f(error) : "libelf.so.1 is not loaded";
}
