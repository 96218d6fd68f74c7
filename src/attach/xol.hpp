// SPDX-License-Identifier: MIT
#pragma once
// The XOL (execute out of line) area: where the relocated copy of a probed
// instruction runs, followed by a jump back (the kernel's xol_area, one page
// per mm there). Here slots are per probe site, written once at register time
// and immutable afterwards, so the trap path writes nothing: any number of
// threads, and a signal handler nested on any of them, can run one slot at
// the same time. Regions live within reach of the code they serve (rip-
// relative operands keep a disp32) and are memfd pages mapped R-X; they are
// written only through a short-lived RW alias of the same pages, never RWX.
// A slot stays assigned to its site address for the life of the process, so a
// thread preempted inside a slot never sees it change under it.

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <memory_resource>
#include <unordered_map>
#include <vector>

#include "arch.hpp"
#include "vma.hpp"

namespace uprobe::detail {

class XolArea {
 public:
  /// Returns the slot for the probe site at `site` running `insn`, writing
  /// the relocated copy into it. 0 with `why` set when no slot can reach the
  /// instruction's rip-relative target. Caller holds the registry mutex.
  std::uint64_t slot_for(std::uint64_t site, const arch::Insn& insn, const std::vector<Vma>& vmas,
                         std::string& why);

  /// Returns the window slot of the function entry at `site`: the relocated
  /// copy of `window` followed by a jump back to site + window.len (one
  /// kWindowSlotSize block per site address, kept for the life of the
  /// process). 0 with `why` set when nothing in reach. Registry mutex held.
  std::uint64_t window_slot_for(std::uint64_t site, const arch::EntryWindow& window, const std::vector<Vma>& vmas,
                                std::string& why);

  /// Reserves `size` bytes of code memory within jmp rel32 reach of `site`,
  /// once per site address (the same block is returned again for the same
  /// site, or the same `key` when given). 0 with `why` set when no memory is
  /// in reach. Registry mutex held.
  std::uint64_t code_near(std::uint64_t site, std::size_t size, const std::vector<Vma>& vmas, std::string& why,
                          std::uint64_t key = 0);

  /// Reserves the `len` bytes at some address A in [lo, hi) for a punned
  /// jump's hop (the jump that E9Patch's tactic B2 lands on, which goes on to
  /// the site's stub): in a page of hops already mapped, or in a new page
  /// mapped there (MAP_FIXED_NOREPLACE, R-X, written through an RW alias like
  /// every region). The same A again for the same `site` while it lies in
  /// [lo, hi) (a padded jump, E9Patch's T1, asks for another range than the
  /// unpadded one; a hop found for a new range becomes the site's, the old
  /// one's bytes stay taken). 0 with `why` set when every page that could
  /// hold it is taken by another mapping.
  /// Registry mutex held.
  std::uint64_t hop_in(std::uint64_t site, std::uint64_t lo, std::uint64_t hi, std::size_t len, std::string& why);

  /// In a fork child: gives the child its own copy of every region, so that
  /// neither process's later writes reach the other's slots and stubs.
  void privatize_all() noexcept;

  /// Writes code or data into XOL memory at `addr` through a transient RW
  /// alias. Registry mutex held.
  bool write_code(std::uint64_t addr, const std::uint8_t* bytes, std::size_t len, std::string& why);

  /// From begin_batch() to end_batch() (registry mutex held throughout, as
  /// for a batch registration), writes keep one RW alias per region mapped
  /// instead of mapping and unmapping one per write; end_batch() unmaps them.
  void begin_batch() noexcept {
    batch_ = true;
    batch_pid_ = ::getpid();
  }
  void end_batch() noexcept;

 private:
  struct Region {
    std::uint64_t base = 0;
    std::size_t size = 0;
    std::size_t used = 0;
    int fd = -1;
    pid_t owner = 0;
    std::uint64_t fork_gen = 0;  ///< fork_generation() when this process got its own copy
    /// A page of hops (hop_in()): bytes taken one by one, never handed out
    /// by code_near(); empty for the other regions.
    std::vector<bool> hop_used;
  };
  Region* region_near(std::uint64_t anchor, std::size_t need, const std::vector<Vma>& vmas, std::string& why);
  bool write(Region& r, std::uint64_t addr, const std::uint8_t* bytes, std::size_t len, std::string& why);
  bool privatize(Region& r, std::string& why);
  Region* region_of(std::uint64_t addr);

  /// The RW alias of a region kept by a batch (base of the region -> alias).
  struct Alias {
    std::uint64_t base;
    void* rw;
  };
  std::vector<Alias> aliases_;
  bool batch_ = false;
  pid_t batch_pid_ = 0;
  std::vector<Region> regions_;
  /// The maps' nodes come from pooled chunks, not one malloc() each: a batch
  /// of a thousand entries adds thousands of nodes, and with every entry of
  /// libc probed each malloc() may itself be a probe hit.
  std::pmr::unsynchronized_pool_resource pool_;
  std::pmr::unordered_map<std::uint64_t, std::uint64_t> by_site_{&pool_};
  std::pmr::unordered_map<std::uint64_t, std::uint64_t> code_by_site_{&pool_};
};

/// The process's XOL area.
XolArea& xol_area();

/// Counts fork()s (bumped before each fork): a region made before the last
/// fork is shared with the child, so a write first gives this process its own
/// copy (the child makes its own copy as well, in its fork handler).
void note_fork() noexcept;

}  // namespace uprobe::detail
