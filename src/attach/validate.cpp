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


}  // namespace uprobe::detail
