// SPDX-License-Identifier: MIT
#include "validate.hpp"

#include <dlfcn.h>
#include <link.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <gnu/lib-names.h>
#include <unistd.h>
#include <urcu/urcu-bp.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "object_of.hpp"
#include "code_refs.hpp"
#include "elf_image.hpp"
#include "elf_info.hpp"
#include "neighbours.hpp"
#include "vma.hpp"
#include "format.hpp"
#include "load_order.hpp"
#include "next_symbol.hpp"
#include "hot.hpp"
#include "signals.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe::detail {

namespace {

std::size_t read_at(int fd, std::uint64_t off, std::uint8_t* buf, std::size_t len) {
  std::size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

/// A batch reads a file's code through a window of this many bytes: the
/// entries of one library, analysed in file order, are a pread() per window
/// (about a dozen for libc's thousand first functions), not one per
/// function, into a buffer faulted in once.
constexpr std::size_t kWindow = 128u << 10;

/// Fills the batch's window of the target's file from file offset `off`
/// (one pread() of up to kWindow bytes). False when no window can be mapped.
bool fill_window(const Target& t, std::uint64_t off) {
  if (!t.window) {
    void* m = ::mmap(nullptr, kWindow, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED) return false;
    t.window = static_cast<std::uint8_t*>(m);
  }
  t.window_offset = off;
  t.window_size = read_at(t.fd, off, t.window, kWindow);
  return true;
}

/// The file's bytes [off, off + len) in the batch's window of the target's
/// file (filled from `off` when they are not all there), as a pointer into
/// it and the count there (fewer at the end of the file); nullptr without a
/// window (not a batch, too long, no memory). Valid until the window is
/// filled again. A copy of the file, never a mapping of it: a file truncated
/// or rewritten meanwhile (`cp new old`) gives short reads, never a SIGBUS.
const std::uint8_t* in_window(const Target& t, std::uint64_t off, std::size_t len, std::size_t& got) {
  if (!t.batch || len > kWindow) return nullptr;
  const bool at_end = t.window_size < kWindow;  // the last fill reached the end of the file
  const bool there = t.window && off >= t.window_offset && off - t.window_offset < t.window_size &&
                     (off + len <= t.window_offset + t.window_size || at_end);
  if (!there && !fill_window(t, off)) return nullptr;
  if (off - t.window_offset >= t.window_size) {  // (past the end of the file)
    got = 0;
    return t.window;
  }
  got = static_cast<std::size_t>(std::min<std::uint64_t>(len, t.window_offset + t.window_size - off));
  return t.window + (off - t.window_offset);
}

/// read_at() on the target's file, through the batch's window when it has
/// one: one pread() per window rather than per function.
std::size_t read_code(const Target& t, std::uint64_t off, std::uint8_t* buf, std::size_t len) {
  std::size_t got = 0;
  const std::uint8_t* w = in_window(t, off, len, got);
  if (!w) return read_at(t.fd, off, buf, len);
  std::memcpy(buf, w, got);
  return got;
}

}  // namespace

/// The file's bytes [off, off + len): a view of the batch's window (no
/// copy; valid until the window is filled again), else read into `scratch`.
std::span<const std::uint8_t> view_code(const Target& t, std::uint64_t off, std::size_t len,
                                        std::vector<std::uint8_t>& scratch) {
  std::size_t got = 0;
  if (const std::uint8_t* w = in_window(t, off, len, got)) return {w, got};
  scratch.resize(len);  // (not zeroed first where it grows: read over at once)
  return {scratch.data(), read_at(t.fd, off, scratch.data(), len)};
}

namespace {

/// The filler bytes after `fn`, whose last `left` bytes from a window's
/// site are fewer than `tail` (the jump's length): nops and int3 up to the next function's
/// start (alignment that nothing runs or branches to), which the window may
/// cover after a last instruction that never falls through. 0 when anything
/// else, or no known function, follows within 64 bytes.
std::size_t filler_after(const Target& t, const ElfImage& info, const FuncSym& fn, const LoadSegment& seg,
                         std::uint64_t left, std::size_t tail) {
  if (left >= tail) return 0;  // the window ends inside the function
  const std::uint64_t end = fn.file_offset + fn.size, seg_end = seg.offset + seg.filesz;
  auto next = std::lower_bound(info.funcs.begin(), info.funcs.end(), end,
                               [](const FuncSym& f, std::uint64_t o) { return f.file_offset < o; });
  if (next == info.funcs.end() || next->file_offset > seg_end || next->file_offset - end > 64) return 0;
  const std::size_t gap = static_cast<std::size_t>(next->file_offset - end);
  std::uint8_t b[64];
  if (gap == 0 || read_code(t, end, b, gap) != gap) return 0;
  return arch::is_filler(b, gap) ? gap : 0;
}

/// Whether nothing the file stores in data can send an indirect jump into
/// the window of `len` bytes at file offset `site` inside `fn` past its first
/// byte: no code address stored in data (data_code_refs(): a computed goto's
/// labels, absolute jump tables) and no entry of a PIC jump table that fn
/// takes with a `lea` (arch::rip_data_refs(): 32-bit offsets from the
/// table's start, read while they land inside fn). False with the reason in
/// `why`.
bool check_data_refs(const Target& t, const ElfImage& info, const FuncSym& fn, const LoadSegment& seg,
                     const std::vector<std::uint8_t>& code, std::uint64_t site, std::size_t len, std::string& why) {
  const std::uint64_t fn_vaddr = seg.vaddr + (fn.file_offset - seg.offset);
  const std::uint64_t lo = fn_vaddr + (site - fn.file_offset), hi = lo + len;  // the window, (lo, hi) refused
  const auto inside = [&](std::uint64_t a) { return a > lo && a < hi; };
  const auto where = [&](std::uint64_t a) { return fn.display_name() + "+" + hex(a - fn_vaddr); };
  auto stored = data_code_refs(t.fd, t.path, info, [](std::uint32_t type) { return arch::is_relative_reloc(type); }, why);
  if (!stored) return false;
  auto it = std::upper_bound(stored->begin(), stored->end(), lo);
  if (it != stored->end() && inside(*it)) {
    why = "the file's data holds the address " + where(*it) + " (a relocation or stored pointer: a computed goto's "
          "label or a jump table), inside the " + std::to_string(len) + " bytes the jump displaces";
    return false;
  }
  std::vector<std::int64_t> refs;
  if (!arch::rip_data_refs(code.data(), code.size(), refs, why)) return false;
  constexpr std::size_t kMaxEntries = 4096;
  std::vector<std::int32_t> entries(kMaxEntries);
  for (const std::int64_t r : refs) {
    const std::uint64_t table = fn_vaddr + static_cast<std::uint64_t>(r);
    const LoadSegment* ts = info.segment_of_vaddr(table);
    if (!ts) continue;
    const std::uint64_t avail = (ts->vaddr + ts->filesz - table) / 4;
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(kMaxEntries, avail));
    const std::size_t got = read_at(t.fd, ts->offset + (table - ts->vaddr), reinterpret_cast<std::uint8_t*>(entries.data()),
                                    want * 4) / 4;
    for (std::size_t i = 0; i < got; ++i) {
      const std::uint64_t dest = table + static_cast<std::uint64_t>(static_cast<std::int64_t>(entries[i]));
      // Past the table once an entry lands outside the code (a case label
      // may be in a split-off part, fn.cold, outside fn's bounds).
      const LoadSegment* ds = info.segment_of_vaddr(dest);
      if (!ds || !ds->executable()) break;
      if (inside(dest)) {
        why = "entry " + std::to_string(i) + " of the jump table at " + hex(table) + " (taken by a lea in " +
              fn.display_name() + ") goes to " + where(dest) + ", inside the " + std::to_string(len) +
              " bytes the jump displaces";
        return false;
      }
    }
  }
  return true;
}

}  // namespace

