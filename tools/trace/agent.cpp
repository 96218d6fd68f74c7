// SPDX-License-Identifier: MIT
// libuprobe-agent.so: the LD_PRELOAD half of uprobe-trace.
//
// It is the first object whose initializer runs (linked with -z initfirst:
// DF_1_INITFIRST puts it ahead of every other initializer, the program's
// DT_PREINIT_ARRAY included). That initializer first brings up what the
// agent itself needs (libc's initializers, run with the real argc, argv and
// envp, then the agent's other dependencies through dlopen of itself), and
// its constructor then reads the probe specs from UPROBE_TRACE_SPECS (one
// per line), resolves them in this process (library names against the
// objects the dynamic linker loaded here, the program's own name to
// /proc/self/exe), registers one counting consumer per probe site and
// enables counting last, so that nothing the agent itself does while
// attaching is counted -- and every other object's initializer is.
//
// Counting never stops. With the CLI (UPROBE_TRACE_OUT set), every thread
// counts in its own block of the counts file the CLI created (counts.hpp),
// mapped shared, so the counts are the CLI's however the process ends --
// exit() through the last destructor, _exit(), exec, a fatal signal,
// SIGKILL -- and nothing is written at exit or exec. What the image attached
// is written to its record file (record.hpp) once, at attach. Without the
// CLI, blocks are private and the agent's destructor prints this process's
// report to stderr.
//
// What runs at a hit (the consumers, the thread's block) is agent_hit.cpp's,
// the resolution and registration agent_attach.cpp's (agent.hpp); here: the
// initializers, the counting memory's set-up, fork and exit, the record.

#include "agent.hpp"
#include "object_of.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <set>
#include <string>
#include <vector>

#include <uprobe/config.hpp>
#include <uprobe/symbols.hpp>
#include <uprobe/uprobe.hpp>

#include "spec.hpp"

