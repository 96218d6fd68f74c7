// SPDX-License-Identifier: MIT
// uprobe-trace's symbolizer for ustack and usym() (usym.hpp).

#include "usym.hpp"

#include <cxxabi.h>
#include <dirent.h>
#include <elfutils/libdwelf.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace uptrace {

struct UserSymbols::Image {
  Dwfl* dwfl = nullptr;   // the mappings its agent recorded at attach
  // /proc/PID/maps as last read (a library dlopen()ed since the record),
  // per process of the image (a fork child has its parent's record).
  struct Live {
    std::string maps;
    Dwfl* dwfl = nullptr;
  };
  std::map<std::uint32_t, Live> live;
  ~Image() {
    if (dwfl) dwfl_end(dwfl);
    for (auto& [pid, l] : live)
      if (l.dwfl) dwfl_end(l.dwfl);
  }
};

namespace {

char* g_debuginfo_path = nullptr;  // libdwfl's default: .debug, /usr/lib/debug, build-id under it

const Dwfl_Callbacks kCallbacks = {
    dwfl_linux_proc_find_elf,       // a module named by its path: that file
    dwfl_standard_find_debuginfo,   // its build-id's debug file (/usr/lib/debug/.build-id/XX/YYYY.debug), ...
    nullptr,
    &g_debuginfo_path,
};

std::string demangle(const char* name) {
  if (std::strncmp(name, "_Z", 2) != 0) return name;
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || !d) return name;
  std::string out = d;
  std::free(d);
  return out;
}

// A Dwfl of the mappings in `maps` (/proc/PID/maps's format); nullptr when
// libdwfl cannot take them.
Dwfl* report_maps(std::FILE* maps) {
  Dwfl* d = dwfl_begin(&kCallbacks);
  if (!d) return nullptr;
  dwfl_report_begin(d);
  if (dwfl_linux_proc_maps_report(d, maps) != 0) {
    dwfl_end(d);
    return nullptr;
  }
  dwfl_report_end(d, nullptr, nullptr);
  return d;
}

std::string slurp(const std::string& path) {
  std::string out;
  if (std::FILE* f = std::fopen(path.c_str(), "re")) {
    char buf[8192];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

}  // namespace

// A module's symbols as bcc (bpftrace's symbolizer) takes them, so that of
// several names at one address (glibc's malloc, __libc_malloc,
// __GI___libc_malloc, ...) the same is printed: every symbol of the SYMTAB and
// DYNSYM sections, first of the debug file found by build-id
// (/usr/lib/debug/.build-id/XX/YYYY.debug), then of the file itself, with a
// name and a non-zero value, of any type (bpftrace asks bcc for all);
// std::sort by start alone (their order among equal starts is then
// std::sort's, as bcc's); an address is the last symbol at or below it whose
// range holds it, walking back over nested ones as bcc's
// ProcSyms::Module::find_addr() does.
struct ModuleSyms {
  struct Sym {
    std::uint64_t start, size;
    std::string name;
    bool operator<(const Sym& o) const { return start < o.start; }  // (start only: bcc's order)
  };
  std::vector<Sym> syms;

  void add_file(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    if (Elf* e = elf_begin(fd, ELF_C_READ_MMAP, nullptr)) {
      for (Elf_Scn* scn = nullptr; (scn = elf_nextscn(e, scn)) != nullptr;) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh) || (sh.sh_type != SHT_SYMTAB && sh.sh_type != SHT_DYNSYM) || !sh.sh_entsize) continue;
        for (Elf_Data* data = nullptr; (data = elf_getdata(scn, data)) != nullptr;) {
          const std::size_t n = data->d_size / sh.sh_entsize;
          for (std::size_t i = 0; i < n; ++i) {
            GElf_Sym sym;
            if (!gelf_getsym(data, static_cast<int>(i), &sym)) continue;
            const char* name = elf_strptr(e, sh.sh_link, sym.st_name);
            if (!name || !*name || sym.st_value == 0) continue;
            syms.push_back({sym.st_value, sym.st_size, name});
          }
        }
      }
      elf_end(e);
    }
    close(fd);
  }

  explicit ModuleSyms(const std::string& path) {
    elf_version(EV_CURRENT);
    // The debug file by build-id, first (as bcc lists it first).
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      if (Elf* e = elf_begin(fd, ELF_C_READ_MMAP, nullptr)) {
        const void* id = nullptr;
        const ssize_t n = dwelf_elf_gnu_build_id(e, &id);
        if (n > 1) {
          const auto* b = static_cast<const unsigned char*>(id);
          char hex[3];
          std::string debug = "/usr/lib/debug/.build-id/";
          for (ssize_t i = 0; i < n; ++i) {
            std::snprintf(hex, sizeof hex, "%02x", b[i]);
            debug += hex;
            if (i == 0) debug += '/';
          }
          debug += ".debug";
          if (access(debug.c_str(), R_OK) == 0) add_file(debug);
        }
        elf_end(e);
      }
      close(fd);
    }
    add_file(path);
    std::sort(syms.begin(), syms.end());
  }

  const Sym* find(std::uint64_t off) const {
    auto it = std::upper_bound(syms.begin(), syms.end(), Sym{off, 0, {}});
    if (it == syms.begin()) return nullptr;
    --it;
    const std::uint64_t limit = it->start;
    for (; off >= it->start; --it) {
      if (off < it->start + it->size) return &*it;
      if (limit > it->start + it->size) break;  // (not a symbol nesting the ones after it)
      if (it == syms.begin()) break;
    }
    return nullptr;
  }
};

