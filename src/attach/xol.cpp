// SPDX-License-Identifier: MIT
#include "xol.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

namespace uprobe::detail {

namespace {

constexpr std::size_t kRegionSize = 64 * 1024;
constexpr std::uint64_t kReach = 1ull << 30;  // keep slots within 1 GiB of what they address
/// code_by_site_'s values: the block's address below bit 48, its size above.
constexpr std::uint64_t kAddrMask = (1ull << 48) - 1;
constexpr std::uint64_t block(std::uint64_t addr, std::size_t size) { return addr | std::uint64_t{size} << 48; }
#ifndef MFD_EXEC
constexpr unsigned kMfdExec = 0x10;
#else
constexpr unsigned kMfdExec = MFD_EXEC;
#endif

std::atomic<std::uint64_t> g_fork_gen{0};

std::uint64_t distance(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : b - a; }

/// A memfd of `size` bytes, for the caller to map and close at once (no
/// descriptor outlives the call that made it: the program sees none of ours
/// in /proc/self/fd, in its fd numbers, in its close_range() or its
/// children). -1 with errno set.
int new_memfd(std::size_t size) {
  int fd = ::memfd_create("libuprobe-xol", MFD_CLOEXEC | kMfdExec);
  if (fd < 0 && errno == EINVAL) fd = ::memfd_create("libuprobe-xol", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

/// Maps the memfd `fd` (`len` bytes) at `at` (MAP_FIXED_NOREPLACE), R-X.
/// False when the range is taken (errno EEXIST) or the mapping fails
/// otherwise (errno says why).
bool map_code_at(int fd, std::uint64_t at, std::size_t len) {
  void* p = ::mmap(reinterpret_cast<void*>(at), len, PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
  if (p == MAP_FAILED) return false;
  if (reinterpret_cast<std::uint64_t>(p) != at) {  // old kernels ignore NOREPLACE: something is mapped there
    ::munmap(p, len);
    errno = EEXIST;
    return false;
  }
  return true;
}

/// An RW view of the `len` bytes of XOL memory at `addr` (page aligned, inside
/// one region's R-X mapping), for the caller to write and unmap: mremap() with
/// old_size 0 maps the same shared pages again elsewhere (the memfd is long
/// closed), R-X as the original, then mprotect() makes the copy RW (the pages
/// were mapped from an O_RDWR memfd, so the mapping may be made writable):
/// never one view both writable and executable. MAP_FAILED with `why` set.
void* rw_alias(std::uint64_t addr, std::size_t len, std::string& why) {
  void* rw = ::mremap(reinterpret_cast<void*>(addr), 0, len, MREMAP_MAYMOVE);
  if (rw == MAP_FAILED) {
    why = std::string("mremap of XOL memory for its RW alias failed: ") + std::strerror(errno);
    return MAP_FAILED;
  }
  if (::mprotect(rw, len, PROT_READ | PROT_WRITE) != 0) {
    why = std::string("mprotect of the XOL alias failed: ") + std::strerror(errno);
    ::munmap(rw, len);
    return MAP_FAILED;
  }
  return rw;
}

}  // namespace

XolArea::Region* XolArea::region_of(std::uint64_t addr) {
  for (Region& r : regions_)
    if (addr >= r.base && addr < r.base + r.size) return &r;
  return nullptr;
}

void note_fork() noexcept { g_fork_gen.fetch_add(1, std::memory_order_relaxed); }

XolArea& xol_area() {
  static XolArea* a = new XolArea;
  return *a;
}

std::uint64_t XolArea::take(Region& r, std::size_t size) noexcept {
  for (auto& [sz, offs] : r.free)
    if (sz == size && !offs.empty()) {
      const std::uint64_t a = r.base + offs.back();
      offs.pop_back();
      r.live += size;
      return a;
    }
  if (r.used + size > r.size) return 0;
  const std::uint64_t a = r.base + r.used;
  r.used += size;
  r.live += size;
  return a;
}

void XolArea::give_back(Region& r, std::uint64_t addr, std::size_t size) {
  r.live -= size;
  if (r.live == 0) {  // nothing in use: the region starts over, unfragmented
    r.used = 0;
    r.free.clear();
    return;
  }
  const auto off = static_cast<std::uint32_t>(addr - r.base);
  for (auto& [sz, offs] : r.free)
    if (sz == size) return offs.push_back(off);
  r.free.push_back({static_cast<std::uint32_t>(size), {off}});
}

XolArea::Region* XolArea::region_near(std::uint64_t anchor, std::size_t need, const std::vector<Vma>& vmas,
                                      std::string& why) {
  auto has_room = [&](const Region& r) {
    if (r.used + need <= r.size) return true;
    for (const auto& [sz, offs] : r.free)
      if (sz == need && !offs.empty()) return true;
    return false;
  };
  for (Region& r : regions_)
    if (r.hop_used.empty() && has_room(r) && distance(r.base, anchor) < kReach &&
        distance(r.base + r.size, anchor) < kReach)
      return &r;

  // Candidate addresses: page-aligned spots in the gaps between mappings
  // (`maps` and our own regions), the closest to the anchor first.
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  auto candidates_in = [&](const std::vector<Vma>& maps) {
    std::vector<std::uint64_t> candidates;
    std::uint64_t prev_end = 0x10000;
    auto consider_gap = [&](std::uint64_t lo, std::uint64_t hi) {
      lo = (lo + page - 1) & ~(page - 1);
      if (hi < lo + kRegionSize) return;
      std::uint64_t best = anchor < lo ? lo : (anchor + kRegionSize > hi ? hi - kRegionSize : anchor & ~(page - 1));
      if (distance(best, anchor) < kReach && distance(best + kRegionSize, anchor) < kReach) candidates.push_back(best);
    };
    std::vector<std::pair<std::uint64_t, std::uint64_t>> taken;
    taken.reserve(maps.size() + regions_.size());
    for (const Vma& v : maps) taken.emplace_back(v.start, v.end);
    for (const Region& r : regions_) taken.emplace_back(r.base, r.base + r.size);
    std::sort(taken.begin(), taken.end());
    for (const auto& [start, end] : taken) {
      if (start > prev_end) consider_gap(prev_end, start);
      if (end > prev_end) prev_end = end;
    }
    consider_gap(prev_end, 0x7ffffffff000ull);
    std::sort(candidates.begin(), candidates.end(),
              [&](std::uint64_t a, std::uint64_t b) { return distance(a, anchor) < distance(b, anchor); });
    return candidates;
  };

  int fd = new_memfd(kRegionSize);
  if (fd < 0) {
    why = std::string("memfd_create for the XOL area failed: ") + std::strerror(errno);
    return nullptr;
  }
  auto map_first = [&](const std::vector<std::uint64_t>& candidates, const std::vector<std::uint64_t>& tried) {
    for (std::uint64_t at : candidates) {
      if (std::find(tried.begin(), tried.end(), at) != tried.end() || !map_code_at(fd, at, kRegionSize)) continue;
      ::close(fd);  // the mapping keeps the pages; an alias comes from it (rw_alias())
      regions_.push_back(
          Region{at, kRegionSize, 0, ::getpid(), g_fork_gen.load(std::memory_order_relaxed), {}, 0, {}});
      return &regions_.back();
    }
    return static_cast<Region*>(nullptr);
  };
  // The caller's snapshot first: a gap it shows that something mapped since
  // is refused by the kernel (map_code_at(): MAP_FIXED_NOREPLACE), never
  // taken over. Only when none of its gaps could be mapped (the snapshot may
  // be older than the last mmap: refresh_vmas() reuses one while the file
  // mappings are unchanged, and a batch places all its slots against one)
  // the gaps of a fresh read of the address space (a new region is rare:
  // one per 2048 slots; the first attach of a process read the maps just
  // before, ~0.1 ms a read).
  const std::vector<std::uint64_t> first = candidates_in(vmas);
  if (Region* r = map_first(first, {})) return r;
  std::vector<Vma> fresh;
  try {
    fresh = read_proc_maps();
  } catch (const std::exception&) {
    fresh = vmas;
  }
  if (Region* r = map_first(candidates_in(fresh), first)) return r;
  ::close(fd);
  why = "no free address range for an XOL area within 1 GiB of 0x" + [&] {
    char b[32];
    std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(anchor));
    return std::string(b);
  }();
  return nullptr;
}

bool XolArea::privatize(Region& r, std::string& why) {
  // A fork child shares the parent's memfd pages; give it its own copy before
  // its first write so that neither process changes the other's slots.
  int fd = new_memfd(r.size);
  if (fd < 0) {
    why = std::string("memfd_create failed: ") + std::strerror(errno);
    return false;
  }
  void* rw = ::mmap(nullptr, r.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (rw == MAP_FAILED) {
    why = std::string("mmap of the XOL alias failed: ") + std::strerror(errno);
    ::close(fd);
    return false;
  }
  std::memcpy(rw, reinterpret_cast<const void*>(r.base), r.size);
  ::munmap(rw, r.size);
  void* p = ::mmap(reinterpret_cast<void*>(r.base), r.size, PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the pages
  if (p == MAP_FAILED) {
    why = std::string("remapping the XOL area failed: ") + std::strerror(err);
    return false;
  }
  r.owner = ::getpid();
  r.fork_gen = g_fork_gen.load(std::memory_order_relaxed);
  return true;
}

bool XolArea::write(Region& r, std::uint64_t addr, const std::uint8_t* bytes, std::size_t len, std::string& why) {
  const pid_t pid = batch_ ? batch_pid_ : ::getpid();  // a batch runs in one process: asked once
  if ((r.owner != pid || r.fork_gen != g_fork_gen.load(std::memory_order_relaxed)) && !privatize(r, why))
    return false;
  if (batch_) {
    // Through the region's alias, kept for the batch. Filling many sites
    // (populate_), it is mapped with all its pages at once (one system call
    // rather than a fault per page) and compared there too (a read through
    // the R-X mapping would fault in pages no thread may ever run).
    if (!populate_ && std::memcmp(reinterpret_cast<const void*>(addr), bytes, len) == 0) return true;
    auto it = std::find_if(aliases_.begin(), aliases_.end(), [&](const Alias& a) { return a.base == r.base; });
    if (it == aliases_.end()) {
      void* rw = rw_alias(r.base, r.size, why);
      if (rw == MAP_FAILED) return false;
#ifdef MADV_POPULATE_WRITE
      if (populate_) (void)::madvise(rw, r.size, MADV_POPULATE_WRITE);  // (a hint: faults do the same)
#endif
      it = aliases_.insert(aliases_.end(), Alias{r.base, rw});
    }
    std::uint8_t* to = static_cast<std::uint8_t*>(it->rw) + (addr - r.base);
    if (!populate_ || std::memcmp(to, bytes, len) != 0) std::memcpy(to, bytes, len);
    return true;
  }
  if (std::memcmp(reinterpret_cast<const void*>(addr), bytes, len) == 0) return true;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::uint64_t off = addr - r.base;
  std::uint64_t page_off = off & ~(page - 1);
  std::size_t map_len = static_cast<std::size_t>(((off + len + page - 1) & ~(page - 1)) - page_off);
  void* rw = rw_alias(r.base + page_off, map_len, why);
  if (rw == MAP_FAILED) return false;
  std::memcpy(static_cast<std::uint8_t*>(rw) + (off - page_off), bytes, len);
  ::munmap(rw, map_len);
  return true;
}

std::uint64_t XolArea::slot_for(std::uint64_t site, const arch::Insn& insn, const std::vector<Vma>& vmas,
                                std::string& why) {
  std::uint64_t slot = 0;
  std::uint8_t code[arch::kXolSlotSize];
  auto it = by_site_.find(site);
  if (it == by_site_.end() && unretire(site, true)) it = by_site_.find(site);
  if (it != by_site_.end()) {
    slot = it->second;
    std::size_t n = arch::build_xol(insn, site, slot, code, why);
    if (n != 0) {
      Region* r = region_of(slot);
      return r && write(*r, slot, code, n, why) ? slot : 0;
    }
    // The same address now holds an instruction this slot cannot reach:
    // fall through to a new slot (the old one keeps its old content).
    why.clear();
  }
  std::uint64_t anchor = insn.rip_relative ? arch::rip_target(insn, site) : site;
  Region* r = region_near(anchor, arch::kXolSlotSize, vmas, why);
  if (!r) return 0;
  slot = take(*r, arch::kXolSlotSize);
  std::size_t n = arch::build_xol(insn, site, slot, code, why);
  if (n == 0 || !write(*r, slot, code, n, why)) {
    give_back(*r, slot, arch::kXolSlotSize);  // never run: free at once
    return 0;
  }
  by_site_[site] = slot;
  return slot;
}

void XolArea::end_batch() noexcept {
  for (const Alias& a : aliases_) {
    const Region* r = region_of(a.base);
    ::munmap(a.rw, r ? r->size : kRegionSize);
  }
  aliases_.clear();
  batch_ = populate_ = false;
}

std::uint64_t XolArea::window_slot_for(std::uint64_t site, const arch::EntryWindow& window,
                                       const std::vector<Vma>& vmas, std::string& why) {
  // Keyed apart from the stubs (user addresses never have bit 63 set); the
  // block must be in reach of the site itself, not of the key.
  std::uint64_t slot = code_near(site, arch::kWindowSlotSize, vmas, why, site | (1ull << 63));
  if (!slot) return 0;
  std::uint8_t code[arch::kWindowSlotSize];
  std::size_t n = arch::build_window_xol(window, site, slot, code, why);
  if (n == 0 || !write_code(slot, code, n, why)) return 0;
  return slot;
}

std::uint64_t XolArea::hop_in(std::uint64_t site, std::uint64_t lo, std::uint64_t hi, std::size_t len,
                              std::string& why, bool* taken) {
  if (taken) *taken = false;
  const std::uint64_t key = site | (3ull << 62);  // apart from stubs and window slots
  // The site's hop (or its retired one, taken back) when it lies in the
  // range asked: a padded jump (E9Patch's T1) asks for another range than the
  // unpadded one, and another instruction there now has other bytes after
  // it. One outside it is no jump's target (a site keeps its form while it
  // has one: compute_sites()): retired (again).
  std::uint64_t known = 0;
  if (auto it = code_by_site_.find(key); it != code_by_site_.end()) known = it->second & kAddrMask;
  else known = unretire(key, false);
  if (known) {
    if (known >= lo && known < hi) return known;
    const auto it = code_by_site_.find(key);
    retired_.push_back(Retired{known, static_cast<std::uint32_t>(it->second >> 48), true, site, key, false});
    code_by_site_.erase(it);
  }
  auto take = [&](Region& r, std::uint64_t a) {
    for (std::size_t i = 0; i < len; ++i) r.hop_used[a - r.base + i] = true;
    r.live += len;
    code_by_site_[key] = block(a, len);
    return a;
  };
  auto fits = [&](const Region& r, std::uint64_t a) {
    if (a < r.base || a + len > r.base + r.size) return false;
    for (std::size_t i = 0; i < len; ++i)
      if (r.hop_used[a - r.base + i]) return false;
    return true;
  };
  for (Region& r : regions_) {
    if (r.hop_used.empty() || r.base >= hi || r.base + r.size <= lo) continue;
    for (std::uint64_t a = std::max(lo, r.base); a < hi && a + len <= r.base + r.size; ++a)
      if (fits(r, a)) return take(r, a);
  }
  // A new page: the first in [lo, hi) that is free and holds [A, A + len).
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  int tries = 0, mapped = 0;
  for (std::uint64_t p = lo & ~(page - 1); p < hi && tries < 16; p += page) {
    const std::uint64_t a = std::max(lo, p);
    if (a >= hi || a + len > p + page) continue;
    ++tries;
    const int fd = new_memfd(page);
    if (fd < 0) {
      why = std::string("memfd_create for a hop page failed: ") + std::strerror(errno);
      return 0;
    }
    const bool ok = map_code_at(fd, p, page);
    const int err = errno;
    ::close(fd);  // the mapping keeps the page; an alias comes from it (rw_alias())
    if (!ok) {
      mapped += err == EEXIST;
      continue;
    }
    Region r{p, static_cast<std::size_t>(page), static_cast<std::size_t>(page), ::getpid(),
             g_fork_gen.load(std::memory_order_relaxed), {}, 0, {}};
    r.hop_used.assign(static_cast<std::size_t>(page), false);
    regions_.push_back(std::move(r));
    return take(regions_.back(), a);
  }
  if (taken) *taken = tries > 0 && mapped == tries;
  char b[96];
  std::snprintf(b, sizeof b, "no free page for the punned jump's target in [0x%llx, 0x%llx)",
                static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi));
  why = b;
  return 0;
}

std::uint64_t XolArea::hop_of(std::uint64_t site) const noexcept {
  const std::uint64_t key = site | (3ull << 62);  // (as hop_in())
  if (auto it = code_by_site_.find(key); it != code_by_site_.end()) return it->second & kAddrMask;
  const std::size_t i = find_retired(key, false);
  return i < retired_.size() ? retired_[i].addr : 0;
}

int XolArea::hop_room(std::uint64_t a, std::size_t len) const noexcept {
  for (const Region& r : regions_) {
    if (r.hop_used.empty() || a < r.base || a >= r.base + r.size) continue;
    if (a + len > r.base + r.size) return 0;
    for (std::size_t i = 0; i < len; ++i)
      if (r.hop_used[a - r.base + i]) return 0;
    return 1;
  }
  return -1;
}

bool XolArea::hop_pages_in(std::uint64_t lo, std::uint64_t hi) const noexcept {
  for (const Region& r : regions_)
    if (!r.hop_used.empty() && r.base < hi && r.base + r.size > lo) return true;
  return false;
}

void XolArea::privatize_all() noexcept {
  std::string why;
  for (Region& r : regions_) privatize(r, why);
}

std::uint64_t XolArea::code_near(std::uint64_t site, std::size_t size, const std::vector<Vma>& vmas,
                                  std::string& why, std::uint64_t key) {
  if (key == 0) key = site;
  // The block the key has (live, or retired and not yet freed) serves again
  // only within reach of `site`: a punned site's stub is near its hop, and a
  // later probe there may take another form whose hop is gigabytes away (a
  // padded jump selects another range); a jump to a block out of reach would
  // wrap its rel32. One out of reach is retired (again) as by retire_site().
  const auto in_reach = [&](std::uint64_t a, std::uint64_t n) {
    return distance(a, site) < kReach && distance(a + n, site) < kReach;
  };
  if (auto it = code_by_site_.find(key); it != code_by_site_.end()) {
    const std::uint64_t a = it->second & kAddrMask, n = it->second >> 48;
    if (in_reach(a, n)) return a;
    retired_.push_back(Retired{a, static_cast<std::uint32_t>(n), false, key & kAddrMask, key, false});
    code_by_site_.erase(it);
  } else if (const std::size_t i = find_retired(key, false);
             i < retired_.size() && in_reach(retired_[i].addr, retired_[i].size)) {
    return unretire(key, false);
  }
  size = (size + 63) & ~std::size_t{63};
  Region* r = region_near(site, size, vmas, why);
  if (!r) return 0;
  const std::uint64_t addr = take(*r, size);
  code_by_site_[key] = block(addr, size);
  return addr;
}

void XolArea::retire_site(std::uint64_t site) {
  if (auto it = by_site_.find(site); it != by_site_.end()) {
    retired_.push_back(Retired{it->second, static_cast<std::uint32_t>(arch::kXolSlotSize), false, site, site, true});
    by_site_.erase(it);
  }
  // The stub, the window slot and the hop (keys as in code_near(), window_slot_for(), hop_in()).
  const std::uint64_t keys[] = {site, site | (1ull << 63), site | (3ull << 62)};
  for (const std::uint64_t key : keys) {
    auto it = code_by_site_.find(key);
    if (it == code_by_site_.end()) continue;
    // (An evicted successor's memory is keyed by its address | kEvictKey:
    // the thread check looks for a trap at the address itself.)
    retired_.push_back(Retired{it->second & kAddrMask, static_cast<std::uint32_t>(it->second >> 48),
                               key == (site | (3ull << 62)), site & ~kEvictKey, key, false});
    code_by_site_.erase(it);
  }
}

std::size_t XolArea::find_retired(std::uint64_t key, bool xol) const noexcept {
  for (std::size_t i = retired_.size(); i-- > 0;)
    if (retired_[i].key == key && retired_[i].xol == xol) return i;
  return retired_.size();
}

std::uint64_t XolArea::unretire(std::uint64_t key, bool xol) {
  const std::size_t i = find_retired(key, xol);
  if (i == retired_.size()) return 0;
  const Retired b = retired_[i];
  if (xol) by_site_[key] = b.addr;
  else code_by_site_[key] = block(b.addr, b.size);
  retired_.erase(retired_.begin() + static_cast<std::ptrdiff_t>(i));
  return b.addr;
}

void XolArea::free_retired(std::size_t n) noexcept {
  n = std::min(n, retired_.size());
  for (std::size_t i = 0; i < n; ++i) {
    const Retired& b = retired_[i];
    Region* r = region_of(b.addr);
    if (!r) continue;
    if (!b.hop) {
      give_back(*r, b.addr, b.size);
      continue;
    }
    for (std::size_t k = 0; k < b.size; ++k) r->hop_used[b.addr - r->base + k] = false;
    r->live -= b.size;
    if (r->live != 0) continue;
    // A page of hops with none left: unmapped (its alias too, in a batch),
    // so that mappings do not grow with the number of sites ever probed.
    auto a = std::find_if(aliases_.begin(), aliases_.end(), [&](const Alias& x) { return x.base == r->base; });
    if (a != aliases_.end()) {
      ::munmap(a->rw, r->size);
      aliases_.erase(a);
    }
    ::munmap(reinterpret_cast<void*>(r->base), r->size);
    regions_.erase(regions_.begin() + (r - regions_.data()));
  }
  retired_.erase(retired_.begin(), retired_.begin() + static_cast<std::ptrdiff_t>(n));
}

bool XolArea::write_code(std::uint64_t addr, const std::uint8_t* bytes, std::size_t len, std::string& why) {
  Region* r = region_of(addr);
  if (!r) {
    why = "not XOL memory";
    return false;
  }
  return write(*r, addr, bytes, len, why);
}

}  // namespace uprobe::detail
