// SPDX-License-Identifier: MIT
#pragma once
// Text patching: writes into this process's own read-only code pages without
// ever making a page writable and executable at once. The primary method is a
// pwrite() to /proc/self/mem (the kernel writes through its own mapping, as
// uprobe_write_opcode() does for the kernel's uprobes, breaking COW on private
// file mappings). The file is opened per operation so that a fork child never
// writes through a descriptor that still points at its parent's mm. A page
// written in a PokeSession is first detached from its file (text_pages.hpp).

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "services.hpp"

namespace uprobe::detail {

/// Takes the pages of [addr, addr + len) out of their file before libuprobe
/// writes there (text_pages.hpp: then the kernel's own uprobes cannot reach
/// them), and makes every thread's PeekCache read them again. Returns the
/// number of pages detached now. poke_text() and TextBatch::write() call it
/// inside a PokeSession (an attach or detach with the registry mutex held).
/// Allocates nothing. Registry mutex held.
std::size_t detach_text(std::uint64_t addr, std::size_t len) noexcept;

/// Writes `len` bytes at `addr`. Returns 0 or an errno value.
/// Async-signal-safe (openat, pwrite64, close: system calls made directly,
/// never through libc's wrappers, which a user may have probed). Thread-safe per address when the
/// caller serialises writers of the same bytes.
int poke_text(std::uint64_t addr, const std::uint8_t* bytes, std::size_t len) noexcept;

/// While one exists, poke_text() on the creating thread writes through one
/// /proc/self/mem descriptor instead of opening one per write (the batch API:
/// thousands of writes). Create it with the registry mutex held (fork() takes
/// that mutex, so no fork can happen while the descriptor is open). Not
/// nestable across threads; nests on one thread (the outermost owns the fd).
class PokeSession {
 public:
  PokeSession() noexcept;
  ~PokeSession();
  PokeSession(const PokeSession&) = delete;
  PokeSession& operator=(const PokeSession&) = delete;

 private:
  bool owner_ = false;
};

/// While one exists, peek_text_checked() on the creating thread reads whole
/// pages and answers later reads in the same page from its copy (a batch
/// attach reads one byte at each of thousands of sites, most sharing pages
/// with others: one system call per page instead of one per site). Every
/// poke_text() on the thread puts the bytes it wrote into the copy (or
/// empties it when the write failed), so a read never returns bytes older
/// than this thread's own last write; a write by any other thread (a
/// handler's Action::remove writes without the registry mutex) makes the
/// next read fetch the page again (a global count of text writes, bumped
/// after each). Not async-signal-safe to create; nests (the outermost owns
/// the copy).
class PeekCache {
 public:
  PeekCache() noexcept;
  ~PeekCache();
  PeekCache(const PeekCache&) = delete;
  PeekCache& operator=(const PeekCache&) = delete;

  struct Page;

 private:
  Page* owned_ = nullptr;
};

/// The text writes of one step of a batch (every breakpoint, every jump's
/// tail, every jump's first byte), made as one pwrite() per run of them in
/// a page: [first, last end) with the bytes between rewritten as memory holds
/// them (so unchanged), where the caller says that no one else writes there
/// meanwhile. A write to a text page costs a system call whatever its
/// length; attaching every libc entry makes ~3,700 writes per step in ~350
/// pages. Registry mutex held (one thread). reserve() allocates; add() and
/// write() do not (they run after breakpoints are in, where libc's malloc may
/// be probed).
class TextBatch {
 public:
  struct Write {
    std::uint64_t addr = 0;
    std::uint32_t owner = 0;  ///< the caller's index (of the probe or item it belongs to)
    std::uint8_t len = 0;
    std::uint8_t bytes[8] = {};
    int err = 0;  ///< after write(): 0 or the errno value of the write (made alone)
  };
  /// Room for `n` writes. @throws std::bad_alloc.
  void reserve(std::size_t n) {
    writes_.reserve(n);
    sorted_.reserve(n);
    order_.reserve(n);
  }
  void clear() noexcept { writes_.clear(); }
  /// Adds a write of `len` (<= 8) bytes at `addr`; false when no room was reserved.
  bool add(std::uint64_t addr, const std::uint8_t* bytes, std::size_t len, std::uint32_t owner) noexcept;
  /// Whether the bytes [lo, hi) of one page may be rewritten with their own
  /// value: no site of a probe whose patch lock the caller does not hold
  /// lies there (a handler's Action::remove restores such a site's bytes
  /// with its own lock only).
  using Joinable = bool (*)(std::uint64_t lo, std::uint64_t hi, const void* ctx);
  /// Makes the writes, sorted by address (they must not overlap): each run
  /// of them within one page that `joinable` allows as one write; a run
  /// whose write or read fails, and any other write, alone. Returns whether
  /// every write succeeded (Write::err says which did not).
  bool write(Joinable joinable, const void* ctx) noexcept;
  const std::vector<Write>& writes() const noexcept { return writes_; }

 private:
  std::vector<Write> writes_, sorted_;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> order_;
  std::uint8_t run_[4096];
};

// peek_text(addr, out, len): declared in src/hit/services.hpp (the hit path
// reads the text through it), defined in patch.cpp.

/// Reads `len` bytes at `addr` without faulting when the memory is not mapped
/// (any more): process_vm_readv(2) on this process (made directly, as
/// poke_text()'s calls are). For the writer side,
/// whose VMA snapshot may be stale by the time it reads (another thread's
/// dlclose() or munmap() runs outside the registry lock). Returns false when
/// the bytes cannot be read (nothing written to `out` then is meaningful).
/// Async-signal-safe (one system call).
bool peek_text_checked(std::uint64_t addr, std::uint8_t* out, std::size_t len) noexcept;

/// peek_text_checked() without the thread's page copy: memory as it is now.
/// Async-signal-safe (two system calls).
bool peek_text_fresh(std::uint64_t addr, std::uint8_t* out, std::size_t len) noexcept;

}  // namespace uprobe::detail
