// SPDX-License-Identifier: MIT
#include "patch.hpp"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace uprobe::detail {

namespace {
/// The calling thread's PokeSession descriptor, or -1.
constinit thread_local int t_session_fd = -1;
constexpr std::uint64_t kPage = 4096;
}  // namespace

struct PeekCache::Page {
  pid_t pid;
  bool valid = false;
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
  owned_->pid = ::getpid();
  t_peek = owned_;
}

PeekCache::~PeekCache() {
  if (!owned_) return;
  t_peek = nullptr;
  delete owned_;
}

PokeSession::PokeSession() noexcept {
  if (t_session_fd >= 0) return;
  t_session_fd = ::open("/proc/self/mem", O_RDWR | O_CLOEXEC);
  owner_ = t_session_fd >= 0;
}

PokeSession::~PokeSession() {
  if (!owner_) return;
  ::close(t_session_fd);
  t_session_fd = -1;
}

int poke_text(std::uint64_t addr, const std::uint8_t* bytes, std::size_t len) noexcept {
  if (t_peek) t_peek->valid = false;
  const bool session = t_session_fd >= 0;
  int fd = session ? t_session_fd : ::open("/proc/self/mem", O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = 0;
  std::size_t done = 0;
  while (done < len) {
    ssize_t n = ::pwrite(fd, bytes + done, len - done, static_cast<off_t>(addr + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (!session) ::close(fd);
  return err;
}

void peek_text(std::uint64_t addr, std::uint8_t* out, std::size_t len) noexcept {
  const volatile std::uint8_t* p = reinterpret_cast<const volatile std::uint8_t*>(addr);
  for (std::size_t i = 0; i < len; ++i) out[i] = p[i];
}

bool peek_text_checked(std::uint64_t addr, std::uint8_t* out, std::size_t len) noexcept {
  if (PeekCache::Page* c = t_peek; c && len <= kPage && (addr & ~(kPage - 1)) == ((addr + len - 1) & ~(kPage - 1))) {
    const std::uint64_t base = addr & ~(kPage - 1);
    if (!c->valid || c->base != base) {
      struct iovec local = {c->bytes, kPage};
      struct iovec remote = {reinterpret_cast<void*>(base), kPage};
      c->valid = ::process_vm_readv(c->pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(kPage);
      c->base = base;
    }
    if (c->valid) {
      std::memcpy(out, c->bytes + (addr - base), len);
      return true;
    }
  }
  struct iovec local = {out, len};
  struct iovec remote = {reinterpret_cast<void*>(addr), len};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(len);
}

}  // namespace uprobe::detail
