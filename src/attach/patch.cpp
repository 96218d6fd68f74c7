// SPDX-License-Identifier: MIT
#include "patch.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include "bytes.hpp"
#include "raw_syscall.hpp"
#include "text_pages.hpp"

namespace uprobe::detail {

namespace {
/// The calling thread's PokeSession descriptor, or -1.
constinit thread_local int t_session_fd = -1;
constexpr std::uint64_t kPage = 4096;

/// Counts completed text writes by every thread (bumped after each write,
/// from a handler's Action::remove too, which writes without the registry
/// mutex): a page copy taken at an older count may be stale.
std::atomic<std::uint64_t> g_text_writes{0};

// The patch path's system calls, never through libc's wrappers (a user may
// have probed them: see raw_syscall.hpp). Each returns what its libc
// namesake returns, with errno set on failure.
long set_errno(long r) noexcept {
  if (r < 0 && r > -4096) {
    errno = static_cast<int>(-r);
    return -1;
  }
  return r;
}
int sys_open_mem() noexcept {
  return static_cast<int>(set_errno(arch::raw_syscall(SYS_openat, AT_FDCWD, reinterpret_cast<long>("/proc/self/mem"),
                                                      O_RDWR | O_CLOEXEC)));
}
void sys_close(int fd) noexcept { arch::raw_syscall(SYS_close, fd); }
ssize_t sys_pwrite(int fd, const void* buf, std::size_t len, std::uint64_t off) noexcept {
  return set_errno(arch::raw_syscall(SYS_pwrite64, fd, reinterpret_cast<long>(buf), static_cast<long>(len),
                                     static_cast<long>(off)));
}
pid_t sys_getpid() noexcept { return static_cast<pid_t>(arch::raw_syscall(SYS_getpid)); }
/// process_vm_readv(2) of one range of this process.
bool read_self(pid_t pid, void* out, std::uint64_t addr, std::size_t len) noexcept {
  struct iovec local = {out, len};
  struct iovec remote = {reinterpret_cast<void*>(addr), len};
  return arch::raw_syscall(SYS_process_vm_readv, pid, reinterpret_cast<long>(&local), 1,
                           reinterpret_cast<long>(&remote), 1, 0) == static_cast<long>(len);
}
/// A write inside a PokeSession (registry mutex held: an attach, a detach)
/// first takes the pages it writes out of their file (text_pages.hpp); a
/// page copy of this thread's may then be stale (kernel breakpoints taken
/// out). Writes outside one (a handler's Action::remove) restore bytes of
/// sites written in one, in pages detached then.
void detach_before_write(std::uint64_t addr, std::size_t len) noexcept {
  if (t_session_fd >= 0) detach_text(addr, len);
}
}  // namespace

std::size_t detach_text(std::uint64_t addr, std::size_t len) noexcept {
  const std::size_t n = detach_text_pages(addr, len);
  if (n) g_text_writes.fetch_add(1, std::memory_order_acq_rel);
  return n;
}

struct PeekCache::Page {
  pid_t pid;
  bool valid = false;
  std::uint64_t gen = 0;  ///< g_text_writes when `bytes` last equalled memory
  std::uint64_t base = 0;
  std::uint8_t bytes[kPage];
};

namespace {
/// The calling thread's PeekCache page, or nullptr.
constinit thread_local PeekCache::Page* t_peek = nullptr;
}  // namespace

PeekCache::PeekCache() noexcept {
  if (t_peek) return;
  owned_ = new (std::nothrow) Page;
  if (!owned_) return;
  owned_->pid = sys_getpid();
  t_peek = owned_;
}

PeekCache::~PeekCache() {
  if (!owned_) return;
  t_peek = nullptr;
  delete owned_;
}

PokeSession::PokeSession() noexcept {
  if (t_session_fd >= 0) return;
  t_session_fd = sys_open_mem();
  owner_ = t_session_fd >= 0;
  if (owner_) begin_text_session();
}

PokeSession::~PokeSession() {
  if (!owner_) return;
  end_text_session();
  sys_close(t_session_fd);
  t_session_fd = -1;
}

int poke_text(std::uint64_t addr, const std::uint8_t* bytes, std::size_t len) noexcept {
  detach_before_write(addr, len);
  const bool session = t_session_fd >= 0;
  int fd = session ? t_session_fd : sys_open_mem();
  if (fd < 0) {
    if (t_peek) t_peek->valid = false;
    return errno;
  }
  int err = 0;
  std::size_t done = 0;
  while (done < len) {
    ssize_t n = sys_pwrite(fd, bytes + done, len - done, addr + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (!session) sys_close(fd);
  const std::uint64_t before = g_text_writes.fetch_add(1, std::memory_order_acq_rel);
  // The thread's page copy now holds what memory holds: the bytes written,
  // where they fall in its page, unless another thread wrote meanwhile or
  // this write failed (it may have written part).
  if (PeekCache::Page* c = t_peek; c && c->valid) {
    if (err || c->gen != before) {
      c->valid = false;
    } else {
      if (addr < c->base + kPage && addr + len > c->base) {
        const std::uint64_t from = addr > c->base ? addr : c->base;
        const std::uint64_t to = addr + len < c->base + kPage ? addr + len : c->base + kPage;
        copy_bytes(c->bytes + (from - c->base), bytes + (from - addr), to - from);
      }
      c->gen = before + 1;
    }
  }
  return err;
}

void peek_text(std::uint64_t addr, std::uint8_t* out, std::size_t len) noexcept {
  const volatile std::uint8_t* p = reinterpret_cast<const volatile std::uint8_t*>(addr);
  for (std::size_t i = 0; i < len; ++i) out[i] = p[i];
}

bool peek_text_fresh(std::uint64_t addr, std::uint8_t* out, std::size_t len) noexcept {
  return read_self(sys_getpid(), out, addr, len);
}

bool peek_text_checked(std::uint64_t addr, std::uint8_t* out, std::size_t len) noexcept {
  if (PeekCache::Page* c = t_peek; c && len <= kPage && (addr & ~(kPage - 1)) == ((addr + len - 1) & ~(kPage - 1))) {
    const std::uint64_t base = addr & ~(kPage - 1);
    const std::uint64_t gen = g_text_writes.load(std::memory_order_acquire);
    if (!c->valid || c->base != base || c->gen != gen) {
      c->valid = read_self(c->pid, c->bytes, base, kPage);
      c->base = base;
      c->gen = gen;
    }
    if (c->valid) {
      copy_bytes(out, c->bytes + (addr - base), len);  // not libc's memcpy: it may be probed
      return true;
    }
  }
  return read_self(sys_getpid(), out, addr, len);
}

bool TextBatch::add(std::uint64_t addr, const std::uint8_t* bytes, std::size_t len, std::uint32_t owner) noexcept {
  const std::size_t room = std::min({writes_.capacity(), sorted_.capacity(), order_.capacity()});  // (write() allocates nothing)
  if (writes_.size() >= room || len == 0 || len > sizeof(Write::bytes)) return false;
  Write w;
  w.addr = addr;
  w.owner = owner;
  w.len = static_cast<std::uint8_t>(len);
  copy_bytes(w.bytes, bytes, len);
  writes_.push_back(w);
  return true;
}

bool TextBatch::write(Joinable joinable, const void* ctx) noexcept {
  // By address: the (address, index) pairs sorted (cheaper to move than
  // the writes), then the writes put in that order. (std::sort allocates
  // nothing; the room was reserved.)
  if (!std::is_sorted(writes_.begin(), writes_.end(), [](const Write& a, const Write& b) { return a.addr < b.addr; })) {
    order_.clear();
    for (std::size_t i = 0; i < writes_.size(); ++i) order_.emplace_back(writes_[i].addr, static_cast<std::uint32_t>(i));
    std::sort(order_.begin(), order_.end());
    sorted_.clear();
    for (const auto& [addr, i] : order_) sorted_.push_back(writes_[i]);
    writes_.swap(sorted_);
  }
  const auto page_of = [](std::uint64_t a) { return a & ~(kPage - 1); };
  bool all = true;
  const std::size_t n = writes_.size();
  for (std::size_t i = 0; i < n;) {
    // The run: the writes after i that lie in i's page, none overlapping.
    const std::uint64_t page = page_of(writes_[i].addr);
    std::uint64_t end = writes_[i].addr + writes_[i].len;
    std::size_t j = i + 1;
    if (end <= page + kPage)
      for (; j < n && writes_[j].addr >= end && writes_[j].addr + writes_[j].len <= page + kPage; ++j)
        end = writes_[j].addr + writes_[j].len;
    const std::uint64_t lo = writes_[i].addr;
    detach_before_write(lo, end - lo);  // (before the run is read: the bytes it rewrites are the copy's)
    bool joined = false;
    if (j - i > 1 && joinable(lo, end, ctx) && peek_text_checked(lo, run_, end - lo)) {
      for (std::size_t k = i; k < j; ++k) copy_bytes(run_ + (writes_[k].addr - lo), writes_[k].bytes, writes_[k].len);
      joined = poke_text(lo, run_, end - lo) == 0;
    }
    for (std::size_t k = i; k < j; ++k) {
      Write& w = writes_[k];
      w.err = joined ? 0 : poke_text(w.addr, w.bytes, w.len);
      all = all && w.err == 0;
    }
    i = j;
  }
  return all;
}

}  // namespace uprobe::detail
