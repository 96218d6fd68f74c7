// SPDX-License-Identifier: MIT
// uprobe-trace: runs a program with libuprobe-agent.so preloaded, counting
// probe hits in the program (and, unless --no-follow, in every process it
// execs), and prints the counts and latency histograms at exit in bpftrace's
// format. `uprobe-trace -l PATH` lists what can be probed in PATH.

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <fnmatch.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <elf.h>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <uprobe/config.hpp>
#include <uprobe/symbols.hpp>
#include <uprobe/uprobe.hpp>
#include <uprobe/usdt.hpp>

#include "bt_lang.hpp"
#include "ld_cache.hpp"
#include "usym.hpp"
#include "counts.hpp"
#include "record.hpp"
#include "spec.hpp"

#ifndef UPROBE_TRACE_AGENT_NAME
#define UPROBE_TRACE_AGENT_NAME "libuprobe-agent.so"
#endif
#ifndef UPROBE_TRACE_BIN_TO_LIB
#define UPROBE_TRACE_BIN_TO_LIB "../lib"
#endif

namespace {

using namespace uptrace;

const char* const kUsage =
    "usage: uprobe-trace [-q] [-o FILE] [-f text|json] -e PROGRAM [-c 'CMD' | -- PROG [ARGS...]]\n"
    "       uprobe-trace [-q] [-o FILE] [-f text|json] PROGRAM-FILE [-c 'CMD' | -- PROG [ARGS...]]\n"
    "       uprobe-trace [-e SPEC]... [-o FILE] [--format text|json] [--per-thread] [--no-follow] [--] PROG [ARGS...]\n"
    "       uprobe-trace -l PATH|SPEC [-v]\n"
    "\n"
    "Runs PROG with libuprobe's agent preloaded (no root, no ptrace, no eBPF). With a bpftrace program\n"
    "(bpftrace 0.17's language, user-space probes: tools/trace/README.md says what is supported), its\n"
    "actions run in PROG at each hit and the output is bpftrace's. With bare SPECs, it counts probe hits\n"
    "and, for functions with both an entry and a return probe, draws a log2 latency histogram; the\n"
    "report (bpftrace's format) goes to standard error at exit.\n"
    "\n"
    "SPEC (bpftrace's spelling; PATH is a path, a library name such as `libc', or the program's name):\n"
    "  uprobe:PATH:SYM[+OFF]      function entry or an offset into it; SYM may be a glob (`str*'),\n"
    "                             0xADDR (link-time address) or +OFF (file offset); short form u:\n"
    "  uretprobe:PATH:SYM         function return; SYM may be a glob; short form ur:\n"
    "  usdt:PATH:PROVIDER:NAME    a USDT probe at all its sites, semaphore set while attached; short form U:\n"
    "\n"
    "options:\n"
    "  -e PROGRAM|SPEC    a bpftrace program, or a probe spec (repeatable)\n"
    "  -c 'CMD'           the program to run, split into words at blanks ('...' and \"...\" quote)\n"
    "  -q                 no \"Attaching N probes...\" line\n"
    "  -o FILE            write the output (the report) to FILE (default: standard output for programs,\n"
    "                     standard error for the report of SPECs)\n"
    "  -f, --format F     text (default) or json (bpftrace's JSON lines for a program)\n"
    "  --per-thread       also report counts per process and thread (SPECs)\n"
    "  --no-follow        do not trace the programs PROG execs (forked children are always traced)\n"
    "  -l PATH|SPEC       list the probe-able functions and USDT probes of PATH (or those a SPEC matches)\n"
    "  -v                 with -l: USDT sites, semaphores and argument specs; when tracing: each\n"
    "                     process's probe sites by mode (int3, optimized-nop5, pending)\n"
    "  -p PID             refused: uprobe-trace runs inside the programs it starts (no ptrace)\n"
    "  -h, --help         this text\n"
    "\n"
    "environment: UPROBE_TRACE_AGENT overrides the agent's path.\n";

void remove_tree(const std::string& dir);
/// The trace directory die() removes: set while the program is being started
/// (its checks may still refuse a spec).
std::string g_dir_to_remove;

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "uprobe-trace: %s\n", m.c_str());
  if (!g_dir_to_remove.empty()) remove_tree(g_dir_to_remove);
  std::exit(2);
}

/// The traced program's start (exec, loading, the agent's attach) runs while
/// this process checks the specs (validate(): each reads ELF files; ~10 ms
/// of page faults on a VM): the child's agent waits at this gate once it has
/// attached, before any code of the program runs (agent.cpp,
/// pass_start_gate()), until open(). If this process dies first (die(): a
/// refused spec), the agent reads end-of-file and the child exits (125)
/// without running the program. A socket pair: a child gone before the gate
/// opens costs no SIGPIPE here (MSG_NOSIGNAL).
struct StartGate {
  int fd[2] = {-1, -1};  ///< [0] ours (close-on-exec), [1] the child's
  void make() {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fd) != 0) die(std::string("socketpair: ") + std::strerror(errno));
    fcntl(fd[0], F_SETFD, FD_CLOEXEC);
  }
  /// In the child, before exec: the agent finds its end by kEnvGate.
  void in_child() {
    if (fd[1] < 0) return;
    close(fd[0]);
    setenv(kEnvGate, std::to_string(fd[1]).c_str(), 1);
  }
  void in_parent() {
    if (fd[1] >= 0) close(fd[1]);
    fd[1] = -1;
  }
  /// Lets the program run (once every spec was checked).
  void open() {
    if (fd[0] >= 0 && send(fd[0], "1", 1, MSG_NOSIGNAL) < 0) {
    }  // (a child already gone: its status says why)
    shut();
  }
  /// Ends the program at the gate (end-of-file: its agent exits, 125).
  void shut() {
    if (fd[0] >= 0) close(fd[0]);
    fd[0] = -1;
  }
};

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  buf[n] = 0;
  return buf;
}

std::string dir_name(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

std::string base_name(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

bool is_file(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string real_path(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) ? std::string(buf) : p;
}

// execvp's search.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return is_file(name) ? real_path(name) : std::string();
  const char* path = getenv("PATH");
  for (const std::string& d : split(path ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    std::string c = d + "/" + name;
    if (is_file(c) && access(c.c_str(), X_OK) == 0) return real_path(c);
  }
  return {};
}

bool is_elf(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  char m[4] = {};
  f.read(m, 4);
  return f && std::memcmp(m, ELFMAG, SELFMAG) == 0;
}

/// Whether running `path` loads the agent, which then waits at the start
/// gate (StartGate): a dynamically linked ELF program (PT_INTERP), or a
/// `#!` script whose interpreter is one, run without secure-execution mode
/// (no set-user-ID or set-group-ID bit, no file capabilities: the dynamic
/// linker would ignore LD_PRELOAD). Otherwise PROG would run before the
/// specs are checked: they are checked first, as the program must not run
/// if one is refused.
bool loads_the_agent(const std::string& path, int depth = 0) {
  struct stat st;
  if (depth > 2 || stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (st.st_mode & (S_ISUID | S_ISGID)) return false;
  if (getxattr(path.c_str(), "security.capability", nullptr, 0) >= 0) return false;
  std::ifstream f(path, std::ios::binary);
  char head[256] = {};
  f.read(head, sizeof head);
  const std::streamsize n = f.gcount();
  if (n >= 2 && head[0] == '#' && head[1] == '!') {
    std::string line(head + 2, static_cast<std::size_t>(n - 2));
    line = line.substr(0, line.find('\n'));
    const std::size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos) return false;
    const std::string interp = line.substr(b, line.find_first_of(" \t", b) - b);
    return interp.find('/') != std::string::npos && loads_the_agent(interp, depth + 1);
  }
  Elf64_Ehdr eh;
  if (n < static_cast<std::streamsize>(sizeof eh) || std::memcmp(head, ELFMAG, SELFMAG) != 0) return false;
  std::memcpy(&eh, head, sizeof eh);
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr)) return false;
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    f.clear();
    f.seekg(static_cast<std::streamoff>(eh.e_phoff + i * sizeof ph));
    if (!f.read(reinterpret_cast<char*>(&ph), sizeof ph)) return false;
    if (ph.p_type == PT_INTERP) return true;
  }
  return false;  // statically linked
}

