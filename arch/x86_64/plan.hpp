// SPDX-License-Identifier: MIT
#pragma once
/// @file plan.hpp
/// Part of the arch boundary (arch.hpp includes it): the tactics a probe site
/// may be patched with and their planning: function-entry and mid-function
/// windows, punned and padded jumps, successor eviction, the neighbours'
/// branches, plan() and its PatchPlan.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "insn.hpp"

namespace uprobe::arch {

/// Longest displaced window of an optimized function entry: instructions
/// covering at least the 5 bytes of the jump, the last one starting at byte 4.
inline constexpr std::size_t kMaxWindowLen = kJumpLen - 1 + kMaxInsnLen;
/// Bytes of one window slot: the relocated window and the jump back.
inline constexpr std::size_t kWindowSlotSize = 64;

/// The instructions an optimized function-entry probe displaces: the first
/// instructions of the function, covering >= kJumpLen bytes, all of which
/// run correctly from another address (the window slot). Computed once at
/// register time from the file's bytes; position independent.
struct EntryWindow {
  std::vector<Insn> insns;                ///< the displaced instructions, in order
  std::uint8_t len = 0;                   ///< bytes covered (0 = no window)
  std::uint8_t bytes[kMaxWindowLen] = {};  ///< the original bytes [0, max(len, kJumpLen))
  /// A punned jump (E9Patch's tactic B2, plan_punned()): the window is one
  /// instruction shorter than the jump (len < kJumpLen), and the jump's
  /// bytes [len, kJumpLen) are the original bytes after it, unchanged, so its
  /// target is fixed by them up to the free low bytes (punned_jump_range()).
  bool punned = false;
  /// A punned jump may be padded (E9Patch's tactic T1): `pad` prefixes
  /// (kJumpPadPrefix) before its opcode, for any pad in [min_pad, max_pad],
  /// each choosing other bytes for its rel32 (those at [pad + 1, pad + 5),
  /// the ones past the instruction fixed) and so another range of targets,
  /// tried in order when the previous range has no free page (a site's pad
  /// is chosen at attach: Site::pad). max_pad < len (the opcode stays inside
  /// the instruction, whose bytes alone change) and the bytes up to
  /// max_pad + kJumpLen exist in the file (bytes holds them). min_pad 0: B2
  /// first; else min_pad .. max_pad, then B2. Position independent, as the
  /// rest of the plan.
  std::uint8_t min_pad = 0;
  std::uint8_t max_pad = 0;
  /// Successor eviction (E9Patch's tactic T2, plan_evict()), for a punned
  /// window whose own forms may find no free page: the instruction right
  /// after it (`evict`, at +len, evict.len bytes; 0 = none planned) first
  /// gets a jump of its own (after 0..evict_max_pad prefixes: B1 when it
  /// fits the instruction, else punned over the bytes after it, which stay),
  /// to a trampoline holding its relocated copy and a jump back; the site's
  /// punned jump then keeps the successor's new bytes, whose free rel32
  /// bytes select other targets (solve_evicted()). A branch to the successor
  /// takes its jump; only the two instructions' own bytes change.
  Insn evict;
  std::uint8_t evict_max_pad = 0;
  /// Place the site by eviction before looking for a free page of its own
  /// punned or padded forms (the core's SiteTactics::instruction_evicted,
  /// for the test suites); false: eviction only where none has one.
  bool evict_first = false;
  /// The original bytes from the site on: [0, len + max(evict.len, kJumpLen
  /// + evict_max_pad)), when evict.len.
  std::uint8_t evict_bytes[kMaxInsnLen + 4 + kMaxJumpLen] = {};
};

/// Bytes from the site on that successor eviction (EntryWindow::evict) may
/// rewrite or keep: the site's instruction, then the successor's jump over
/// its whole instruction (or its longest padded punned form). 0 when no
/// eviction is planned. Pure.
inline std::size_t evict_extent(const EntryWindow& w) noexcept {
  if (!w.evict.len) return 0;
  const std::size_t sj = kJumpLen + w.evict_max_pad;
  return w.len + (w.evict.len > sj ? w.evict.len : sj);
}

/// Plans successor eviction (EntryWindow::evict) for the punned window `w`
/// (plan_punned()'s result) from the file's bytes `code` [0, avail) at the
/// site: the successor at +w.len must be displaceable as a window's last
/// instruction (no trap or system call, no loop; a call or return is fine:
/// nothing of the window follows it) and its bytes and the kJumpLen +
/// evict_max_pad after its start must exist. False with `why` (w unchanged)
/// otherwise. Thread-safe.
bool plan_evict(const std::uint8_t* code, std::size_t avail, EntryWindow& w, std::string& why);

/// One solution of successor eviction: the site's jump after `pad`
/// prefixes to `target`, the successor's after `evict_pad` prefixes to
/// `evict_target`, consistent byte for byte (the site's rel32 bytes past
/// its instruction are the successor's jump's).
struct EvictChoice {
  std::uint8_t pad = 0, evict_pad = 0;
  std::uint64_t target = 0, evict_target = 0;
};

/// Searches the jumps of successor eviction for the site at `site` with the
/// planned window `w` (w.evict.len != 0): for each pair of pads, the free
/// bytes of both rel32s (the site's bytes after its opcode, the
/// successor's rel32 bytes inside the successor; the others are fixed: a
/// prefix, the successor's opcode, a byte past the successor), asking
/// `maybe_free(addr, len)` (cheap: false when that memory is known to be
/// taken) before `place_evict(addr)` (reserves the successor's trampoline
/// at exactly addr, true when done) and `place_site(addr)` (the site's hop
/// at exactly addr). `mapped(lo, hi)` (cheap, no question counted): true
/// when every address of [lo, hi) is known to be mapped (none can hold a
/// trampoline); the search skips the successor's pads, and the values of
/// its free bytes, whose every target is, and asks again after each failed
/// place_evict() (which may teach the caller's memory that the address is
/// mapped after all: a snapshot older than the heap's growth). At most
/// `budget` maybe_free() questions. True with `out` when both were placed;
/// false with `why`: "every trampoline address its bytes allow is mapped
/// (SPANS)" when it is so for every successor's pad (eviction is
/// impossible in this address space), "every address its bytes allow for
/// the successor's trampoline or the site's hop is mapped (SPANS)" when
/// each pair of pads is closed by one or the other (the site's spans: its
/// jump's targets with its free bytes open, for a pad and evict_pad whose
/// trampoline span is not wholly mapped), else that the search gave up after
/// `budget` questions ("... (the search gave up)"), or found no free pair
/// among those it tries. Not hot; thread-safe as its callbacks are.
bool solve_evicted(std::uint64_t site, const EntryWindow& w, bool (*maybe_free)(void*, std::uint64_t, std::size_t),
                   bool (*mapped)(void*, std::uint64_t, std::uint64_t), bool (*place_evict)(void*, std::uint64_t),
                   bool (*place_site)(void*, std::uint64_t), void* ctx, EvictChoice& out, std::string& why,
                   std::size_t budget = 20000);

/// The successor's bytes once evicted: its jump (after `evict_pad`
/// prefixes) to `evict_target`, written over the successor's own bytes
/// only (a punned jump's bytes past it are the original ones): out[0 ..
/// n), n = min(evict_pad + kJumpLen, evict.len) returned. Pure.
std::size_t evict_jump(std::uint64_t site, const EntryWindow& w, std::size_t evict_pad, std::uint64_t evict_target,
                       std::uint8_t* out) noexcept;

/// The mark after an evicted successor's trampoline (its relocated copy,
/// then its jump back; never executed: ud2, 'E', 'V'), followed by the
/// successor's address relative to the trampoline's entry (int32, little
/// endian): kEvictMarkLen bytes. The step path finds the successor of a
/// trampoline a self-stepping program entered with find_evict_mark().
inline constexpr std::uint8_t kEvictMark[4] = {0x0f, 0x0b, 'E', 'V'};
inline constexpr std::size_t kEvictMarkLen = 8;

/// Appends the mark (kEvictMark, then successor - entry) at code[n]:
/// returns n + kEvictMarkLen. `entry` is the trampoline's address,
/// `successor` the evicted instruction's (within rel32 reach of it: the
/// trampoline's jump back reaches it). Pure.
std::size_t append_evict_mark(std::uint8_t* code, std::size_t n, std::uint64_t entry, std::uint64_t successor) noexcept;

/// Looks in `code` [0, n) (the bytes at `entry` on) for a trampoline's
/// mark after `from` bytes: the first kEvictMark at offset k >= from whose
/// claimed successor is in user space. True with the successor's address
/// and k (the trampoline's code length). The caller checks the successor's
/// jump aims at `entry` (and calls again with from = k + 1 if not). Pure;
/// async-signal-safe.
bool find_evict_mark(const std::uint8_t* code, std::size_t n, std::uint64_t entry, std::size_t from,
                     std::uint64_t& successor, std::size_t& len) noexcept;

/// Bytes from the site on that a window's jump may cover and whose values it
/// needs unchanged, without successor eviction: its window, or for a
/// punned jump its longest padded form (max_pad + kJumpLen; a probe inside
/// them would change the jump's target). Pure.
inline std::size_t own_jump_extent(const EntryWindow& w) noexcept {
  return w.punned ? kJumpLen + w.max_pad : w.len;
}

/// own_jump_extent(), or evict_extent() when longer: the bytes a site
/// that evicts its successor needs unchanged. Pure.
inline std::size_t jump_extent(const EntryWindow& w) noexcept {
  const std::size_t own = own_jump_extent(w);
  const std::size_t ev = evict_extent(w);
  return ev > own ? ev : own;
}

/// Bytes of the jump a window's site holds once optimized that differ from
/// the original ones after byte 0 (the tail written before byte 0, and
/// restored before it): kJumpLen - 1, or len - 1 for a punned jump, whose
/// other bytes stay the original ones. Pure.
inline std::size_t jump_tail_len(const EntryWindow& w) noexcept {
  return w.punned ? static_cast<std::size_t>(w.len) - 1 : kJumpLen - 1;
}

/// Plans a punned jump at the instruction `insn` (analyze()'s result, at
/// `code`, with at least kJumpLen bytes there): a window of that one
/// instruction when it is shorter than the jump and may run displaced as a
/// window's last instruction. Only the instruction's own bytes change (no
/// thread can be inside an instruction, nothing branches into one), so none
/// of plan_window()'s function checks apply. With more bytes available
/// (`avail` up to kMaxJumpLen), padded forms too (EntryWindow::max_pad:
/// min(len - 1, avail - kJumpLen, kMaxJumpPad)); min_pad is left 0. False
/// with `why` otherwise. Thread-safe.
bool plan_punned(const std::uint8_t* code, std::size_t avail, const Insn& insn, EntryWindow& out, std::string& why);

/// The targets [lo, hi) a punned `jmp rel32` at `site`, after `pad`
/// prefixes (<= w.max_pad), may take: its rel32 is the bytes
/// [pad + 1, pad + 5); those past the window (w.bytes[w.len ..)) are fixed,
/// the ones before free (none when pad = w.len - 1: a single target). False
/// when the range lies outside user space or pad is not planned. Pure.
bool punned_jump_range(std::uint64_t site, const EntryWindow& w, std::uint64_t& lo, std::uint64_t& hi,
                       std::size_t pad = 0) noexcept;

/// Plans the window of a function entry from the function's bytes
/// [func, func + size) (size from the symbol table). Refuses, with the reason
/// in `why`: a function shorter than the jump; an instruction in the window
/// that cannot be relocated (a return, a system call or trap, a call (direct
/// or indirect) or indirect jump before the last instruction of the window;
/// direct jumps and Jcc anywhere are re-encoded); and a direct branch anywhere
/// in the function whose target lies inside the window past its first byte
/// (it would land in the middle of the jump: case C-04), or a rip-relative
/// operand anywhere in the function that takes an address there (a computed
/// goto: an indirect jump may land in the middle of the jump). Jump tables
/// (indirect jmp through a register) are not followed: compilers aim them at
/// case labels after the dispatch, never into a function's first bytes.
/// Branches are found by a scan of every byte as a possible opcode (so for
/// any instruction boundaries); only where one could aim into the window,
/// the linear sweep from the entry (Capstone's instruction lengths: from the
/// sweep's table for the common encodings, sweep.cpp) decides, and it
/// refuses when it cannot decode up to there.
/// `first`, when given, is analyze()'s result for the instruction at func[0]
/// (the probed one, analyzed already), so it is not decoded again.
/// A return (ret, ret imm16) may be the last displaced instruction, as a
/// `jmp *` may. `padding` (func holds size + padding bytes) is the count of
/// filler bytes after the function (nops or int3 up to the next function's
/// start, which nothing executes or branches to): a function whose last
/// instruction never falls through (ret, jmp) before 5 bytes lets the window
/// cover just enough of them (a 3-byte `xor %eax,%eax; ret` takes the jump).
/// Not async-signal-safe (Capstone). Thread-safe.
bool plan_entry_window(const std::uint8_t* func, std::size_t size, EntryWindow& out, std::string& why,
                       const Insn* first = nullptr, std::size_t padding = 0);

/// plan_entry_window() for a window at any instruction start `at` inside
/// the function [func, func + size) (at == 0: the entry), `padding` filler
/// bytes after the function as there (a site whose last instructions never
/// fall through, `nop; ret`, may cover them). The same refusals, each
/// reason's offsets relative to the function. What the
/// function's bytes alone cannot show is the caller's to check: branches from
/// neighbours (check_neighbour_branches()), jump tables in data
/// (rip_data_refs()), code addresses stored in data, exception landing pads.
/// `first`, when given, is analyze()'s result for func[at]. Not
/// async-signal-safe (Capstone). Thread-safe.
bool plan_window(const std::uint8_t* func, std::size_t size, std::size_t at, EntryWindow& out, std::string& why,
                 const Insn* first = nullptr, std::size_t padding = 0);

/// The addresses outside the function [func, func + size) that a `lea
/// disp32(%rip)` inside it takes, relative to func, sorted and unique: the
/// candidates for the jump tables of its switch statements (a compiler's PIC
/// table is an array of 32-bit offsets from its own start, which the
/// function's indirect jump adds to that start). Linear sweep from the entry;
/// false with the reason in `why` when it cannot decode to the end. Not hot;
/// thread-safe.
bool rip_data_refs(const std::uint8_t* func, std::size_t size, std::vector<std::int64_t>& refs, std::string& why);

/// True for the relocation type whose target is the load base plus its
/// addend, with no symbol (R_X86_64_RELATIVE): how a position-independent
/// file stores the address of its own code (a computed goto's label table, a
/// jump table of absolute addresses). Pure.
constexpr bool is_relative_reloc(std::uint32_t type) noexcept { return type == 8; }

/// Refuses (false, the reason in `why`) when the function `code` [0, size),
/// a neighbour of a planned window and swept from its own first byte, holds
/// a direct branch (jmp, Jcc, call, jrcxz/loop, xbegin) or a `lea
/// disp32(%rip)` whose target lies inside the window past its first byte:
/// (win, win + len), `win` the window's entry relative to `code` (past the
/// end for a function before it, negative for one after it). Hand-written
/// assembly shares labels across functions (glibc's __mempcpy_*_erms jumps
/// to the second instruction of __memmove_*_erms), which the window's own
/// function cannot show. Also refuses when the sweep meets undecodable bytes
/// before the last possible such branch. Not hot; thread-safe (one Capstone
/// handle per thread, for what the sweep's table does not know).
bool check_neighbour_branches(const std::uint8_t* code, std::size_t size, std::int64_t win, std::size_t len,
                              std::string& why);

/// The targets of the function `f` [0, size), swept from its first byte as
/// check_neighbour_branches() sweeps it: of every direct branch and every
/// `lea disp32(%rip)`, relative to `f` (a target beyond the int32 range kept
/// at its bound), appended to `targets`, those appended sorted. Returns
/// false when the sweep cannot reach the end (undecodable bytes: then
/// check_neighbour_branches() may refuse a window for that reason alone).
/// With true and no target in (win, win + len), check_neighbour_branches()
/// on the same bytes accepts that window: an index that clears a neighbour
/// for every window of a batch after one sweep (a window it does not clear is
/// checked exactly). Not async-signal-safe (Capstone, for the encodings the
/// sweep's table does not know: sweep.cpp); thread-safe.
bool neighbour_branch_targets(const std::uint8_t* f, std::size_t size, std::vector<std::int32_t>& targets);

/// Builds the relocated copy of `w` (original address `ip`) to run at
/// `slot`: every instruction with its rip-relative displacement re-aimed, a
/// final direct branch re-encoded with a rel32 from the slot (a call pushes
/// the original return address, ip + w.len; an indirect call pushes its
/// operand, then that return address, and jumps through the stack, leaving
/// the target in the dead quadword below the callee's rsp), then a jump back
/// to ip + w.len.
/// Writes at most kWindowSlotSize bytes; returns the length, or 0 with `why`
/// set when a target is out of rel32 reach of the slot. Not hot.
std::size_t build_window_xol(const EntryWindow& w, std::uint64_t ip, std::uint64_t slot, std::uint8_t* out,
                             std::string& why);

/// True when the `n` bytes at `b` are only filler: nops and int3 (the
/// alignment between two functions, which nothing runs or branches to).
/// Not async-signal-safe (Capstone). Thread-safe.
bool is_filler(const std::uint8_t* b, std::size_t n);

/// How a probe site is patched: the tactic plan() chooses.
enum class Tactic : std::uint8_t {
  int3,    ///< the breakpoint only: every hit traps (emulated or out of line)
  nop5,    ///< a 5-byte nop (is_nop5()) becomes a jmp rel32 to a stub; nothing is displaced
  window,  ///< a jmp rel32 over >= kJumpLen bytes of whole instructions, which run relocated from a
           ///< window slot (at a function's entry: the core's "entry window"; E9Patch's B1 when one instruction)
  punned,  ///< a jmp rel32 over one shorter instruction whose rel32's high bytes are the original bytes
           ///< after it (E9Patch's B2): it lands on a hop, placed in punned_jump_range(), that jumps to the stub
};

/// What plan() asks the core about a site's surroundings: the facts of the
/// file (function bounds, neighbours, data, exception tables) that the bytes
/// at the site cannot show. Implemented by src/attach/validate.cpp at attach
/// time. Not hot.
class PlanContext {
 public:
  /// The bytes of the function enclosing the site, from its entry.
  struct Function {
    const std::uint8_t* code = nullptr;  ///< the function's bytes, then `padding` filler bytes
    std::size_t size = 0;                ///< the function's size
    std::size_t at = 0;                  ///< the site, relative to code
    std::size_t padding = 0;             ///< filler after the function (is_filler()) that a window may cover
  };
  /// Whether the site is the entry of a function of known bounds.
  virtual bool at_function_entry() const = 0;
  /// The enclosing function for a window inside it; `tail`: when fewer bytes
  /// than that follow the site in the function, the filler after it is
  /// appended (Function::padding). False, with the reason in `why`, when no
  /// function of known bounds holds the site, when its sweep from the entry
  /// does not reach the site as an instruction start, or when the function
  /// may be resumed where its bytes cannot show (exception landing pads).
  virtual bool function(std::size_t tail, Function& out, std::string& why) = 0;
  /// Whether nothing outside the function's own bytes may enter the window
  /// (site, site + len): no neighbouring function's direct branch
  /// (check_neighbour_branches()), no jump-table entry (rip_data_refs()) or
  /// stored code address in the file's data. False with the reason in `why`.
  virtual bool no_outside_entry(std::size_t len, std::string& why) = 0;
  /// The file's `n` bytes at the site; false when fewer exist there.
  virtual bool site_bytes(std::uint8_t* out, std::size_t n) = 0;
  /// Whether successor eviction (EntryWindow::evict) is to be planned.
  virtual bool evict_wanted() const { return false; }
  /// Whether the byte `off` bytes past the site is known to be code of the
  /// site's function (a function of known bounds, disassembled from its
  /// entry up to the site, holds it): after a jump or a return, only then is
  /// what follows evicted (it may be another function's data otherwise).
  virtual bool code_at(std::size_t off) const {
    (void)off;
    return false;
  }

