// SPDX-License-Identifier: MIT
#pragma once
/// @file ld_cache.hpp
/// The dynamic linker cache's path for a library name, as bpftrace names
/// libraries (its `probe` strings and -l listing). CLI only; not thread-safe
/// (ld_cache_path() memoizes).

#include <optional>
#include <string>

namespace uptrace {

/// The path bpftrace 0.17 names a library by in its `probe` strings and its
/// -l listing, for a name with no '/' that starts with "lib" (`libc`,
/// `libz`): the first 64-bit entry of the dynamic linker's cache (ldconfig
/// -p, in the cache's order) whose name starts with NAME.so, as bcc's
/// bcc_procutils_which_so() picks it (/lib/x86_64-linux-gnu/libc.so.6 on
/// Debian 12, where the path uprobe-trace resolves is /usr/lib/...). Empty
/// when none.
std::string ld_cache_path(const std::string& name);

/// The path /etc/ld.so.cache gives the first x86-64 libc6 entry whose
/// soname starts with `name` + ".so", read from the cache itself (glibc's
/// "glibc-ld.so.cache1.1" format: a header, then entries of flags, soname
/// and path offsets), in the order `ldconfig -p` prints them; nullopt when
/// the file is not in that format.
std::optional<std::string> ld_cache_lookup(const std::string& name);

}  // namespace uptrace