// PATH of a spec or of -l, as this process can see it: a path, the program
// (by its name), a program found in $PATH, or a library on the search path.
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

// PATH as bpftrace 0.17 shows it: as written when it has a '/', the
// dynamic linker cache's path for a `lib...` name, else what this process
// resolves.
std::string bpftrace_path(const std::string& name, const std::string& resolved) {
  if (name.find('/') != std::string::npos) return name;
  if (std::string c = ld_cache_path(name); !c.empty()) return c;
  return resolved;
}

// ---------------------------------------------------------------- -l

bool fnmatch_like(const std::string& glob, const std::string& s) { return fnmatch(glob.c_str(), s.c_str(), 0) == 0; }

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
    if (parts.size() >= 2) usdt_provider = parts[1];
    if (parts.size() >= 3) usdt_name = parts[2];
    if (parts.size() == 2 && !has_glob(parts[1])) usdt_provider = "*", usdt_name = parts[1];
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
class NullConsumer final : public uprobe::Consumer {
 public:
  uprobe::Action handler(uprobe::Regs&) override { return uprobe::Action::keep; }
};

bool loaded_here(const std::string& file) {
  struct stat st;
  if (stat(file.c_str(), &st) != 0) return true;
  for (const auto& o : uprobe::loaded_objects())
    if (o.path == file || (o.dev == st.st_dev && o.ino == st.st_ino)) return true;
  return false;
}

// An offset into a function (SYM+OFF, 0xADDR, +FILEOFF) must be an
// instruction start: libuprobe checks that when a probe is registered, so a
// file this process has not mapped gets a pending registration here (nothing
// is patched), taken back at once. A file mapped here (libc, ...) is left to
// the agent: registering would patch this process's own code.
void check_site(const uprobe::Location& loc) {
  if (!loc.symbol.empty() && loc.symbol_offset == 0) return;  // a function entry
  if (loaded_here(loc.path)) return;
  static NullConsumer consumer;
  try {
    uprobe::unregister_uprobe(uprobe::register_uprobe(loc.path, loc.offset, consumer), consumer);
  } catch (const uprobe::Error& e) {
    if (e.code() == uprobe::Errc::mid_instruction || e.code() == uprobe::Errc::not_executable ||
        e.code() == uprobe::Errc::bad_offset || e.code() == uprobe::Errc::refused_instruction)
      die(e.what());
  }
}

/// Also returns the number of probes bpftrace would attach for the spec (its
/// wildcard expansions; 1 without a wildcard or where this process cannot
/// tell), from the same resolution: a glob over libc is resolved once.
std::size_t validate(const Spec& s, const std::string& prog_path) {
  std::string file = resolve_here(s.binary, prog_path);
  if (file.empty()) return 1;
  if (!is_elf(file)) {
    // Named by a path: that file is what the user means, and it cannot be
    // probed. (By name, a script run by PROG resolves differently in the agent.)
    if (s.binary.find('/') != std::string::npos) die(s.binary + ": not an ELF file");
    return 1;
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
    if (e.code() == uprobe::Errc::bad_offset || e.code() == uprobe::Errc::not_executable) die(e.what());
  }
  return 1;
}

// ---------------------------------------------------------------- run

std::string find_agent() {
  if (const char* a = getenv("UPROBE_TRACE_AGENT")) return a;
  const std::string dir = dir_name(self_exe());
  for (const std::string& c : {dir + "/" + UPROBE_TRACE_AGENT_NAME,
                               dir + "/" + UPROBE_TRACE_BIN_TO_LIB + "/" + UPROBE_TRACE_AGENT_NAME})
    if (is_file(c)) return real_path(c);
  die(std::string("cannot find ") + UPROBE_TRACE_AGENT_NAME + " next to " + dir + " (set UPROBE_TRACE_AGENT)");
}

// libuprobe.so as this process loaded it: preloaded too, so that its
// sigaction()/signal()/dlopen() interposition comes before libc's.
std::string find_libuprobe() {
  // The file mapped there (/proc/self/maps: an absolute path, also when the
  // dynamic linker found it through a relative LD_LIBRARY_PATH, whose
  // dli_fname is relative). Without it the traced program would load
  // libuprobe after libc, as the agent's dependency, where every probe is refused.
  try {
    return real_path(uprobe::resolve_address(reinterpret_cast<const void*>(&uprobe::stats)).path);
  } catch (const uprobe::Error&) {
    return {};
  }
}

void remove_tree(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") unlink((dir + "/" + n).c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

// DIR/counts (counts.hpp): made before the program runs; every traced
// process maps it and counts there. Returns its descriptor (close-on-exec).
// The trace's private directory (counts file, records, program): under
// $TMPDIR when it is set, else in /dev/shm when that is a writable tmpfs
// directory, else under /tmp. Memory-backed, its files cost no journal: a
// shared page a traced thread first writes, a record file, the final unlink
// are page-cache operations only (with /tmp on ext4, a traced process's
// start took ~20% longer). Storage is reserved before any page is written
// (fallocate: create_counts_file(), the agent's alloc_block()), so a full
// filesystem gives unrecorded hits, never a SIGBUS in the program.
std::string make_trace_dir() {
  std::string base;
  if (const char* tmp = getenv("TMPDIR"); tmp && *tmp) {
    base = tmp;
  } else {
    struct statfs fs;
    base = statfs("/dev/shm", &fs) == 0 && fs.f_type == TMPFS_MAGIC && access("/dev/shm", W_OK | X_OK) == 0
               ? "/dev/shm"
               : "/tmp";
  }
  const std::string tmpl = base + "/uprobe-trace.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back(0);
  if (!mkdtemp(buf.data())) die("mkdtemp " + tmpl + ": " + std::strerror(errno));
  return buf.data();
}

int create_counts_file(const std::string& dir) {
  const std::string path = dir + "/" + counts::kFileName;
  auto fail = [&](const std::string& what) {
    const std::string m = path + ": " + what + ": " + std::strerror(errno);
    remove_tree(dir);
    die(m);
  };
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) fail("create");
  if (ftruncate(fd, static_cast<off_t>(counts::kHeaderBytes)) != 0) fail("ftruncate");
  // The header's first page, which this writes (the rest is sparse: a page
  // of the tables is reserved by the process that first writes it).
  if (fallocate(fd, 0, 0, static_cast<off_t>(counts::kPage)) != 0 && errno != EOPNOTSUPP && errno != ENOSYS)
    fail("fallocate");
  void* m = mmap(nullptr, counts::kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) fail("mmap");
  auto* h = static_cast<counts::Header*>(m);
  h->page_size = counts::kPage;
  h->next_page.store(counts::kHeaderPages);
  h->bt_start_ns = bt::now_ns();
  h->magic = counts::kMagic;
  munmap(m, counts::kHeaderBytes);
  return fd;
}