Target::~Target() {
  release_neighbour_cache(own_neighbour_cache);
  if (window) ::munmap(window, kWindow);
  if (fd >= 0) ::close(fd);
}

void open_target(const std::string& path, std::uint64_t offset, Target& out) {
  out.path = path;
  if (path.empty()) throw Error(Errc::file_not_found, path, offset, "the path is empty");
  // O_NONBLOCK: a FIFO (or a device) must be refused, not waited on.
  out.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (out.fd < 0) {
    const int err = errno;
    struct stat st;  // a socket fails to open (ENXIO): say what it is
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
      throw Error(Errc::not_executable, path, offset,
                  std::string("not a regular file (") + (S_ISSOCK(st.st_mode) ? "a socket" : "a special file") + ")");
    throw Error(Errc::file_not_found, path, offset, std::string("cannot open file: ") + std::strerror(err), err);
  }
  if (::fstat(out.fd, &out.st) != 0) {
    const int err = errno;
    throw Error(Errc::file_not_found, path, offset, std::string("cannot stat file: ") + std::strerror(err), err);
  }
  if (!S_ISREG(out.st.st_mode))
    throw Error(Errc::not_executable, path, offset, S_ISDIR(out.st.st_mode) ? "a directory, not a regular file" : "not a regular file",
                S_ISDIR(out.st.st_mode) ? EISDIR : 0);
  if (offset >= static_cast<std::uint64_t>(out.st.st_size))
    throw Error(Errc::bad_offset, path, offset,
                "offset is past the end of the file (size " + std::to_string(out.st.st_size) + " bytes)");
}

