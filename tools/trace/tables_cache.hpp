// SPDX-License-Identifier: MIT
// uprobe-trace's CLI: the ELF tables of the probed files kept between runs
// (uprobe::export_elf_tables() files in the user's cache directory), so that
// a run's checks take them instead of reading the files again.

#pragma once

#include <string>
#include <vector>

namespace uptrace {

/// The directory the tables are kept in: $UPROBE_TRACE_CACHE_DIR when set
/// ("" turns the keeping off), else $XDG_CACHE_HOME/uprobe-trace, else
/// $HOME/.cache/uprobe-trace; made (mode 0700) when missing. "" when there
/// is none this process may use: it cannot be made, or it is not a
/// directory of this user's that no other user can write (another user's
/// file there would give the agent the symbols probes are placed by).
/// Not thread-safe against itself (the checks' thread alone calls it).
std::string tables_cache_dir();

/// The kept tables file for a run whose specs are `keys` (each spec's kind,
/// file as resolved here and what it names; order and repeats do not
/// matter), in `dir` (tables_cache_dir(); "" gives ""). Each image in it is
/// taken only while its file, and the debug file beside it, are the ones it
/// was read from (uprobe::import_elf_tables()): a file changed since is read
/// again.
std::string tables_cache_file(const std::string& dir, std::vector<std::string> keys);

/// Writes the ELF tables this process has read of `files` (those its specs
/// name: not what else it read) to `file` (a tables_cache_file()), whole or
/// not at all (written under a name of this
/// process, then renamed: runs beside each other each leave a whole file),
/// and keeps the directory to the kKeptTablesFiles most recently used files
/// (this one among them). Only files unchanged for the last seconds are
/// written (uprobe::export_elf_tables(), settled_only: a file rewritten
/// within its filesystem's timestamp resolution could keep its identity). A
/// failure only means that the next run reads the files. Never throws.
void keep_tables(const std::string& file, const std::vector<std::string>& files) noexcept;

/// Marks a kept file as used now (its modification time): the directory
/// keeps the most recently used. Never throws.
void note_tables_used(const std::string& file) noexcept;

/// How many tables files the cache directory keeps (the least recently used
/// go).
inline constexpr std::size_t kKeptTablesFiles = 32;

}  // namespace uptrace
