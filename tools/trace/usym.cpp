// SPDX-License-Identifier: MIT
// uprobe-trace's symbolizer for ustack and usym() (usym.hpp).

#include "usym.hpp"

#include <cxxabi.h>
#include <dirent.h>
#include <elfutils/libdwfl.h>

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

// The symbol covering `addr` in `d`.
bool lookup(Dwfl* d, std::uint64_t addr, bt::UserSym& out) {
  Dwfl_Module* mod = d ? dwfl_addrmodule(d, addr) : nullptr;
  if (!mod) return false;
  GElf_Off off = 0;
  GElf_Sym sym;
  const char* name = dwfl_module_addrinfo(mod, addr, &off, &sym, nullptr, nullptr, nullptr);
  if (!name || !*name) return false;
  const char* mname = dwfl_module_info(mod, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  out = bt::UserSym{demangle(name), off, mname ? mname : ""};
  return true;
}

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
