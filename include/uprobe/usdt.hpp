// SPDX-License-Identifier: MIT
#pragma once
/// @file usdt.hpp
/// USDT (SystemTap SDT) probes: reading the `.note.stapsdt` notes of an ELF
/// file, turning each probe site into the (file offset, semaphore file offset)
/// pair the uprobe registration takes (the kernel's `offset` and
/// `ref_ctr_offset`), and evaluating the x86-64 argument specs of a site
/// against the registers of a hit.
///
/// Note layout (sys/sdt.h, NT_STAPSDT = 3, owner "stapsdt"): three addresses
/// (pc, the link-time address of `_.stapsdt.base`, semaphore or 0) then
/// `provider\0name\0args\0`. When the file has a `.stapsdt.base` section, pc
/// is moved by (section sh_addr - note base), as libbpf's usdt.c does: the
/// prelink compensation (the difference is 0 unless the file was prelinked
/// after linking). The semaphore is moved by the same amount (libbpf leaves it;
/// prelink moved it as it moved the code, and for a file never prelinked both
/// agree). The moved link-time addresses become file offsets through the
/// PT_LOAD segment whose file bytes hold them; pc must be in an executable
/// segment, the semaphore in a non-executable one.
///
/// Argument specs (one `SIZE@OPERAND` per argument, separated by blanks):
/// SIZE is 1, 2, 4 or 8, negative when signed, optionally followed by `f` for
/// a floating-point value (sys/sdt.h >= 4.3); a spec without `SIZE@` (sdt v1/v2)
/// is taken as unsigned, of the register's width or 8 bytes. OPERAND is:
///   `$N` (a constant; N decimal, 0x-hex or 0-octal, possibly negative) or
///   `$SYM[+-N]` (a symbol's runtime address);
///   `%REG` (any GPR at any width: %rax %eax %ax %al %ah ... %r8 %r8d %r8w
///   %r8b, %sil %dil %bpl %spl; %rip is the probe address; %xmmN parses but
///   cannot be evaluated: uprobe::Regs has no vector state);
///   memory `DISP(%BASE,%INDEX,SCALE)` with any part optional as in AT&T
///   syntax (`(%rsp)`, `-8(%rbp)`, `(%rax,%rbx)`, `16(,%rcx,8)`), where DISP is a
///   sum of numbers and at most one symbol (`-8`, `SYM`, `SYM+8`, `8+SYM`, as
///   gcc prints them); `SYM+N(%rip)` is the address of SYM+N (the symbol is
///   looked up in the file's symbol tables at parse time and evaluated
///   relative to the probe's runtime ip, so it works in PIE and shared
///   objects); `N(%rip)` is the probe address + N. Base and index must be
///   64-bit registers; SCALE is 1, 2, 4 or 8.
/// At most 12 arguments (sys/sdt.h's maximum).
///
/// Thread-safety: the functions that read files may be called from any
/// thread, not from a handler. ArgSpec::read() is async-signal-safe,
/// allocation-free and lock-free: call it from a handler.

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "uprobe/regs.hpp"
#include "uprobe/symbols.hpp"

namespace uprobe::usdt {

/// sys/sdt.h's maximum number of probe arguments.
inline constexpr unsigned kMaxArgs = 12;

/// A register named in an argument spec.
enum class Reg : std::uint8_t {
  none = 0,
  rax, rbx, rcx, rdx, rsi, rdi, rbp, rsp,
  r8, r9, r10, r11, r12, r13, r14, r15,
  rip,
  ah, bh, ch, dh,  ///< bits 8..15 of rax, rbx, rcx, rdx
  xmm,             ///< an SSE register (number in Arg::disp): not in uprobe::Regs, so not evaluable
};

enum class ArgKind : std::uint8_t {
  constant,  ///< `$N` / `$SYM`
  reg,       ///< `%REG`
  memory,    ///< `DISP(%BASE,%INDEX,SCALE)`
};

/// One parsed argument: 16 bytes, trivially copyable.
struct Arg {
  std::int64_t disp = 0;           ///< the constant, or the memory displacement
  ArgKind kind = ArgKind::constant;
  std::int8_t size = 8;            ///< bytes; negative: signed
  Reg base = Reg::none;            ///< the register (kind reg) or the memory base
  Reg index = Reg::none;           ///< memory index
  std::uint8_t scale = 1;          ///< memory index scale (1, 2, 4, 8)
  std::uint8_t width = 8;          ///< bytes of the register as named (kind reg): %eax 4, %al 1, %xmm0 16
  bool pc_relative = false;        ///< add the probe's runtime ip (a symbol operand: disp = SYM+N - pc)
  bool is_float = false;           ///< `Nf@`: a floating-point value (its raw bits are returned)

  unsigned bytes() const noexcept { return static_cast<unsigned>(size < 0 ? -size : size); }
  bool is_signed() const noexcept { return size < 0 && !is_float; }
};

/// How memory operands are read.
enum class MemoryAccess : std::uint8_t {
  checked,  ///< probe_read_user() (uprobe.hpp): an unmapped address gives false, never a fault (default)
  direct,   ///< a plain load: faster, but a bad address faults in the handler
};

/// The parsed arguments of one probe site: fixed size, no heap memory.
class ArgSpec {
 public:
  unsigned count() const noexcept { return count_; }
  /// Argument i (0-based; i < count()).
  const Arg& operator[](unsigned i) const noexcept { return args_[i < kMaxArgs ? i : 0]; }

