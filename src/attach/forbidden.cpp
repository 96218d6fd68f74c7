// SPDX-License-Identifier: MIT
// Where a probe must never go: libuprobe's own trap path (its code, the
// libraries and libc functions it runs) and the code glibc runs with every
// signal blocked (the kernel makes an int3 hit there fatal).

#include "forbidden.hpp"

#include <dlfcn.h>
#include <gnu/lib-names.h>
#include <link.h>
#include <sys/stat.h>
#include <urcu/urcu-bp.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "elf_image.hpp"
#include "elf_info.hpp"
#include "fork_fresh.hpp"
#include "format.hpp"
#include "load_order.hpp"
#include "next_symbol.hpp"
#include "object_of.hpp"
#include "signals.hpp"
#include "uprobe/uprobe.hpp"
#include "validate.hpp"
#include "vma.hpp"

namespace uprobe::detail {

namespace {

/// Why a libc function cannot carry an int3 probe.
enum class TrapPathUse {
  trap_path,        ///< the SIGTRAP handler, return trampoline or optimized path calls it: a probe would recurse
  sigtrap_blocked,  ///< called with SIGTRAP blocked: an int3 there is fatal (the kernel forces the signal)
};

/// libc functions that the trap path, the return trampoline, liburcu-bp (a
/// new reader's registration on its first hit, the writer's grace period) or
/// glibc itself (thread start and exit, posix_spawn's child) call, the latter
/// with every signal blocked by its own system call: a probe there would
/// recurse without end or be hit with SIGTRAP blocked, which the kernel makes
/// fatal. (liburcu-bp blocks signals through pthread_sigmask(), which
/// libuprobe interposes, keeping SIGTRAP out (masks.cpp); its functions stay
/// refused because a thread's first hit registers it as a reader inside the
/// SIGTRAP handler, and a probe on what registration calls recurses.)
struct TrapPathFunction {
  const char* name;
  TrapPathUse use;
  const char* caller;
  bool sanitizer_only = false;  ///< only while a sanitizer runtime is loaded (see sanitizer_runtime_loaded)
};
constexpr TrapPathFunction kTrapPathLibc[] = {
    {"__errno_location", TrapPathUse::trap_path, "the SIGTRAP handler"},
    // libc's own pthread_sigmask and sigprocmask: the program's calls reach
    // libuprobe's interposers instead (masks.cpp), but glibc calls these
    // internally, in posix_spawn's child with every signal blocked (to set
    // the new program's mask just before exec).
    {"pthread_sigmask", TrapPathUse::sigtrap_blocked,
     "glibc's posix_spawn child, which sets the new program's mask through it with every signal blocked"},
    {"syscall", TrapPathUse::sigtrap_blocked, "liburcu-bp's grace period (every unregister: membarrier)"},
    {"getpid", TrapPathUse::sigtrap_blocked,
     "glibc's pthread_kill and pthread_cancel of another thread (every signal blocked, then getpid)"},
    {"sigprocmask", TrapPathUse::sigtrap_blocked,
     "glibc's posix_spawn child, which reads and sets its mask through it with every signal blocked"},
    {"sigfillset", TrapPathUse::trap_path, "liburcu-bp's reader registration on a thread's first hit"},
    {"sigaltstack", TrapPathUse::trap_path, "the return path"},
    {"sched_getcpu", TrapPathUse::trap_path, "the return-instance pool"},
    // Not open, pwrite, close: the text patcher (Action::remove from a
    // handler) makes those system calls itself (raw_syscall.hpp).
    {"mmap", TrapPathUse::trap_path, "the return-instance pool and liburcu-bp's reader registration"},
    {"mmap64", TrapPathUse::trap_path, "the return-instance pool and liburcu-bp's reader registration"},
    {"munmap", TrapPathUse::trap_path, "the return-instance pool and liburcu-bp"},
    {"pthread_setspecific", TrapPathUse::trap_path, "the return path and liburcu-bp's reader registration"},
    {"abort", TrapPathUse::trap_path, "the return path (fatal errors)"},
    {"write", TrapPathUse::trap_path, "the return path (fatal errors)"},
    {"mremap", TrapPathUse::sigtrap_blocked, "liburcu-bp's reader registration on a thread's first hit"},
    {"pthread_mutex_lock", TrapPathUse::sigtrap_blocked,
     "liburcu-bp's reader registration on a thread's first hit and its grace period (every unregister)"},
    {"pthread_mutex_unlock", TrapPathUse::sigtrap_blocked,
     "liburcu-bp's reader registration on a thread's first hit and its grace period (every unregister)"},
    {"pthread_self", TrapPathUse::sigtrap_blocked, "liburcu-bp's reader registration on a thread's first hit"},
    {"poll", TrapPathUse::sigtrap_blocked, "liburcu-bp's grace period (every unregister)"},
    {"__ctype_init", TrapPathUse::sigtrap_blocked, "glibc's thread start (start_thread)"},
    {"_setjmp", TrapPathUse::sigtrap_blocked, "glibc's thread start (start_thread)"},
    {"__sigsetjmp", TrapPathUse::sigtrap_blocked, "glibc's thread start (start_thread, through _setjmp)"},
    {"madvise", TrapPathUse::sigtrap_blocked, "glibc's thread exit (start_thread)"},
    {"getpagesize", TrapPathUse::sigtrap_blocked, "glibc's thread exit (start_thread)"},
    // The sanitizer runtime's own libc calls on the trap path: ASan intercepts
    // __tls_get_addr (liburcu-bp's reader lookup on every hit) and looks up
    // its current thread there, as in every malloc, with pthread_getspecific.
    {"pthread_getspecific", TrapPathUse::trap_path,
     "the sanitizer runtime's current-thread lookup in its __tls_get_addr interceptor", true},
};


/// Where glibc 2.36 (Debian 12) runs a function with every signal blocked by
/// a raw rt_sigprocmask system call of its own (README, "Signal masks"),
/// beyond the functions refused above: an int3 there is fatal, an optimized
/// site is not. Bits of SignalsBlocked.
enum : unsigned {
  kCreating = 1,      ///< pthread_create() in the creating thread (clone and what leads to it)
  kStarting = 2,      ///< a new thread before start_thread() sets its mask
  kExiting = 4,       ///< thread exit, after the thread's destructors
  kKilling = 8,       ///< pthread_kill()/pthread_cancel() of another thread
  kSpawning = 16,     ///< posix_spawn() (system(), popen()) in the parent
  kSpawnChild = 32,   ///< posix_spawn()'s child until execve: every handler reset to SIG_DFL too
  kLckpwdf = 64,      ///< lckpwdf(): every signal but SIGALRM
};

struct SignalsBlocked {
  const char* name;
  unsigned where;
};
// From the disassembly of Debian 12's libc.so.6 with its debug symbols
// (libc6-dbg): the calls between each raw rt_sigprocmask that blocks every
// signal and the one that restores the mask, and what they call.
constexpr SignalsBlocked kSignalsBlockedLibc[] = {
    {"__lll_lock_wait_private", kCreating | kStarting | kExiting | kKilling},
    {"__lll_lock_wake_private", kStarting | kExiting | kKilling},
    {"__clone_internal", kCreating | kSpawning},
    {"clone", kCreating | kSpawning},
    {"__nptl_create_event", kCreating},
    {"free", kExiting},
    {"waitpid", kSpawning},
    {"__libc_sigaction", kSpawnChild},
    {"chdir", kSpawnChild},
    {"fchdir", kSpawnChild},
    {"__close_nocancel", kSpawnChild},
    {"__open64_nocancel", kSpawnChild},
    {"dup2", kSpawnChild},
    {"getpgid", kSpawnChild},
    {"tcsetpgrp", kSpawnChild},
    {"ioctl", kSpawnChild},
    {"getuid", kSpawnChild},
    {"getgid", kSpawnChild},
    {"fcntl64", kSpawnChild | kLckpwdf},
    {"fcntl", kSpawnChild | kLckpwdf},
    {"setsid", kSpawnChild},
    {"setpgid", kSpawnChild},
    {"sched_setscheduler", kSpawnChild},
    {"sched_setparam", kSpawnChild},
    {"getrlimit", kSpawnChild},
    {"lseek64", kSpawnChild},
    {"getdents64", kSpawnChild},
    {"execve", kSpawnChild},
    {"getenv", kSpawnChild},
    {"strnlen", kSpawnChild},
    {"strchr", kSpawnChild},
    {"strchrnul", kSpawnChild},
    {"mempcpy", kSpawnChild},
    {"memcpy", kSpawnChild},
    {"_exit", kSpawnChild},
    {"alarm", kLckpwdf},
};

/// A file that holds code of the trap path: its identity and whether it is
/// the main program (libuprobe linked statically).
struct Anchor {
  dev_t dev;
  ino_t ino;
  bool in_exe;
  std::string name;
};

/// What the checks below ask the dynamic linker. Asked before the registry
/// mutex is taken (prepare_forbidden_checks()), never under it: dlsym(),
/// dladdr() and dlopen() wait for the dynamic linker's lock, which a
/// thread inside dlopen() holds while the new library's constructors run,
/// and one of those that registers a probe (or forks) waits for the
/// registry mutex: a thread asking the dynamic linker with the mutex held
/// would wait for it forever.
struct DlAnswers {
  /// A dlopen() handle on libc (already loaded: RTLD_NOLOAD; kept, libc is
  /// never unloaded), or nullptr. dlsym() on it searches libc, then its
  /// dependencies (the dynamic linker), never an interposer that the global
  /// scope finds first (a sanitizer's interceptor, an LD_PRELOAD wrapper).
  /// libc's own dlopen() (libc_dlopen()): our interposed one resyncs the
  /// address space, which takes the registry mutex.
  void* libc = nullptr;
  /// A sanitizer runtime (ASan, TSan, UBSan, ...) is in the process: its
  /// interceptors and hooks run on the trap path too.
  bool sanitized = false;
  /// Each of kTrapPathLibc twice: in the global scope, where an interposer
  /// may answer (a sanitizer's interceptor, an LD_PRELOAD wrapper: what our
  /// calls reach first), and in libc itself (what the interposer calls on).
  /// 0: not found.
  std::uint64_t trap_path[std::size(kTrapPathLibc)][2] = {};
  /// Each of kSignalsBlockedLibc in libc's own scope (an IFUNC: the
  /// implementation selected here); 0: not found.
  std::uint64_t signals_blocked[std::size(kSignalsBlockedLibc)] = {};
  /// The files of our own code, liburcu-bp (read-side calls) and the dynamic
  /// linker (TLS resolution of liburcu-bp's per-thread reader): none of them
  /// can be unloaded while the runtime exists, and the identity of the
  /// mapped file is what matters even if its path is replaced later.
  std::vector<Anchor> anchors;
};

DlAnswers ask_dynamic_linker() {
  DlAnswers d;
  const auto real_dlopen = libc_dlopen();
  d.libc = real_dlopen ? real_dlopen(LIBC_SO, RTLD_LAZY | RTLD_NOLOAD) : nullptr;
  d.sanitized = dlsym(RTLD_DEFAULT, "__sanitizer_print_stack_trace") != nullptr;
  for (std::size_t i = 0; i < std::size(kTrapPathLibc); ++i) {
    d.trap_path[i][0] = reinterpret_cast<std::uint64_t>(dlsym(RTLD_DEFAULT, kTrapPathLibc[i].name));
    if (d.libc) d.trap_path[i][1] = reinterpret_cast<std::uint64_t>(dlsym(d.libc, kTrapPathLibc[i].name));
  }
  for (std::size_t i = 0; d.libc && i < std::size(kSignalsBlockedLibc); ++i)
    d.signals_blocked[i] = reinterpret_cast<std::uint64_t>(dlsym(d.libc, kSignalsBlockedLibc[i].name));
  // __tls_get_addr twice: the global scope's may be an interceptor (libasan's:
  // then the sanitizer runtime, which the trap path runs through, is an
  // anchor too), libc's scope finds the dynamic linker's own.
  const void* addrs[] = {reinterpret_cast<const void*>(&open_target),
                         reinterpret_cast<const void*>(&urcu_bp_synchronize_rcu),
                         dlsym(RTLD_DEFAULT, "__tls_get_addr"), d.libc ? dlsym(d.libc, "__tls_get_addr") : nullptr};
  struct stat exe;
  const bool have_exe = ::stat("/proc/self/exe", &exe) == 0;
  for (const void* a : addrs) {
    const struct link_map* lm = a ? object_of(a) : nullptr;
    if (!lm || !lm->l_name) continue;
    const char* name = lm->l_name;
    struct stat st;
    // The program's link map has no name; /proc/self/exe is reliable.
    const bool in_exe = name[0] == '\0' || (have_exe && ::stat(name, &st) == 0 && st.st_dev == exe.st_dev &&
                                             st.st_ino == exe.st_ino);
    if (in_exe) st = exe;
    else if (::stat(name, &st) != 0) continue;
    d.anchors.push_back(Anchor{st.st_dev, st.st_ino, in_exe, name});
  }
  return d;
}

/// The answers, asked once per process. Without a lock (a thread inside
/// dlopen() may ask while another waits for the dynamic linker's lock to
/// ask: a guard would make one wait for the other): a thread that loses the
/// race to publish drops its copy. Never destroyed (probes fire during exit).
std::atomic<const DlAnswers*> g_dl_answers{nullptr};

const DlAnswers& dl_answers() {
  if (const DlAnswers* a = g_dl_answers.load(std::memory_order_acquire)) return *a;
  auto* fresh = new DlAnswers(ask_dynamic_linker());
  const DlAnswers* expected = nullptr;
  if (g_dl_answers.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;
  return *expected;
}

/// At libuprobe's load (the loading thread holds the dynamic linker's lock
/// then: its own lookups do not wait), so that no registration asks later.
__attribute__((constructor)) void ask_at_load() noexcept {
  try {
    prepare_forbidden_checks();
  } catch (...) {  // (out of memory: asked again before the first registration)
  }
}

void check_not_trap_path_libc(const Target& t, std::uint64_t offset, const VmaSnapshot* vmas) {
  struct Forbidden {
    dev_t dev;
    ino_t ino;
    std::uint64_t offset;
    const TrapPathFunction* fn;
  };
  // Their (file, offset) in this process, computed once (computed_once():
  // plan_site() gets here without the registry mutex).
  // Each name twice: in the global scope, where an interposer may answer
  // (a sanitizer's interceptor, an LD_PRELOAD wrapper: what our calls reach
  // first), and in libc itself (what the interposer calls on). Under ASan,
  // dlsym(RTLD_DEFAULT, "mmap") is libasan's interceptor, and libc's own
  // mmap would otherwise be left probeable although the trap path runs it.
  // Never destroyed (a static destructor would run at exit while probes
  // still fire: elf_image.cpp).
  // (The addresses: dl_answers(), asked before the registry mutex.)
  static std::atomic<const std::vector<Forbidden>*> computed{nullptr};
  const std::vector<Forbidden>& forbidden = computed_once(computed, [vmas] {
    std::vector<Forbidden> out;
    std::optional<VmaSnapshot> own;
    const VmaSnapshot& maps = vmas ? *vmas : own.emplace(read_proc_maps());
    const DlAnswers& dl = dl_answers();
    for (std::size_t i = 0; i < std::size(kTrapPathLibc); ++i) {
      const TrapPathFunction& f = kTrapPathLibc[i];
      if (f.sanitizer_only && !dl.sanitized) continue;
      for (const std::uint64_t a : dl.trap_path[i]) {
        const Vma* v = maps.find(a);
        if (!a || !v || !v->ino) continue;
        const Forbidden x{v->dev, v->ino, v->pgoff + (a - v->start), &f};
        if (std::none_of(out.begin(), out.end(), [&](const Forbidden& y) {
              return y.dev == x.dev && y.ino == x.ino && y.offset == x.offset;
            }))
          out.push_back(x);
      }
    }
    return out;
  });
  const Forbidden* match = nullptr;
  for (const Forbidden& f : forbidden)
    if (f.dev == t.st.st_dev && f.ino == t.st.st_ino) match = &f;
  if (!match) return;  // not a file that holds one of them
  std::string why;
  auto info = elf_info(t.fd, t.path, t.st, why);
  const FuncSym* fn = info ? function_at(info, t.fd, t.path, t.st, offset) : nullptr;
  if (!fn) return;
  for (const Forbidden& f : forbidden)
    if (f.dev == t.st.st_dev && f.ino == t.st.st_ino && f.offset == fn->file_offset)
      throw Error(Errc::forbidden_target, t.path, offset,
                  "the function " + fn->display_name() + " (" + f.fn->name + ") " +
                      (f.fn->use == TrapPathUse::trap_path
                           ? std::string("runs on libuprobe's trap path (") + f.fn->caller +
                                 "); a probe there would recurse"
                           : std::string("runs with SIGTRAP blocked (") + f.fn->caller +
                                 "); a breakpoint hit there is fatal"));
}

std::string describe_signals_blocked(unsigned where) {
  static const std::pair<unsigned, const char*> kNames[] = {
      {kCreating, "pthread_create() in the creating thread"},
      {kStarting, "a new thread's start"},
      {kExiting, "thread exit"},
      {kKilling, "pthread_kill()/pthread_cancel() of another thread"},
      {kSpawning, "posix_spawn()/system()/popen() in the parent"},
      {kSpawnChild, "posix_spawn()'s child before execve, with every handler reset to SIG_DFL"},
      {kLckpwdf, "lckpwdf()"},
  };
  std::string out;
  for (const auto& [bit, text] : kNames)
    if (where & bit) out += (out.empty() ? "" : "; ") + std::string(text);
  return out;
}

}  // namespace

void prepare_forbidden_checks() {
  (void)interposers_in_front();
  (void)dl_answers();
}

std::string signals_blocked_windows(dev_t dev, ino_t ino, std::uint64_t offset, const VmaSnapshot* vmas) {
  // Where each function is in this process: the address libc's own scope
  // gives (an IFUNC: the implementation selected here), as a file offset of
  // libc's mapping. Computed once, never destroyed: probes fire during exit,
  // and its free() at exit would be the traced program's (uprobe-trace
  // counts it).
  struct Libc {
    dev_t dev = 0;
    ino_t ino = 0;
    std::string path;
    std::vector<std::pair<const SignalsBlocked*, std::uint64_t>> at;  // (function, file offset)
  };
  static std::atomic<const Libc*> computed_libc{nullptr};
  const Libc& libc = computed_once(computed_libc, [caller = vmas] {
    const VmaSnapshot* vmas = caller;
    Libc out;
    const DlAnswers& dl = dl_answers();
    if (!dl.libc) return out;
    // (The caller's snapshot: a transaction's keeps the file mappings
    // exact, libc's among them; a /proc/self/maps read is ~0.1 ms.)
    std::optional<VmaSnapshot> own;
    if (!vmas) vmas = &own.emplace(read_proc_maps());
    for (std::size_t i = 0; i < std::size(kSignalsBlockedLibc); ++i) {
      const SignalsBlocked& f = kSignalsBlockedLibc[i];
      const std::uint64_t a = dl.signals_blocked[i];
      const Vma* v = vmas->find(a);
      if (!a || !v || !v->ino) continue;
      if (out.ino == 0) out.dev = v->dev, out.ino = v->ino, out.path = v->path;
      if (v->dev != out.dev || v->ino != out.ino) continue;
      out.at.emplace_back(&f, v->pgoff + (a - v->start));
    }
    return out;
  });
  if (libc.ino == 0 || dev != libc.dev || ino != libc.ino) return "";  // (a probe elsewhere: nothing to read)
  struct Range {
    std::uint64_t lo, hi;
    unsigned where;
  };
  // Each function's range: from its offset, sized by the .dynsym symbol
  // exactly there (what dladdr1() reports; none for an IFUNC's
  // implementation, which then covers its first byte). From libc's image,
  // which resolving the probe in libc has read: one pass over its symbols
  // (dladdr1() scans every dynamic symbol per call: ~0.4 ms for the 36).
  static std::atomic<const std::vector<Range>*> computed_ranges{nullptr};
  const std::vector<Range>& ranges = computed_once(computed_ranges, [&libc] {
    std::unordered_map<std::uint64_t, std::uint64_t> size_at;
    for (const auto& [f, off] : libc.at) size_at.emplace(off, 1);
    try {
      const std::shared_ptr<const ElfImage> img = load_elf_image(libc.path, ImageDepth::file_tables);
      if (img->dev == libc.dev && img->ino == libc.ino) {
        std::unordered_map<std::uint64_t, bool> sized;
        for (const ElfSymbol& s : img->symbols) {
          if (!s.dynamic || !s.in_file || !s.size) continue;
          const auto it = size_at.find(s.offset);
          if (it != size_at.end() && sized.emplace(s.offset, true).second) it->second = s.size;
        }
      }
    } catch (const std::exception&) {  // (unreadable: each function covers its first byte)
    }
    std::vector<Range> out;
    for (const auto& [f, off] : libc.at) {
      auto same = std::find_if(out.begin(), out.end(), [&](const Range& r) { return r.lo == off; });
      if (same != out.end()) same->where |= f->where;
      else out.push_back(Range{off, off + size_at[off], f->where});
    }
    return out;
  });
  unsigned where = 0;
  for (const Range& r : ranges)
    if (offset >= r.lo && offset < r.hi) where |= r.where;
  return describe_signals_blocked(where);
}

namespace {

/// Where the signal-return trampoline is, in its file: read once per
/// address (fork_fresh(): a thread that does not come along may hold `mu`).
struct SignalReturnCache {
  struct Where {
    std::uint64_t address = 0;
    dev_t dev = 0;
    ino_t ino = 0;
    std::uint64_t offset = 0;
  };
  std::mutex mu;
  Where known;
};

/// Refuses the bytes of the signal-return trampoline (glibc's __restore_rt,
/// the sa_restorer of libuprobe's SIGTRAP handler): every handler returns
/// through it, ours included, so a breakpoint there is hit by the return of
/// its own SIGTRAP handler, without end (the stack overflows); a jump there
/// would count every signal's return. A local symbol of size 0 in the debug
/// file: no function bounds hold it, so check_not_trap_path_libc() cannot.
void check_not_signal_return(const Target& t, std::uint64_t offset, const VmaSnapshot* vmas) {
  const std::uint64_t restorer = signal_return_trampoline();
  if (!restorer) return;
  // Computed once per address; its own lock: plan_site() checks without the
  // registry mutex (so a fork child starts afresh: fork_fresh()).
  SignalReturnCache& cache = fork_fresh<SignalReturnCache>();
  SignalReturnCache::Where where;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    where = cache.known;
  }
  if (where.address != restorer) {
    std::optional<VmaSnapshot> own;
    const VmaSnapshot& maps = vmas ? *vmas : own.emplace(read_proc_maps());
    const Vma* v = maps.find(restorer);
    if (!v || !v->ino) return;
    where = {restorer, v->dev, v->ino, v->pgoff + (restorer - v->start)};
    std::lock_guard<std::mutex> lock(cache.mu);
    cache.known = where;
  }
  if (where.dev != t.st.st_dev || where.ino != t.st.st_ino) return;
  if (offset < where.offset || offset - where.offset >= arch::kSignalReturnTrampolineLen) return;
  throw Error(Errc::forbidden_target, t.path, offset,
              "inside the signal-return trampoline at file offset " + hex_str(where.offset) +
                  " (libc's sa_restorer, glibc's __restore_rt): every signal handler returns through it, "
                  "libuprobe's SIGTRAP handler too, so a probe there would recurse");
}

}  // namespace

void check_not_forbidden(const Target& t, std::uint64_t offset, const VmaSnapshot* vmas) {
  if (!interposers_in_front())
    throw Error(Errc::forbidden_target, t.path, offset,
                "libuprobe was loaded after libc in this process (the program names libc before it, or it came "
                "as a dependency of a library loaded after libc, by dlopen, or into a namespace of its own by "
                "dlmopen), so its interposers of sigaction, sigprocmask, pthread_create and dlopen cannot see "
                "the program's calls, and a probe could be hit with SIGTRAP blocked, which the kernel makes "
                "fatal: load libuprobe before libc (link the program with -luprobe before libc, or put "
                "libuprobe.so first in LD_PRELOAD)");
  // Our own code, liburcu-bp and the dynamic linker run before the recursion
  // guard can help, so a probe there would trap forever.
  check_not_trap_path_libc(t, offset, vmas);
  check_not_signal_return(t, offset, vmas);
  for (const Anchor& a : dl_answers().anchors) {
    if (a.dev != t.st.st_dev || a.ino != t.st.st_ino) continue;
    if (a.in_exe) {
      // Linked statically into the program: refuse only our own functions.
      std::string why;
      // (The names: the image with the debug file's symbols.)
      auto info = elf_info(t.fd, t.path, t.st, why, ImageDepth::with_debug_file);
      const FuncSym* fn = info ? info->enclosing_function(offset) : nullptr;
      if (!fn) continue;
      static const char* const prefixes[] = {"_ZN6uprobe", "_ZNK6uprobe", "uprobe_", "urcu_", "_urcu"};
      for (const char* p : prefixes)
        if (fn->name.rfind(p, 0) == 0)
          throw Error(Errc::forbidden_target, t.path, offset,
                      "the function " + std::string(fn->name) + " is part of libuprobe's trap path; a probe there would recurse");
      continue;
    }
    throw Error(Errc::forbidden_target, t.path, offset,
                "this file (" + a.name + ") holds code that libuprobe's trap path runs; a probe there would recurse");
  }
}

}  // namespace uprobe::detail
