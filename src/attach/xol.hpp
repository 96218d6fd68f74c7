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
// No descriptor is kept (the kernel's uprobes add none to the process): the
// memfd is closed once its R-X view is mapped, and an alias is mapped from
// that view (mremap() of a shared mapping with old_size 0), so the program
// never sees one of ours, nor closes one under us (close_range()).
// A slot stays assigned to its site address until the site is retired
// (retire_site(): its probe is gone and its text restored); retired memory is
// reused only after free_retired(), which the registry calls once no thread
// can be inside (reclaim_retired() in sites.cpp), so a thread preempted
// inside a slot never sees it change under it.

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <memory_resource>
#include <unordered_map>
#include <utility>
#include <vector>

#include "arch.hpp"
#include "vma.hpp"

namespace uprobe::detail {

/// Added to an evicted successor's address (arch::EntryWindow::evict) to
/// key its trampoline apart from the memory of a probe at that address
/// (hop_in(), retire_site()): user addresses stay below bit 47.
inline constexpr std::uint64_t kEvictKey = 1ull << 60;

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
  /// site, or the same `key` when given, while it is within reach of `site`:
  /// one made for another anchor is retired and a new one taken). 0 with
  /// `why` set when no memory is in reach. Registry mutex held.
  std::uint64_t code_near(std::uint64_t site, std::size_t size, const std::vector<Vma>& vmas, std::string& why,
                          std::uint64_t key = 0);

  /// Reserves the `len` bytes at some address A in [lo, hi) for a punned
  /// jump's hop (the jump that E9Patch's tactic B2 lands on, which goes on to
  /// the site's stub): in a page of hops already mapped, or in a new page
  /// mapped there (MAP_FIXED_NOREPLACE, R-X, written through an RW alias like
  /// every region). The same A again for the same `site` while it lies in
  /// [lo, hi) (a padded jump, E9Patch's T1, asks for another range than the
  /// unpadded one); one outside is retired as by retire_site() (no jump aims
  /// at it: a site keeps its form while it has one). 0 with `why` set when
  /// every page that could hold it is taken by another mapping (then
  /// `*taken`, when given, is true: every page it tried to map was refused
  /// with EEXIST, so the caller's snapshot, if it said free, is stale).
  /// Registry mutex held.
  std::uint64_t hop_in(std::uint64_t site, std::uint64_t lo, std::uint64_t hi, std::size_t len, std::string& why,
                       bool* taken = nullptr);

  /// Whether hop_in() could give the `len` bytes at exactly `a`: 1 when a
  /// page of hops holds them and they are free, 0 when one holds `a` but
  /// not them all free, -1 when no page of hops holds `a`. Registry mutex
  /// held.
  int hop_room(std::uint64_t a, std::size_t len) const noexcept;

  /// Whether a page of hops (hop_in()) lies in [lo, hi), whose free bytes
  /// hop_in() may still give: memory that is mapped, yet not taken for a
  /// hop. Registry mutex held.
  bool hop_pages_in(std::uint64_t lo, std::uint64_t hi) const noexcept;

  /// The hop hop_in() keeps for `site` (`site` as given to hop_in()), live or
  /// retired and not yet freed: what hop_in() gives that site back when its
  /// range holds it. 0 when none. Registry mutex held.
  std::uint64_t hop_of(std::uint64_t site) const noexcept;

  /// Takes the memory of the probe site at `site` out of use: its XOL slot,
  /// window slot, stub and punned jump's hop (those it has) are no longer
  /// returned for `site` and join the retired list, in retirement order.
  /// Call only when no thread can enter them any more: the site's own bytes
  /// are back and every core serialised, and no published probe names them.
  /// Registry mutex held.
  void retire_site(std::uint64_t site);

  /// The retired blocks, oldest first (retire_site() order), each as the
  /// range [start, end) of its bytes. Registry mutex held.
  std::size_t retired_count() const noexcept { return retired_.size(); }
  std::pair<std::uint64_t, std::uint64_t> retired_range(std::size_t i) const noexcept {
    return {retired_[i].addr, retired_[i].addr + retired_[i].size};
  }
  /// The site address the i-th retired block served.
  std::uint64_t retired_site(std::size_t i) const noexcept { return retired_[i].site; }

