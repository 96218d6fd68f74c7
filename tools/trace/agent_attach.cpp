// SPDX-License-Identifier: MIT
// libuprobe-agent.so: the specs resolved in this process and every site
// registered in one transaction (agent.hpp; not signal context).

#include "agent.hpp"

#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <uprobe/batch.hpp>
#include <uprobe/config.hpp>
#include <uprobe/symbols.hpp>
#include <uprobe/uprobe.hpp>
#include <uprobe/usdt.hpp>

#include "spec.hpp"

namespace uptrace::agent {

Meta* meta = nullptr;
std::vector<unsigned char>* g_bt_blob = nullptr;
bt::Program g_bt;

using counts::kHeaderWords;

void load_bt_program(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  auto* blob = new std::vector<unsigned char>;
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    blob->resize(static_cast<std::size_t>(st.st_size));
    if (pread(fd, blob->data(), blob->size(), 0) != static_cast<ssize_t>(blob->size())) blob->clear();
  }
  close(fd);
  if (!blob->empty() && g_bt.load(blob->data(), blob->size())) g_bt_blob = blob;
}

namespace {

// Probe block `probe` of the program at a site whose `probe` string is
// `name` and `func` string `func` (copied, never freed), with its fast form
// (bt::fast_agg()); UPROBE_TRACE_DEBUG=1 prints which blocks run without the
// interpreter.
BtHit bt_hit(long probe, const std::string& name, const std::string& func, bool usdt) {
  const auto pi = static_cast<std::uint32_t>(probe);
  BtHit h{pi, strdup(name.c_str()), strdup(func.c_str()), bt::fast_agg(g_bt, pi, usdt)};
  if (libc_getenv("UPROBE_TRACE_DEBUG"))
    std::fprintf(stderr, "uprobe-trace agent: block %u at %s: %s\n", pi, name.c_str(),
                 h.fast.kind ? "one map update, without the interpreter" : "interpreted");
  return h;
}

// "malloc@@GLIBC_2.2.5" -> "malloc": the default version is what users write.
std::string display_symbol(const std::string& s) {
  auto at = s.find("@@");
  return at == std::string::npos ? s : s.substr(0, at);
}

// A shared library (ET_DYN, not a program): worth a pending registration
// when not loaded yet (libuprobe installs it when a dlopen() maps it).
bool is_shared_library(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  Elf64_Ehdr eh;
  bool ok = pread(fd, &eh, sizeof eh, 0) == static_cast<ssize_t>(sizeof eh);
  close(fd);
  return ok && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_type == ET_DYN &&
         base_name(path).find(".so") != std::string::npos;
}

enum class Where { here, pending, absent, error };

// Resolves a spec's PATH in this process.
Where resolve_binary(const std::string& name, std::string& path, std::string& why) {
  if (name.find('/') != std::string::npos) {
    char buf[PATH_MAX];
    if (!realpath(name.c_str(), buf)) {
      why = name + ": " + std::strerror(errno);
      return Where::error;
    }
    path = buf;
  } else {
    const std::string exe = self_exe();
    if (name == base_name(exe) || name == program_invocation_short_name) {
      path = exe;
      return Where::here;
    }
    try {
      path = uprobe::resolve_library(name);
      return Where::here;
    } catch (const uprobe::Error& e) {
      if (e.code() != uprobe::Errc::file_not_found) {
        why = e.what();
        return Where::error;
      }
      why = e.what();
      try {
        path = uprobe::resolve_library(name, uprobe::LibrarySearch::search_path);
      } catch (const uprobe::Error&) {
        return Where::absent;
      }
    }
  }
  if (loaded_here(path).value_or(false)) return Where::here;
  if (is_shared_library(path)) return Where::pending;
  why = path + " is not loaded in this process";
  return Where::absent;
}

struct FnPlan {
  std::string name;  // the first spec's name of the site (SYM, SYM+OFF, +FILEOFF)
  std::string path;
  std::uint64_t offset = 0;
  std::set<std::string> entry_keys, ret_keys;
  std::string hist_key;
  std::set<std::size_t> specs;  // indexes into meta->specs
  std::set<std::size_t> ret_specs;  // those of uretprobe specs
  std::vector<BtHit> bt_entries, bt_rets;
};

struct UsdtPlan {
  std::string key;
  std::vector<uprobe::usdt::Probe> sites;
  std::set<std::size_t> specs;  // indexes into meta->specs
  std::vector<BtHit> bt;
  bool count = true;  // a count key (not with a bpftrace program)
};

}  // namespace