// The report from the images' record files (DIR/*.rec) and the counts file:
// one process record per process (an image, or a fork child of one), with
// the counts of its blocks. Reads what is there now (processes may still be
// running after a second Ctrl-C).
Report read_report(const std::string& dir, int counts_fd) {
  std::map<std::uint64_t, ImageRecord> images;  // by layout
  std::vector<ImageRecord> unmapped;             // layout 0: the process could not map the counts file
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() < 5 || n.substr(n.size() - 4) != ".rec") continue;
      std::ifstream f(dir + "/" + n, std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      if (auto r = parse_image(ss.str())) {
        if (r->layout == 0) unmapped.push_back(std::move(*r));
        else images.emplace(r->layout, std::move(*r));
      }
    }
    closedir(d);
  }
  Report rep;
  void* m = mmap(nullptr, counts::kHeaderBytes, PROT_READ, MAP_SHARED, counts_fd, 0);
  if (m == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    remove_tree(dir);
    die(dir + "/" + counts::kFileName + ": mmap: " + why);
  }
  const auto* h = static_cast<const counts::Header*>(m);
  // Processes, in the order they registered: (pid, layout) -> record.
  std::map<std::pair<long, std::uint64_t>, std::size_t> index;
  std::vector<std::pair<std::size_t, ProcessRecord>> procs;  // (registration order, record)
  auto add_proc = [&](const ImageRecord& img, long pid, long ppid, std::size_t order) -> ProcessRecord& {
    auto [it, fresh] = index.try_emplace({pid, img.layout}, procs.size());
    if (fresh) procs.emplace_back(order, process_of(img, pid, ppid));
    return procs[it->second].second;
  };
  const std::uint64_t nprocs = std::min<std::uint64_t>(h->nprocs.load(), counts::kMaxProcs);
  for (std::uint64_t i = 0; i < nprocs; ++i) {
    const counts::Proc& p = h->procs[i];
    if (p.ready.load(std::memory_order_acquire) != 1) continue;
    auto img = images.find(p.layout);
    if (img != images.end()) add_proc(img->second, static_cast<long>(p.pid), static_cast<long>(p.ppid), i);
  }
  for (const auto& [layout, img] : images)  // (the process table was full)
    add_proc(img, img.pid, img.ppid, counts::kMaxProcs);
  // Blocks.
  const std::uint64_t nslots = std::min<std::uint64_t>(h->nslots.load(), counts::kMaxSlots);
  std::vector<std::uint64_t> buf;
  for (std::uint64_t i = 0; i < nslots; ++i) {
    const std::uint64_t w = h->slots[i].load(std::memory_order_acquire);
    if (w == 0) continue;
    const std::size_t bytes = counts::slot_pages(w) * counts::kPage;
    buf.assign(bytes / sizeof(std::uint64_t), 0);
    if (pread(counts_fd, buf.data(), bytes, static_cast<off_t>(counts::slot_first_page(w) * counts::kPage)) !=
        static_cast<ssize_t>(bytes))
      continue;
    if (buf[counts::kBlockMagicWord] != counts::kBlockMagic) continue;
    const std::size_t words = buf[counts::kBlockWords];
    auto img = images.find(buf[counts::kBlockLayout]);
    if (words > buf.size() || img == images.end()) continue;
    ProcessRecord& r = add_proc(img->second, static_cast<long>(static_cast<std::int64_t>(buf[counts::kBlockPid])), 0,
                                counts::kMaxProcs);
    add_block(r, img->second, buf.data(), words);
  }
  rep.unrecorded = h->unrecorded.load();
  munmap(m, counts::kHeaderBytes);
  for (const auto& img : unmapped) procs.emplace_back(counts::kMaxProcs, process_of(img, img.pid, img.ppid));
  std::stable_sort(procs.begin(), procs.end(), [](const auto& a, const auto& b) {
    return a.second.pid != b.second.pid ? a.second.pid < b.second.pid : a.first < b.first;
  });
  for (const auto& [order, r] : procs) rep.add(r);
  return rep;
}

volatile sig_atomic_t g_child = 0;

void forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

/// The CLI's signals while a traced program runs: SIGINT (which the terminal
/// sends to the program too) and SIGCHLD are taken through `fd` (a
/// signalfd); SIGQUIT is ignored; SIGTERM and SIGHUP go to the program
/// (forward()). restore_in_child() gives a forked child the dispositions and
/// mask the CLI started with.
struct TraceSignals {
  struct sigaction old_int{}, old_quit{};
  sigset_t old_mask{};
  int fd = -1;
  TraceSignals() {
    struct sigaction dfl{}, ign{}, fwd{};
    dfl.sa_handler = SIG_DFL;
    ign.sa_handler = SIG_IGN;
    fwd.sa_handler = forward;
    sigset_t waited;
    sigemptyset(&waited);
    sigaddset(&waited, SIGINT);
    sigaddset(&waited, SIGCHLD);
    sigprocmask(SIG_BLOCK, &waited, &old_mask);
    sigaction(SIGINT, &dfl, &old_int);
    sigaction(SIGQUIT, &ign, &old_quit);
    sigaction(SIGTERM, &fwd, nullptr);
    sigaction(SIGHUP, &fwd, nullptr);
    fd = signalfd(-1, &waited, SFD_CLOEXEC);
    if (fd < 0) die(std::string("signalfd: ") + std::strerror(errno));
  }
  void restore_in_child() const {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGQUIT, &old_quit, nullptr);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  }
};


// ---------------------------------------------------------------- bpftrace programs

// What a bpftrace program's run sees of the counts file: its header and
// every block with a program area, mapped shared (the CLI consumes the
// rings: it writes their tail words).
class BtRun {
 public:
  BtRun(const bt::Program& p, std::FILE* out, int counts_fd, bool json)
      : p_(p), out_(out), fd_(counts_fd), json_(json) {
    void* m = mmap(nullptr, counts::kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) die(std::string("counts file: mmap: ") + std::strerror(errno));
    h_ = static_cast<counts::Header*>(m);
    own_.assign(p_.h->area_words, 0);
  }

  counts::Header* header() { return h_; }