 protected:
  ~PlanContext() = default;
};

/// A probe site's patch plan (position independent: the same for every
/// mapping of the file). What each site of it is built from, per mapping
/// (src/attach/sites.cpp, xol.cpp): an XOL slot (kXolSlotSize, build_xol(),
/// within disp32 reach of a rip-relative operand's target), a window slot
/// when window.len (kWindowSlotSize, build_window_xol(), within rel32 reach
/// of the site) and, for every tactic but int3, a stub (kOptStubSize,
/// build_opt_stub(), within rel32 reach of the site; for punned, of a hop
/// placed inside punned_jump_range()).
struct PatchPlan {
  Tactic tactic = Tactic::int3;
  /// The displaced instructions and the original bytes the jump covers
  /// (len 0: none). Planned for a nop5 too: its int3 hits run the window slot
  /// while a conversion is under way.
  EntryWindow window;
  /// Why no window (nor punned jump) was planned; "" when one was.
  std::string why_no_window;
  /// For a punned window: why no successor eviction (EntryWindow::evict)
  /// was planned; "" when one was (or no punned jump).
  std::string why_no_evict;
};

/// The kernel has no counterpart (its uprobes always trap; kprobes'
/// can_optimize() is the nearest): plans how the probe at the instruction
/// `insn` (analyze()'s result for the site) is patched. In order: an
/// instruction as long as the jump, off a function's entry, is a window of
/// its own; else a window inside the enclosing function (plan_window(),
/// then ctx.no_outside_entry()); else, for an instruction shorter than the
/// jump, a punned jump (plan_punned() on ctx.site_bytes()). The tactic is
/// nop5 for a 5-byte nop whatever the window, else punned, window or int3.
/// Not async-signal-safe (Capstone). Thread-safe.
PatchPlan plan(const Insn& insn, PlanContext& ctx);

}  // namespace uprobe::arch