namespace {

/// Whether the running kernel was built with CONFIG_X86_KERNEL_IBT, as its
/// config file in /boot says (false when there is none to read).
bool kernel_ibt() {
  static const bool ibt = [] {
    utsname u{};
    if (::uname(&u) != 0) return false;
    std::FILE* f = std::fopen((std::string("/boot/config-") + u.release).c_str(), "re");
    if (!f) return false;
    char line[256];
    bool on = false;
    while (!on && std::fgets(line, sizeof line, f)) on = std::strncmp(line, "CONFIG_X86_KERNEL_IBT=y", 23) == 0;
    std::fclose(f);
    return on;
  }();
  return ibt;
}

/// Whether the instruction at file offset `offset` of `path` is `push %rbp`
/// (0x55), or `endbr64` (f3 0f 1e fa) on a kernel built with
/// CONFIG_X86_KERNEL_IBT (whose is_endbr() is false otherwise): the kernel's
/// is_uprobe_at_func_entry() (arch/x86/kernel/uprobes.c), which decides
/// where its user stack walker reads the caller's return address at the
/// stack pointer. Read from the file (the code in memory may be patched
/// already).
/// (One open file at a time, kept for the next site of the same file: a glob
/// over libc's ~3,000 functions opened the file once per site.)
class FrameEntries {
 public:
  FrameEntries() = default;
  FrameEntries(const FrameEntries&) = delete;
  FrameEntries& operator=(const FrameEntries&) = delete;
  ~FrameEntries() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool sets_up_frame(const std::string& path, std::uint64_t offset) {
    if (path != path_) {
      if (fd_ >= 0) ::close(fd_);
      path_ = path;
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    }
    if (fd_ < 0) return false;
    unsigned char b[4] = {};
    const ssize_t got = ::pread(fd_, b, sizeof b, static_cast<off_t>(offset));
    if (got >= 1 && b[0] == 0x55) return true;
    return got == 4 && b[0] == 0xf3 && b[1] == 0x0f && b[2] == 0x1e && b[3] == 0xfa && kernel_ibt();
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

void add_message(SpecStatus& s, const std::string& m) {
  if (s.message.empty()) s.message = m;
}

namespace {

// A libc function that libuprobe itself runs where a probe cannot fire: its
// SIGTRAP handler reads errno before its recursion guard is up (a probe on
// __errno_location recurses until the stack overflows). Refused here rather
// than crashing the traced program; every alias at that offset is covered.
// (libuprobe refuses the others of its kind itself, with the reason.)
std::string refused_site(const std::string& path, std::uint64_t offset) {
  static auto* cache = new std::map<std::string, std::map<std::uint64_t, std::string>>;
  auto [it, fresh] = cache->try_emplace(path);
  if (fresh && base_name(path).rfind("libc.so", 0) == 0) {
    for (const char* name : {"__errno_location"}) {
      try {
        it->second[uprobe::resolve_symbol(path, name).offset] = name;
      } catch (const uprobe::Error&) {
      }
    }
  }
  auto hit = it->second.find(offset);
  if (hit == it->second.end()) return {};
  return "not probed: libuprobe's own trap/registration path calls " + hit->second +
         " (a probe there would recurse or be fatal)";
}

// 0 for most sites; 1 + i for the i-th libc function of the list below,
// which is what libuprobe's registration path calls, least used first
// (measured with UPROBE_TRACE_DEBUG=1 on `uprobe:libc:*`; a site missing here
// only makes attaching slower).
unsigned registration_rank(const std::string& path, std::uint64_t offset) {
  static const char* const kRegistrationPath[] = {
      "getenv", "memfd_create", "ftruncate", "fprintf", "write", "_IO_file_write", "_IO_file_xsputn",
      "_IO_do_write", "_IO_file_overflow", "brk", "sbrk", "__default_morecore", "vsnprintf", "munmap", "mmap",
      "getpagesize", "fstat", "fstat64", "pwrite", "pwrite64", "pread", "pread64", "sysconf", "getpid",
      "_IO_default_xsputn", "sigfillset", "close", "open", "open64", "read", "dladdr", "pthread_mutex_unlock",
      "pthread_mutex_lock", "stat", "stat64", "fstatat", "fstatat64", "_IO_str_underflow", "_IO_default_uflow",
      "__uflow", "_IO_setb", "__isoc99_sscanf", "free", "malloc", "__strtoul_internal", "_IO_sputbackc"};
  static auto* cache = new std::map<std::string, std::map<std::uint64_t, unsigned>>;
  auto [it, fresh] = cache->try_emplace(path);
  if (fresh && base_name(path).rfind("libc.so", 0) == 0) {
    unsigned rank = 1;
    for (const char* name : kRegistrationPath) {
      // The site resolve_symbol() gives the name: its symbol's offset (the
      // path is resolve_location()'s, canonical already), or for a GNU
      // IFUNC the implementation bound to it.
      try {
        const uprobe::Symbol sym = uprobe::find_symbol(path, name);
        if (sym.in_file && sym.executable)  // (what resolve_symbol() refuses is no site)
          it->second[sym.type == STT_GNU_IFUNC ? uprobe::resolve_symbol(path, name).offset : sym.offset] = rank;
      } catch (const uprobe::Error&) {
      }
      ++rank;
    }
  }
  auto hit = it->second.find(offset);
  return hit == it->second.end() ? 0 : hit->second;
}

/// Sites attached per mode (ProbeMode's values), counted while the probes
/// are in: no string, no map (their libc calls would be probed, some int3).
/// Named into meta->modes afterwards.
unsigned mode_sites[static_cast<std::size_t>(uprobe::ProbeMode::optimized_evicted) + 1] = {};

void note_mode(uprobe::ProbeMode mode) {
  const auto m = static_cast<std::size_t>(mode);
  if (m < std::size(mode_sites)) mode_sites[m]++;
}

void name_modes() {
  for (std::size_t m = 0; m < std::size(mode_sites); ++m)
    if (mode_sites[m]) meta->modes[uprobe::to_string(static_cast<uprobe::ProbeMode>(m))] += mode_sites[m];
}

}  // namespace

void make_counters() {
  auto* c = new Counters;
  c->nkeys = meta->keys.size();
  c->nhists = meta->hist_keys.size();
  c->hist_base = kHeaderWords + c->nkeys;
  c->block_words = block_words(c->nkeys, c->nhists);
  if (g_bt_blob) {  // the program's area after the counters, cache-line aligned
    c->bt = g_bt;
    c->bt_area = (c->block_words + 7) & ~std::size_t{7};
    c->block_words = c->bt_area + g_bt.h->area_words;
  }
  c->block_bytes = (c->block_words * sizeof(std::uint64_t) + counts::kPage - 1) / counts::kPage * counts::kPage;
  for (auto& b : c->blocks) b.store(nullptr, std::memory_order_relaxed);
  g = c;
}

namespace {

/// Int3 sites in code glibc runs with every signal blocked by a system call
/// of its own (probe_info().signals_blocked): a hit there kills the program,
/// and no signal mask libuprobe could change helps. Per spec, "NAME (where)".
std::map<std::size_t, std::vector<std::string>>* fatal_sites = nullptr;

void note_fatal_site(const uprobe::ProbeInfo& info, const std::string& name, const std::set<std::size_t>& specs) {
  if (info.mode != uprobe::ProbeMode::int3 || info.signals_blocked.empty()) return;
  if (!fatal_sites) fatal_sites = new std::map<std::size_t, std::vector<std::string>>;
  for (std::size_t s : specs) (*fatal_sites)[s].push_back(name + " (" + info.signals_blocked + ")");
}

/// The site's mode (its RegisterResult's) and, for an int3 function site, its
/// fatal-site warning: probe_info() of the registry's state only
/// (ProbeDetail::state; the symbol and IFUNC bindings would read the ELF
/// image and ask the dynamic linker, through libc functions that are probed
/// now), and only there: a few sites, not thousands.
void note_site(const uprobe::RegisterResult& r, const std::string* name, const std::set<std::size_t>* specs) {
  note_mode(r.mode);
  if (!name || r.mode != uprobe::ProbeMode::int3) return;
  try {
    note_fatal_site(uprobe::probe_info(r.probe, uprobe::ProbeDetail::state), *name, *specs);
  } catch (...) {
  }
}

/// The warning of each spec with such sites, added to its message.
void warn_fatal_sites() {
  if (!fatal_sites) return;
  for (const auto& [si, sites] : *fatal_sites) {
    SpecStatus& st = meta->specs[si];
    std::string w;
    if (sites.size() == 1) {
      w = sites[0] + ": int3 site in code glibc runs with every signal blocked: a hit there kills the program";
    } else {
      w = std::to_string(sites.size()) +
          " int3 sites in code glibc runs with every signal blocked, where a hit kills the program:";
      for (std::size_t i = 0; i < sites.size() && i < 5; ++i) w += (i ? ", " : " ") + sites[i];
      if (sites.size() > 5) w += ", ...";
    }
    st.message += (st.message.empty() ? "" : "; ") + w;
  }
}

}  // namespace

void attach(const std::vector<std::string>& texts) {
  std::map<std::pair<std::string, std::uint64_t>, FnPlan> fns;
  std::map<std::string, UsdtPlan> usdts;
  for (const std::string& line : texts) {
    // "PROBE\tSPEC[\tSHOWN]": an attach point of the bpftrace program's probe
    // block PROBE; SHOWN: the PATH its `probe` strings name (bpftrace's).
    long bt_probe = -1;
    std::string text = line, shown;
    if (const auto tab = line.find('\t'); tab != std::string::npos) {
      bt_probe = std::strtol(line.c_str(), nullptr, 10);
      text = line.substr(tab + 1);
      if (const auto t2 = text.find('\t'); t2 != std::string::npos) shown = text.substr(t2 + 1), text.resize(t2);
      if (!g_bt_blob || bt_probe < 0 || static_cast<std::uint64_t>(bt_probe) >= g_bt.h->nprobes) continue;
    }
    meta->specs.push_back({text, 0, ""});
    const std::size_t si = meta->specs.size() - 1;
    SpecStatus& st = meta->specs.back();
    std::string err;
    auto spec = parse_spec(text, err);
    if (!spec) {
      st.message = err;
      continue;
    }
    std::string path, why;
    Where w = resolve_binary(spec->binary, path, why);
    if (w == Where::absent || w == Where::error) {
      st.message = (w == Where::absent ? "not loaded here: " : "") + why;
      continue;
    }
    try {
      if (spec->kind == Kind::usdt) {
        std::set<std::string> mine;  // keys this spec created (a probe has several sites)
        std::set<std::string> bt_done;
        for (auto& p : uprobe::usdt::find(path + ":" + spec->what)) {
          std::string key = "usdt:" + p.path + ":" + p.provider + ":" + p.name;
          auto [it, fresh] = usdts.try_emplace(key);
          if (fresh) it->second.key = key, mine.insert(key), it->second.count = bt_probe < 0;
          if (bt_probe < 0) it->second.count = true;
          else if (bt_done.insert(key).second)
            it->second.bt.push_back(
                bt_hit(bt_probe, shown.empty() ? key : "usdt:" + shown + ":" + p.provider + ":" + p.name, p.name, true));
          it->second.specs.insert(si);
          if (mine.count(key)) it->second.sites.push_back(std::move(p));
        }
      } else {
        // (A GNU IFUNC such as strlen resolves to the implementation the
        // dynamic linker bound it to here: what calls run.)
        for (auto loc : uprobe::resolve_location(path + ":" + spec->what)) {
          std::string what = loc.symbol.empty() ? "+" + std::to_string(loc.offset) : display_symbol(loc.symbol);
          if (!loc.symbol.empty() && loc.symbol_offset) what += "+" + std::to_string(loc.symbol_offset);
          if (std::string why_not = refused_site(loc.path, loc.offset); !why_not.empty()) {
            add_message(st, display_symbol(loc.symbol) + ": " + why_not);
            st.failed++;
            continue;
          }
          FnPlan& f = fns[{loc.path, loc.offset}];
          f.path = loc.path, f.offset = loc.offset;
          if (f.name.empty()) f.name = what;
          f.specs.insert(si);
          if (spec->kind == Kind::uretprobe) f.ret_specs.insert(si);
          if (bt_probe >= 0) {
            const std::string probe_name =
                std::string(kind_name(spec->kind)) + ":" + (shown.empty() ? loc.path : shown) + ":" + what;
            (spec->kind == Kind::uprobe ? f.bt_entries : f.bt_rets)
                .push_back(bt_hit(bt_probe, probe_name, display_symbol(loc.symbol), false));
            continue;
          }
          (spec->kind == Kind::uprobe ? f.entry_keys : f.ret_keys)
              .insert(std::string(kind_name(spec->kind)) + ":" + loc.path + ":" + what);
          if (spec->kind == Kind::uretprobe || f.hist_key.empty()) f.hist_key = loc.path + ":" + what;
        }
      }
    } catch (const uprobe::Error& e) {
      st.message = e.what();
    }
  }

  // Counter layout.
  std::map<std::string, long> key_index;
  auto index_of = [&](const std::string& k) -> long {
    if (k.empty()) return -1;
    auto [it, fresh] = key_index.try_emplace(k, static_cast<long>(meta->keys.size()));
    if (fresh) meta->keys.push_back(k);
    return it->second;
  };
  struct PendingFn {
    FnPlan* plan;
    std::vector<long> entries, rets;
    long hist;
    unsigned rank = 0;  // registration_rank() of its site
  };
  std::vector<PendingFn> pf;
  for (auto& [k, f] : fns) {
    PendingFn p{&f, {}, {}, -1, 0};
    for (const auto& key : f.entry_keys) p.entries.push_back(index_of(key));
    for (const auto& key : f.ret_keys) p.rets.push_back(index_of(key));
    if (!p.entries.empty() && !p.rets.empty()) {
      p.hist = static_cast<long>(meta->hist_keys.size());
      meta->hist_keys.push_back(f.hist_key);
    }
    pf.push_back(std::move(p));
  }
  std::vector<std::pair<UsdtPlan*, long>> pu;
  for (auto& [k, u] : usdts) pu.emplace_back(&u, u.count ? index_of(u.key) : -1);

  make_counters();
  prepare_record_lines();

  // Register, every site in one transaction (register_uprobes(): one read of
  // the address space, one ELF read per file, one publication, the
  // breakpoints written last). Keys whose registration failed everywhere are
  // dropped from the record (they were never attached); their counters just
  // stay 0.
  std::vector<bool> attached(meta->keys.size(), false);
  std::vector<bool> hist_attached(meta->hist_keys.size(), false);
  // What the transaction does after the breakpoints are in (its optimized
  // jumps, the USDT semaphores, its bookkeeping) runs libc code (malloc,
  // free, locks, ...): a site there that is already armed traps then. The
  // breakpoints are written in request order, so those sites come last, the
  // most used last. (Taking such a site out and re-arming it is not an
  // option: libuprobe and liburcu-bp call libc with every signal blocked
  // while they unregister or unapply, and a trap there is fatal.)
  // (Ranked once per site, not per comparison; a single site needs no order,
  // nor the ~50 symbol lookups of the ranks.)
  if (pf.size() > 1) {
    for (PendingFn& p : pf) p.rank = registration_rank(p.plan->path, p.plan->offset);
    std::stable_sort(pf.begin(), pf.end(), [](const PendingFn& a, const PendingFn& b) { return a.rank < b.rank; });
  }
  using CB = uprobe::Callbacks;
  std::vector<uprobe::ProbeRequest> requests;
  std::vector<FnConsumer*> fn_consumers;  // request i < pf.size(): pf[i]'s
  FrameEntries frames;
  for (auto& p : pf) {
    const bool entry = !p.entries.empty() || !p.plan->bt_entries.empty();
    const bool ret = !p.rets.empty() || !p.plan->bt_rets.empty();
    CB cb = !entry ? CB::ret : !ret ? CB::entry : CB::entry_and_ret;
    auto* c = new FnConsumer(cb, p.entries, p.rets, p.hist, p.plan->bt_entries, p.plan->bt_rets,
                             !p.plan->bt_entries.empty() && frames.sets_up_frame(p.plan->path, p.plan->offset));  // never freed (see Meta)
    fn_consumers.push_back(c);
    requests.push_back(uprobe::ProbeRequest::at(p.plan->path, p.plan->offset, *c));
  }
  for (auto& [u, idx] : pu) {
    for (const auto& site : u->sites) {
      // One per site: each has its own argument specs (a site whose specs did
      // not parse gives 0 for every argN, as none).
      auto* c = new CountConsumer(idx, u->bt, site.args_error.empty() ? site.args : uprobe::usdt::ArgSpec{});  // never freed (see Meta)
      requests.push_back(uprobe::ProbeRequest::at(site.path, site.offset, *c, site.semaphore_offset));
    }
  }
  const std::vector<uprobe::RegisterResult> results = uprobe::register_uprobes(requests);

  // A site refused for its return probe alone (vfork returns twice: a
  // return probe there is refused, an entry probe is fine) keeps its entry
  // probes, registered again without the return side: the kernel registers
  // an entry and a return consumer apart, so one's refusal leaves the other.
  std::vector<PendingFn> entry_pf;  // (complete before Armed points into it)
  std::vector<std::set<std::size_t>> entry_specs;
  std::vector<std::size_t> entry_of;  // entry_pf[k] is pf[entry_of[k]]'s entry side
  std::vector<uprobe::ProbeRequest> entry_requests;
  std::vector<FnConsumer*> entry_consumers;
  for (std::size_t i = 0; i < pf.size(); ++i) {
    const PendingFn& p = pf[i];
    if (results[i] || fn_consumers[i]->callbacks() != CB::entry_and_ret) continue;
    std::set<std::size_t> mine;
    for (std::size_t s : p.plan->specs)
      if (!p.plan->ret_specs.count(s)) mine.insert(s);
    if (mine.empty()) continue;
    entry_of.push_back(i);
    entry_specs.push_back(std::move(mine));
    entry_pf.push_back({p.plan, p.entries, {}, -1, p.rank});
    auto* c = new FnConsumer(CB::entry, p.entries, {}, -1, p.plan->bt_entries, {},
                             fn_consumers[i]->entry_frame());  // never freed (see Meta)
    entry_consumers.push_back(c);
    entry_requests.push_back(uprobe::ProbeRequest::at(p.plan->path, p.plan->offset, *c));
  }
  const std::vector<uprobe::RegisterResult> entry_results =
      entry_requests.empty() ? std::vector<uprobe::RegisterResult>{} : uprobe::register_uprobes(entry_requests);
  std::vector<const std::set<std::size_t>*> entry_only(pf.size(), nullptr);  // the specs its entry side holds

  struct Armed {
    PendingFn* p;
    FnConsumer* c;
    const uprobe::RegisterResult* r;
    const std::set<std::size_t>* specs;  // the specs it attaches
  };
  std::vector<Armed> armed;
  armed.reserve(pf.size());
  for (std::size_t k = 0; k < entry_pf.size(); ++k)
    if (entry_results[k]) {
      armed.push_back({&entry_pf[k], entry_consumers[k], &entry_results[k], &entry_specs[k]});
      entry_only[entry_of[k]] = &entry_specs[k];
    }
  for (std::size_t i = 0; i < pf.size(); ++i) {
    if (results[i]) {
      armed.push_back({&pf[i], fn_consumers[i], &results[i], &pf[i].plan->specs});
      continue;
    }
    for (std::size_t s : pf[i].plan->specs) {
      if (entry_only[i] && entry_only[i]->count(s)) continue;  // attached by its entry side
      add_message(meta->specs[s], results[i].error->what());
      meta->specs[s].failed++;
    }
  }
  if (libc_getenv("UPROBE_TRACE_DEBUG"))
    for (const Armed& a : armed)
      if (a.c->setup_hits())
        std::fprintf(stderr, "uprobe-trace agent: %u hits while attaching: %s+%#llx\n", a.c->setup_hits(),
                     a.p->plan->path.c_str(), static_cast<unsigned long long>(a.p->plan->offset));
  for (const Armed& a : armed) {
    note_site(*a.r, &a.p->plan->name, a.specs);
    for (std::size_t s : *a.specs) meta->specs[s].attached++;
    for (long e : a.p->entries) attached[static_cast<std::size_t>(e)] = true;
    for (long r : a.p->rets) attached[static_cast<std::size_t>(r)] = true;
    if (a.p->hist >= 0) hist_attached[static_cast<std::size_t>(a.p->hist)] = true;
  }
  std::size_t i = pf.size();
  for (auto& [u, idx] : pu) {
    for (std::size_t k = 0; k < u->sites.size(); ++k, ++i) {
      if (results[i]) {
        note_site(results[i], nullptr, nullptr);
        for (std::size_t s : u->specs) meta->specs[s].attached++;
        if (idx >= 0) attached[static_cast<std::size_t>(idx)] = true;
        continue;
      }
      for (std::size_t s : u->specs) {
        add_message(meta->specs[s], results[i].error->what());
        meta->specs[s].failed++;
      }
    }
  }
  for (auto& sp : meta->specs)
    if (sp.failed && sp.attached)
      sp.message = std::to_string(sp.failed) + " of " + std::to_string(sp.failed + sp.attached) +
                   " sites not probed; first: " + sp.message;
  name_modes();
  warn_fatal_sites();
  // Keep only attached keys in the record (indexes stay as allocated).
  for (std::size_t i = 0; i < attached.size(); ++i)
    if (!attached[i]) meta->keys[i].clear();
  for (std::size_t i = 0; i < hist_attached.size(); ++i)
    if (!hist_attached[i]) meta->hist_keys[i].clear();
}

}  // namespace uptrace::agent
