// SPDX-License-Identifier: MIT
#pragma once
/// @file bt_form.hpp
/// The compact form of a bpftrace program (compiled by the CLI, bt_lang.hpp;
/// run by the interpreter of bt_vm.hpp). Internal to uprobe-trace (CLI and
/// agent of one build).
///
/// The program is one flat blob of plain arrays (BlobHeader, then nodes,
/// statements, lists, probes, maps, formats, strings): the CLI writes it to
/// DIR/program, the agent reads it once at start-up, and nothing in it is
/// changed afterwards. Expressions are a flat tree (Node children are
/// indexes), statement blocks are ranges of the `lists` array.
///
/// Each thread's block in the counts file (counts.hpp) carries an area for
/// the program (word kBlockBt of the block header: its first word): a
/// single-producer ring of printf events the CLI drains while the program
/// runs, and one open-addressing table per map, which the CLI merges over
/// every thread and process when it prints the maps.

#include <cstddef>
#include <cstdint>

namespace uptrace::bt {

inline constexpr std::uint64_t kBlobMagic = 0x316d76747470750aull;
inline constexpr std::size_t kStrLen = 160;    ///< bytes of a string value, NUL included (a `probe` string is PATH and more)
inline constexpr unsigned kMaxVars = 32;       ///< $variables per probe
inline constexpr unsigned kMaxStrVars = 8;     ///< string $variables per probe (kStrLen bytes each, on the hit's stack)
inline constexpr unsigned kMaxDepth = 48;      ///< expression nesting
inline constexpr unsigned kMaxIfDepth = 64;    ///< if/else nesting (`else if` included): exec()'s recursion
inline constexpr unsigned kMaxArgs = 8;        ///< map key components
/// Words for the keys being encoded at once: a map read inside a key
/// (`@a[1, @b[tid]]`) encodes its key above the outer one's. The compiler
/// refuses keys nested deeper than this holds.
inline constexpr unsigned kKeyStackWords = kMaxArgs * kStrLen / 8 + 32;
inline constexpr unsigned kHistBuckets = 66;
inline constexpr std::size_t kStrDefault = 64;  ///< str()'s size, NUL included (bpftrace's BPFTRACE_STRLEN)
inline constexpr unsigned kStrSlots = 4;        ///< str() results alive at once in one expression   ///< hist(): 0 negative, 1 [0], k+2 [2^k, 2^(k+1))
/// ustack's most frames: bpftrace's default (the kernel's perf_event_max_stack,
/// 127); ustack(N) takes 1..kMaxFrames.
inline constexpr unsigned kMaxFrames = 127;

/// Expression nodes.
enum class Op : std::uint8_t {
  num,       ///< imm
  str,       ///< string literal at strtab offset a
  arg,       ///< argN, N = imm
  retval, pid, tid, uid, comm, func, probe, nsecs, elapsed, cpu,
  var,       ///< $variable slot a (is_str: string $variable slot a)
  map_read,  ///< map a, key list b (count c)
  unary,     ///< sub: '-', '!', '~'
  binary,    ///< sub: BinOp, children a b; imm 1: signed
  land, lor, ///< && ||, children a b
  ternary,   ///< a ? b : c
  cast,      ///< a cast to imm bits (sub 1: signed)
  str_read,  ///< str(a[, b]): the NUL-terminated string at address a, at most b (or kStrDefault - 1) bytes
  sarg,      ///< sargN, N = imm: the stack word at sp + 8 * (N + 1) (uprobes; read with uprobe::probe_read_user())
  ustack,    ///< ustack / ustack([perf, ]N): imm frames at most, sub 1: perf mode (a Node::vt kVtStack value)
  usym,      ///< usym(a): the address a (a Node::vt kVtUsym value, symbolized by the CLI)
  strftime_, ///< strftime(format imm, a): the time a (ns, CLOCK_MONOTONIC; a Node::vt kVtTime value, printed by the CLI)
};

/// What a node's value is besides an integer or a string (Node::is_str).
enum ValueType : std::uint8_t {
  kVtPlain = 0,
  kVtStack = 1,  ///< ustack: raw return addresses (key/event: the image word, then frames)
  kVtUsym = 2,   ///< usym(): an address (key/event: the image word, then the address)
  kVtTime = 3,   ///< strftime(): a time in ns (event: the word; its format a FmtDesc, FmtDesc::arg_limit)
};

/// The word that names the image a stack or usym address belongs to: the
/// process's ID (high 32 bits, as bpftrace keys its stacks by pid) and its
/// image's layout id in the counts file (low 32 bits: which DIR/*.maps file
/// gives its modules; a fork child has its parent's, an exec'd image a new one).
inline std::uint64_t image_word(std::uint64_t pid, std::uint64_t layout) noexcept {
  return (pid << 32) | (layout & 0xffffffffu);
}

enum BinOp : std::uint8_t { kAdd, kSub, kMul, kDiv, kMod, kAnd, kOr, kXor, kShl, kShr, kEq, kNe, kLt, kLe, kGt, kGe };

struct Node {
  Op op;
  std::uint8_t sub = 0;
  std::uint8_t is_str = 0;  ///< the value is a string (kStrLen bytes)
  std::uint8_t vt = kVtPlain;  ///< ValueType
  std::int32_t a = -1, b = -1, c = -1;
  std::int64_t imm = 0;
};

/// Aggregations and map stores.
enum class Agg : std::uint8_t { count, sum, avg, min, max, stats, hist, lhist, assign };

enum class StmtOp : std::uint8_t {
  set_var,   ///< $var a = expr b (c 1: a string $variable)
  map_agg,   ///< map a [keys: list b, count c] (agg of the map) with value expr d (or none)
  printf_,   ///< format a, args: list b, count c
  if_,       ///< cond a; then: list b count c; else: list d count e
  exit_,
  expr,      ///< evaluate a (no effect)
  print_map, ///< print(@map a): an event; the CLI prints the map as it is when it reads the event
  map_delete, ///< delete(@map a [keys: list b, count c]); d 1: a key component is `tid` (no other thread has it)
  map_clear, ///< clear(@map a): an event; the CLI removes every key of every table when it reads it
  map_zero,  ///< zero(@map a): an event; the CLI zeroes every key's value when it reads it
  time_,     ///< time(format a): an event; the CLI prints the hit's wall-clock time with strftime(format)
  while_,    ///< while (cond a) { list b, count c }
  unroll,    ///< unroll(a) { list b, count c }: the body a times
  jump,      ///< a: kJumpBreak, kJumpContinue or kJumpReturn
};
inline constexpr std::int32_t kJumpBreak = 0, kJumpContinue = 1, kJumpReturn = 2;
/// Loop iterations (while and unroll bodies) one probe run may take: the
/// kernel's verifier refuses a BPF program it cannot bound (about a million
/// instructions); here the run stops there (Area kLoopStops counts it).
inline constexpr std::uint32_t kMaxLoopIterations = 1000000;

struct Stmt {
  StmtOp op;
  std::uint8_t pad[3] = {};
  std::int32_t a = -1, b = -1, c = 0, d = -1, e = 0;
};

enum class ProbeKind : std::uint8_t { uprobe, uretprobe, usdt, begin, end, interval };

/// One probe block (all its attach points share it).
struct ProbeDesc {
  ProbeKind kind;
  std::uint8_t pad[3] = {};
  std::int32_t pred = -1;        ///< predicate expr, -1: none
  std::int32_t body = 0, nbody = 0;  ///< statements: list range
  std::int32_t nvars = 0;
  std::int32_t nsvars = 0;       ///< string $variables
  std::int64_t interval_ns = 0;
};

struct MapDesc {
  Agg agg;
  std::uint8_t nkeys = 0;
  /// Per key component: 0 unsigned int, 1 string, 2 signed int, 3 ustack
  /// (1 + stack_limit words: the image word, the frames, 0 after the last),
  /// 4 usym (2 words: the image word, the address).
  std::uint8_t key_is_str[kMaxArgs] = {};
  std::uint8_t value_signed = 0;   ///< sum/min/max/assign: the value prints signed
  std::uint8_t stack_perf = 0;     ///< the ustack key component is ustack(perf...)
  std::uint8_t value_is_str = 0;   ///< assign: a string value (kStrLen bytes, then the store's time)
  std::uint8_t pad = 0;
  std::uint16_t stack_limit = 0;   ///< the ustack key component's frames
  std::uint32_t name = 0;          ///< strtab offset ("@name")
  std::uint32_t key_words = 0;     ///< words of an encoded key
  std::uint32_t value_words = 0;
  std::uint32_t nslots = 0;        ///< power of two
  std::uint64_t offset = 0;        ///< words from the area's start to its table
  std::int64_t lmin = 0, lmax = 0, lstep = 1;  ///< lhist
  /// Words of one slot: state, key, value.
  std::uint32_t slot_words() const { return 1 + key_words + value_words; }
};

inline constexpr unsigned kMaxPrintfArgs = 16;  ///< printf arguments

struct FmtDesc {
  std::uint32_t text = 0;  ///< strtab offset of the format string (bpftrace escapes resolved)
  std::uint32_t nargs = 0;
  /// Per argument: 0 integer (8 bytes), 1 string (its bytes, NUL, padded to
  /// 8), 2 ustack (the image word, a word `frames | perf << 32`, the
  /// frames), 3 usym (the image word, the address), 4 strftime (the time, ns).
  std::uint8_t arg_is_str[kMaxPrintfArgs] = {};
  /// ustack arguments: their frames at most; strftime: the FmtDesc of its format
  std::uint16_t arg_limit[kMaxPrintfArgs] = {};
};

/// The area's header words (then the ring, then the map tables).
enum AreaWord : std::size_t {
  kRingHead = 0,   ///< bytes ever written (the writer's; release store)
  kRingTail = 1,   ///< bytes ever consumed (the CLI's)
  kLostEvents = 2, ///< printf events dropped: the ring was full
  kMapDrops = 3,   ///< map updates dropped: the table was full
  kSelfPid = 4,    ///< the process's ID for image words (0: not known yet; a fork child has new blocks)
  kLoopStops = 5,  ///< probe runs stopped at kMaxLoopIterations
  kAreaHeaderWords = 8,
};

/// An event in the ring: a header, then (printf) one word per int argument
/// and per string argument its bytes, NUL-terminated, padded with NULs to a
/// multiple of 8 (at most kStrLen). kind kEvWrap: skip to the ring's start.
struct EventHeader {
  std::uint32_t bytes;  ///< the whole event, a multiple of 8
  std::uint32_t kind;   ///< kEvPrintf, kEvWrap
  std::uint64_t ts;     ///< CLOCK_MONOTONIC ns
  std::uint32_t fmt;
  std::uint32_t pad;
};
inline constexpr std::uint32_t kEvPrintf = 1, kEvWrap = 2, kEvPrint = 3;  ///< kEvPrint: fmt is the map
/// Map operations (fmt is the map): kEvDelete carries the key's words (the
/// CLI deletes it from every other table), kEvClear and kEvZero nothing.
inline constexpr std::uint32_t kEvDelete = 4, kEvClear = 5, kEvZero = 6;
/// time(): fmt is the format (a FmtDesc without arguments); no payload.
inline constexpr std::uint32_t kEvTime = 7;

/// A table slot's first word: the state in its low 2 bits, a generation
/// above them (bumped each time the writer revives or reuses the slot, so the
/// CLI's compare-and-swap of a state cannot act on a later key: no ABA).
/// A deleted slot keeps its key: a lookup goes past it, an insert of that
/// key revives it, of another key reuses the first one on its path.
enum SlotState : std::uint64_t {
  kSlotEmpty = 0,
  kSlotLive = 1,
  kSlotDeleted = 2,  ///< delete()/clear(): not in the map
  kSlotZeroed = 3,   ///< zero(): in the map, its value 0 (the words are stale until the writer revives it)
};
inline constexpr std::uint64_t kSlotStateMask = 3, kSlotGen = 4;

struct BlobHeader {
  std::uint64_t magic = kBlobMagic;
  std::uint32_t nnodes = 0, nstmts = 0, nlists = 0, nprobes = 0, nmaps = 0, nfmts = 0, strtab = 0, pad = 0;
  std::uint64_t ring_bytes = 0;  ///< power of two
  std::uint64_t area_words = 0;  ///< header + ring + tables
};

/// A loaded program (pointers into the blob).
struct Program {
  const BlobHeader* h = nullptr;
  const Node* nodes = nullptr;
  const Stmt* stmts = nullptr;
  const std::int32_t* lists = nullptr;
  const ProbeDesc* probes = nullptr;
  const MapDesc* maps = nullptr;
  const FmtDesc* fmts = nullptr;
  const char* strtab = nullptr;