  // Runs the BEGIN, END or interval probe blocks of `kind` here, in the CLI.
  void run_here(bt::ProbeKind kind, const std::vector<bt::AttachPoint>& aps, std::uint32_t only = ~0u) {
    map_new_blocks();  // (a map read sees every thread's table)
    for (const auto& ap : aps) {
      if (ap.kind != kind || (only != ~0u && ap.probe != only)) continue;
      if (h_->bt_exit.load() && kind != bt::ProbeKind::end) return;
      bt::HitContext c;
      c.probe = ap.spec.c_str();
      c.start_ns = h_->bt_start_ns;
      c.area = own_.data();
      c.exit_flag = kind == bt::ProbeKind::end ? nullptr : reinterpret_cast<volatile std::uint64_t*>(&h_->bt_exit);
      c.read_map = &BtRun::read_map;
      c.read_map_ctx = this;
      c.map_op = &BtRun::map_op;
      c.map_op_ctx = this;
      bt::Vm vm(p_, c);
      vm.run_probe(ap.probe);
    }
    drain();
  }

  // A map read in BEGIN, END or interval: the map merged over the CLI's own
  // table and every thread's of every process, as bpftrace's one map.
  static bool read_map(void* self, std::uint32_t m, const std::uint64_t* key, std::int64_t& value) {
    auto* r = static_cast<BtRun*>(self);
    std::vector<std::uint64_t*> areas{r->own_.data()};
    for (auto& b : r->blocks_) areas.push_back(b.area);
    return bt::merged_read(r->p_, m, areas, key, value);
  }

  // delete, clear or zero in BEGIN, END or interval: in every table now.
  static void map_op(void* self, std::uint32_t op, std::uint32_t m, const std::uint64_t* key) {
    auto* r = static_cast<BtRun*>(self);
    r->map_new_blocks();
    r->apply(op, m, key, 0, nullptr);
  }

  // Applies a map operation to every table but `except`'s (a delete's
  // sender, which did its own): delete removes the key (from a `@m[k] = x`
  // map only when its store is older than `ts`, the delete's time; 0: any),
  // clear every key, zero every key's value (compare-and-swap of each
  // slot's state: the threads keep running).
  void apply(std::uint32_t op, std::uint32_t mi, const std::uint64_t* key, std::uint64_t ts,
             const std::uint64_t* except) {
    const bt::MapDesc& m = p_.maps[mi];
    std::vector<std::uint64_t*> areas{own_.data()};
    for (auto& b : blocks_) areas.push_back(b.area);
    for (std::uint64_t* area : areas) {
      if (area == except) continue;
      if (op == bt::kEvDelete) {
        for (int tries = 0; tries < 8; ++tries) {
          std::uint64_t* s = bt::Vm::slot(m, area, key, false);
          if (!s) break;
          const std::uint64_t seen = __atomic_load_n(s, __ATOMIC_ACQUIRE);
          if (ts && m.agg == bt::Agg::assign && (seen & bt::kSlotStateMask) == bt::kSlotLive &&
              bt::load(s + m.key_words + m.value_words) >= ts)  // (the store's time: the last value word)
            break;  // stored again after the delete
          if (bt::Vm::cli_mark(s, seen, bt::kSlotDeleted)) break;
        }
        continue;
      }
      std::uint64_t* table = area + m.offset;
      for (std::uint32_t i = 0; i < m.nslots; ++i) {
        std::uint64_t* s = table + std::uint64_t{i} * m.slot_words();
        for (int tries = 0; tries < 8; ++tries)
          if (bt::Vm::cli_mark(s, __atomic_load_n(s, __ATOMIC_ACQUIRE),
                               op == bt::kEvClear ? bt::kSlotDeleted : bt::kSlotZeroed))
            break;
          else if (!(__atomic_load_n(s, __ATOMIC_ACQUIRE) & 1))  // (neither live nor zeroed)
            break;
      }
    }
  }

  // Prints the printf events written since the last drain, in time order
  // (each thread's in its own order), with the print(@map), delete, clear
  // and zero events in that order among them. The events are read where
  // they are, in the rings (a ring's tail moves only after they are
  // printed): a reference each, sorted by time only when several rings had
  // some (each ring's are in order already), formatted into one buffer,
  // written with one fwrite.
  void drain() {
    map_new_blocks();
    evs_.clear();
    std::size_t rings = 0;
    auto take = [&](std::uint64_t* area) {
      if (!p_.h->ring_bytes) return;
      const std::uint64_t ring = p_.h->ring_bytes;
      const auto* base = reinterpret_cast<const unsigned char*>(area + bt::kAreaHeaderWords);
      std::uint64_t tail = bt::load(area + bt::kRingTail);
      const std::uint64_t head = __atomic_load_n(area + bt::kRingHead, __ATOMIC_ACQUIRE);
      const std::size_t before = evs_.size();
      while (tail < head) {
        const auto* e = reinterpret_cast<const bt::EventHeader*>(base + (tail & (ring - 1)));
        if (e->bytes == 0 || e->bytes > ring) break;
        if ((e->kind == bt::kEvPrintf && e->fmt < p_.h->nfmts) ||
            ((e->kind == bt::kEvPrint || e->kind == bt::kEvClear || e->kind == bt::kEvZero) && e->fmt < p_.h->nmaps) ||
            (e->kind == bt::kEvDelete && e->fmt < p_.h->nmaps &&
             sizeof *e + p_.maps[e->fmt].key_words * 8 <= e->bytes))
          evs_.push_back({e->ts, e, area});
        tail += e->bytes;
      }
      if (evs_.size() > before) ++rings;
      ends_.push_back({area, tail});
    };
    ends_.clear();
    take(own_.data());
    for (auto& b : blocks_) take(b.area);
    if (rings > 1)
      std::stable_sort(evs_.begin(), evs_.end(), [](const EvRef& a, const EvRef& b) { return a.ts < b.ts; });
    text_.clear();
    for (const EvRef& r : evs_) {
      const bt::EventHeader* e = r.e;
      const auto* args = reinterpret_cast<const unsigned char*>(e + 1);
      if (e->kind == bt::kEvPrintf) {
        if (!json_) {
          bt::format_event(text_, p_, e->fmt, args);
        } else {
          text_ += "{\"type\": \"printf\", \"data\": \"" + bt::json_escape(bt::format_event(p_, e->fmt, args)) + "\"}\n";
        }
      } else if (e->kind == bt::kEvPrint) {
        text_ += map_text(e->fmt);
      } else {
        const auto* k = reinterpret_cast<const std::uint64_t*>(args);
        const std::vector<std::uint64_t> key =
            e->kind == bt::kEvDelete ? std::vector<std::uint64_t>(k, k + p_.maps[e->fmt].key_words) : std::vector<std::uint64_t>{};
        // (the sender did its own table, but for the CLI's own events)
        apply(e->kind, e->fmt, key.data(), e->ts, r.from == own_.data() ? nullptr : r.from);
      }
    }
    const bool wrote = !text_.empty();
    if (wrote) std::fwrite(text_.data(), 1, text_.size(), out_);
    for (const auto& [area, tail] : ends_) __atomic_store_n(area + bt::kRingTail, tail, __ATOMIC_RELEASE);
    // Events a full ring dropped since the last drain: bpftrace's line, in
    // the output (its perf reader prints it when it learns of them).
    bool lost_line = false;
    if (const std::uint64_t lost = lost_events(); lost > lost_) {
      const unsigned long long d = lost - lost_;
      if (json_) std::fprintf(out_, "{\"type\": \"lost_events\", \"data\": {\"events\": %llu}}\n", d);
      else std::fprintf(out_, "Lost %llu events\n", d);
      lost_ = lost;
      lost_line = true;
    }
    if (wrote || lost_line) std::fflush(out_);
  }

