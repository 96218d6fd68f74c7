// SPDX-License-Identifier: MIT
#pragma once
// The one read-only model of an ELF file, for symbol, address and USDT
// resolution and for the registry's checks: its PT_LOAD segments, every
// defined symbol of .symtab and .dynsym (with GNU symbol versions), the
// .symtab of its separate debug file (found by build-id under
// /usr/lib/debug/.build-id/, e.g. Debian's libc6-dbg) when it has none of its
// own, its function bounds (FuncSym: from those symbols and from the
// .eh_frame FDEs, which stripped files keep), its .dynamic strings (SONAME,
// RPATH, RUNPATH) and its .note.stapsdt notes. Read with libelf (into
// memory, section by section, never mapped) and libdw; symbol names are
// views of the string tables libelf read, which the image keeps; cached per
// (dev, ino, size, mtime). Not used on the hit path.

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "uprobe/symbols.hpp"

namespace uprobe::detail {

struct LoadSegment {
  std::uint64_t offset = 0, vaddr = 0, filesz = 0, memsz = 0;
  std::uint32_t flags = 0;  ///< PF_R / PF_W / PF_X
  bool executable() const noexcept;
};

/// A defined symbol of an ElfImage: uprobe::Symbol's fields, with the name
/// and version as views of the string tables the image keeps (no allocation
/// per symbol: libc with its debug file has 11,000), valid while the image
/// lives.
struct ElfSymbol {
  std::string_view name;     ///< without version
  std::string_view version;  ///< GNU symbol version; empty when unversioned
  std::uint64_t address = 0, size = 0, offset = 0;
  std::uint8_t type = 0, binding = 0;
  bool hidden_version = false, in_file = false, executable = false, dynamic = false;
  /// `name`, `name@VER` or `name@@VER` (Symbol::full_name()).
  std::string full_name() const;
  /// The public form: a copy.
  Symbol to_symbol() const;
};

/// One NT_STAPSDT note, fields as written in the file.
struct StapsdtNote {
  std::uint64_t pc = 0, base = 0, semaphore = 0;
  std::string provider, name, args;
};

/// Where the bounds of a function come from, most trusted first.
enum class BoundsSource : std::uint8_t {
  symtab,     ///< a sized STT_FUNC / STT_GNU_IFUNC symbol of the file's .symtab
  dynsym,     ///< ... of its .dynsym
  debuginfo,  ///< ... of the .symtab of its separate debug file (ElfImage::debug_file)
  eh_frame,   ///< an .eh_frame FDE: [initial_location, + address_range), no name
};

/// "symtab", "dynsym", "debuginfo" or "eh_frame".
const char* bounds_source_name(BoundsSource s) noexcept;

/// The bounds of one function: where it starts in the file and how long it is.
struct FuncSym {
  /// The symbol's name, "" for an FDE (see display_name()): a view of the
  /// name of an entry of ElfImage::symbols, valid while the image lives.
  std::string_view name;
  std::uint64_t file_offset = 0;  ///< where the function starts in the file
  std::uint64_t size = 0;
  BoundsSource source = BoundsSource::symtab;
  std::uint32_t symbol_index = ~0u;  ///< the entry of ElfImage::symbols it comes from; ~0u for an FDE
  /// `name`, or "the function at file offset 0x..." for an unnamed one.
  std::string display_name() const;
};

struct ElfImage {
  ElfImage() = default;
  ElfImage(const ElfImage&) = delete;  // (funcs' names are views into symbols)
  ElfImage& operator=(const ElfImage&) = delete;
  dev_t dev = 0;
  ino_t ino = 0;
  /// This image's number, unique in the process (1, 2, ...): what caches
  /// derived from an image are keyed by (code_refs.cpp, the attach side's
  /// neighbour index), so that they never outlive the content they were
  /// made from (a file rewritten in place, a reused inode: a new image).
  std::uint64_t serial = 0;
  std::uint16_t type = 0;  ///< ET_EXEC or ET_DYN
  std::vector<LoadSegment> loads;
  std::vector<ElfSymbol> symbols;  ///< defined symbols, .symtab (or the debug file's) entries first, then .dynsym
  /// What `symbols`' names are views of: the libelf descriptors (Elf*, of
  /// the file and of its debug file) that read the string tables, kept with
  /// what they read. Read into memory (ELF_C_READ), never mapped: a file
  /// truncated meanwhile (`cp new old`) cannot raise SIGBUS here later; their
  /// file descriptors are closed (ELF_C_FDDONE).
  std::vector<std::shared_ptr<void>> elf_handles;
  /// .gnu.version_d index -> name, what dynamic symbols' versions view
  /// (node-based: never moved).
  std::unordered_map<unsigned, std::string> version_names;
  bool has_symtab = false;
  bool has_dynsym = false;
  /// The separate debug file whose .symtab was read (its build-id matches
  /// this file's), "" when none was (the file has a .symtab, or no debug
  /// file is installed, or the image was read at ImageDepth::file_tables).
  /// Its symbols are in `symbols` with dynamic = false.
  std::string debug_file;
  /// Read at ImageDepth::file_tables while a debug file for this file's
  /// build-id is installed: `symbols` and `funcs` lack its .symtab (the
  /// image at ImageDepth::with_debug_file has them). False when nothing was
  /// left out: then this image is the with_debug_file one too.
  bool debug_deferred = false;
  /// The file's build-id (lowercase hex) when it has no .symtab of its own,
  /// "" otherwise or when it has none: what its debug file is found by
  /// (debug_file_path()), for elf_tables.cpp to tell whether that file is
  /// still the one this image was read beside.
  std::string build_id;
  /// With debug_deferred: the debug file left out (its path by build-id),
  /// and the build-id (lowercase hex) it must have.
  std::string deferred_debug_file, deferred_build_id;
  /// Function bounds from every source, sorted by (file_offset, size): every
  /// sized code symbol in an executable segment, and each .eh_frame FDE whose
  /// start no such symbol covers.
  std::vector<FuncSym> funcs;
  std::vector<std::uint64_t> reach;  ///< reach[i]: the largest end (file_offset + size) of funcs[0..i]
  std::size_t fde_count = 0;         ///< FDEs read from .eh_frame (added to funcs or not)
  /// File ranges [begin, end) of the FDEs that point to an LSDA (a function
  /// with exception landing pads, where the unwinder may resume), sorted.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> lsda_ranges;
  std::string soname;
  std::vector<std::string> rpath, runpath;  ///< split at ':', unexpanded
  std::optional<std::uint64_t> stapsdt_base;  ///< sh_addr of .stapsdt.base
  bool has_stapsdt_section = false;
  std::vector<StapsdtNote> notes;
  std::size_t malformed_notes = 0;

