// SPDX-License-Identifier: MIT
// Library names as users write them -> the file the dynamic linker loaded
// (dl_iterate_phdr), or the file a dlopen() from the main program would find;
// file offsets -> addresses in this process.
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329); the state must be set before <string> is included.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <glob.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "elf_image.hpp"
#include "uprobe/symbols.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe {

using detail::load_elf_image;

namespace {

std::string canonical(const std::string& p) {
  char buf[PATH_MAX];
  if (::realpath(p.c_str(), buf)) return buf;
  return {};
}

std::string self_exe_path() {
  std::string c = canonical("/proc/self/exe");
  if (!c.empty()) return c;
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("/proc/self/exe");
}

std::string base_name(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::string dir_name(const std::string& p) {
  auto s = p.rfind('/');
  if (s == std::string::npos) return ".";
  return s == 0 ? "/" : p.substr(0, s);
}

// `file` is what a user means by `name`: equal, or name.so, name.so.*, or
// name-<digit>...so* (the short forms, e.g. libc -> libc.so.6).
bool name_matches(const std::string& file, std::string_view name) {
  if (file.empty() || name.empty()) return false;
  if (file == name) return true;
  if (file.size() <= name.size() || file.compare(0, name.size(), name) != 0) return false;
  std::string_view rest(file);
  rest.remove_prefix(name.size());
  if (rest == ".so" || rest.substr(0, 4) == ".so.") return true;
  if (rest.size() >= 2 && rest[0] == '-' && rest[1] >= '0' && rest[1] <= '9' && rest.find(".so") != std::string_view::npos)
    return true;
  return false;
}

bool is_x86_64_elf(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  unsigned char h[20];
  ssize_t n = ::pread(fd, h, sizeof h, 0);
  ::close(fd);
  return n == static_cast<ssize_t>(sizeof h) && std::memcmp(h, ELFMAG, SELFMAG) == 0 && h[EI_CLASS] == ELFCLASS64 &&
         h[EI_DATA] == ELFDATA2LSB && (h[18] | (h[19] << 8)) == EM_X86_64;
}

struct RawObject {
  std::string name;
  std::uintptr_t base;
  bool main;
};

std::vector<RawObject> raw_objects() {
  std::vector<RawObject> v;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t, void* data) {
        auto* out = static_cast<std::vector<RawObject>*>(data);
        out->push_back({info->dlpi_name ? info->dlpi_name : "", info->dlpi_addr, out->empty()});
        return 0;
      },
      &v);
  return v;
}

// ---------------------------------------------------- search path ----

std::string expand_origin(const std::string& dir, const std::string& origin) {
  std::string out;
  for (std::size_t i = 0; i < dir.size();) {
    if (dir[i] == '$') {
      std::string_view rest(dir.c_str() + i + 1);
      auto sub = [&](std::string_view token, const std::string& value) {
        if (rest.substr(0, token.size()) == token) {
          out += value;
          i += 1 + token.size();
          return true;
        }
        return false;
      };
      if (sub("{ORIGIN}", origin) || sub("ORIGIN", origin) || sub("{LIB}", "lib/x86_64-linux-gnu") ||
          sub("LIB", "lib/x86_64-linux-gnu") || sub("{PLATFORM}", "x86_64") || sub("PLATFORM", "x86_64"))
        continue;
    }
    out += dir[i++];
  }
  return out;
}

void read_ld_so_conf(const std::string& file, std::vector<std::string>& dirs, int depth) {
  if (depth > 8) return;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    auto e = line.find_last_not_of(" \t\r");
    line = line.substr(b, e - b + 1);
    if (line.compare(0, 8, "include ") == 0 || line.compare(0, 8, "include\t") == 0) {
      std::string pat = line.substr(8);
      pat.erase(0, pat.find_first_not_of(" \t"));
      if (!pat.empty() && pat[0] != '/') pat = dir_name(file) + "/" + pat;
      glob_t g{};
      if (::glob(pat.c_str(), 0, nullptr, &g) == 0)
        for (std::size_t i = 0; i < g.gl_pathc; ++i) read_ld_so_conf(g.gl_pathv[i], dirs, depth + 1);
      ::globfree(&g);
      continue;
    }
    if (line.compare(0, 6, "hwcap ") == 0) continue;
    if (auto eq = line.find('='); eq != std::string::npos) line.resize(eq);  // old "dir=TYPE"
    if (!line.empty() && line[0] == '/') dirs.push_back(line);
  }
}

