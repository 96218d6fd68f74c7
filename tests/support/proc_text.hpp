// SPDX-License-Identifier: MIT
#pragma once
/// @file proc_text.hpp
/// Test support without GoogleTest (used by the stress binaries and the gtest
/// suites alike): this process's /proc/self/maps, the mappings that are
/// writable and executable at once, and a byte-for-byte comparison of
/// executable mappings with the files they map ("every code byte equals the
/// file's byte" after a run). Not async-signal-safe (allocates, reads files).

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace uprobe_test {

/// One line of /proc/self/maps.
struct MapLine {
  std::uintptr_t start = 0, end = 0;
  std::string perms;         ///< "r-xp" etc.
  std::uint64_t offset = 0;  ///< pgoff: file offset of `start`
  dev_t dev = 0;             ///< device of the file (makedev of the maps line's major:minor)
  ino_t ino = 0;             ///< inode of the file; 0 for anonymous memory
  std::string path;          ///< as the kernel prints it (may end in " (deleted)", or be "[vdso]" etc.)
  std::string line;          ///< the whole line
  bool copied = false;       ///< holds pages libuprobe copied out of the file (read_maps())

  bool executable() const { return perms.size() > 2 && perms[2] == 'x'; }
  bool writable() const { return perms.size() > 1 && perms[1] == 'w'; }
};

/// The current mappings of this process, in address order, with the pages
/// libuprobe copied out of their files (Config::detach_patched_pages: the
/// kernel shows each as an anonymous private mapping, "00:00 0", between
/// pieces of the file's mapping) shown as the file's again (as_files()).
std::vector<MapLine> read_maps();

/// /proc/self/maps as the kernel shows it.
std::vector<MapLine> read_maps_raw();

/// `maps` (address order) with each anonymous private unnamed mapping that
/// continues a mapping of a file with the same permissions end to end (or
/// is continued by one, or lies between two of one file's mappings whose
/// offsets leave exactly its room) taken as that file's (offset continued), merged
/// with the pieces around it, `copied` set: a mapping as it was before
/// libuprobe copied some of its pages. Independent of libuprobe's own
/// table of them.
std::vector<MapLine> as_files(std::vector<MapLine> maps);

/// The lines of /proc/self/maps that are writable and executable at once.
std::vector<std::string> rwx_mappings();

/// Result of compare_text_with_files().
struct TextCheck {
  unsigned mappings = 0;           ///< executable mappings compared
  std::uint64_t bytes = 0;         ///< bytes compared
  std::uint64_t differing = 0;     ///< bytes that differ from the file
  std::vector<std::string> diffs;  ///< the first differences ("path+0xOFF (addr): mem XX, file YY")
  std::vector<std::string> paths;  ///< the files compared, one per mapping
};

/// Compares every byte of each executable, file-backed mapping that `want`
/// accepts (all when empty) with the bytes of the file at the mapping's
/// offset, up to the end of the file. Mappings whose path does not name the
/// mapped file any more (deleted, memfd, another inode) are skipped.
/// At most `max_diffs` differences are described.
TextCheck compare_text_with_files(const std::function<bool(const MapLine&)>& want = {}, unsigned max_diffs = 16);

/// `v` as 0x-hex.
std::string hex(std::uint64_t v);

}  // namespace uprobe_test