  /// The PT_LOAD whose file bytes hold link-time address `vaddr`, or nullptr.
  const LoadSegment* segment_of_vaddr(std::uint64_t vaddr) const noexcept;
  /// The PT_LOAD whose file bytes hold file offset `off` (executable first), or nullptr.
  const LoadSegment* segment_of_offset(std::uint64_t off) const noexcept;
  /// The executable PT_LOAD whose file bytes hold file offset `off`, or nullptr.
  const LoadSegment* exec_segment(std::uint64_t off) const noexcept;
  /// The function whose bytes hold file offset `off` (the tightest when
  /// bounds nest), or nullptr: "what function contains this offset, where
  /// does it start and how long is it" for every caller.
  const FuncSym* enclosing_function(std::uint64_t off) const noexcept;
  /// Whether an FDE with an LSDA covers file offset `off`: the unwinder may
  /// resume the function at a landing pad (its address is in the LSDA, not
  /// in the code), so no window may cover bytes there past its first.
  bool has_landing_pads(std::uint64_t off) const noexcept;
};

/// How a symbol's binding ranks where aliases compete for a name: 0 global
/// (or GNU unique), 1 weak, 2 local. Pure.
int binding_rank(const ElfSymbol& s) noexcept;

/// For each of `offsets` (sorted, unique), the code symbol of `img` that
/// symbol_at() (symbols.hpp) reports there: the tightest sized one holding
/// the offset (or an unsized one at it), the preferred alias among equals;
/// nullptr where none. One pass over the symbols for all the offsets. Pure.
std::vector<const ElfSymbol*> symbols_at(const ElfImage& img, const std::vector<std::uint64_t>& offsets);

/// How much of a file's symbols an image holds.
enum class ImageDepth : std::uint8_t {
  /// The file's own .symtab and .dynsym (and FDEs, notes, ...): what a
  /// machine without the file's debug file knows. Reading the debug file's
  /// .symtab is most of the cost of an image of a stripped library whose
  /// debug file is installed (Debian's libc with libc6-dbg: 10,000 symbols,
  /// ~1 ms and ~300 page faults in a fresh process), which resolving an
  /// exported function and checking a site in it do not need
  /// (symbols.cpp, validate.cpp say where each asks for which).
  file_tables,
  /// Also the .symtab of the file's separate debug file, when it has no
  /// .symtab of its own and one is installed.
  with_debug_file,
};

/// For an image that left its debug file out (ElfImage::debug_deferred):
/// whether that file's symbols would change what enclosing_function(off)
/// answers, `fn` (a function symbol of the file's own tables): a function
/// symbol of the debug file holds `off` with tighter bounds, or with other
/// bounds of the same length (a local function inside an exported one, a
/// shorter alias at its start). Read from the debug file's .symtab directly,
/// its function bounds kept per image (no ElfImage: ~0.1 ms for libc's,
/// against ~0.55 ms for the image with them). True when the debug file
/// cannot be read as the one of this build-id (the caller then reads the
/// image with it, which says what can be said). Thread-safety: any thread
/// (internal mutex). Not async-signal-safe.
bool debug_file_refines(const ElfImage& img, const FuncSym& fn, std::uint64_t off);

/// Reads the function bounds of `img`'s deferred debug file now, as
/// debug_file_refines() would at its first call (for export_elf_tables():
/// the importer then reads no debug file). Nothing when none is deferred.
/// Thread-safety: any thread (internal mutex).
void read_debug_bounds_of(const ElfImage& img);

/// The function bounds of `img`'s deferred debug file that
/// debug_file_refines() has read (`ok`: whether it could), copied to
/// `funcs`; false when it has read none for this image. For
/// elf_tables.cpp's export. Thread-safety: any thread (internal mutex).
bool cached_debug_bounds(const ElfImage& img, bool& ok, std::vector<std::pair<std::uint64_t, std::uint64_t>>& funcs);

/// Gives debug_file_refines() the bounds of `img`'s deferred debug file
/// read elsewhere (elf_tables.cpp's import), as if it had read them (kept
/// unless it has some for this image already). Thread-safety: any thread.
void adopt_debug_bounds(const ElfImage& img, bool ok, std::vector<std::pair<std::uint64_t, std::uint64_t>> funcs);

/// Reads (or returns the cached) image of `path`. Cached per file identity:
/// device, inode, size, modification and status-change times (the ctime
/// changes with every write and cannot be set back: a file rewritten in
/// place with its size and mtime kept, `cp -p` or `rsync --inplace -t`, or a
/// new file on a reused inode, is read again).
/// @throws uprobe::Error: file_not_found (cannot open/stat), not_executable
/// (not a 64-bit x86-64 ET_EXEC/ET_DYN ELF file).
/// At ImageDepth::file_tables, the with_debug_file image when that one is
/// cached already (it answers everything the other does).
/// Thread-safety: any thread (internal mutex).
std::shared_ptr<const ElfImage> load_elf_image(const std::string& path,
                                               ImageDepth depth = ImageDepth::with_debug_file);

/// The same for a file already open as `fd` (not closed), with `st` its
/// fstat(): the same cache.
/// @throws uprobe::Error: not_executable (as above).
std::shared_ptr<const ElfImage> load_elf_image(int fd, const std::string& path, const struct stat& st,
                                               ImageDepth depth = ImageDepth::with_debug_file);

/// What the image cache tells files apart by: device, inode, size,
/// modification and status-change times (load_elf_image()).
struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  long mtime_sec = 0, mtime_nsec = 0, ctime_sec = 0, ctime_nsec = 0;
  static FileIdentity of(const struct stat& st) noexcept;
  bool operator==(const FileIdentity&) const = default;
};

