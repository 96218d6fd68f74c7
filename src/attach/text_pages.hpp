// SPDX-License-Identifier: MIT
#pragma once
// Text pages detached from their files (Config::detach_patched_pages, on by
// default). Before libuprobe writes into a page
// of a file's code for the first time, the page is replaced by an anonymous
// copy of itself (mremap(2) of the copy over it: one step, under the
// kernel's mmap lock, so no thread ever sees the page missing). The kernel's
// own uprobes reach only file-backed VMAs (kernel/events/uprobes.c:
// valid_vma(), register_for_each_vma() walks the file's i_mmap), so a
// system-wide kernel uprobe (bpftrace or perf without a pid) on a function
// this process patched no longer writes its int3 into our jump, nor its
// original byte back over our rel32 on unregister: either killed the program.
// A kernel breakpoint already in the page when it is copied is left behind
// (the file's bytes are put back there), so the copy never traps to nobody.
//
// The VMA model knows a detached page as what it was (read_proc_maps() and
// the PROCMAP_QUERY checks in vma.cpp read this table): the file, its
// offset, its protection. A page stays detached until it is unmapped (the
// kernel's uprobes then miss it for the rest of the process's life; /proc
// shows it as anonymous memory). Writer side only: registry mutex held.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace uprobe::detail {

/// One detached page: where it is and what file page it was a copy of.
struct DetachedPage {
  std::uint64_t page = 0;   ///< address, page-aligned
  std::uint64_t pgoff = 0;  ///< the file offset it maps, bytes
  dev_t dev = 0;
  ino_t ino = 0;
  std::uint8_t prot = 0;  ///< 1 read, 2 write, 4 exec (as Vma::prot)
};

/// Config::detach_patched_pages: whether detach_text_pages() copies pages.
void set_detach_patched_pages(bool on) noexcept;
bool detach_patched_pages() noexcept;

/// Detaches every page of [addr, addr + len) that is a private file mapping
/// of code (PROT_EXEC) and not detached yet. Returns the number of pages it
/// replaced (their bytes may differ from before where a kernel breakpoint
/// was taken out: a caller's copy of them is stale). A page written in
/// place once (the switch off then, or no copy possible) is never copied
/// later: its copy would leave libuprobe's own int3s out as the kernel's. A page that cannot be
/// detached (no PROCMAP_QUERY: Linux < 6.11; copies past a quarter of
/// vm.max_map_count's mappings, two each; mremap refused) stays as it is: the write then goes into
/// the file mapping, as before this existed. Allocates nothing (it runs
/// between breakpoint writes, with libc's malloc possibly probed); every
/// system call made directly. Registry mutex held; not async-signal-safe
/// (a mutex).
std::size_t detach_text_pages(std::uint64_t addr, std::size_t len) noexcept;

/// A write session (PokeSession) begins / ends: between them
/// detach_text_pages() keeps /proc/self/maps and the last file it read open
/// across pages (one open of each per session instead of per page); the end
/// closes them. Not async-signal-safe (a mutex).
void begin_text_session() noexcept;
void end_text_session() noexcept;

/// The copied pages in [lo, hi), in address order: up to `max` written to
/// `out`; returns how many there are. Not async-signal-safe (a mutex).
std::size_t copied_pages_in(std::uint64_t lo, std::uint64_t hi, std::uint64_t* out, std::size_t max) noexcept;

/// Whether `page` (page-aligned) is in the table.
bool text_page_detached(std::uint64_t page) noexcept;

/// The table, sorted by address. Allocates (not between breakpoint writes).
std::vector<DetachedPage> detached_pages();

/// Takes `page` out of the table (it is no longer an anonymous mapping of
/// ours: unmapped, or mapped again by someone else).
void forget_detached_page(std::uint64_t page) noexcept;

/// pthread_atfork's child handler (runtime.cpp): the table's mutex anew (a
/// thread the child does not have may have held it at the fork; an API call
/// from a program's own atfork handler may take it meanwhile, so it is not
/// held across the fork).
void detached_pages_after_fork_child();

}  // namespace uprobe::detail
