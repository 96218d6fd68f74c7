// SPDX-License-Identifier: MIT
// Pending probes and dlopen: dlopen() and dlclose() are interposed so that
// after every load the probes registered on a file that just got mapped get
// their breakpoints (and USDT semaphore counts), and after every unload the
// sites in memory that is gone are forgotten without a write (so a later
// mapping at the same address is never patched by mistake, and a reload gets
// fresh breakpoints). The new object's constructors run inside the real
// dlopen(), before the probes are installed; code the dynamic linker loads
// without going through dlopen() (glibc-internal loads such as NSS and iconv
// modules) is picked up at the next register/unregister or dlopen.

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "next_symbol.hpp"
#include "runtime.hpp"
#include "thread_state.hpp"

namespace {

using DlopenFn = void* (*)(const char*, int);
using DlcloseFn = int (*)(void*);

/// libc's dlopen and dlclose, looked up at libuprobe's load
/// (next_symbol_in(): a guarded first-call lookup would make a thread inside
/// dlopen() whose constructor calls dlopen() wait for another thread that
/// holds the guard and waits for the dynamic linker's lock).
DlopenFn g_real_dlopen;
DlcloseFn g_real_dlclose;
DlopenFn real_dlopen() noexcept { return uprobe::detail::libc_symbol_in(g_real_dlopen, "dlopen"); }
DlcloseFn real_dlclose() noexcept { return uprobe::detail::libc_symbol_in(g_real_dlclose, "dlclose"); }
__attribute__((constructor)) void resolve_dl_reals() noexcept {
  (void)real_dlopen();
  (void)real_dlclose();
}

std::string search_as_caller(const char* file, const void* caller);

/// dlopen() searches a bare name in the *caller's* RUNPATH/RPATH; called
/// from here it would use libuprobe's. So a bare name that is not loaded yet
/// is looked up in the caller's search list (dlinfo RTLD_DI_SERINFO) and
/// opened by path; anything else goes to dlopen unchanged.
void* open_as_caller(DlopenFn real, const char* file, int mode, const void* caller) {
  if (!file || std::strchr(file, '/')) return real(file, mode);
  if (mode & RTLD_NOLOAD) return real(file, mode);
  void* loaded;
  {
    uprobe::detail::RuntimeCallScope ours;  // (this question is not the program's call)
    loaded = real(file, mode | RTLD_NOLOAD);
  }
  if (loaded) {  // already loaded (by soname)
    void* again = real(file, mode);  // apply the caller's mode flags (e.g. RTLD_GLOBAL)
    uprobe::detail::RuntimeCallScope ours;  // (nor this reference given back)
    real_dlclose()(loaded);
    return again;
  }
  std::string found;  // the caller's search list's match, if any
  {
    uprobe::detail::RuntimeCallScope ours;  // (this search is not the program's calls)
    try {
      found = search_as_caller(file, caller);
    } catch (...) {  // (out of memory: the name as given, as from libuprobe's own search list)
    }
  }
  return real(found.empty() ? file : found.c_str(), mode);
}

/// The path of `file` in `caller`'s search list (its RUNPATH/RPATH first), or "".
std::string search_as_caller(const char* file, const void* caller) {
  Dl_info di;
  struct link_map* lm = nullptr;
  if (dladdr1(caller, &di, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) && lm) {
    Dl_serinfo size;
    if (dlinfo(lm, RTLD_DI_SERINFOSIZE, &size) == 0 && size.dls_size >= sizeof(Dl_serinfo)) {
      std::vector<unsigned char> buf(size.dls_size);
      auto* info = reinterpret_cast<Dl_serinfo*>(buf.data());
      info->dls_size = size.dls_size;
      info->dls_cnt = size.dls_cnt;
      if (dlinfo(lm, RTLD_DI_SERINFO, info) == 0) {
        for (unsigned i = 0; i < info->dls_cnt; ++i) {
          std::string path = std::string(info->dls_serpath[i].dls_name) + "/" + file;
          if (::access(path.c_str(), F_OK) == 0) return path;
        }
      }
    }
  }
  return {};
}

}  // namespace

namespace {

/// The resync after the program's dlopen() or dlclose(), which never lets an
/// exception out into the program (its caller is C: one would end it with
/// std::terminate()): a resync that fails (no memory near vm.max_map_count,
/// no descriptor left for /proc/self/maps) leaves the new mappings' pending
/// probes, and forgetting a gone library's sites, to the next resync (the
/// next dlopen, dlclose, registration or unregistration), and the program
/// goes on.
void resync_after_dl() noexcept {
  uprobe::detail::RuntimeCallScope ours;  // (the resync is not the program's calls)
  try {
    uprobe::detail::resync_address_space();
  } catch (...) {
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void* dlopen(const char* file, int mode) {
  void* handle = open_as_caller(real_dlopen(), file, mode, __builtin_return_address(0));
  if (handle) resync_after_dl();
  return handle;
}

extern "C" __attribute__((visibility("default"))) int dlclose(void* handle) {
  int rc = real_dlclose()(handle);
  resync_after_dl();
  return rc;
}