  /// Reuses the `n` oldest retired blocks: slots and stubs go to their
  /// region's free list (a region with nothing left in use starts over
  /// empty), hop bytes are free again and a page of hops with none left is
  /// unmapped. Only once no thread can be inside any of them (the caller's
  /// proof). Registry mutex held.
  void free_retired(std::size_t n) noexcept;

  /// In a fork child: gives the child its own copy of every region, so that
  /// neither process's later writes reach the other's slots and stubs.
  void privatize_all() noexcept;

  /// Writes code or data into XOL memory at `addr` through a transient RW
  /// alias. Registry mutex held.
  bool write_code(std::uint64_t addr, const std::uint8_t* bytes, std::size_t len, std::string& why);

  /// From begin_batch() to end_batch() (registry mutex held throughout, as
  /// for a batch registration), writes keep one RW alias per region mapped
  /// instead of mapping and unmapping one per write; end_batch() unmaps them.
  /// `populate` (a batch of many sites, which fills regions): each alias is
  /// mapped with its pages populated.
  void begin_batch(bool populate = false) noexcept {
    batch_ = true;
    populate_ = populate;
    batch_pid_ = ::getpid();
  }
  void end_batch() noexcept;

 private:
  struct Region {
    std::uint64_t base = 0;
    std::size_t size = 0;
    std::size_t used = 0;
    pid_t owner = 0;
    std::uint64_t fork_gen = 0;  ///< fork_generation() when this process got its own copy
    /// A page of hops (hop_in()): bytes taken one by one, never handed out
    /// by code_near(); empty for the other regions.
    std::vector<bool> hop_used;
    /// Bytes in use: hop bytes in a page of hops, else slot and stub bytes
    /// below `used` not on a free list.
    std::size_t live = 0;
    /// Freed blocks below `used`, by size (offsets from base), for code_near()
    /// and slot_for() to reuse before they bump `used`.
    std::vector<std::pair<std::uint32_t, std::vector<std::uint32_t>>> free;
  };
  /// Takes a block of `size` bytes in `r` (a freed one first), 0 if none.
  std::uint64_t take(Region& r, std::size_t size) noexcept;
  /// Gives back a block taken by take().
  void give_back(Region& r, std::uint64_t addr, std::size_t size);
  /// A retired block: slot or stub bytes of a region, or a hop's bytes.
  struct Retired {
    std::uint64_t addr;
    std::uint32_t size;
    bool hop;
    std::uint64_t site;
    std::uint64_t key;  ///< its key in by_site_ (xol) or code_by_site_
    bool xol;
  };
  std::vector<Retired> retired_;
  /// The newest retired block of `key` (in by_site_ when `xol`, else in
  /// code_by_site_): its index, retired_.size() when none.
  std::size_t find_retired(std::uint64_t key, bool xol) const noexcept;
  /// A new probe at a site whose block (of `key`) is retired but not yet
  /// freed takes that block back, as a site kept its memory for good before
  /// blocks were reclaimed: the same stub, slot or hop again (a thread still
  /// inside it runs the same code). Its address, or 0 when none is waiting.
  std::uint64_t unretire(std::uint64_t key, bool xol);
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
  bool populate_ = false;  ///< begin_batch(true): aliases mapped with their pages
  pid_t batch_pid_ = 0;
  std::vector<Region> regions_;
  /// The maps' nodes come from pooled chunks, not one malloc() each: a batch
  /// of a thousand entries adds thousands of nodes, and with every entry of
  /// libc probed each malloc() may itself be a probe hit.
  std::pmr::unsynchronized_pool_resource pool_;
  std::pmr::unordered_map<std::uint64_t, std::uint64_t> by_site_{&pool_};
  /// key -> block: the address in the low 48 bits, its size (bytes) above.
  std::pmr::unordered_map<std::uint64_t, std::uint64_t> code_by_site_{&pool_};
};

/// The process's XOL area.
XolArea& xol_area();

/// Counts fork()s (bumped before each fork): a region made before the last
/// fork is shared with the child, so a write first gives this process its own
/// copy (the child makes its own copy as well, in its fork handler).
void note_fork() noexcept;

}  // namespace uprobe::detail
