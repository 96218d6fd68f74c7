// SPDX-License-Identifier: MIT
#pragma once
/// @file symbols.hpp
/// From what a user writes to the (file, offset) pair a probe is keyed by.
///
/// A probe target is written `BINARY:WHAT`:
///
/// | WHAT              | meaning                                                                    |
/// |-------------------|----------------------------------------------------------------------------|
/// | `SYMBOL`          | the first byte of SYMBOL (`.symtab`, then `.dynsym`)                       |
/// | `SYMBOL+OFF`      | OFF bytes into SYMBOL (OFF decimal or 0x-hex; must be < the symbol's size)  |
/// | `NAME@VER`        | the symbol version VER of NAME (hidden or default), e.g. `memcpy@GLIBC_2.14` |
/// | `NAME@@VER`       | NAME's default version, which must be VER                                  |
/// | `GLOB`            | every code symbol whose name matches (`*`, `?`, `[...]`; fnmatch(3)), aliases at one offset reported once |
/// | `0xADDR` / `ADDR` | a link-time virtual address (the st_value space, as bpftrace and perf take it) |
/// | `+OFF`            | a raw file offset (the kernel's uprobe_events `PATH:OFFSET`)               |
///
/// BINARY is a path (anything with a `/`), or a library name as users write
/// it: a file name or soname (`libc.so.6`) or a short name (`libc`, meaning
/// `libc.so` / `libc.so.*` / `libc-<digits>...so*`), or the main program's
/// file name. Names are resolved against the objects the dynamic linker loaded
/// in this process (dl_iterate_phdr: the path it found, that file's real path
/// and its DT_SONAME), so the answer is the file the program actually runs.
/// A library that is not loaded is an error unless LibrarySearch::search_path
/// is given; then the directories a dlopen() from the main program would
/// search are tried: the executable's DT_RPATH (when it has no DT_RUNPATH),
/// LD_LIBRARY_PATH (ignored in secure-execution mode), its DT_RUNPATH, the
/// directories of /etc/ld.so.conf (with its `include` globs) and the system
/// directories (/lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu, /lib64,
/// /usr/lib64, /lib, /usr/lib). /etc/ld.so.cache itself is not read; files
/// that are not x86-64 ELF (linker scripts such as libc.so) are skipped.
///
/// Errors are uprobe::Error; the message names the file, the symbol and the
/// reason: file_not_found (no such file, library not loaded or not found),
/// not_executable (not an x86-64 ELF file; the target is data, not code),
/// bad_offset (no such symbol, offset outside the symbol, address outside
/// the file's segments, malformed spec, stripped file asked for a symbol),
/// conflict (an ambiguous library name or symbol name).
///
/// GNU indirect functions (STT_GNU_IFUNC, e.g. glibc's strlen): the symbol is
/// a resolver, which runs when the dynamic linker binds the name and returns
/// the implementation calls run (__strlen_avx2, __strlen_evex, ... by CPU).
/// When the file is loaded in this process, `SYMBOL` and a glob matching it
/// resolve to that implementation, as the dynamic linker bound it (dlsym()'s
/// answer, which runs the resolver the same way), with Location::ifunc set
/// and Location::implementation naming it; probe_info() of a probe there
/// says so (ProbeInfo::ifunc). Where the file is not loaded (nothing is
/// bound yet), and for `SYMBOL+OFF`, the resolver's address is used, as the
/// kernel's uprobes, bpftrace and perf do: such a probe sees no calls.
/// find_symbol() and match_symbols() report the symbol itself (the resolver;
/// Symbol::type tells them apart).
///
/// Thread-safety: every function may be called from any thread, not from a
/// probe handler (they allocate, open files and take a lock). ELF files are
/// read once and cached per (st_dev, st_ino, size, mtime).

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace uprobe {

/// A defined symbol of an ELF file.
struct Symbol {
  std::string name;             ///< without version
  std::string version;          ///< GNU symbol version ("GLIBC_2.14"); empty when unversioned
  bool hidden_version = false;  ///< `name@VER` (not the default version); false for `@@` and unversioned
  std::uint64_t address = 0;    ///< st_value: link-time virtual address
  std::uint64_t size = 0;       ///< st_size (0: unknown, e.g. an assembly label)
  std::uint64_t offset = 0;     ///< file offset of the first byte (valid when in_file)
  bool in_file = false;         ///< the address lies in the file bytes of a PT_LOAD segment
  bool executable = false;      ///< ... of an executable PT_LOAD segment
  std::uint8_t type = 0;        ///< STT_NOTYPE, STT_OBJECT, STT_FUNC, STT_GNU_IFUNC, ...
  std::uint8_t binding = 0;     ///< STB_LOCAL, STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE
  bool dynamic = false;         ///< from .dynsym (else .symtab)

  /// `name`, `name@VER` or `name@@VER`.
  std::string full_name() const;
};

/// A resolved probe target.
struct Location {
  std::string path;                 ///< canonical path of the ELF file
  std::uint64_t offset = 0;         ///< file offset: register_uprobe(path, offset, consumer)
  std::uint64_t address = 0;        ///< the same place as a link-time virtual address
  std::string symbol;               ///< Symbol::full_name() of the symbol used; empty for ADDR / +OFF
  std::uint64_t symbol_offset = 0;  ///< OFF of SYMBOL+OFF
  /// SYMBOL is a GNU indirect function (STT_GNU_IFUNC; see above).
  bool ifunc = false;
  /// With ifunc: path/offset/address are the implementation the dynamic
  /// linker bound SYMBOL to in this process (else they are the resolver's).
  bool ifunc_bound = false;
  /// With ifunc: the file offset of the resolver (SYMBOL's st_value) in the
  /// file that defines SYMBOL.
  std::uint64_t ifunc_resolver = 0;
  /// With ifunc_bound: the code symbol that starts at the implementation
  /// (symbol_at(), e.g. "__strlen_avx2"); empty when it has none.
  std::string implementation;
};

/// How library names that are not loaded are handled.
enum class LibrarySearch : std::uint8_t {
  loaded_only,  ///< only objects loaded in this process (default)
  search_path,  ///< loaded objects first, then the dynamic linker's default search path
};

/// An object the dynamic linker has loaded into this process.
struct LoadedObject {
  std::string name;         ///< as the dynamic linker recorded it (link_map l_name); "" for the main program
  std::string path;         ///< canonical path of the file
  std::uintptr_t base = 0;  ///< load bias: runtime address = base + link-time address
  dev_t dev = 0;
  ino_t ino = 0;
};

/// The file-backed objects loaded now (main program first; the vDSO is left out).
std::vector<LoadedObject> loaded_objects();

/// Resolves BINARY as described above to a canonical path.
/// @throws Error: file_not_found, conflict (several loaded objects match).
std::string resolve_library(std::string_view name, LibrarySearch search = LibrarySearch::loaded_only);

/// Every defined symbol of `path` (.symtab entries, then .dynsym entries; a
/// function usually appears in both). Empty for a stripped file without
/// .dynsym. SHN_ABS, section, file and TLS symbols are left out.
/// @throws Error: file_not_found, not_executable.
std::vector<Symbol> read_symbols(const std::string& path);

/// Looks up one symbol by `NAME`, `NAME@VER` or `NAME@@VER` (any type). When
/// NAME alone matches several places: the default / unversioned definition
/// wins over hidden versions, then global and weak over local symbols; if
/// places still differ the request is ambiguous.
/// @throws Error: bad_offset (not found, or the file has no symbol table),
/// conflict (ambiguous).
Symbol find_symbol(const std::string& path, std::string_view name);

/// The code symbols (executable segment; FUNC, IFUNC or NOTYPE) whose names
/// match the fnmatch(3) pattern `glob` (matched against `name`, or against
/// full_name() when the pattern contains '@'), one per file offset (the
/// preferred alias: global over weak over local, default version, then the
/// shortest name), sorted by offset. Empty when nothing matches.
std::vector<Symbol> match_symbols(const std::string& path, std::string_view glob);

/// The tightest sized code symbol holding file offset `offset` (or a size-0
/// one starting exactly there), if any.
std::optional<Symbol> symbol_at(const std::string& path, std::uint64_t offset);

/// Link-time virtual address -> file offset through the PT_LOAD segment whose
/// file bytes hold it.
/// @throws Error(bad_offset) when no segment's file bytes hold it (e.g. .bss).
std::uint64_t address_to_offset(const std::string& path, std::uint64_t address);

/// File offset -> link-time virtual address (inverse of address_to_offset).
/// @throws Error(bad_offset) when no PT_LOAD segment maps that offset.
std::uint64_t offset_to_address(const std::string& path, std::uint64_t offset);

/// Resolves `SYMBOL[+OFF]` (or NAME@VER forms) in `path` to a code location;
/// an IFUNC's implementation as described above.
/// @throws Error: bad_offset, conflict, not_executable (not code).
Location resolve_symbol(const std::string& path, std::string_view symbol, std::uint64_t offset = 0);

/// Resolves a full `BINARY:WHAT` spec (table above). One Location, except for
/// a glob, which gives one per matching code address (at least one); an
/// IFUNC it matches gives its implementation, which then stands for the
/// implementation's own symbol if the glob matches that too (several IFUNCs
/// bound to one implementation, e.g. memcpy and memmove, give one each).
/// @throws Error as resolve_library() and resolve_symbol().
std::vector<Location> resolve_location(std::string_view spec,
                                       LibrarySearch search = LibrarySearch::loaded_only);

/// Where file offset `offset` of `path` is in this process now: for every
/// loaded object that is that file (same st_dev/st_ino), the load bias plus
/// the link-time address of the offset. Works for code and data (e.g. a USDT
/// semaphore). Empty when the file is not loaded.
std::vector<std::uintptr_t> runtime_addresses(const std::string& path, std::uint64_t offset);

/// Writes the ELF tables this process has read (every file whose symbols,
/// function bounds, USDT notes, ... a resolution or registration here has
/// read, and the function bounds of their build-id debug files) to a new
/// file `path`, for import_elf_tables() in another process of this machine
/// that will resolve and probe the same files: uprobe-trace's CLI reads
/// libc's tables to check the specs while the program starts, and hands them
/// to its agent, whose attach then reads no file's tables (on a 2-vCPU VM,
/// ~3-4 ms less of a traced program's start). Written as `path`.tmp
/// (created, mode 0600; it must not exist), then renamed to `path`: a reader
/// sees the whole file or none. Returns the number of files written. With
/// `settled_only`, only files (and their debug files) unchanged for the last
/// 3 seconds: for tables kept long (uprobe-trace keeps them between runs), a
/// file rewritten within its filesystem's timestamp resolution of being read
/// could keep the identity it was read with. The file ends with a hash of
/// its bytes (import_elf_tables() takes nothing from a damaged one).
/// Thread-safety: any thread. Not async-signal-safe.
/// @throws Error(system) when the file cannot be created or written (nothing
/// is left behind).
std::size_t export_elf_tables(const std::string& path, bool settled_only = false);

/// export_elf_tables() of only the files among `files` (paths, compared by
/// device and inode; a path that cannot be stat()ed names none; empty: every
/// file): what the process that imports them will resolve and probe, not
/// what this one read besides (uprobe-trace's CLI: the files its specs
/// name). Same thread-safety and errors.
std::size_t export_elf_tables(const std::string& path, bool settled_only, const std::vector<std::string>& files);

/// Reads a file export_elf_tables() wrote and gives this process's
/// resolutions and registrations the tables of each file it holds that is
/// the file it was read from -- the same device, inode, size, modification
/// and status-change times now (what libuprobe's own cache of tables is
/// keyed by), beside the same debug file found by its build-id (the same
/// identity, or still none) -- as if read here. (uprobe-trace also keeps
/// these files between runs.) A file changed since, or whose tables this
/// process has read already, is skipped. A file that is missing, not a
/// regular file (never waited on: a FIFO), of another format version,
/// truncated, damaged (its hash) or malformed anywhere gives nothing at all.
/// Returns the number of files whose tables were taken. Never throws.
/// Thread-safety: any thread. Not async-signal-safe.
std::size_t import_elf_tables(const std::string& path) noexcept;

/// How many ELF tables this process holds (read or imported; a file read at
/// two depths -- its own tables, then with its debug file's symbols --
/// counts twice): a count that grows when a resolution or registration had
/// to read a file (uprobe-trace's CLI keeps its tables again then).
/// Thread-safety: any thread. Not async-signal-safe. Never throws.
std::size_t elf_tables_held() noexcept;

/// libuprobe.so loads elfutils (libelf.so.1, libdw.so.1, and what they need:
/// libz, liblzma, libbz2) as it starts -- its initializer, a dlopen() of
/// each, not DT_NEEDED entries -- so that a request refused later maps no new
/// code into the process. Called before that initializer runs (from the
/// initializer of an object that runs first: DF_1_INITFIRST, as
/// uprobe-trace's agent, which imports ELF tables and may read no file at
/// all), they are loaded when a file is first read as ELF instead (~0.3 ms
/// of a process's start on a 2-vCPU VM where none is read); the first
/// request that reads one, refused or not, then maps them. Later calls
/// change nothing; libuprobe.a links elfutils and ignores it. (Like the
/// kernel's uprobes, which read no ELF: nothing of theirs to mirror.)
/// Thread-safety: any thread. Async-signal-safe (one atomic store).
/// Never throws.
void defer_elfutils() noexcept;

}  // namespace uprobe