  // print(@map): the map as it is now, merged.
  std::string map_text(std::uint32_t m) {
    bt::MapData data;
    bt::merge_table(p_, m, own_.data(), data);
    for (auto& b : blocks_) bt::merge_table(p_, m, b.area, data);
    return json_ ? bt::format_map_json(p_, m, data) : bt::format_map(p_, m, data);
  }

  // The maps merged over every thread of every process (and the CLI's own area).
  std::string maps() {
    map_new_blocks();
    std::vector<bt::MapData> data(p_.h->nmaps);
    for (std::uint32_t m = 0; m < p_.h->nmaps; ++m) {
      bt::merge_table(p_, m, own_.data(), data[m]);
      for (auto& b : blocks_) bt::merge_table(p_, m, b.area, data[m]);
    }
    return json_ ? bt::format_maps_json(p_, data) : bt::format_maps(p_, data);
  }

  std::uint64_t lost_events() {
    std::uint64_t n = 0;
    for (auto& b : blocks_) n += bt::load(b.area + bt::kLostEvents);
    return n;
  }
  std::uint64_t map_drops() {
    std::uint64_t n = bt::load(own_.data() + bt::kMapDrops);
    for (auto& b : blocks_) n += bt::load(b.area + bt::kMapDrops);
    return n;
  }

 private:
  void map_new_blocks() {
    const std::uint64_t n = std::min<std::uint64_t>(h_->nslots.load(), counts::kMaxSlots);
    for (; next_slot_ < n; ++next_slot_) {
      const std::uint64_t w = h_->slots[next_slot_].load(std::memory_order_acquire);
      if (w == 0) {  // handed out, not published yet: look again next time
        if (pending_.insert(next_slot_).second) continue;
        continue;
      }
      add_block(w);
    }
    for (auto it = pending_.begin(); it != pending_.end();) {
      const std::uint64_t w = h_->slots[*it].load(std::memory_order_acquire);
      if (w == 0) {
        ++it;
        continue;
      }
      add_block(w);
      it = pending_.erase(it);
    }
  }
  void add_block(std::uint64_t w) {
    const std::size_t bytes = counts::slot_pages(w) * counts::kPage;
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                   static_cast<off_t>(counts::slot_first_page(w) * counts::kPage));
    if (m == MAP_FAILED) return;
    auto* b = static_cast<std::uint64_t*>(m);
    const std::uint64_t area = b[counts::kBlockBt];
    if (b[counts::kBlockMagicWord] != counts::kBlockMagic || area == 0 ||
        (area + p_.h->area_words) * 8 > bytes) {
      munmap(m, bytes);
      return;
    }
    blocks_.push_back({b + area});
  }

  struct Block {
    std::uint64_t* area;
  };
  const bt::Program& p_;
  std::FILE* out_;
  int fd_;
  bool json_;  // -f json: bpftrace's JSON lines
  counts::Header* h_ = nullptr;
  std::vector<std::uint64_t> own_;  // the CLI's area (BEGIN, END, interval)
  std::vector<Block> blocks_;
  std::uint64_t next_slot_ = 0;
  std::set<std::uint64_t> pending_;
  std::uint64_t lost_ = 0;  // lost events already reported
  /// drain()'s: the events of the rings (a reference into a ring each), the
  /// tail each ring gets once they are printed, the text made of them.
  struct EvRef {
    std::uint64_t ts;
    const bt::EventHeader* e;
    const std::uint64_t* from;
  };
  std::vector<EvRef> evs_;
  std::vector<std::pair<std::uint64_t*, std::uint64_t>> ends_;
  std::string text_;
};

struct BtOptions {
  std::string text, name;  // the program and its name in errors ("stdin" for -e)
  std::vector<std::string> cmd;  // the program to run (empty: none)
  std::string out_file;
  bool quiet = false, follow = true, json = false;
};

