// SPDX-License-Identifier: MIT
// uprobe-trace's CLI: spec checks before the run and `-l` (checks.hpp).

#include "checks.hpp"

#include <signal.h>

#include <elf.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <uprobe/symbols.hpp>
#include <uprobe/uprobe.hpp>
#include <uprobe/usdt.hpp>

#include "launch.hpp"
#include "ld_cache.hpp"
#include "tables_cache.hpp"

namespace uptrace {

std::string resolve_here(const std::string& name, const std::string& prog_path) {
  if (name.find('/') != std::string::npos) {
    struct stat st;
    if (stat(name.c_str(), &st) != 0) die(name + ": " + (errno == ENOENT ? "no such file" : std::strerror(errno)));
    if (S_ISDIR(st.st_mode)) die(name + ": is a directory, not a regular file");
    if (!S_ISREG(st.st_mode)) die(name + ": not a regular file");
    return real_path(name);
  }
  if (!prog_path.empty() && (name == base_name(prog_path))) return prog_path;
  try {
    return uprobe::resolve_library(name, uprobe::LibrarySearch::search_path);
  } catch (const uprobe::Error&) {
  }
  if (std::string p = find_program(name); !p.empty() && is_elf(p)) return p;
  return {};
}

std::string bpftrace_path(const std::string& name, const std::string& resolved) {
  if (name.find('/') != std::string::npos) return name;
  if (std::string c = ld_cache_path(name); !c.empty()) return c;
  return resolved;
}

// ---------------------------------------------------------------- -l

namespace {
bool fnmatch_like(const std::string& glob, const std::string& s) { return fnmatch(glob.c_str(), s.c_str(), 0) == 0; }
}  // namespace

int list(const std::string& arg, bool verbose) {
  // PATH, or uprobe:PATH[:GLOB], uretprobe:..., usdt:PATH[:PROVIDER[:NAME]].
  std::string path = arg, sym_glob = "*", usdt_provider = "*", usdt_name = "*";
  bool want_sym = true, want_usdt = true;
  auto colon = arg.find(':');
  std::string type = colon == std::string::npos ? "" : arg.substr(0, colon);
  if (type == "uprobe" || type == "u" || type == "uretprobe" || type == "ur") {
    want_usdt = false;
    std::string rest = arg.substr(colon + 1);
    auto last = rest.rfind(':');
    if (last != std::string::npos && last > 0) {
      path = rest.substr(0, last);
      sym_glob = rest.substr(last + 1);
    } else {
      path = rest;
    }
  } else if (type == "usdt" || type == "U") {
    want_sym = false;
    std::vector<std::string> parts;
    std::string rest = arg.substr(colon + 1);
    // PATH[:PROVIDER[:NAME]]: a PATH holds no ':' here.
    parts = split(rest, ':');
    if (parts.empty()) die("-l " + arg + ": expected usdt:PATH[:PROVIDER[:NAME]]");
    path = parts[0];
    if (parts.size() == 2 && !has_glob(parts[1])) {
      usdt_name = parts[1];  // usdt:PATH:NAME, any provider
    } else {
      if (parts.size() >= 2) usdt_provider = parts[1];
      if (parts.size() >= 3) usdt_name = parts[2];
    }
  }
  if (path.empty()) die("-l: empty PATH");
  const std::string file = resolve_here(path, {});
  if (file.empty()) die(path + ": no such file, loaded library, library on the search path or program in $PATH");
  // (listed by the path bpftrace shows: as written, or libc's from the linker's cache)
  const std::string shown = bpftrace_path(path, file);
  std::string out;
  try {
    if (want_sym) {
      // bpftrace's names: .symtab's as they are (`fnmatch@@GLIBC_2.2.5` in
      // libc6-dbg's), .dynsym's without their version.
      std::set<std::string> names;
      for (const auto& s : uprobe::read_symbols(file)) {
        if (!s.executable || !s.in_file) continue;
        if (s.type != STT_FUNC && s.type != STT_GNU_IFUNC) continue;
        // (and, as bpftrace 0.17's listing, no GCC partial function `f.part.N`)
        if (s.name.find(".part.") != std::string::npos) continue;
        for (const std::string& n : {s.name, s.dynamic ? s.name : s.full_name()})
          if (fnmatch_like(sym_glob, n)) names.insert(n);
      }
      for (const auto& n : names) out += "uprobe:" + shown + ":" + n + "\n";
    }
    if (want_usdt) {
      std::vector<std::string> order;
      struct Info {
        unsigned sites = 0;
        std::vector<std::string> detail;
      };
      std::map<std::string, Info> info;
      for (const auto& p : uprobe::usdt::probes(file)) {
        if (!fnmatch_like(usdt_provider, p.provider) || !fnmatch_like(usdt_name, p.name)) continue;
        std::string k = "usdt:" + shown + ":" + p.provider + ":" + p.name;
        auto [it, fresh] = info.try_emplace(k);
        if (fresh) order.push_back(k);
        it->second.sites++;
        char b[128];
        std::snprintf(b, sizeof b, "    site 0x%llx", static_cast<unsigned long long>(p.offset));
        std::string d = b;
        if (p.semaphore_offset) {
          std::snprintf(b, sizeof b, ", semaphore 0x%llx", static_cast<unsigned long long>(p.semaphore_offset));
          d += b;
        }
        if (!p.args_text.empty()) d += ", args: " + p.args_text;
        if (!p.error.empty()) d += " (unusable: " + p.error + ")";
        it->second.detail.push_back(d);
      }
      for (const auto& k : order) {
        out += k + "\n";
        if (verbose)
          for (const auto& d : info[k].detail) out += d + "\n";
      }
    }
  } catch (const uprobe::Error& e) {
    die(e.what());
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

// ---------------------------------------------------------------- validation

// Definite errors (no such file, symbol or USDT probe) stop before the run,
// as in bpftrace; what this process cannot resolve (a library the program
// loads from its own RUNPATH, a script's interpreter) is left to the agent.
// A consumer that only exists to have a probe site checked.
namespace {

class NullConsumer final : public uprobe::Consumer {
 public:
  uprobe::Action handler(uprobe::Regs&) override { return uprobe::Action::keep; }
};

// An offset into a function (SYM+OFF, 0xADDR, +FILEOFF) must be an
// instruction start: libuprobe checks that when a probe is registered, so a
// file this process has not mapped gets a pending registration here (nothing
// is patched), taken back at once. A file mapped here (libc, ...) is planned
// instead (uprobe::plan_site(): the same checks of the file, nothing
// attached): registering would patch this process's own code.
void check_site(const uprobe::Location& loc) {
  if (!loc.symbol.empty() && loc.symbol_offset == 0) return;  // a function entry
  const std::optional<bool> mapped = loaded_here(loc.path);
  if (!mapped) return;  // (one that cannot be read: the agent says why)
  static NullConsumer consumer;
  try {
    if (*mapped) uprobe::plan_site(loc.path, loc.offset);
    else uprobe::unregister_uprobe(uprobe::register_uprobe(loc.path, loc.offset, consumer), consumer);
  } catch (const uprobe::Error& e) {
    if (e.code() == uprobe::Errc::mid_instruction || e.code() == uprobe::Errc::not_executable ||
        e.code() == uprobe::Errc::bad_offset || e.code() == uprobe::Errc::refused_instruction)
      die(e.what());
  }
}

}  // namespace

// (The count comes from the same resolution: a glob over libc is resolved once.)
namespace {

/// True when `s` (an uprobe or uretprobe of `file`) names a function `file`
/// has no symbol for: no symbol of that name, or none its wildcard matches
/// (an offset, SYM+OFF of an existing SYM, or any other error: false).
bool names_no_function(const Spec& s, const std::string& file) {
  if (s.what.empty()) return false;
  if (s.kind == Kind::usdt) {
    // PROVIDER:NAME or NAME (any provider), globs: no probe of the file
    // matches (bpftrace 0.17 skips such a usdt attach point as it skips a
    // missing function; a probe that is there but cannot be used is an error).
    const auto colon = s.what.find(':');
    const std::string provider = colon == std::string::npos ? "*" : s.what.substr(0, colon);
    const std::string name = colon == std::string::npos ? s.what : s.what.substr(colon + 1);
    try {
      for (const auto& p : uprobe::usdt::probes(file))
        if (fnmatch_like(provider, p.provider) && fnmatch_like(name, p.name)) return false;
      return true;
    } catch (const uprobe::Error&) {
      return false;
    }
  }
  std::string name = s.what.substr(0, s.what.find('+'));
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;  // (an offset)
  try {
    return uprobe::match_symbols(file, name.substr(0, name.find('@'))).empty();
  } catch (const uprobe::Error&) {
    return false;
  }
}

}  // namespace

std::size_t validate(const Spec& s, const std::string& prog_path, std::string* skipped) {
  std::string file = resolve_here(s.binary, prog_path);
  if (file.empty()) return 1;
  if (!is_elf(file)) {
    // Named by a path: that file is what the user means, and it cannot be
    // probed. (By name, a script run by PROG resolves differently in the agent.)
    if (s.binary.find('/') == std::string::npos) return 1;
    if (::access(file.c_str(), R_OK) != 0) die(s.binary + ": " + std::strerror(errno));  // (EACCES: not "not ELF")
    die(s.binary + ": not an ELF file");
  }
  try {
    if (s.kind == Kind::usdt) {
      std::set<std::string> names;
      for (const auto& p : uprobe::usdt::find(file + ":" + s.what)) names.insert(p.provider + ":" + p.name);
      return has_glob(s.what) ? std::max<std::size_t>(names.size(), 1) : 1;
    }
    const std::vector<uprobe::Location> locs = uprobe::resolve_location(file + ":" + s.what);
    for (const auto& loc : locs) check_site(loc);
    return has_glob(s.what) ? std::max<std::size_t>(locs.size(), 1) : 1;
  } catch (const uprobe::Error& e) {
    if (skipped && names_no_function(s, file)) {
      *skipped = e.what();
      return 0;
    }
    if (e.code() == uprobe::Errc::bad_offset || e.code() == uprobe::Errc::not_executable) die(e.what());
  }
  return 1;
}

namespace {

/// What the kept tables of a run are found by: each spec as probed here
/// (its kind, its file as resolved here, what it names in it). The specs,
/// not only the files: runs of the same files that read different tables
/// (a glob reads a debug file's symbols) keep a file each, which holds only
/// what its run reads. A file that cannot be resolved is left out
/// (validate() says why).
/// `files`: the files they name, as resolved here (what the tables written
/// for the agent, and kept, hold: export_elf_tables()'s `files`). Any
/// thread: a file that cannot be resolved is left out, never died on (here
/// die() throws).
std::vector<std::string> spec_keys(const std::vector<Spec>& specs, const std::string& prog_path,
                                   std::vector<std::string>& files) {
  const bool threw = t_die_throws;
  t_die_throws = true;
  std::vector<std::string> keys;
  for (const Spec& s : specs) {
    try {
      if (std::string f = resolve_here(s.binary, prog_path); !f.empty()) {
        keys.push_back(std::to_string(static_cast<int>(s.kind)) + ":" + f + ":" + s.what);
        files.push_back(f);
      }
    } catch (const Died&) {
    }
  }
  t_die_throws = threw;
  return keys;
}

SpecChecks* g_running_checks = nullptr;  // (one run at a time: joined by die())
}  // namespace

void SpecChecks::validate_all() {
  for (std::size_t k = 0; k < specs_->size(); ++k) {
    std::string why;
    probes_ += validate((*specs_)[k], prog_path_, skip_missing_ ? &why : nullptr);
    if (!why.empty()) skipped_.emplace_back(k, why);
  }
}

SpecChecks::SpecChecks(const std::vector<Spec>& specs, const std::string& prog_path, const std::string& tables_path,
                       bool skip_missing)
    : specs_(&specs), prog_path_(prog_path), tables_path_(tables_path), skip_missing_(skip_missing) {
  // The kept tables' file, named here, before the program starts: its agent
  // takes them at once (kEnvTables), without waiting for these checks.
  if (!tables_path_.empty()) {
    kept_ = tables_cache_file(tables_cache_dir(), spec_keys(specs, prog_path, files_));
    // One per file (`libc` and /lib/x86_64-linux-gnu/libc.so.6 are one: the
    // kept file holds its tables once, and N counts files).
    std::vector<std::pair<dev_t, ino_t>> seen;
    std::vector<std::string> unique;
    for (const std::string& f : files_) {
      struct stat st;
      if (::stat(f.c_str(), &st) != 0) continue;
      if (std::find(seen.begin(), seen.end(), std::pair<dev_t, ino_t>(st.st_dev, st.st_ino)) != seen.end()) continue;
      seen.emplace_back(st.st_dev, st.st_ino);
      unique.push_back(f);
    }
    files_ = std::move(unique);
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // (inherited by the thread)
  running_ = pthread_create(
                 &thread_, nullptr,
                 [](void* p) -> void* {
                   auto* self = static_cast<SpecChecks*>(p);
                   t_die_throws = true;
                   try {
                     // The tables kept by an earlier run of these files, when
                     // they are still theirs (tables_cache.hpp).
                     const std::string& kept = self->kept_;
                     std::size_t taken = 0;
                     if (usable_tables_file(kept.c_str())) taken = self->kept_taken_ = uprobe::import_elf_tables(kept);
                     if (taken) note_tables_used(kept);
                     const std::size_t held = uprobe::elf_tables_held();
                     self->validate_all();
                     // The agent waits for tables written here when it took
                     // fewer than one per file from the kept file (so did
                     // these checks: a file changed since, or none kept).
                     if (!self->tables_path_.empty() && taken < self->files_.size()) {
                       try {
                         uprobe::export_elf_tables(self->tables_path_, false, self->files_);
                       } catch (const uprobe::Error&) {  // (the agent reads them itself)
                       }
                     }
                     if (!kept.empty() && uprobe::elf_tables_held() != held)
                       keep_tables(kept, self->files_);  // (something was read here)
                   } catch (const Died& d) {
                     self->error_ = d.message;
                   } catch (const std::exception& e) {
                     self->error_ = e.what();
                   }
                   return nullptr;
                 },
                 this) == 0;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!running_) {  // (no thread: here, now)
    validate_all();
    return;
  }
  g_running_checks = this;
  g_before_die = [] {
    if (g_running_checks) g_running_checks->join();
  };
}

std::string kept_tables_env(const SpecChecks* checks) {
  if (!checks || checks->kept_path().empty()) return {};
  return std::to_string(checks->spec_files()) + ":" + checks->kept_path();
}

void SpecChecks::join() {
  if (running_) pthread_join(thread_, nullptr);
  running_ = false;
  if (g_running_checks == this) g_running_checks = nullptr;
}

SpecChecks::~SpecChecks() { join(); }

std::size_t SpecChecks::wait() {
  join();
  if (!error_.empty()) die(error_);
  return probes_;
}

}  // namespace uptrace
