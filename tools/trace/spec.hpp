// SPDX-License-Identifier: MIT
#pragma once
/// @file spec.hpp
/// uprobe-trace probe specs in bpftrace's spelling, shared by the CLI and the
/// LD_PRELOAD agent:
///   uprobe:PATH:SYM[+OFF]  (also u:)   SYM may be a glob (`str*`), an address
///                                      (0xADDR) or a raw file offset (+OFF)
///   uretprobe:PATH:SYM     (also ur:)  SYM may be a glob
///   usdt:PATH:PROVIDER:NAME (also U:)  PROVIDER and NAME may be globs;
///   usdt:PATH:NAME                     when one provider has NAME
/// PATH is a path, a library name (`libc`, `libc.so.6`) or the program's name.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace uptrace {

enum class Kind { uprobe, uretprobe, usdt };

const char* kind_name(Kind k);

struct Spec {
  Kind kind = Kind::uprobe;
  std::string text;      ///< as written
  std::string binary;    ///< PATH as written
  std::string what;      ///< SYM[+OFF] (uprobe, uretprobe); PROVIDER:NAME or NAME (usdt)
};

/// Parses one spec; on failure returns nullopt and sets `error`.
std::optional<Spec> parse_spec(std::string_view text, std::string& error);

/// True when `s` has fnmatch(3) metacharacters.
bool has_glob(std::string_view s);

/// This process's executable (/proc/self/exe), "" when unreadable.
std::string self_exe();
/// The last component of path `p` (`p` itself without a '/').
std::string base_name(const std::string& p);
/// Whether this process has the file at `path` mapped (an object of the
/// dynamic linker's, by its path or its device and inode); nullopt when the
/// file cannot be stat()ed.
std::optional<bool> loaded_here(const std::string& path);

/// The environment variables the CLI sets for the agent.
inline constexpr const char* kEnvSpecs = "UPROBE_TRACE_SPECS";          ///< specs, one per line
/// The CLI's directory: its counts file and the agent's records (unset: report to stderr).
inline constexpr const char* kEnvOut = "UPROBE_TRACE_OUT";
inline constexpr const char* kEnvFormat = "UPROBE_TRACE_FORMAT";        ///< text|json (report to stderr only)
inline constexpr const char* kEnvFollow = "UPROBE_TRACE_FOLLOW";        ///< "0": --no-follow
inline constexpr const char* kEnvOrigPreload = "UPROBE_TRACE_ORIG_PRELOAD";  ///< LD_PRELOAD before ours ("-": unset)
/// The compiled bpftrace program (bt_vm.hpp) in the CLI's directory; the specs are then "PROBE\tSPEC" lines.
inline constexpr const char* kEnvProgram = "UPROBE_TRACE_PROGRAM";
inline constexpr const char* kEnvPerThread = "UPROBE_TRACE_PER_THREAD";  ///< "1": per-thread counts (stderr report)
/// The descriptor of the start gate (launch.hpp, StartGate): the agent of the
/// process the CLI starts waits there, once it has attached, for the CLI's
/// checks of the specs; end-of-file (a refused spec) ends it before the
/// program's code runs (agent.cpp, pass_start_gate()).
inline constexpr const char* kEnvGate = "UPROBE_TRACE_GATE";
/// The file of the CLI's directory where the CLI puts the ELF tables it read
/// to check the specs (uprobe::export_elf_tables(), once the checks are
/// done); the agent takes those of unchanged files before it attaches
/// (uprobe::import_elf_tables()), or reads them itself when it is not there yet.
inline constexpr const char* kElfTablesFile = "elf-tables";
/// "1[:N:FILE]" for the process the CLI starts: the CLI's checks run while
/// it starts, and may write kElfTablesFile; FILE (absolute), when there,
/// holds the ELF tables an earlier run of the same specs kept
/// (tables_cache.hpp; SpecChecks::kept_path()), of the N files the specs
/// name. Its agent imports FILE before it attaches (when usable_tables_file()),
/// and only when it took fewer than N waits for the start gate's 't'
/// (StartGate::tables_ready(): the checks wrote kElfTablesFile) and takes
/// those (agent.cpp, wait_for_elf_tables()). That agent leaves "0[:N:FILE]"
/// for what the program execs: their agents take FILE too, and wait for
/// nothing. (One variable, whatever the cache does: a program that copies
/// its environment makes the same calls with the cache on or off.)
inline constexpr const char* kEnvTables = "UPROBE_TRACE_TABLES";

/// The largest kept tables file taken (libc's: ~0.3 MB; a glob reading a
/// large library's debug symbols: a few MB): a larger one, or anything but
/// a regular file (a symlink to a huge file), is not read: its hash would
/// hold the program's start for as long as reading it takes.
inline constexpr long long kMaxKeptTablesBytes = 64ll << 20;

/// Whether `path` is a kept tables file worth importing: a regular file
/// itself (lstat: not a symlink), of at most kMaxKeptTablesBytes.
bool usable_tables_file(const char* path) noexcept;

/// Splits on `sep`, dropping empty pieces.
std::vector<std::string> split(std::string_view s, char sep);

}  // namespace uptrace