namespace {

/// What arch::plan() asks about the site at file offset `offset` (inside
/// `fn` when known, whose bytes from its entry `code` holds, up to fn_len):
/// the file's facts, from the ELF image and the file's bytes.
class SitePlanContext final : public arch::PlanContext {
 public:
  SitePlanContext(const Target& t, const ElfImage& info, const FuncSym* fn, const LoadSegment& seg,
                  std::uint64_t offset, std::vector<std::uint8_t>& code, std::size_t fn_len, bool swept_to_site)
      : t_(t), info_(info), fn_(fn), seg_(seg), offset_(offset), code_(code), fn_len_(fn_len),
        swept_to_site_(swept_to_site) {}

  bool at_function_entry() const override { return fn_ && fn_->file_offset == offset_; }

  bool function(std::size_t tail, Function& out, std::string& why) override {
    const SiteTactics st = g_hot.site_tactics.load(std::memory_order_relaxed);
    if (!at_function_entry() && st != SiteTactics::windows) {
      why = st == SiteTactics::instruction_only
                ? "no window is planned past a function's entry (Config::site_tactics is SiteTactics::instruction_only)"
                : st == SiteTactics::instruction_padded
                    ? "no window is planned past a function's entry (Config::site_tactics is "
                      "SiteTactics::instruction_padded)"
                    : "no window is planned past a function's entry (Config::site_tactics is "
                      "SiteTactics::instruction_evicted)";
      return false;
    }
    if (!fn_) {
      why = "the offset is not inside a function of known size (no sized symbol in .symtab, .dynsym or a debug "
            "file, no .eh_frame FDE), and its instruction is shorter than the jump";
      return false;
    }
    // The function's own bytes only (more were read when it is shorter than
    // an instruction's longest encoding).
    code_.resize(std::min(code_.size(), fn_len_));
    const std::size_t at_fn = static_cast<std::size_t>(offset_ - fn_->file_offset);
    // A function shorter than the jump: the filler after it, read with it.
    const std::size_t size = code_.size();
    const std::size_t padding = size == fn_->size ? filler_after(t_, info_, *fn_, seg_, size - at_fn, tail) : 0;
    if (padding) {
      code_.resize(size + padding);
      if (read_code(t_, fn_->file_offset, code_.data(), code_.size()) != code_.size()) code_.resize(size);
    }
    if (!swept_to_site_) {
      why = fn_->display_name() + " cannot be disassembled from its entry up to the offset, so the offset is not "
            "known to start an instruction";
      return false;
    }
    if (!at_function_entry() && info_.has_landing_pads(offset_)) {
      why = fn_->display_name() + " has exception landing pads (an LSDA in .eh_frame), where the unwinder may "
            "resume it; their addresses are not read, so no window is planned inside it";
      return false;
    }
    out = Function{code_.data(), size, at_fn, code_.size() - size};
    return true;
  }