std::vector<std::string> search_dirs() {
  std::vector<std::string> dirs;
  std::string exe = self_exe_path();
  std::string origin = dir_name(exe);
  std::vector<std::string> rpath, runpath;
  try {
    auto img = load_elf_image(exe);
    rpath = img->rpath;
    runpath = img->runpath;
  } catch (const Error&) {
  }
  if (runpath.empty())
    for (const auto& d : rpath) dirs.push_back(expand_origin(d, origin));
  if (!::getauxval(AT_SECURE)) {
    if (const char* llp = std::getenv("LD_LIBRARY_PATH")) {
      std::string cur;
      for (const char* p = llp;; ++p) {
        if (*p == ':' || *p == ';' || *p == '\0') {
          if (!cur.empty()) dirs.push_back(expand_origin(cur, origin));
          cur.clear();
          if (!*p) break;
        } else {
          cur += *p;
        }
      }
    }
  }
  for (const auto& d : runpath) dirs.push_back(expand_origin(d, origin));
  read_ld_so_conf("/etc/ld.so.conf", dirs, 0);
  for (const char* d : {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"})
    dirs.emplace_back(d);
  return dirs;
}

// Candidate files for `name` in `dir`, by (dev, ino).
std::vector<std::string> candidates_in(const std::string& dir, std::string_view name) {
  std::vector<std::string> found;
  std::set<std::pair<dev_t, ino_t>> seen;
  auto consider = [&](const std::string& file) {
    struct stat st;
    if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    if (!is_x86_64_elf(file)) return;
    if (seen.insert({st.st_dev, st.st_ino}).second) found.push_back(canonical(file).empty() ? file : canonical(file));
  };
  const std::string n(name);
  if (n.find(".so") != std::string::npos) {
    consider(dir + "/" + n);
    if (!found.empty()) return found;
  }
  DIR* d = ::opendir(dir.c_str());
  if (!d) return found;
  std::vector<std::string> names;
  while (struct dirent* ent = ::readdir(d))
    if (name_matches(ent->d_name, name)) names.emplace_back(ent->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& f : names) consider(dir + "/" + f);
  return found;
}

std::string search_library(std::string_view name, std::string& tried) {
  for (const std::string& dir : search_dirs()) {
    tried += (tried.empty() ? "" : ":") + dir;
    auto c = candidates_in(dir, name);
    if (c.size() == 1) return c[0];
    if (c.size() > 1) {
      std::string list;
      for (const auto& f : c) list += (list.empty() ? "" : ", ") + f;
      throw Error(Errc::conflict, std::string(name), 0,
                  "library name `" + std::string(name) + "' is ambiguous in " + dir + ": " + list +
                      "; give the file name or path");
    }
  }
  return {};
}

}  // namespace

std::vector<LoadedObject> loaded_objects() {
  std::vector<LoadedObject> out;
  for (const RawObject& r : raw_objects()) {
    LoadedObject o;
    o.name = r.main ? std::string() : r.name;
    o.base = r.base;
    std::string file = r.main && r.name.empty() ? self_exe_path() : r.name;
    if (file.empty()) continue;
    struct stat st;
    if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // the vDSO, deleted files
    o.path = canonical(file);
    if (o.path.empty()) o.path = file;
    o.dev = st.st_dev;
    o.ino = st.st_ino;
    out.push_back(std::move(o));
  }
  return out;
}

std::string resolve_library(std::string_view name, LibrarySearch search) {
  const std::string n(name);
  if (n.empty()) throw Error(Errc::file_not_found, n, 0, "empty binary name");
  if (n.find('/') != std::string::npos) {
    std::string c = canonical(n);
    if (c.empty()) {
      const int err = errno;
      throw Error(Errc::file_not_found, n, 0, std::string("no such file: ") + std::strerror(err), err);
    }
    return c;
  }
  const std::vector<LoadedObject> objs = loaded_objects();
  std::vector<const LoadedObject*> hits;
  auto add = [&](const LoadedObject& o) {
    for (const LoadedObject* h : hits)
      if (h->dev == o.dev && h->ino == o.ino) return;
    hits.push_back(&o);
  };
  for (const LoadedObject& o : objs)
    if (name_matches(base_name(o.name), name) || name_matches(base_name(o.path), name)) add(o);
  if (hits.empty()) {
    for (const LoadedObject& o : objs) {
      try {
        if (name_matches(load_elf_image(o.path)->soname, name)) add(o);
      } catch (const Error&) {
      }
    }
  }
  if (hits.size() == 1) return hits[0]->path;
  if (hits.size() > 1) {
    std::string list;
    for (const LoadedObject* h : hits) list += (list.empty() ? "" : ", ") + h->path;
    throw Error(Errc::conflict, n, 0,
                "library name `" + n + "' matches several loaded objects (" + list + "); give the file name or path");
  }
  std::string tried;
  if (search == LibrarySearch::search_path) {
    std::string f = search_library(name, tried);
    if (!f.empty()) return f;
  }
  std::string loaded;
  for (const LoadedObject& o : objs) loaded += (loaded.empty() ? "" : ", ") + base_name(o.path);
  if (search == LibrarySearch::search_path)
    throw Error(Errc::file_not_found, n, 0,
                "library `" + n + "' is not loaded in this process and was not found on the search path (" + tried +
                    ")");
  throw Error(Errc::file_not_found, n, 0,
              "library `" + n + "' is not loaded in this process (loaded: " + loaded +
                  "); give its path, or ask for LibrarySearch::search_path");
}

std::vector<std::uintptr_t> runtime_addresses(const std::string& path, std::uint64_t offset) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    throw Error(Errc::file_not_found, path, offset, std::string("cannot stat file: ") + std::strerror(err), err);
  }
  struct Ctx {
    dev_t dev;
    ino_t ino;
    std::uint64_t offset;
    std::string exe;
    bool first = true;
    std::vector<std::uintptr_t> out;
  } ctx{st.st_dev, st.st_ino, offset, self_exe_path(), true, {}};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t, void* data) {
        auto* c = static_cast<Ctx*>(data);
        const bool main = c->first;
        c->first = false;
        const char* file = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : (main ? c->exe.c_str() : nullptr);
        struct stat s;
        if (!file || ::stat(file, &s) != 0 || s.st_dev != c->dev || s.st_ino != c->ino) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          if (c->offset >= ph.p_offset && c->offset - ph.p_offset < ph.p_filesz) {
            c->out.push_back(info->dlpi_addr + ph.p_vaddr + (c->offset - ph.p_offset));
            break;
          }
        }
        return 0;
      },
      &ctx);
  return ctx.out;
}

}  // namespace uprobe