namespace uptrace::agent {

/// libc's own getenv(), unsetenv() and setenv(). A program may define its own (bash
/// defines getenv, setenv, unsetenv, putenv), which the agent's calls would
/// reach; bash's, before its main() set up its variables, leave `environ` as
/// it is, and bash then passed UPROBE_TRACE_GATE on to every command it ran
/// (each exited 125 at a gate already read). libc's change the array main()
/// is given, in place. RTLD_NEXT from the agent (preloaded after the program)
/// finds libc's.
const char* libc_getenv(const char* name) {
  static const auto f = reinterpret_cast<char* (*)(const char*)>(dlsym(RTLD_NEXT, "getenv"));
  return f ? f(name) : getenv(name);
}
int libc_unsetenv(const char* name) {
  static const auto f = reinterpret_cast<int (*)(const char*)>(dlsym(RTLD_NEXT, "unsetenv"));
  return f ? f(name) : unsetenv(name);
}
int libc_setenv(const char* name, const char* value, int overwrite) {
  static const auto f = reinterpret_cast<int (*)(const char*, const char*, int)>(dlsym(RTLD_NEXT, "setenv"));
  return f ? f(name, value, overwrite) : setenv(name, value, overwrite);
}

namespace {

// ---------------------------------------------------------------- results

std::string env_or(const char* name, const char* def) {
  const char* v = libc_getenv(name);
  return v ? v : def;
}

ImageRecord image_record(bool with_keys = true) {
  ImageRecord r;
  r.layout = g ? g->layout : 0;
  r.pid = getpid();
  r.ppid = getppid();
  r.exe = self_exe();
  r.nkeys = g ? g->nkeys : 0;
  r.nhists = g ? g->nhists : 0;
  r.specs = meta->specs;
  r.modes = meta->modes;
  r.elf_tables = meta->elf_tables;
  r.notes = meta->notes;
  if (!with_keys) return r;
  for (std::size_t i = 0; i < meta->keys.size() && i < r.nkeys; ++i)
    if (!meta->keys[i].empty()) r.keys.emplace_back(meta->keys[i], i);
  for (std::size_t i = 0; i < meta->hist_keys.size() && i < r.nhists; ++i)
    if (!meta->hist_keys[i].empty()) r.hists.emplace_back(meta->hist_keys[i], i);
  return r;
}

/// The record's key and hist lines (serialize_entry()), one per index, made
/// before the probes are in: the record is written after, and copying
/// thousands of strings then would call libc's memcpy() (probed, and int3:
/// a trap per key) for each. Null when attach() did not get that far.
struct RecordLines {
  std::vector<std::string> keys, hists;
};
RecordLines* record_lines = nullptr;  // never freed (see Meta)

}  // namespace

void prepare_record_lines() {
  auto* l = new RecordLines;
  l->keys.reserve(meta->keys.size());
  l->hists.reserve(meta->hist_keys.size());
  for (std::size_t i = 0; i < meta->keys.size(); ++i) l->keys.push_back(serialize_entry("key", meta->keys[i], i));
  for (std::size_t i = 0; i < meta->hist_keys.size(); ++i)
    l->hists.push_back(serialize_entry("hist", meta->hist_keys[i], i));
  record_lines = l;
}

namespace {

/// Appends `s` to `out`, whose capacity holds it, without libc's memcpy().
void append_plain(std::string& out, const std::string& s) {
  const std::size_t at = out.size();
  out.resize(at + s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    asm("" : "+r"(c));  // (not turned back into a memcpy() call)
    out[at + i] = c;
  }
}

/// The record file's text: serialize(), with the key and hist lines made
/// beforehand (record_lines) when there are some.
std::string record_text() {
  if (!record_lines) return serialize(image_record());
  const ImageRecord r = image_record(false);
  std::string text = serialize(r, false);
  std::size_t total = text.size() + 4;
  for (std::size_t i = 0; i < meta->keys.size() && i < r.nkeys && i < record_lines->keys.size(); ++i)
    if (!meta->keys[i].empty()) total += record_lines->keys[i].size();
  for (std::size_t i = 0; i < meta->hist_keys.size() && i < r.nhists && i < record_lines->hists.size(); ++i)
    if (!meta->hist_keys[i].empty()) total += record_lines->hists[i].size();
  text.reserve(total);
  for (std::size_t i = 0; i < meta->keys.size() && i < r.nkeys && i < record_lines->keys.size(); ++i)
    if (!meta->keys[i].empty()) append_plain(text, record_lines->keys[i]);
  for (std::size_t i = 0; i < meta->hist_keys.size() && i < r.nhists && i < record_lines->hists.size(); ++i)
    if (!meta->hist_keys[i].empty()) append_plain(text, record_lines->hists[i]);
  text += "end\n";
  return text;
}

bool write_all(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    ssize_t w = write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<std::size_t>(w);
  }
  return true;
}

// DIR/PID.LAYOUT.rec: what this image attached (written once, at attach).
void write_image_record() {
  const std::string base =
      meta->out_dir + "/" + std::to_string(getpid()) + "." + std::to_string(g ? g->layout : 0);
  const std::string tmp = base + ".tmp", final_path = base + ".rec";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return;
  bool ok = write_all(fd, record_text());
  close(fd);
  if (!ok || rename(tmp.c_str(), final_path.c_str()) != 0) unlink(tmp.c_str());
  // DIR/PID.LAYOUT.maps: the image's mappings (/proc/self/maps as it is
  // now), which the CLI symbolizes its ustack and usym addresses with, after
  // the process is gone too (bt_vm.hpp image_word()).
  if (!g_bt.h) return;
  const std::string maps_tmp = base + ".maps.tmp";
  int in = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  int out = in < 0 ? -1 : open(maps_tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ok = out >= 0;
  char buf[8192];
  for (ssize_t n; ok && (n = read(in, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0 && write_all(out, std::string(buf, static_cast<std::size_t>(n)));
  }
  if (in >= 0) close(in);
  if (out >= 0) close(out);
  if (out >= 0 && (!ok || rename(maps_tmp.c_str(), (base + ".maps").c_str()) != 0)) unlink(maps_tmp.c_str());
}

// Without the CLI: this process's report from its private blocks.
void report_to_stderr() {
  const ImageRecord img = image_record();
  ProcessRecord r = process_of(img, img.pid, img.ppid);
  if (g && g->local->epoch.load() == g->last_epoch) {  // (a fork child that never hit has its parent's)
    const unsigned n = std::min(g->nblocks.load(std::memory_order_acquire), kMaxBlocks);
    for (unsigned i = 0; i < n; ++i)
      if (const std::uint64_t* b = g->blocks[i].load(std::memory_order_acquire)) add_block(r, img, b, g->block_words);
    if (const std::uint64_t* ov = g->overflow.load(std::memory_order_acquire)) add_block(r, img, ov, g->block_words);
  }
  Report rep;
  rep.add(r);
  std::string text = meta->format == "json" ? format_json(rep, meta->per_thread) : format_text(rep, meta->per_thread);
  for (const auto& m : rep.messages) text += "uprobe-trace: " + (m.spec.empty() ? "" : m.spec + ": ") + m.text + "\n";
  write_all(STDERR_FILENO, "\n" + text);
}

// The counting memory: this process's wipe-on-fork page, the counts file's
// header (with the CLI), this image's record, the attaching thread's block.
void setup_counting() {
  static ProcessLocal fallback_local;  // no page: a fork child is then told by the atfork handler only
  void* lp = mmap(nullptr, sizeof(ProcessLocal), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  g->local = lp == MAP_FAILED ? &fallback_local : new (lp) ProcessLocal;
  g->wipe_on_fork = lp != MAP_FAILED && madvise(lp, sizeof(ProcessLocal), MADV_WIPEONFORK) == 0;
  g->pid = getpid();
  if (!meta->out_dir.empty()) {
    const std::string path = meta->out_dir + "/" + counts::kFileName;
    std::string why;
    int fd = path.size() < sizeof g->path ? open(path.c_str(), O_RDWR | O_CLOEXEC) : -1;
    void* h = MAP_FAILED;
    if (fd < 0) {
      why = path.size() < sizeof g->path ? std::strerror(errno) : "path too long";
    } else {
      h = mmap(nullptr, counts::kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (h == MAP_FAILED) why = std::strerror(errno);
      close(fd);
    }
    if (h != MAP_FAILED && static_cast<counts::Header*>(h)->magic != counts::kMagic) {
      munmap(h, counts::kHeaderBytes);
      h = MAP_FAILED;
      why = "not a counts file of this uprobe-trace";
    }
    if (h == MAP_FAILED) {
      if (!meta->specs.empty())
        add_message(meta->specs.front(), "agent: " + path + ": " + why + ": this process's counts are not recorded");
    } else {
      g->header = static_cast<counts::Header*>(h);
      std::memcpy(g->path, path.c_str(), path.size() + 1);
      g->layout = g->header->nlayouts.fetch_add(1, std::memory_order_relaxed) + 1;
    }
    write_image_record();
    register_process(g->pid, getppid());
  }
  g->last_epoch = 1;
  g->local->epoch.store(1, std::memory_order_release);
  new_block();  // the attaching thread's, now rather than in its first hit
}

// fork(): libuprobe's atfork handlers (registered when it starts, inside
// attach()) take its locks and, in the child, re-register with liburcu-bp,
// privatize the XOL area, ... : the agent's work, not the program's. So the
// agent registers handlers twice, before attach() (inner) and after it
// (outer), and the calling thread runs everything between them as the
// agent's. glibc runs prepare handlers last-registered first and the others
// first-registered first:
//   outer.prepare  libuprobe's  inner.prepare  (glibc's fork, _Fork)  inner.child  libuprobe's  outer.child
// The program's own calls in glibc's fork and in its own atfork handlers
// stay counted. inner.child is also the child's first point: a process of
// its own from here (reinit_process()), unless a hit in the child got there
// first.
void fork_outer_prepare() { ++tls_in_agent; }
void fork_outer_after() { --tls_in_agent; }
void fork_inner_prepare() { --tls_in_agent; }
void fork_inner_parent() { ++tls_in_agent; }
void fork_inner_child() {
  ++tls_in_agent;
  if (!g || !g->local) return;
  if (!g->wipe_on_fork) g->local->epoch.store(0, std::memory_order_release);
  reinit_process();  // (or already done by a hit between the fork and here)
}

void leave_exit_dtors() { tls_exit_dtors = false; }

// exit() runs the thread_local destructors first (the last constructed
// first), then the atexit list. Those constructed while attaching, before
// this guard (libuprobe's own per-thread decoders are no thread_locals:
// thread_object.hpp, never destroyed by exit()), run after its destructor,
// which marks them as the agent's, and registers (now, so first in line)
// the atexit handler that ends the mark before the program's own atexit
// handlers and static destructors run, which are counted.
struct ExitDtorGuard {
  ExitDtorGuard() = default;
  ExitDtorGuard(const ExitDtorGuard&) = delete;
  ExitDtorGuard& operator=(const ExitDtorGuard&) = delete;
  ~ExitDtorGuard() {
    tls_exit_dtors = true;
    Scope scope;
    std::atexit(leave_exit_dtors);
  }
};

void arm_exit_dtor_guard() {
  thread_local ExitDtorGuard guard;
  static_cast<void>(guard);
}

// ---------------------------------------------------------------- the first initializer

using InitFn = void (*)(int, char**, char**);

struct LibcDynamic {
  ElfW(Addr) base = 0;
  const ElfW(Dyn)* dyn = nullptr;
};

int find_libc(struct dl_phdr_info* info, std::size_t, void* data) {
  const char* name = info->dlpi_name;
  const char* slash = name ? std::strrchr(name, '/') : nullptr;
  const char* base = slash ? slash + 1 : name;
  if (!base || std::strncmp(base, "libc.so.", 8) != 0) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
      auto* out = static_cast<LibcDynamic*>(data);
      out->base = info->dlpi_addr;
      out->dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
      return 1;
    }
  return 0;
}

// libc's DT_INIT and DT_INIT_ARRAY, as the dynamic linker's call_init runs
// them: they set libc's argc, argv, environ and program_invocation_name
// (glibc 2.36: _init_first, and the stdio vtable check), all idempotent.
bool run_libc_initializers(int argc, char** argv, char** envp) {
  LibcDynamic libc;
  if (!dl_iterate_phdr(find_libc, &libc) || !libc.dyn) return false;
  ElfW(Addr) init = 0, array = 0, arraysz = 0;
  for (const ElfW(Dyn)* d = libc.dyn; d->d_tag != DT_NULL; ++d) {
    if (d->d_tag == DT_INIT) init = d->d_un.d_ptr;
    else if (d->d_tag == DT_INIT_ARRAY) array = d->d_un.d_ptr;
    else if (d->d_tag == DT_INIT_ARRAYSZ) arraysz = d->d_un.d_val;
  }
  if (init) reinterpret_cast<InitFn>(libc.base + init)(argc, argv, envp);
  const auto* fns = reinterpret_cast<const ElfW(Addr)*>(libc.base + array);
  for (std::size_t i = 0; array && i < arraysz / sizeof(ElfW(Addr)); ++i)
    reinterpret_cast<InitFn>(fns[i])(argc, argv, envp);
  return true;
}

bool g_dependencies_ready = false;  // agent_init_first() brought them up

// Objects loaded after the agent that are DF_1_INITFIRST too: the dynamic
// linker runs only the last loaded one first, and a program's libraries load
// after LD_PRELOAD's. Their initializers ran before the probes were attached.
struct RivalSearch {
  std::string self;  // the agent's path, as the dynamic linker names it
  bool after = false;
  std::vector<std::string> rivals;
};

int find_initfirst_rivals(struct dl_phdr_info* info, std::size_t, void* data) {
  auto* st = static_cast<RivalSearch*>(data);
  const std::string name = info->dlpi_name ? info->dlpi_name : "";
  if (!st->after) {
    st->after = name == st->self;
    return 0;
  }
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
    const auto* d = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    for (; d->d_tag != DT_NULL; ++d)
      if (d->d_tag == DT_FLAGS_1 && (d->d_un.d_val & DF_1_INITFIRST)) st->rivals.push_back(name);
  }
  return 0;
}

void note_initfirst_rivals() {
  const struct link_map* self = uprobe::detail::object_of(reinterpret_cast<const void*>(&find_initfirst_rivals));
  if (!self || !self->l_name) return;
  RivalSearch st{self->l_name, false, {}};
  dl_iterate_phdr(find_initfirst_rivals, &st);
  for (const auto& path : st.rivals)
    meta->notes.push_back(path + " is DF_1_INITFIRST too: the dynamic linker ran its initializer before the "
                                 "agent's, and what that initializer called is not counted");
}

// The agent is DF_1_INITFIRST: the dynamic linker calls this before any
// other initializer (the program's preinit array included), with nothing
// else initialized -- not even libc, whose environ is still NULL. The
// agent's dependencies (libc, libstdc++, libuprobe, liburcu-bp, capstone,
// ...) must be up before it attaches: dlopen() of the agent itself runs the
// initializers of every dependency not run yet, in dependency order, and
// marks them done (the dynamic linker will not run them again). It passes
// them libc's argc, argv and environ, which libc's own initializer sets: so
// that one runs first, here, with the real values (it will run again inside
// dlopen with the same ones). libc's dlopen, not libuprobe's (RTLD_NEXT from
// here; libuprobe is preloaded ahead of the agent): libuprobe's wrapper is
// not initialized yet. If another object wins DF_1_INITFIRST, libc is up
// already and this only makes sure the dependencies are.
__attribute__((constructor(101))) void agent_init_first(int argc, char** argv, char** envp) {
  // Before libuprobe's initializer (it runs inside the dlopen below):
  // elfutils only when this process reads a file as ELF, which with the
  // tables an earlier run kept it does not.
  uprobe::defer_elfutils();
  if (environ == nullptr && (program_invocation_name == nullptr || *program_invocation_name == '\0') &&
      !run_libc_initializers(argc, argv, envp))
    environ = envp;  // (no libc.so.*: dlopen then passes it at least the environment)
  const struct link_map* self = uprobe::detail::object_of(reinterpret_cast<const void*>(&agent_init_first));
  auto real_dlopen = reinterpret_cast<void* (*)(const char*, int)>(dlsym(RTLD_NEXT, "dlopen"));
  // (a reference never dropped)
  g_dependencies_ready = self && self->l_name && self->l_name[0] && real_dlopen &&
                         real_dlopen(self->l_name, RTLD_NOW | RTLD_NOLOAD);
  if (!g_dependencies_ready) {
    static const char kWhy[] = "uprobe-trace agent: cannot initialize its dependencies (dlopen of itself): "
                               "not attaching\n";
    if (write(STDERR_FILENO, kWhy, sizeof kWhy - 1) < 0) {
    }
  }
}

/// What the start gate said before the attach (wait_for_elf_tables()):
/// 0 nothing read yet, '1' it is open already.
char g_gate_said = 0;

/// One byte from the start gate (kEnvGate's descriptor): 't' the CLI's
/// checks wrote the ELF tables (StartGate::tables_ready()), '1' open
/// (StartGate::open()); 0 at end-of-file (the CLI refused a spec, or died:
/// StartGate::shut()) or an error. (A system call, not libc's read: a probe
/// on read counts the program's calls only.)
char read_gate(int fd) {
  char c = 0;
  long n;
  do n = syscall(SYS_read, fd, &c, 1);
  while (n < 0 && errno == EINTR);
  return n == 1 ? c : 0;
}

/// Waits, when `coming` (kEnvTables was "1...": the CLI's checks run while this
/// process starts and write kElfTablesFile when done), for the gate's 't'
/// (StartGate::tables_ready(), sent once they are written, before the gate
/// opens), so that the attach takes them instead of reading the files. End
/// of file ends the process here (125), as at the gate: the program never
/// runs. (It waited on inotify for the file's rename before: the close of
/// an inotify descriptor with a watch waits for an SRCU grace period of the
/// kernel's, 10-20 ms on a 2-vCPU VM, in every traced process.) True when
/// it waited: this process is the one the CLI started, and removes the file
/// once it imported it (on a small `$TMPDIR` it would take room the counts
/// file may need).
bool wait_for_elf_tables(bool coming) {
  const char* g = libc_getenv(kEnvGate);
  if (!coming || !g) return false;
  const char c = read_gate(std::atoi(g));
  if (c == 0) _exit(125);
  if (c == '1') g_gate_said = '1';  // (a CLI that sends no 't': the checks are over)
  return true;
}

/// uprobe-trace's start gate (launch.hpp, StartGate; kEnvGate): once this
/// process attached, wait for the CLI's checks of the specs before any code
/// of the program runs; end-of-file (the CLI refused a spec, or died) ends
/// the process here (125). A 't' not taken before the attach (the tables
/// were not waited for: --no-follow's agent, or a process exec'd since)
/// is passed over. The descriptor is closed and the variable unset: the
/// program, its children and what it execs see neither.
void pass_start_gate() {
  const char* v = libc_getenv(kEnvGate);
  if (!v) return;
  const int fd = std::atoi(v);
  libc_unsetenv(kEnvGate);
  char c = g_gate_said;
  while (c != '1') {  // ('t' not taken before the attach passed over; 0: end-of-file)
    c = read_gate(fd);
    if (c != 't') break;
  }
  syscall(SYS_close, fd);
  if (c != '1') _exit(125);
}

__attribute__((constructor)) void agent_init() {
  Scope scope;  // also covers this function's locals, freed after counting is on
  struct AtReturn {
    ~AtReturn() { pass_start_gate(); }
  } gate;  // (whichever way this returns; inside the scope)
  const char* specs = libc_getenv(kEnvSpecs);
  if (!specs || !g_dependencies_ready) return;
  const std::vector<std::string> texts = split(specs, '\n');
  meta = new Meta;
  bt::init_vdso_clock();  // (nsecs and the latency histogram at hits: no libc call there)
  if (const char* prog = libc_getenv(kEnvProgram)) load_bt_program(prog);
  // str(), sargN and ustack read the program's memory at hits: in process
  // (faults taken by libuprobe's SIGSEGV/SIGBUS handler), not by a system call each.
  if (g_bt_blob) uprobe::enable_fault_safe_reads();
  meta->out_dir = env_or(kEnvOut, "");
  meta->format = env_or(kEnvFormat, "text");
  meta->per_thread = env_or(kEnvPerThread, "0") == "1";
  // "1[:N:FILE]" or "0[:N:FILE]" (spec.hpp): whether the CLI's checks may
  // hand tables to this process, and the tables of N files an earlier run
  // kept. (Read before --no-follow unsets it.) What this program execs finds
  // "0": no hand-over for them.
  std::string tables_var = env_or(kEnvTables, "0");
  const bool tables_coming = tables_var[0] == '1';
  std::size_t kept_want = 0;
  std::string kept_tables;
  if (tables_var.size() > 2 && tables_var[1] == ':') {
    char* end = nullptr;
    kept_want = std::strtoul(tables_var.c_str() + 2, &end, 10);
    if (end && end[0] == ':' && end[1] == '/') kept_tables = end + 1;
  }
  if (tables_coming) {
    tables_var[0] = '0';
    libc_setenv(kEnvTables, tables_var.c_str(), 1);
  }
  {
    // Every page a probe writes becomes a copy of itself out of the kernel's
    // uprobes' reach (Config::detach_patched_pages; libuprobe's default,
    // set here whatever it becomes): a system-wide bpftrace
    // or perf probe on a function probed here, as root beside us, would
    // otherwise tear our jump and kill the program. (The CLI symbolizes
    // with libdwfl, which takes a file's mapping across the copies' holes.)
    uprobe::Config c = uprobe::configuration();
    c.detach_patched_pages = true;
    uprobe::configure(c);
  }
  if (env_or("UPROBE_TRACE_NO_OPTIMIZE", "0") == "1") {
    // Every probe on int3 (Config::optimize off), as the kernel's: for comparisons.
    uprobe::Config c = uprobe::configuration();
    c.optimize = false;
    uprobe::configure(c);
  }
  if (env_or(kEnvFollow, "1") == "0") {
    // --no-follow: whatever this program execs runs without the agent.
    std::string orig = env_or(kEnvOrigPreload, "-");
    if (orig == "-") libc_unsetenv("LD_PRELOAD");
    else libc_setenv("LD_PRELOAD", orig.c_str(), 1);
    for (const char* v : {kEnvSpecs, kEnvOut, kEnvFormat, kEnvFollow, kEnvOrigPreload, kEnvPerThread, kEnvProgram, kEnvTables})
      libc_unsetenv(v);
  }
  pthread_atfork(fork_inner_prepare, fork_inner_parent, fork_inner_child);
  // The tables an earlier run of these specs kept, at once; else those the
  // CLI read for its checks, once they are written. Of the files unchanged
  // since: the attach then reads none of theirs (a file not there, or
  // changed since: the attach reads it).
  if (!meta->out_dir.empty()) {
    if (usable_tables_file(kept_tables.c_str()))
      meta->elf_tables = static_cast<unsigned>(uprobe::import_elf_tables(kept_tables));
    if (kept_tables.empty() || meta->elf_tables < kept_want) {
      const std::string tables = meta->out_dir + "/" + kElfTablesFile;
      const bool first = wait_for_elf_tables(tables_coming);
      meta->elf_tables += static_cast<unsigned>(uprobe::import_elf_tables(tables));
      if (first) syscall(SYS_unlink, tables.c_str());
    }
  }
  try {
    attach(texts);
  } catch (const std::exception& e) {
    if (!meta->specs.empty()) add_message(meta->specs.front(), std::string("agent: ") + e.what());
  }
  pthread_atfork(fork_outer_prepare, fork_outer_after, fork_outer_after);
  note_initfirst_rivals();
  try {
    if (!g) make_counters();  // (attach failed before it made them: the record still says why)
    setup_counting();
  } catch (const std::exception& e) {
    if (!meta->specs.empty()) add_message(meta->specs.front(), std::string("agent: ") + e.what());
    return;  // counting stays off
  }
  arm_exit_dtor_guard();
  uprobe::set_recursion_miss_hook(missed_hit);  // (counts only while counting)
  g->enabled.store(true, std::memory_order_seq_cst);
}

// Without the CLI, the report is printed here (counts of later destructors
// and of a process that skips exit() are not in it); with the CLI there is
// nothing to do: the counts are in the counts file, and counting goes on.
__attribute__((destructor)) void agent_fini() {
  if (!meta || !meta->out_dir.empty() || !g) return;
  Scope scope;
  g->enabled.store(false, std::memory_order_seq_cst);
  try {
    report_to_stderr();
  } catch (...) {
  }
}

}  // namespace

}  // namespace uptrace::agent