/// One image of the cache (elf_tables.cpp exports them): the file it was
/// read from (identity, the path it was read by) and the depths it answers
/// for (bit 1 << ImageDepth).
struct CachedImage {
  FileIdentity id;
  std::string path;
  unsigned depths = 0;
  std::shared_ptr<const ElfImage> image;
};

/// Every image in this process's cache, each once. Thread-safety: any
/// thread (the cache's mutex).
std::vector<CachedImage> cached_images();

/// Puts `img` (built elsewhere: elf_tables.cpp's import) in the cache as the
/// image of the file `id` at the depths `depths` (bit 1 << ImageDepth),
/// giving it this process's next serial, dev and ino. False, and nothing
/// changes, when the cache has an image for one of them already.
/// Thread-safety: any thread (the cache's mutex).
bool adopt_image(const FileIdentity& id, const std::string& path, unsigned depths, std::shared_ptr<ElfImage> img);

/// Whether elfutils (libelf and libdw) can be called: libuprobe.so's
/// elfutils_lazy.cpp loads them (its definition wins over the weak one in
/// elf_image.cpp, which says true: libuprobe.a and uprobe-trace's command
/// line link them); false with `why` (which file, dlerror()'s words) when
/// one cannot be loaded -- a missing libdw must not leave the reads with no
/// .eh_frame bounds and no build-id, which would take a mid-instruction
/// offset for an instruction start. Tried again at each call until it
/// succeeds (a process out of descriptors now may load them later).
/// Thread-safe.
bool elfutils_available(std::string& why) noexcept;

/// elfutils_available(), then libelf's elf_version(EV_CURRENT): what every
/// elf_begin() here needs first (an image taken from another process,
/// import_elf_tables(), is in the cache before any file was read here).
/// False, with `why`, when either fails; true from the first success on.
/// Thread-safe.
bool libelf_ready(std::string& why) noexcept;

/// Whether uprobe::defer_elfutils() left elfutils to the first ELF read and
/// no read has loaded it yet (libelf_ready() has not succeeded). Thread-safe;
/// async-signal-safe.
bool elfutils_load_pending() noexcept;

/// Loads elfutils now (libelf_ready()) when elfutils_load_pending(): for a
/// thread about to take the registry mutex, under which that load (a
/// dlopen()) must not happen while another thread may hold the dynamic
/// linker's lock (attach/runtime.hpp, lock_registry()). A failure is left to
/// the read to report. Thread-safe; not async-signal-safe.
void prepare_elf_reads() noexcept;

/// Set by uprobe::defer_elfutils(): libuprobe.so's initializer then leaves
/// elfutils to the first ELF read (elfutils_lazy.cpp).
extern std::atomic<bool> g_elfutils_deferred;

/// "0x1234".
std::string hex_str(std::uint64_t v);

}  // namespace uprobe::detail