int run_bpftrace(const BtOptions& o) {
  std::string err;
  std::optional<bt::Compiled> c = bt::compile(o.text, o.name, err);
  if (!c) {
    std::fputs(err.c_str(), stderr);
    return 1;
  }
  const bt::Program& p = c->prog;
  std::string prog_path;
  if (!o.cmd.empty()) {
    prog_path = find_program(o.cmd[0]);
    if (prog_path.empty()) {
      std::fprintf(stderr, "uprobe-trace: %s: command not found\n", o.cmd[0].c_str());
      return 127;
    }
  }
  std::string joined;  // "PROBE\tSPEC" lines for the agent
  std::size_t nprobes = 0;
  bool user_probes = false;
  std::vector<Spec> specs;  // checked while the program starts (StartGate)
  for (const auto& ap : c->attach) {
    if (ap.kind == bt::ProbeKind::begin || ap.kind == bt::ProbeKind::end || ap.kind == bt::ProbeKind::interval) {
      ++nprobes;
      continue;
    }
    std::string perr;
    auto s = parse_spec(ap.spec, perr);
    if (!s) die(perr);
    specs.push_back(*s);
    // (the `probe` strings name PATH as bpftrace does: as written, or a
    // `lib...` name by the dynamic linker cache's path)
    std::string shown;
    if (s->binary.find('/') != std::string::npos) shown = s->binary;
    else shown = ld_cache_path(s->binary);
    joined += std::to_string(ap.probe) + "\t" + ap.spec + (shown.empty() ? "" : "\t" + shown) + "\n";
    user_probes = true;
  }
  if (user_probes && o.cmd.empty())
    die("uprobe, uretprobe and usdt probes need a program to trace: -c 'CMD' or -- PROG ARGS (uprobe-trace "
        "runs in the programs it starts, not system-wide)");
  std::FILE* out = stdout;
  if (!o.out_file.empty()) {
    out = std::fopen(o.out_file.c_str(), "we");
    if (!out) die(o.out_file + ": " + std::strerror(errno));
  }
  std::string agent, libuprobe;
  if (!o.cmd.empty()) {
    agent = find_agent();
    libuprobe = find_libuprobe();
    for (const std::string& f : {agent, libuprobe})
      if (f.find_first_of(": \t") != std::string::npos) die("cannot preload " + f + ": its path has ':' or a blank");
  }
  const std::string dir = make_trace_dir();
  const int counts_fd = create_counts_file(dir);
  const std::string prog_file = dir + "/program";
  {
    std::ofstream f(prog_file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(c->blob.data()), static_cast<std::streamsize>(c->blob.size()));
    if (!f) {
      remove_tree(dir);
      die(prog_file + ": cannot write");
    }
  }
  // ustack and usym(): symbolized with each image's recorded mappings (usym.hpp)
  static UserSymbols* symbols = nullptr;
  symbols = new UserSymbols(dir);  // (lives until exit: the maps print at the end)
  bt::set_symbolizer([](std::uint64_t image, std::uint64_t addr, bt::UserSym& u) { return symbols->resolve(image, addr, u); });
  BtRun run(p, out, counts_fd, o.json);

  prctl(PR_SET_CHILD_SUBREAPER, 1);
  TraceSignals sigs;
  const int sig_fd = sigs.fd;

  // The specs checked, "Attaching N probes..." and BEGIN: while the program
  // starts when it waits at the gate, else before it starts.
  auto check_and_begin = [&] {
    for (const Spec& s : specs) nprobes += validate(s, prog_path);
    g_dir_to_remove.clear();
    if (!o.quiet && o.json) std::fprintf(out, "{\"type\": \"attached_probes\", \"data\": {\"probes\": %zu}}\n", nprobes);
    else if (!o.quiet) std::fprintf(out, "Attaching %zu probe%s...\n", nprobes, nprobes == 1 ? "" : "s");
    std::fflush(out);
    run.run_here(bt::ProbeKind::begin, c->attach);
  };
  const bool gated = !o.cmd.empty() && loads_the_agent(prog_path);
  if (!gated) check_and_begin();
  pid_t child = -1;
  int exec_errno = 0;
  StartGate gate;
  if (!o.cmd.empty() && !run.header()->bt_exit.load()) {
    const char* orig = getenv("LD_PRELOAD");
    std::string preload = (libuprobe.empty() ? "" : libuprobe + ":") + agent;
    if (orig && *orig) preload += ":" + std::string(orig);
    int exec_pipe[2];
    if (pipe2(exec_pipe, O_CLOEXEC) != 0) die(std::string("pipe: ") + std::strerror(errno));
    std::fflush(out);
    if (gated) gate.make();
    g_dir_to_remove = dir;
    child = fork();
    if (child < 0) die(std::string("fork: ") + std::strerror(errno));
    if (child == 0) {
      close(exec_pipe[0]);
      sigs.restore_in_child();
      gate.in_child();
      setenv(kEnvSpecs, joined.c_str(), 1);
      setenv(kEnvOut, dir.c_str(), 1);
      setenv(kEnvProgram, prog_file.c_str(), 1);
      setenv(kEnvFollow, o.follow ? "1" : "0", 1);
      setenv(kEnvOrigPreload, orig ? orig : "-", 1);
      setenv("LD_PRELOAD", preload.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : o.cmd) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      const int e = errno;
      std::fprintf(stderr, "uprobe-trace: %s: %s\n", o.cmd[0].c_str(), std::strerror(e));
      if (write(exec_pipe[1], &e, sizeof e) < 0) {
      }
      _exit(e == ENOENT ? 127 : 126);
    }
    close(exec_pipe[1]);
    gate.in_parent();
    while (read(exec_pipe[0], &exec_errno, sizeof exec_errno) < 0 && errno == EINTR) {
    }
    close(exec_pipe[0]);
  }
  if (gated) check_and_begin();
  g_dir_to_remove.clear();
  if (gated && child > 0 && run.header()->bt_exit.load()) {
    // exit() in BEGIN: the program never runs (its agent ends at the gate).
    gate.shut();
    while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
    child = -1;
  } else if (child > 0) {
    gate.open();
    g_child = child;
  }
  // Interval probes: the next time each fires.
  std::vector<std::pair<std::uint64_t, std::uint32_t>> timers;  // (due ns, probe)
  for (const auto& ap : c->attach)
    if (ap.kind == bt::ProbeKind::interval)
      timers.emplace_back(bt::now_ns() + static_cast<std::uint64_t>(p.probes[ap.probe].interval_ns), ap.probe);
  int status = 0, main_status = 0;
  bool terminated = false;
  unsigned interrupts = 0;
  for (;;) {
    bool all_gone = false;
    for (;;) {
      const pid_t w = waitpid(-1, &status, WNOHANG);
      if (w > 0) {
        if (w == child) {
          main_status = status;
          g_child = 0;
        }
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      all_gone = w < 0;
      break;
    }
    run.drain();
    if (run.header()->bt_exit.load() && !terminated) {  // exit(): the program is stopped, as bpftrace stops its child
      terminated = true;
      if (g_child > 0) kill(g_child, SIGTERM);
    }
    // With a program: until it and its descendants are gone. Without one
    // (BEGIN, END, interval only): until exit() or Ctrl-C, as bpftrace.
    if (all_gone && (child >= 0 || terminated)) break;
    std::uint64_t now = bt::now_ns();
    int timeout = 10;  // the rings are drained at least this often (ms)
    for (auto& [due, probe] : timers) {
      if (now >= due) {
        run.run_here(bt::ProbeKind::interval, c->attach, probe);
        due += static_cast<std::uint64_t>(p.probes[probe].interval_ns);
        now = bt::now_ns();
      }
      timeout = std::min<int>(timeout, static_cast<int>((due > now ? due - now : 0) / 1000000) + 1);
    }
    pollfd pfd{sig_fd, POLLIN, 0};
    if (poll(&pfd, 1, timeout) > 0) {
      signalfd_siginfo si;
      const ssize_t n = read(sig_fd, &si, sizeof si);
      if (n == static_cast<ssize_t>(sizeof si) && si.ssi_signo == SIGINT) {
        if (child < 0 || ++interrupts >= 2) break;
        // bpftrace's Ctrl-C: END, the maps, and the program ended (SIGTERM,
        // as after exit(); one that survives SIGINT too): once it is gone,
        // with every event it made, here; a second Ctrl-C does not wait.
        if (!terminated) {
          terminated = true;
          if (g_child > 0) kill(g_child, SIGTERM);
        }
      }
    }
  }
  close(sig_fd);
  run.drain();
  run.run_here(bt::ProbeKind::end, c->attach);
  // bpftrace writes the two newlines before the maps to its standard output
  // whatever -o says (std::cout), the maps to the output.
  std::fwrite("\n\n", 1, 2, stdout);
  if (out != stdout) std::fflush(stdout);
  std::string text = run.maps();
  std::fwrite(text.data(), 1, text.size(), out);
  const bool flushed = std::fflush(out) == 0;
  if (out != stdout) std::fclose(out);
  if (!flushed) die(o.out_file.empty() ? "standard output: cannot write" : o.out_file + ": cannot write");
  if (const std::uint64_t lost = run.lost_events())
    std::fprintf(stderr, "uprobe-trace: WARNING: Lost %llu events (a thread's printf ring was full)\n",
                 static_cast<unsigned long long>(lost));
  if (const std::uint64_t drops = run.map_drops())
    std::fprintf(stderr, "uprobe-trace: WARNING: %llu map updates dropped (a thread's map table was full)\n",
                 static_cast<unsigned long long>(drops));
  if (run.header()->unrecorded.load())
    std::fprintf(stderr, "uprobe-trace: WARNING: %llu hits were not run (no block of their own for them)\n",
                 static_cast<unsigned long long>(run.header()->unrecorded.load()));
  close(counts_fd);
  remove_tree(dir);
  if (exec_errno != 0) return WIFEXITED(main_status) ? WEXITSTATUS(main_status) : 127;
  if (terminated || child < 0) return 0;
  // The terminal's ^C reaches the program too: when it ended the program
  // before this loop read it from the signalfd, it is still bpftrace's
  // Ctrl-C (exit status 0), not a program that failed.
  if (WIFSIGNALED(main_status) && WTERMSIG(main_status) == SIGINT) return 0;
  if (WIFEXITED(main_status)) return WEXITSTATUS(main_status);
  if (WIFSIGNALED(main_status)) return 128 + WTERMSIG(main_status);
  return 1;
}

}  // namespace