  /// Evaluates argument `i` at a hit of this probe site: registers from
  /// `regs` (regs.rip must be the probe address, as in a handler), memory
  /// read per `access`; the value is sign- or zero-extended from its size to
  /// 64 bits (floats: raw bits, zero-extended). Returns false (out untouched)
  /// when i >= count(), the operand is an xmm register, or memory is unreadable.
  /// Async-signal-safe; no allocation, no lock.
  bool read(unsigned i, const Regs& regs, std::uint64_t& out,
            MemoryAccess access = MemoryAccess::checked) const noexcept;

  /// read() as a value; 0 when read() fails.
  std::uint64_t value(unsigned i, const Regs& regs, MemoryAccess access = MemoryAccess::checked) const noexcept {
    std::uint64_t v = 0;
    return read(i, regs, v, access) ? v : 0;
  }

  /// Appends an argument (parsers and tests). Returns false when full.
  bool push(const Arg& a) noexcept {
    if (count_ >= kMaxArgs) return false;
    args_[count_++] = a;
    return true;
  }

 private:
  std::array<Arg, kMaxArgs> args_{};
  std::uint8_t count_ = 0;
};

/// What the parser needs to know beyond the text.
struct ParseContext {
  /// Link-time address of the probe site (the moved note pc): symbol operands
  /// are stored relative to it.
  std::uint64_t pc = 0;
  /// Link-time address of a symbol named in an operand, or nullopt (unknown,
  /// or ambiguous). When empty, symbol operands are errors. probes() looks
  /// names up in .symtab and .dynsym; a name defined at several addresses
  /// (local symbols of different files) is refused, since a note does not say
  /// which file it came from.
  std::function<std::optional<std::uint64_t>(std::string_view)> lookup;
};

/// The outcome of parse_args().
struct ParseResult {
  ArgSpec args;            ///< the arguments parsed (all of them when ok())
  std::string error;       ///< empty on success, else e.g. "argument #2 `-4@%foo': unknown register `%foo'"
  unsigned error_arg = 0;  ///< 1-based number of the offending argument (0: none)
  bool ok() const noexcept { return error.empty(); }
};

/// Parses a note's argument string. Never throws for bad input, never loops:
/// it walks the text once, left to right (std::bad_alloc aside).
ParseResult parse_args(std::string_view text, const ParseContext& ctx = {});

/// The AT&T spelling of an argument as parsed (for messages and tools), e.g.
/// "-4@-20(%rbp)", "8@%rip+0x2f10" for a resolved symbol operand.
std::string format_arg(const Arg& a);

/// One probe site: one NT_STAPSDT note.
struct Probe {
  std::string path;      ///< canonical path of the file
  std::string provider;
  std::string name;
  std::uint64_t pc = 0;         ///< link-time address of the site (after the .stapsdt.base move)
  std::uint64_t semaphore = 0;  ///< link-time address of the semaphore (after the move), 0: none
  std::uint64_t note_pc = 0, note_base = 0, note_semaphore = 0;  ///< the note's raw fields
  std::uint64_t offset = 0;            ///< file offset of the site: register_uprobe(path, offset, c)
  std::uint64_t semaphore_offset = 0;  ///< file offset of the semaphore: the kernel's ref_ctr_offset; 0: none
  std::string args_text;               ///< the argument string as written in the note
  ArgSpec args;                        ///< parsed arguments (valid when args_error is empty)
  std::string args_error;              ///< why args_text did not parse (the site is still probeable)
  std::string error;                   ///< why the site cannot be probed (pc or semaphore outside the file's segments); offsets are 0 then

  bool has_semaphore() const noexcept { return semaphore != 0; }
  /// "provider:name".
  std::string full_name() const { return provider + ":" + name; }
};

/// Every probe site of `binary` (a path or a library name: see symbols.hpp),
/// in note order. Empty when the file has no .note.stapsdt.
/// @throws uprobe::Error: file_not_found, not_executable, conflict (as resolve_library()).
std::vector<Probe> probes(std::string_view binary, LibrarySearch search = LibrarySearch::loaded_only);

/// The sites of the probes whose provider and name match (fnmatch(3) globs;
/// plain names match exactly). A probe often has several sites (inlined or
/// repeated probe points): all are returned, in note order.
/// @throws uprobe::Error: as probes(); bad_offset when nothing matches (the
/// message lists the probes the file has) or a matching site is unusable
/// (Probe::error).
std::vector<Probe> find(std::string_view binary, std::string_view provider, std::string_view name,
                        LibrarySearch search = LibrarySearch::loaded_only);

/// find() for a `BINARY:PROVIDER:NAME` spec (bpftrace's usdt:BINARY:PROVIDER:NAME
/// without the prefix). `BINARY:NAME` is accepted when exactly one provider
/// has NAME.
std::vector<Probe> find(std::string_view spec, LibrarySearch search = LibrarySearch::loaded_only);

/// The parsed arguments of `p`.
/// @throws uprobe::Error(bad_offset) naming the site when its args did not parse.
const ArgSpec& require_args(const Probe& p);

}  // namespace uprobe::usdt