// The symbol covering `addr` in `d`: the module libdwfl finds for it (and
// its load bias), the symbol as bcc finds it in that module.
bool UserSymbols::lookup(Dwfl* d, std::uint64_t addr, bt::UserSym& out) {
  Dwfl_Module* mod = d ? dwfl_addrmodule(d, addr) : nullptr;
  if (!mod) return false;
  Dwarf_Addr bias = 0;
  if (!dwfl_module_getelf(mod, &bias)) return false;
  const char* mname = dwfl_module_info(mod, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  if (!mname || mname[0] != '/') return false;
  auto it = modules_.find(mname);
  if (it == modules_.end()) it = modules_.emplace(mname, std::make_unique<ModuleSyms>(mname)).first;
  const ModuleSyms::Sym* sym = it->second->find(addr - bias);
  if (!sym) return false;
  out = bt::UserSym{demangle(sym->name.c_str()), addr - bias - sym->start, mname};
  return true;
}

namespace {
}  // namespace

UserSymbols::UserSymbols(std::string dir) : dir_(std::move(dir)) {}
UserSymbols::~UserSymbols() = default;

UserSymbols::Image* UserSymbols::image(std::uint32_t layout) {
  auto it = images_.find(layout);
  if (it != images_.end() && it->second) return it->second.get();
  // DIR/PID.LAYOUT.maps (one per image: its agent writes it at attach)
  std::string suffix = std::to_string(layout);  // (not "." + ...: a false -Wrestrict in GCC 12's operator+)
  suffix.insert(suffix.begin(), '.');
  suffix += ".maps";
  std::string path;
  if (DIR* d = opendir(dir_.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0 &&
          n.find('.') == n.size() - suffix.size()) {
        path = dir_ + "/" + n;
        break;
      }
    }
    closedir(d);
  }
  if (path.empty()) return nullptr;
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return nullptr;
  auto img = std::make_unique<Image>();
  img->dwfl = report_maps(f);
  std::fclose(f);
  Image* r = img.get();
  images_[layout] = std::move(img);
  return r;
}

bool UserSymbols::resolve(std::uint64_t image_word, std::uint64_t addr, bt::UserSym& out) {
  const auto layout = static_cast<std::uint32_t>(image_word & 0xffffffffu);
  auto [it, fresh] = cache_.try_emplace({layout, addr});
  if (!fresh && it->second) return out = *it->second, true;
  if (!fresh) return false;
  Image* img = image(layout);
  if (!img || !img->dwfl) {
    cache_.erase(it);  // (its .maps file may not be there yet)
    return false;
  }
  bt::UserSym u;
  if (!lookup(img->dwfl, addr, u) && !lookup(live(*img, layout, static_cast<std::uint32_t>(image_word >> 32)), addr, u))
    return false;
  it->second = u;
  out = u;
  return true;
}

Dwfl* UserSymbols::live(Image& img, std::uint32_t layout, std::uint32_t pid) {
  // Only while process `pid` still runs this image: not when it has exec'd
  // another that recorded its own mappings (DIR/PID.LAYOUT.maps, a larger
  // LAYOUT); a fork child has none of its own.
  const std::string prefix = std::to_string(pid) + ".";
  if (DIR* d = opendir(dir_.c_str())) {
    bool newer = false;
    while (const dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.compare(0, prefix.size(), prefix) == 0 && n.size() > 5 && n.compare(n.size() - 5, 5, ".maps") == 0 &&
          std::strtoul(n.c_str() + prefix.size(), nullptr, 10) > layout)
        newer = true;
    }
    closedir(d);
    if (newer) return nullptr;
  }
  const std::string maps = slurp("/proc/" + std::to_string(pid) + "/maps");
  if (maps.empty()) return nullptr;  // (gone)
  Image::Live& l = img.live[pid];
  if (maps != l.maps) {  // (rebuilt only when the mappings changed: a Dwfl loads its symbol tables again)
    if (l.dwfl) dwfl_end(l.dwfl);
    l.maps = maps;
    std::FILE* f = fmemopen(l.maps.data(), l.maps.size(), "r");
    l.dwfl = f ? report_maps(f) : nullptr;
    if (f) std::fclose(f);
  }
  return l.dwfl;
}

}  // namespace uptrace