// libuprobe loads its decoder (Capstone) at the first analysis rather than
// with itself (arch/x86_64/capstone_lib.hpp): this process analyses only an
// offset into a function of a file it has not mapped (check_site()).
extern "C" const int uprobe_decoder_on_demand = 1;

/// The program's status as uprobe-trace's own: its exit code; or, when a
/// signal ended it, the same signal raised here once the report is out (core
/// dumps off: the program dumped its own), as timeout(1) and strace do, so
/// that a caller sees a death by signal, not an exit (128 + N if the signal
/// does not end this process).
int pass_on_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (!WIFSIGNALED(status)) return 1;
  const int sig = WTERMSIG(status);
  std::fflush(nullptr);
  const rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  std::signal(sig, SIG_DFL);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, sig);
  sigprocmask(SIG_UNBLOCK, &only, nullptr);
  raise(sig);
  return 128 + sig;
}

int main(int argc, char** argv) {
  std::vector<std::string> spec_texts;
  std::string out_file, format = "text", list_arg, program_file, cmd_text;
  bool per_thread = false, follow = true, verbose = false, do_list = false, quiet = false, have_cmd = false;
  enum { kFormat = 1000, kNoFollow, kPerThread };
  static const option longopts[] = {{"format", required_argument, nullptr, kFormat},
                                    {"per-thread", no_argument, nullptr, kPerThread},
                                    {"no-follow", no_argument, nullptr, kNoFollow},
                                    {"help", no_argument, nullptr, 'h'},
                                    {nullptr, 0, nullptr, 0}};
  int c;
again:
  while ((c = getopt_long(argc, argv, "+e:o:l:p:c:f:qvh", longopts, nullptr)) != -1) {
    switch (c) {
      case 'e': spec_texts.emplace_back(optarg); break;
      case 'o': out_file = optarg; break;
      case 'l': list_arg = optarg, do_list = true; break;
      case 'p':
        die("-p PID: uprobe-trace cannot attach to a running process (it runs inside the programs it starts, "
            "through LD_PRELOAD, without ptrace): start the program under it instead, with -c 'CMD' or -- PROG "
            "ARGS (per-thread counts: --per-thread)");
      case 'c': cmd_text = optarg, have_cmd = true; break;
      case 'q': quiet = true; break;
      case kPerThread: per_thread = true; break;
      case 'v': verbose = true; break;
      case 'f':
      case kFormat: format = optarg; break;
      case kNoFollow: follow = false; break;
      case 'h': std::fputs(kUsage, stdout); return 0;
      default: std::fputs(kUsage, stderr); return 2;
    }
  }
  if (do_list) return list(list_arg, verbose);
  // bpftrace's `uprobe-trace [options] FILE`: with no -e, the first operand
  // is the program file (options may follow it).
  if (spec_texts.empty() && program_file.empty() && optind < argc && std::string(argv[optind - 1]) != "--") {
    program_file = argv[optind++];
    goto again;
  }
  std::vector<std::string> cmd;
  if (have_cmd) {
    // Words split at blanks, with '...' and "..." quoting, as a shell would
    // (nothing is expanded: no globs, no variables), as bpftrace takes -c.
    std::string w;
    bool in_word = false;
    char quote = 0;
    for (char ch : cmd_text) {
      if (quote) {
        if (ch == quote) quote = 0;
        else w += ch;
      } else if (ch == '\'' || ch == '"') {
        quote = ch, in_word = true;
      } else if (ch == ' ' || ch == '\t' || ch == '\n') {
        if (in_word) cmd.push_back(w), w.clear(), in_word = false;
      } else {
        w += ch, in_word = true;
      }
    }
    if (quote) die("-c: unterminated quote in '" + cmd_text + "'");
    if (in_word) cmd.push_back(w);
    if (cmd.empty()) die("-c: no command in '" + cmd_text + "'");
    if (optind < argc) die("-c CMD and -- PROG ARGS: give the program once");
  } else {
    for (int i = optind; i < argc; ++i) cmd.emplace_back(argv[i]);
  }
  const bool bare = program_file.empty() && !spec_texts.empty() &&
                    std::all_of(spec_texts.begin(), spec_texts.end(), [](const std::string& t) { return bt::is_bare_spec(t); });
  if (!bare && (!program_file.empty() || !spec_texts.empty())) {
    BtOptions o;
    if (!program_file.empty()) {
      if (!spec_texts.empty()) die("-e PROGRAM and a program file: give one");
      std::ifstream f(program_file, std::ios::binary);
      if (!f) die(program_file + ": " + std::strerror(errno));
      std::stringstream ss;
      ss << f.rdbuf();
      o.text = ss.str(), o.name = program_file;
    } else {
      if (spec_texts.size() > 1) die("-e: one bpftrace program (several probes go in it, as in bpftrace)");
      o.text = spec_texts[0], o.name = "stdin";
    }
    o.cmd = cmd;
    o.out_file = out_file;
    o.quiet = quiet;
    o.follow = follow;
    if (format != "text" && format != "json") die("-f: text or json");
    o.json = format == "json";
    return run_bpftrace(o);
  }
  if (format != "text" && format != "json") die("--format: text or json");
  std::vector<char*> cmd_argv;
  for (auto& a : cmd) cmd_argv.push_back(a.data());
  cmd_argv.push_back(nullptr);
  if (cmd.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (spec_texts.empty()) die("no probes: give at least one -e SPEC");

  const std::string prog = cmd[0];
  if (prog.find('/') != std::string::npos) {  // what execvp would say, before anything runs (a shell's 126/127)
    struct stat st;
    if (stat(prog.c_str(), &st) != 0) {
      std::fprintf(stderr, "uprobe-trace: %s: %s\n", prog.c_str(), std::strerror(errno));
      return 127;
    }
    const char* why = S_ISDIR(st.st_mode)           ? "is a directory"
                      : !S_ISREG(st.st_mode)        ? "not a regular file"
                      : access(prog.c_str(), X_OK) ? "not executable (Permission denied)"
                                                    : nullptr;
    if (why) {
      std::fprintf(stderr, "uprobe-trace: %s: %s\n", prog.c_str(), why);
      return 126;
    }
  }
  const std::string prog_path = find_program(prog);
  if (prog_path.empty()) {
    std::fprintf(stderr, "uprobe-trace: %s: command not found\n", prog.c_str());
    return 127;
  }
  std::vector<Spec> specs;
  for (const auto& t : spec_texts) {
    std::string err;
    auto s = parse_spec(t, err);
    if (!s) die(err);
    specs.push_back(*s);  // (checked while the program starts: StartGate)
  }
  const bool gated = loads_the_agent(prog_path);
  if (!gated)
    for (const Spec& s : specs) validate(s, prog_path);

  // The report file is opened (created, truncated) before the program runs,
  // as a shell's redirection: a missing directory stops here.
  std::FILE* out = nullptr;
  if (!out_file.empty()) {
    out = std::fopen(out_file.c_str(), "we");
    if (!out) die(out_file + ": " + std::strerror(errno));
  }

  const std::string agent = find_agent();
  const std::string libuprobe = find_libuprobe();
  for (const std::string& p : {agent, libuprobe})  // LD_PRELOAD separates with ':' and blanks
    if (p.find_first_of(": \t") != std::string::npos) die("cannot preload " + p + ": its path has ':' or a blank");
  const std::string dir = make_trace_dir();

  std::string joined;
  for (const auto& t : spec_texts) joined += t + "\n";
  const char* orig = getenv("LD_PRELOAD");
  std::string preload = (libuprobe.empty() ? "" : libuprobe + ":") + agent;
  if (orig && *orig) preload += ":" + std::string(orig);

  const int counts_fd = create_counts_file(dir);

  prctl(PR_SET_CHILD_SUBREAPER, 1);  // orphaned descendants are reaped (and waited for) here
  // SIGINT (the terminal's ^C goes to the whole foreground group, the
  // program too) and SIGCHLD are taken through a signalfd: the first ^C
  // does not stop uprobe-trace, which reports once every descendant is gone
  // (as bpftrace prints its maps on ^C); a second one reports the counts so
  // far at once. SIGQUIT is ignored; SIGTERM and SIGHUP go to the program.
  TraceSignals sigs;
  const int sig_fd = sigs.fd;

  // The child reports a failed exec through this pipe (closed by a
  // successful one): no "no process loaded the agent" for a program that never ran.
  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) die(std::string("pipe: ") + std::strerror(errno));
  StartGate gate;
  if (gated) gate.make();
  g_dir_to_remove = dir;
  pid_t child = fork();
  if (child < 0) die(std::string("fork: ") + std::strerror(errno));
  if (child == 0) {
    close(exec_pipe[0]);
    sigs.restore_in_child();
    gate.in_child();
    setenv(kEnvSpecs, joined.c_str(), 1);
    setenv(kEnvOut, dir.c_str(), 1);
    setenv(kEnvFollow, follow ? "1" : "0", 1);
    setenv(kEnvOrigPreload, orig ? orig : "-", 1);
    setenv("LD_PRELOAD", preload.c_str(), 1);
    execvp(cmd_argv[0], cmd_argv.data());
    const int err = errno;
    std::fprintf(stderr, "uprobe-trace: %s: %s\n", prog.c_str(), std::strerror(err));
    if (write(exec_pipe[1], &err, sizeof err) < 0) {
    }
    _exit(err == ENOENT ? 127 : 126);
  }
  close(exec_pipe[1]);
  gate.in_parent();
  int exec_errno = 0;
  while (read(exec_pipe[0], &exec_errno, sizeof exec_errno) < 0 && errno == EINTR) {
  }
  close(exec_pipe[0]);
  if (exec_errno == 0 && gated)
    for (const Spec& s : specs) validate(s, prog_path);
  g_dir_to_remove.clear();
  gate.open();
  g_child = child;
  int status = 0, main_status = 0;
  bool main_done = false, interrupted = false;
  unsigned interrupts = 0;
  for (;;) {
    bool all_gone = false;
    for (;;) {  // reap whatever has ended
      const pid_t p = waitpid(-1, &status, WNOHANG);
      if (p > 0) {
        if (p == child) {
          main_status = status, main_done = true;
          g_child = 0;
        }
        continue;
      }
      if (p < 0 && errno == EINTR) continue;
      all_gone = p < 0;  // ECHILD: every descendant is gone
      break;
    }
    if (all_gone) break;
    signalfd_siginfo si;
    const ssize_t n = read(sig_fd, &si, sizeof si);
    if (n == static_cast<ssize_t>(sizeof si) && si.ssi_signo == SIGINT && ++interrupts >= 2) {
      interrupted = true;
      break;
    }
  }
  close(sig_fd);

  Report rep = read_report(dir, counts_fd);
  close(counts_fd);
  remove_tree(dir);

  if (exec_errno != 0) {  // the child said why; nothing ran, nothing to report
    if (out) std::fclose(out);
    return WIFEXITED(main_status) ? WEXITSTATUS(main_status) : 127;
  }

  std::string text = format == "json" ? format_json(rep, per_thread) : format_text(rep, per_thread);
  if (!out) {
    std::fputs(("\n" + text).c_str(), stderr);
  } else {
    const bool wrote = std::fwrite(text.data(), 1, text.size(), out) == text.size();
    const bool flushed = std::fflush(out) == 0;
    const int err = errno;
    const bool closed = std::fclose(out) == 0;
    if (!wrote || !flushed || !closed) die(out_file + ": cannot write the report: " + std::strerror(err ? err : errno));
  }
  if (verbose)
    for (const auto& p : rep.processes) {
      std::string modes;
      for (const auto& [m, n] : p.modes) modes += (modes.empty() ? "" : ", ") + m + " " + std::to_string(n);
      std::fprintf(stderr, "uprobe-trace: pid %ld (%s, parent %ld): sites %s\n", p.pid, p.exe.c_str(), p.ppid,
                   modes.empty() ? "none" : modes.c_str());
    }
  if (rep.unrecorded)
    std::fprintf(stderr, "uprobe-trace: WARNING: %llu hits were not recorded (a thread could not make its counting "
                 "block: its process could not open or extend the counts file, or the trace made more than %zu)\n",
                 static_cast<unsigned long long>(rep.unrecorded), counts::kMaxSlots);
  if (interrupted)
    std::fprintf(stderr, "uprobe-trace: interrupted: the counts so far; %s\n",
                 main_done ? "processes it started are still running" : (prog + " is still running").c_str());
  if (rep.processes.empty())
    std::fprintf(stderr, "uprobe-trace: no process loaded the agent (a static or set-user-ID program?)\n");
  const std::vector<std::string> unattached = rep.unattached();
  for (const auto& s : rep.spec_attached) {
    const bool none = std::find(unattached.begin(), unattached.end(), s.first) != unattached.end();
    std::set<std::string> seen;
    if (none) std::fprintf(stderr, "uprobe-trace: WARNING: %s attached in no process\n", s.first.c_str());
    for (const auto& m : rep.messages) {
      if (m.spec != s.first || !seen.insert(m.text).second || seen.size() > 3) continue;
      const bool absent = m.text.rfind("not loaded here", 0) == 0;
      if (none) std::fprintf(stderr, "uprobe-trace:   pid %ld (%s): %s\n", m.pid, m.exe.c_str(), m.text.c_str());
      else if (!absent)
        std::fprintf(stderr, "uprobe-trace: WARNING: %s: pid %ld (%s): %s\n", m.spec.c_str(), m.pid, m.exe.c_str(),
                     m.text.c_str());
    }
  }
  std::set<std::string> notes;  // about a process, not a spec: each text once
  for (const auto& m : rep.messages)
    if (m.spec.empty() && notes.insert(m.text).second)
      std::fprintf(stderr, "uprobe-trace: WARNING: pid %ld (%s): %s\n", m.pid, m.exe.c_str(), m.text.c_str());
  if (interrupted && !main_done) return 128 + SIGINT;
  return pass_on_status(main_status);
}
