// SPDX-License-Identifier: MIT
// GNU indirect functions: the implementation the dynamic linker binds each
// exported IFUNC of a loaded file to (ifunc.hpp).

#include "ifunc.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/stat.h>

#include <map>
#include <mutex>
#include <tuple>

#include "elf_image.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe::detail {

namespace {

using DlopenFn = void* (*)(const char*, int);
using DlcloseFn = int (*)(void*);

/// libc's dlopen and dlclose: libuprobe interposes both (dl_glue.cpp) to
/// install pending probes, which takes the registry mutex.
DlopenFn real_dlopen() {
  static const auto fn = reinterpret_cast<DlopenFn>(dlsym(RTLD_NEXT, "dlopen"));
  return fn;
}
DlcloseFn real_dlclose() {
  static const auto fn = reinterpret_cast<DlcloseFn>(dlsym(RTLD_NEXT, "dlclose"));
  return fn;
}

/// The file and file offset of code address `addr` of a loaded object.
bool file_offset_of_code(const void* addr, std::string& path, std::uint64_t& offset) {
  Dl_info info;
  struct link_map* lm = nullptr;
  if (!dladdr1(addr, &info, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) || !lm) return false;
  const bool main = !lm->l_name || !lm->l_name[0];
  const std::string file = main ? std::string("/proc/self/exe") : std::string(lm->l_name);
  char buf[PATH_MAX];
  if (!::realpath(file.c_str(), buf)) return false;
  try {
    auto img = load_elf_image(buf);
    const std::uint64_t vaddr = reinterpret_cast<std::uint64_t>(addr) - lm->l_addr;
    const LoadSegment* seg = img->segment_of_vaddr(vaddr);
    if (!seg || !seg->executable()) return false;
    path = buf;
    offset = vaddr - seg->vaddr + seg->offset;
    return true;
  } catch (const Error&) {
    return false;
  }
}

/// One loaded object's bindings, found again without a system call: the
/// dynamic linker's name and load address of the object they were computed
/// for (an object unloaded since, or loaded elsewhere, is looked up afresh).
struct CacheEntry {
  std::string name;
  std::uintptr_t base;
  std::shared_ptr<const std::vector<IfuncBinding>> bindings;
};

std::mutex g_mutex;
// Never destroyed: probes fire and libraries load during exit, and its
// free()s at exit would be the traced program's (uprobe-trace counts them).
std::map<std::pair<dev_t, ino_t>, CacheEntry>& g_cache = *new std::map<std::pair<dev_t, ino_t>, CacheEntry>;

/// Whether the dynamic linker has an object named `name` at `base` now.
bool still_loaded(const std::string& name, std::uintptr_t base) {
  struct Find {
    const std::string* name;
    std::uintptr_t base;
    bool found;
  } f{&name, base, false};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t, void* p) {
        auto* f = static_cast<Find*>(p);
        if (info->dlpi_addr == f->base && *f->name == (info->dlpi_name ? info->dlpi_name : "")) f->found = true;
        return f->found ? 1 : 0;
      },
      &f);
  return f.found;
}

}  // namespace

std::shared_ptr<const std::vector<IfuncBinding>> ifunc_bindings(const std::string& path) {
  // Never destroyed (as the cache below).
  static const auto& none = *new std::shared_ptr<const std::vector<IfuncBinding>>(
      std::make_shared<const std::vector<IfuncBinding>>());
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return none;
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (auto it = g_cache.find(id); it != g_cache.end() && still_loaded(it->second.name, it->second.base))
      return it->second.bindings;
  }
  const LoadedObject* obj = nullptr;
  const std::vector<LoadedObject> objs = loaded_objects();
  for (const LoadedObject& o : objs)
    if (o.dev == st.st_dev && o.ino == st.st_ino) {
      obj = &o;
      break;
    }
  if (!obj) return none;
  std::shared_ptr<const ElfImage> img;
  try {
    img = load_elf_image(path);
  } catch (const Error&) {
    return none;
  }
  std::vector<IfuncBinding> out;
  bool any = false;
  for (const ElfSymbol& s : img->symbols) any = any || (s.dynamic && s.type == STT_GNU_IFUNC);
  if (any && real_dlopen() && real_dlclose()) {
    // The object as the dynamic linker knows it: dlopen(NULL) is the main
    // program (its lookups start there); a library by its recorded name, or
    // by path (RTLD_NOLOAD matches the file's identity too).
    void* h = real_dlopen()(obj->name.empty() ? nullptr : obj->name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (h) {
      for (const ElfSymbol& s : img->symbols) {
        if (!s.dynamic || s.type != STT_GNU_IFUNC) continue;
        // A hidden version (name@VER) only through dlvsym; the default one
        // (name@@VER, or unversioned) as dlsym binds it.
        const std::string name(s.name), version(s.version);
        void* impl = version.empty() ? dlsym(h, name.c_str()) : dlvsym(h, name.c_str(), version.c_str());
        // (The handle's lookup scope starts with the object itself, so the
        // definition found is this symbol; its resolver's answer is usually
        // code of the same file, but need not be.)
        IfuncBinding b{s.to_symbol(), {}, 0, 0, 0};
        struct stat ist;
        if (!impl || !file_offset_of_code(impl, b.impl_path, b.impl_offset) || ::stat(b.impl_path.c_str(), &ist) != 0)
          continue;
        b.impl_dev = ist.st_dev;
        b.impl_ino = ist.st_ino;
        out.push_back(std::move(b));
      }
      real_dlclose()(h);
    }
  }
  // The name the dynamic linker reports for the object (dl_iterate_phdr's
  // dlpi_name: "" for the main program).
  auto shared = std::make_shared<const std::vector<IfuncBinding>>(std::move(out));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_cache[id] = CacheEntry{obj->name, obj->base, shared};
  return shared;
}

}  // namespace uprobe::detail
