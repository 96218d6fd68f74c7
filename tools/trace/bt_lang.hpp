// SPDX-License-Identifier: MIT
#pragma once
/// @file bt_lang.hpp
/// bpftrace's language (0.17, the user-space subset) for uprobe-trace: the
/// CLI parses and checks a program here and compiles it into the compact
/// form the agent interprets at each hit (bt_vm.hpp). Not async-signal-safe
/// (allocates); CLI only. Errors come in bpftrace's shape:
///   stdin:LINE:COL-COLEND: ERROR: MESSAGE
///   <the source line>
///   <~~~ under the construct>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bt_vm.hpp"

namespace uptrace::bt {

/// A probe's attach point as the agent gets it.
struct AttachPoint {
  ProbeKind kind;
  std::string spec;      ///< uprobe:PATH:SYM, uretprobe:..., usdt:... (canonical spelling); BEGIN, END, interval:UNIT:N
  std::uint32_t probe;   ///< index of its probe block
};

/// A compiled program.
struct Compiled {
  std::vector<unsigned char> blob;   ///< the compact form (bt_vm.hpp)
  Program prog;                      ///< points into blob
  std::vector<AttachPoint> attach;   ///< in source order
};

/// Parses, checks and compiles `text` (`name`: "stdin" for -e, else the file's
/// path, for error messages). nullopt with `error` set (the three lines of
/// bpftrace's error shape, newline-terminated) when the program is not
/// valid or uses what uprobe-trace does not support yet.
/// With `target_exists`, each uprobe/uretprobe/usdt attach point's PATH
/// (without wildcards) is asked for, as bpftrace's semantic analysis checks
/// it: false is bpftrace's "uprobe target file 'PATH' does not exist or is
/// not executable" error at that attach point.
/// `params`: the positional parameters ($1, $2, ...; $# their count), as
/// bpftrace takes them: a number where one is used (base 0: 16, 0x10, -5),
/// a string in str($N) and in attach points, "" or 0 when not given.
using TargetExists = bool (*)(const std::string& path, const void* ctx);
std::optional<Compiled> compile(const std::string& text, const std::string& name, std::string& error,
                                TargetExists target_exists = nullptr, const void* ctx = nullptr,
                                const std::vector<std::string>& params = {});

/// True when `text` is a bare probe spec (today's `-e uprobe:libc:malloc`:
/// no action block), not a program.
bool is_bare_spec(const std::string& text);

/// One piece of a printf format, as bpftrace 0.17 splits it: a conversion is
/// what matches `%-?[0-9]*(\.[0-9]+)?` then `c`, `s`, or an optional length
/// (hh h l ll z j t) and one of `d u o x X p` (so `%i`, `%+d`, `%ls`, `%f`
/// are not conversions, and a `%` alone is text). Each conversion piece
/// carries the text before it (`text`), printed as printf would print it
/// (`%%` is `%`); the text after the last conversion is printed as it is
/// (`raw`: bpftrace prints "100%%" for `printf("100%%")`).
struct FmtPiece {
  std::string text;   ///< the text before the conversion (or the trailing text)
  std::string spec;   ///< the conversion without its length modifier ("%-5d"); "" for the trailing text
  char conv = 0;      ///< 0: trailing text; d u o x X c s p
  char len = 0;       ///< 0, 'l' (l ll z j t: 64 bits), 'h', 'H' (hh)
  std::string match;  ///< the conversion as written ("%-5lld")
};
/// Splits a printf format as bpftrace does (never fails: what is not a
/// conversion is text; `error` is unused).
bool parse_format(const std::string& fmt, std::vector<FmtPiece>& out, std::string& error);

/// The text printf prints for one event's argument bytes (`args`: per
/// FmtDesc, 8 bytes per int and kStrLen per string).
std::string format_event(const Program& p, std::uint32_t fmt, const unsigned char* args);
/// The same, appended to `out`.
void format_event(std::string& out, const Program& p, std::uint32_t fmt, const unsigned char* args);
/// time(FORMAT)'s text (bpftrace's: strftime of the local time into 64
/// bytes) for an event stamped `ts_ns` (CLOCK_MONOTONIC): the wall-clock time
/// of the hit. False (`out` unchanged) when strftime gives nothing (bpftrace
/// prints "ERROR: strftime returned 0" then).
bool format_time(std::string& out, const Program& p, std::uint32_t fmt, std::uint64_t ts_ns);

/// A user-space address resolved (the CLI's symbolizer): the symbol, the
/// offset into it, the module's path as the process mapped it.
struct UserSym {
  std::string name;
  std::uint64_t offset = 0;
  std::string module;
};
/// Resolves `addr` of the image named by `image` (bt_vm.hpp image_word()):
/// false when no symbol covers it (bpftrace then prints the address).
using Symbolizer = bool (*)(std::uint64_t image, std::uint64_t addr, UserSym& out);
/// The symbolizer format_event() and format_map() use for ustack and usym
/// (nullptr, the default: every address prints as bpftrace prints one it
/// cannot resolve).
void set_symbolizer(Symbolizer f);
/// A ustack as bpftrace 0.17 prints it: a newline, then one line per frame
/// (up to the first 0), `indent` spaces and SYM+OFF (perf: a tab, the
/// address in hex, SYM+OFF and the module in parentheses); an address no
/// symbol covers prints as 0xADDR (perf: `ADDR 0xADDR ([unknown])`).
std::string stack_text(std::uint64_t image, const std::uint64_t* frames, std::size_t n, bool perf, int indent);
/// usym(): the symbol's name, or 0xADDR.
std::string usym_text(std::uint64_t image, std::uint64_t addr);

/// One map's merged contents: encoded key words -> merged value words.
using MapData = std::map<std::vector<std::uint64_t>, std::vector<std::uint64_t>>;
/// Merges the table of map `mi` found in a thread's `area` into `into`.
void merge_table(const Program& p, std::uint32_t mi, const std::uint64_t* area, MapData& into);
/// The value a map read (`@m[k]` in an expression) gives for map `mi` and
/// encoded `key`, merged over the tables in `areas` as merge_table() merges
/// them (count/sum: the total, avg: total / count, min/max: the extreme,
/// `@m = x`: the latest store); false when no table has the key.
bool merged_read(const Program& p, std::uint32_t mi, const std::vector<std::uint64_t*>& areas,
                 const std::uint64_t* key, std::int64_t& value);
/// Every map as bpftrace prints them at exit (in name order; `maps[i]`: map i).
std::string format_maps(const Program& p, const std::vector<MapData>& maps);
/// One map as bpftrace prints it (at exit, or for print(@map)).
std::string format_map(const Program& p, std::uint32_t mi, const MapData& contents);
/// The same with `-f json`: bpftrace 0.17's one line (`{"type": "map"|"hist"|"stats", "data": {...}}`),
/// nothing for an empty map.
std::string format_map_json(const Program& p, std::uint32_t mi, const MapData& contents);
std::string format_maps_json(const Program& p, const std::vector<MapData>& maps);
/// A string as bpftrace's JSON output escapes it (`"` `\` `\n` `\r` `\t`, other bytes below 0x20 as \u00XX).
std::string json_escape(const std::string& s);

}  // namespace uptrace::bt
