// SPDX-License-Identifier: MIT
// uprobe-trace's CLI: the ELF tables kept between runs (tables_cache.hpp).
//
// Why: a run's checks read libc's tables (~4-5 ms of page faults and
// parsing on a 2-vCPU PVM guest, with its debug file's function bounds) and
// hand them to the agent, which waits for them before the program runs; the
// same files give the same tables in the next run. The identity checks are
// import_elf_tables()'s own (each image's file and its debug file by
// build-id: device, inode, size, mtime, ctime).

#include "tables_cache.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <uprobe/symbols.hpp>

namespace uptrace {

namespace {

constexpr const char* kPrefix = "elf-tables-";

/// `path` as a directory of this user's that no other user can write,
/// made (0700) when missing.
bool own_private_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return false;
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
         (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

}  // namespace

std::string tables_cache_dir() {
  // (Trailing slashes dropped: lstat() of "link/" follows the link.)
  auto trimmed = [](std::string d) {
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    return d;
  };
  if (const char* d = std::getenv("UPROBE_TRACE_CACHE_DIR")) {
    std::string dir = trimmed(d);
    if (!dir.empty() && dir[0] != '/') {  // (absolute: the agents of programs that change directory take it too)
      char cwd[PATH_MAX];
      if (!::getcwd(cwd, sizeof cwd)) return {};
      dir = std::string(cwd) + "/" + dir;
    }
    return !dir.empty() && own_private_dir(dir) ? dir : "";
  }
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/') {
    base = trimmed(x);
  } else if (const char* h = std::getenv("HOME"); h && *h == '/') {
    base = trimmed(h) + "/.cache";
  } else {
    return {};
  }
  if (::mkdir(base.c_str(), 0700) != 0 && errno != EEXIST) return {};
  const std::string dir = base + "/uprobe-trace";
  return own_private_dir(dir) ? dir : "";
}

std::string tables_cache_file(const std::string& dir, std::vector<std::string> keys) {
  if (dir.empty() || keys.empty()) return {};
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the keys, each NUL-terminated
  for (const std::string& f : keys)
    for (const char* c = f.c_str(); c <= f.c_str() + f.size(); ++c) h = (h ^ static_cast<unsigned char>(*c)) * 0x100000001b3ull;
  char name[32];
  std::snprintf(name, sizeof name, "%s%016llx", kPrefix, static_cast<unsigned long long>(h));
  return dir + "/" + name;
}

void keep_tables(const std::string& file, const std::vector<std::string>& files) noexcept {
  try {
    const std::string mine = file + "." + std::to_string(::getpid());
    ::unlink(mine.c_str());
    ::unlink((mine + ".tmp").c_str());  // (a run of this pid killed while writing)
    uprobe::export_elf_tables(mine, true, files);  // (files changed in the last seconds: read again next time)
    if (::rename(mine.c_str(), file.c_str()) != 0) ::unlink(mine.c_str());
    // The oldest beyond kKeptTablesFiles go (their names are hashes: runs on
    // ever new files, a test's temporary copies, would fill the directory).
    const std::string dir = file.substr(0, file.rfind('/'));
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    std::vector<std::pair<struct timespec, std::string>> kept;
    while (const dirent* e = ::readdir(d)) {
      struct stat st;
      const std::string p = dir + "/" + e->d_name;
      if (std::string(e->d_name).rfind(kPrefix, 0) == 0 && p != file && ::lstat(p.c_str(), &st) == 0)
        kept.emplace_back(st.st_mtim, p);  // (the one just written stays, whatever the others' times)
    }
    ::closedir(d);
    if (kept.size() < kKeptTablesFiles) return;
    std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
      return a.first.tv_sec != b.first.tv_sec ? a.first.tv_sec > b.first.tv_sec : a.first.tv_nsec > b.first.tv_nsec;
    });
    for (std::size_t i = kKeptTablesFiles - 1; i < kept.size(); ++i) ::unlink(kept[i].second.c_str());
  } catch (...) {
  }
}

void note_tables_used(const std::string& file) noexcept { ::utimensat(AT_FDCWD, file.c_str(), nullptr, 0); }

}  // namespace uptrace