  bool no_outside_entry(std::size_t len, std::string& why) override {
    return check_neighbours(t_, info_, *fn_, seg_, offset_, len, why) &&
           (at_function_entry() || check_data_refs(t_, info_, *fn_, seg_, code_, offset_, len, why));
  }

  bool evict_wanted() const override { return g_hot.optimize_evicted.load(std::memory_order_relaxed); }
  bool code_at(std::size_t off) const override {
    return fn_ && swept_to_site_ && offset_ + off < fn_->file_offset + fn_->size;
  }
  bool site_bytes(std::uint8_t* out, std::size_t n) override {
    return seg_.offset + seg_.filesz - offset_ >= n && read_code(t_, offset_, out, n) == n;
  }

 private:
  const Target& t_;
  const ElfImage& info_;
  const FuncSym* fn_;
  const LoadSegment& seg_;
  std::uint64_t offset_;
  std::vector<std::uint8_t>& code_;
  std::size_t fn_len_;
  bool swept_to_site_;
};

}  // namespace

void analyze_target(const Target& t, std::uint64_t offset, arch::Insn& insn, arch::PatchPlan* plan,
                    bool* function_entry) {
  std::string why;
  auto info = elf_info(t.fd, t.path, t.st, why);
  if (!info) throw Error(Errc::not_executable, t.path, offset, why);
  const LoadSegment* seg = info->exec_segment(offset);
  if (!seg) {
    std::string ranges;
    for (const LoadSegment& s : info->loads)
      if (s.executable()) ranges += (ranges.empty() ? "" : ", ") + hex(s.offset) + "-" + hex(s.offset + s.filesz);
    throw Error(Errc::not_executable, t.path, offset,
                "offset is outside every executable segment (executable file ranges: " +
                    (ranges.empty() ? std::string("none") : ranges) + ")");
  }

  // Inside a known function, the offset must be an instruction start of a
  // linear sweep from the function's entry.
  const FuncSym* fn = function_at(info, t.fd, t.path, t.st, offset);
  // function_at() may have replaced `info` by the deeper image, dropping the
  // last reference to the one `seg` points into (the image cache is emptied
  // at 64 entries): the segment again, from the image `fn` belongs to.
  seg = info->exec_segment(offset);
  if (!seg) throw Error(Errc::not_executable, t.path, offset, "offset is outside every executable segment");
  if (function_entry) *function_entry = fn && fn->file_offset == offset;
  bool swept_to_site = true;  // the sweep from fn's entry found the offset as an instruction start
  if (fn && offset != fn->file_offset) {
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(fn->size, 1u << 20));
    std::vector<std::uint8_t> code(want);
    std::size_t got = read_at(t.fd, fn->file_offset, code.data(), want);
    std::vector<std::size_t> starts = arch::instruction_starts(code.data(), got);
    const std::uint64_t rel = offset - fn->file_offset;
    auto it = std::upper_bound(starts.begin(), starts.end(), rel);
    bool at_start = it != starts.begin() && *(it - 1) == rel;
    swept_to_site = at_start;
    if (!at_start && it != starts.begin()) {
      std::size_t start = *(it - 1), len = 0;
      std::string text = arch::disassemble(code.data() + start, got - start, fn->file_offset + start, len);
      if (len != 0 && start + len > rel)
        throw Error(Errc::mid_instruction, t.path, offset,
                    "offset falls inside the " + std::to_string(len) + "-byte instruction `" + text +
                        "` at file offset " + hex(fn->file_offset + start) + " (" + fn->display_name() + "+" + hex(start) +
                        ")");
    }
  }

  // With a window to plan inside a known function, the whole function is
  // read at once (the probed instruction is in it); else just the instruction.
  const std::uint64_t in_seg = seg->offset + seg->filesz - offset;
  const bool planned = plan && fn;
  const std::size_t at_fn = planned ? static_cast<std::size_t>(offset - fn->file_offset) : 0;  // the site in code
  std::vector<std::uint8_t> code;
  std::uint8_t bytes[arch::kMaxInsnLen];
  const std::uint8_t* at = bytes;
  std::size_t avail = std::min<std::uint64_t>(arch::kMaxInsnLen, in_seg);
  // The function's bytes: up to its end, in the segment, at most 1 MiB.
  const std::size_t fn_len =
      planned ? static_cast<std::size_t>(std::min<std::uint64_t>({fn->size, in_seg + at_fn, 1u << 20})) : 0;
  if (planned) {
    code.resize(std::max<std::size_t>(fn_len, at_fn + avail));
    code.resize(read_code(t, fn->file_offset, code.data(), code.size()));
    if (code.size() <= at_fn) throw Error(Errc::not_executable, t.path, offset, "cannot read the function's bytes");
    at = code.data() + at_fn;
    avail = std::min(avail, code.size() - at_fn);
  } else {
    avail = read_code(t, offset, bytes, avail);
  }
  if (!arch::analyze(at, avail, insn, why)) throw Error(Errc::refused_instruction, t.path, offset, why);

  if (!plan) return;
  SitePlanContext ctx(t, *info, fn, *seg, offset, code, fn_len, swept_to_site);
  *plan = arch::plan(insn, ctx);
  // SiteTactics::instruction_padded: a padded form (T1) first wherever one is planned.
  if (plan->window.punned && plan->window.max_pad > 0 &&
      g_hot.site_tactics.load(std::memory_order_relaxed) == SiteTactics::instruction_padded)
    plan->window.min_pad = 1;
  // Successor eviction (T2) only when asked for: its bytes then count as
  // the jump's (a probe there blocks it, arch::jump_extent()).
  if (!g_hot.optimize_evicted.load(std::memory_order_relaxed)) {
    plan->window.evict = arch::Insn{};
    plan->window.evict_max_pad = 0;
    plan->why_no_evict = "successor eviction is switched off (Config::optimize_evicted)";
  } else if (plan->window.evict.len &&
             g_hot.site_tactics.load(std::memory_order_relaxed) == SiteTactics::instruction_evicted) {
    plan->window.evict_first = true;  // SiteTactics::instruction_evicted: T2 before any free page of B2/T1
  }
}


