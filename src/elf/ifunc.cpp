// SPDX-License-Identifier: MIT
// GNU indirect functions: the implementation the dynamic linker binds each
// exported IFUNC of a loaded file to (ifunc.hpp).

#include "ifunc.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "elf_image.hpp"
#include "fork_fresh.hpp"
#include "next_symbol.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe::detail {

namespace {

/// The executable segments of the loaded objects (dl_iterate_phdr()), to
/// find the object of a code address without dladdr() (a scan of the
/// object's symbols for each address).
struct LoadedCode {
  std::uintptr_t lo, hi;  ///< [lo, hi): an executable PT_LOAD in memory
  std::uintptr_t base;    ///< the object's load bias (dlpi_addr, the link map's l_addr)
  std::string name;       ///< dlpi_name ("" for the main program)
};

std::vector<LoadedCode> loaded_code() {
  std::vector<LoadedCode> out;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t, void* p) {
        auto& out = *static_cast<std::vector<LoadedCode>*>(p);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          out.push_back(LoadedCode{lo, lo + ph.p_memsz, info->dlpi_addr, info->dlpi_name ? info->dlpi_name : ""});
        }
        return 0;
      },
      &out);
  return out;
}

/// One file holding implementations: its canonical path, image and identity,
/// found once per object name.
struct ImplFile {
  std::string path;
  std::shared_ptr<const ElfImage> img;
  struct stat st;
};

/// The file and file offset of code address `addr` of a loaded object (the
/// object's file opened and read once for all its addresses: `files`, by the
/// dynamic linker's name).
bool file_offset_of_code(const void* addr, const std::vector<LoadedCode>& code,
                         std::map<std::string, std::optional<ImplFile>>& files, const ImplFile*& file,
                         std::uint64_t& offset) {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  const LoadedCode* obj = nullptr;
  for (const LoadedCode& c : code)
    if (a >= c.lo && a < c.hi) obj = &c;
  if (!obj) return false;
  auto [it, fresh] = files.try_emplace(obj->name);
  if (fresh) {
    const std::string name = obj->name.empty() ? std::string("/proc/self/exe") : obj->name;
    char buf[PATH_MAX];
    struct stat st;
    if (::realpath(name.c_str(), buf) && ::stat(buf, &st) == 0) {
      try {
        it->second = ImplFile{buf, load_elf_image(buf), st};
      } catch (const Error&) {
      }
    }
  }
  if (!it->second) return false;
  file = &*it->second;
  const std::uint64_t vaddr = a - obj->base;
  const LoadSegment* seg = file->img->segment_of_vaddr(vaddr);
  if (!seg || !seg->executable()) return false;
  offset = vaddr - seg->vaddr + seg->offset;
  return true;
}

/// One loaded object's bindings, found again without a system call: the
/// dynamic linker's name and load address of the object they were computed
/// for (an object unloaded since, or loaded elsewhere, is looked up afresh).
struct CacheEntry {
  std::string name;
  std::uintptr_t base;
  std::shared_ptr<const std::vector<IfuncBinding>> bindings;
};

/// The bindings found so far (fork_fresh()).
struct Cache {
  std::mutex mu;
  std::map<std::pair<dev_t, ino_t>, CacheEntry> entries;
};

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
    Cache& c = fork_fresh<Cache>();
    std::lock_guard<std::mutex> lock(c.mu);
    if (auto it = c.entries.find(id); it != c.entries.end() && still_loaded(it->second.name, it->second.base))
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
  // (libc's own dlopen and dlclose: libuprobe interposes both, dl_glue.cpp,
  // to install pending probes, which takes the registry mutex.)
  if (any && libc_dlopen() && libc_dlclose()) {
    // The object as the dynamic linker knows it: dlopen(NULL) is the main
    // program (its lookups start there); a library by its recorded name, or
    // by path (RTLD_NOLOAD matches the file's identity too).
    void* h = libc_dlopen()(obj->name.empty() ? nullptr : obj->name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (h) {
      const std::vector<LoadedCode> code = loaded_code();
      std::map<std::string, std::optional<ImplFile>> files;
      for (const ElfSymbol& s : img->symbols) {
        if (!s.dynamic || s.type != STT_GNU_IFUNC) continue;
        // A hidden version (name@VER) only through dlvsym; the default one
        // (name@@VER, or unversioned) as dlsym binds it.
        const std::string name(s.name), version(s.version);
        void* impl = version.empty() ? dlsym(h, name.c_str()) : dlvsym(h, name.c_str(), version.c_str());
        // (The handle's lookup scope starts with the object itself, so the
        // definition found is this symbol; its resolver's answer is usually
        // code of the same file, but need not be.)
        IfuncBinding b{s.to_symbol(), {}, 0, 0, 0, 0, {}};
        const ImplFile* file = nullptr;
        if (!impl || !file_offset_of_code(impl, code, files, file, b.impl_offset)) continue;
        b.impl_path = file->path;
        b.impl_dev = file->st.st_dev;
        b.impl_ino = file->st.st_ino;
        const LoadSegment* seg = file->img->segment_of_offset(b.impl_offset);
        b.impl_address = seg ? b.impl_offset - seg->offset + seg->vaddr : 0;
        out.push_back(std::move(b));
      }
      libc_dlclose()(h);
      // The implementations' names, one pass over each file's symbols.
      for (auto& [name, file] : files) {
        if (!file) continue;
        std::vector<std::uint64_t> offsets;
        for (const IfuncBinding& b : out)
          if (b.impl_path == file->path) offsets.push_back(b.impl_offset);
        std::sort(offsets.begin(), offsets.end());
        offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
        const std::vector<const ElfSymbol*> at = symbols_at(*file->img, offsets);
        for (IfuncBinding& b : out) {
          if (b.impl_path != file->path) continue;
          const auto i = static_cast<std::size_t>(
              std::lower_bound(offsets.begin(), offsets.end(), b.impl_offset) - offsets.begin());
          if (at[i] && at[i]->offset == b.impl_offset) b.implementation = at[i]->full_name();
        }
      }
    }
  }
  // The name the dynamic linker reports for the object (dl_iterate_phdr's
  // dlpi_name: "" for the main program).
  auto shared = std::make_shared<const std::vector<IfuncBinding>>(std::move(out));
  Cache& c = fork_fresh<Cache>();
  std::lock_guard<std::mutex> lock(c.mu);
  c.entries[id] = CacheEntry{obj->name, obj->base, shared};
  return shared;
}

}  // namespace uprobe::detail