  /// Points into `blob` (which must outlive this); false when it is not a program of this build.
  bool load(const void* blob, std::size_t size) {
    if (size < sizeof(BlobHeader)) return false;
    auto* p = static_cast<const char*>(blob);
    h = reinterpret_cast<const BlobHeader*>(p);
    if (h->magic != kBlobMagic) return false;
    std::size_t off = sizeof(BlobHeader);
    auto take = [&](std::size_t n, std::size_t each) {
      const char* r = p + off;
      off += (n * each + 7) & ~std::size_t{7};
      return r;
    };
    nodes = reinterpret_cast<const Node*>(take(h->nnodes, sizeof(Node)));
    stmts = reinterpret_cast<const Stmt*>(take(h->nstmts, sizeof(Stmt)));
    lists = reinterpret_cast<const std::int32_t*>(take(h->nlists, sizeof(std::int32_t)));
    probes = reinterpret_cast<const ProbeDesc*>(take(h->nprobes, sizeof(ProbeDesc)));
    maps = reinterpret_cast<const MapDesc*>(take(h->nmaps, sizeof(MapDesc)));
    fmts = reinterpret_cast<const FmtDesc*>(take(h->nfmts, sizeof(FmtDesc)));
    strtab = take(h->strtab, 1);
    return off <= size;
  }
};

}  // namespace uptrace::bt
