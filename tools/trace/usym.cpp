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
  Dwfl* dwfl = nullptr;
  ~Image() {
    if (dwfl) dwfl_end(dwfl);
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
  img->dwfl = dwfl_begin(&kCallbacks);
  if (img->dwfl) {
    dwfl_report_begin(img->dwfl);
    if (dwfl_linux_proc_maps_report(img->dwfl, f) != 0) {
      dwfl_end(img->dwfl);
      img->dwfl = nullptr;
    } else {
      dwfl_report_end(img->dwfl, nullptr, nullptr);
    }
  }
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
  Dwfl_Module* mod = dwfl_addrmodule(img->dwfl, addr);
  if (!mod) return false;
  GElf_Off off = 0;
  GElf_Sym sym;
  const char* name = dwfl_module_addrinfo(mod, addr, &off, &sym, nullptr, nullptr, nullptr);
  if (!name || !*name) return false;
  const char* mname = dwfl_module_info(mod, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  it->second = bt::UserSym{demangle(name), off, mname ? mname : ""};
  out = *it->second;
  return true;
}

}  // namespace uptrace