namespace {

/// A dlopen() handle on libc (already loaded: RTLD_NOLOAD; kept, libc is
/// never unloaded), or nullptr. dlsym() on it searches libc, then its
/// dependencies (the dynamic linker), never an interposer that the global
/// scope finds first (a sanitizer's interceptor, an LD_PRELOAD wrapper). The
/// dlopen() after ours (libc_symbol()): our interposed one resyncs the address
/// space, which takes the registry mutex that our callers hold.
void* libc_handle() {
  static void* const h = [] {
    const auto real_dlopen = reinterpret_cast<void* (*)(const char*, int)>(libc_symbol("dlopen"));
    return real_dlopen ? real_dlopen(LIBC_SO, RTLD_LAZY | RTLD_NOLOAD) : nullptr;
  }();
  return h;
}

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

/// A sanitizer runtime (ASan, TSan, UBSan, ...) is in the process: its
/// interceptors and hooks run on the trap path too.
bool sanitizer_runtime_loaded() { return dlsym(RTLD_DEFAULT, "__sanitizer_print_stack_trace") != nullptr; }

void check_not_trap_path_libc(const Target& t, std::uint64_t offset, const VmaSnapshot* vmas) {
  struct Forbidden {
    dev_t dev;
    ino_t ino;
    std::uint64_t offset;
    const TrapPathFunction* fn;
  };
  // Their (file, offset) in this process, computed once (registry mutex held).
  // Each name twice: in the global scope, where an interposer may answer
  // (a sanitizer's interceptor, an LD_PRELOAD wrapper: what our calls reach
  // first), and in libc itself (what the interposer calls on). Under ASan,
  // dlsym(RTLD_DEFAULT, "mmap") is libasan's interceptor, and libc's own
  // mmap would otherwise be left probeable although the trap path runs it.
  // Never destroyed (a static destructor would run at exit while probes
  // still fire: elf_image.cpp).
  static const std::vector<Forbidden>& forbidden = *new const std::vector<Forbidden>([vmas] {
    std::vector<Forbidden> out;
    std::optional<VmaSnapshot> own;
    const VmaSnapshot& maps = vmas ? *vmas : own.emplace(read_proc_maps());
    const bool sanitized = sanitizer_runtime_loaded();
    for (const TrapPathFunction& f : kTrapPathLibc) {
      if (f.sanitizer_only && !sanitized) continue;
      for (void* scope : {RTLD_DEFAULT, libc_handle()}) {
        if (!scope) continue;
        const auto a = reinterpret_cast<std::uint64_t>(dlsym(scope, f.name));
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
  }());
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

}  // namespace

namespace {

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
  static const Libc& libc = *new const Libc([caller = vmas] {
    const VmaSnapshot* vmas = caller;
    Libc out;
    void* const h = libc_handle();
    if (!h) return out;
    // (The caller's snapshot: a transaction's keeps the file mappings
    // exact, libc's among them; a /proc/self/maps read is ~0.1 ms.)
    std::optional<VmaSnapshot> own;
    if (!vmas) vmas = &own.emplace(read_proc_maps());
    for (const SignalsBlocked& f : kSignalsBlockedLibc) {
      const auto a = reinterpret_cast<std::uint64_t>(dlsym(h, f.name));
      const Vma* v = vmas->find(a);
      if (!a || !v || !v->ino) continue;
      if (out.ino == 0) out.dev = v->dev, out.ino = v->ino, out.path = v->path;
      if (v->dev != out.dev || v->ino != out.ino) continue;
      out.at.emplace_back(&f, v->pgoff + (a - v->start));
    }
    return out;
  }());
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
  static const std::vector<Range>& ranges = *new const std::vector<Range>([] {
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
  }());
  unsigned where = 0;
  for (const Range& r : ranges)
    if (offset >= r.lo && offset < r.hi) where |= r.where;
  return describe_signals_blocked(where);
}

namespace {

/// A file that holds code of the trap path: its identity and whether it is
/// the main program (libuprobe linked statically).
struct Anchor {
  dev_t dev;
  ino_t ino;
  bool in_exe;
  std::string name;
};

/// The files of our own code, liburcu-bp (read-side calls) and the dynamic
/// linker (TLS resolution of liburcu-bp's per-thread reader). Computed once:
/// none of them can be unloaded while the runtime exists, and the identity of
/// the mapped file is what matters even if its path is replaced later.
const std::vector<Anchor>& anchors() {
  static const std::vector<Anchor>& out = *new const std::vector<Anchor>([] {  // never destroyed
    // __tls_get_addr twice: the global scope's may be an interceptor (libasan's:
    // then the sanitizer runtime, which the trap path runs through, is an
    // anchor too), libc's scope finds the dynamic linker's own.
    void* const libc = libc_handle();
    const void* addrs[] = {reinterpret_cast<const void*>(&open_target),
                           reinterpret_cast<const void*>(&urcu_bp_synchronize_rcu),
                           dlsym(RTLD_DEFAULT, "__tls_get_addr"), libc ? dlsym(libc, "__tls_get_addr") : nullptr};
    std::vector<Anchor> v;
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
      v.push_back(Anchor{st.st_dev, st.st_ino, in_exe, name});
    }
    return v;
  }());
  return out;
}

/// Refuses the bytes of the signal-return trampoline (glibc's __restore_rt,
/// the sa_restorer of libuprobe's SIGTRAP handler): every handler returns
/// through it, ours included, so a breakpoint there is hit by the return of
/// its own SIGTRAP handler, without end (the stack overflows); a jump there
/// would count every signal's return. A local symbol of size 0 in the debug
/// file: no function bounds hold it, so check_not_trap_path_libc() cannot.
void check_not_signal_return(const Target& t, std::uint64_t offset, const VmaSnapshot* vmas) {
  const std::uint64_t restorer = signal_return_trampoline();
  if (!restorer) return;
  struct Where {
    std::uint64_t address = 0;
    dev_t dev = 0;
    ino_t ino = 0;
    std::uint64_t offset = 0;
  };
  static Where where;  // (registry mutex held: computed once per address)
  if (where.address != restorer) {
    std::optional<VmaSnapshot> own;
    const VmaSnapshot& maps = vmas ? *vmas : own.emplace(read_proc_maps());
    const Vma* v = maps.find(restorer);
    if (!v || !v->ino) return;
    where = {restorer, v->dev, v->ino, v->pgoff + (restorer - v->start)};
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
  for (const Anchor& a : anchors()) {
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
