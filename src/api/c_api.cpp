// SPDX-License-Identifier: MIT
// The C API (include/uprobe/uprobe.h) over the C++ API. Each C consumer gets
// one uprobe::Consumer adapter, shared by all its registrations and freed with
// the last one. Every entry point catches everything: no exception crosses
// the C boundary; failures become a negative errno plus a thread-local message.

#include "uprobe/uprobe.h"

#include <pthread.h>

#include <cerrno>
#include <cstddef>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "fork_fresh.hpp"
#include "fork_held_mutex.hpp"
#include "thread_object.hpp"
#include "uprobe/batch.hpp"
#include "uprobe/config.hpp"
#include "uprobe/regs.hpp"
#include "uprobe/uprobe.hpp"

#ifndef UPROBE_VERSION_STRING
#error "UPROBE_VERSION_STRING must be defined by the build"
#endif

// struct uprobe_regs is a byte-for-byte copy of uprobe::Regs.
static_assert(sizeof(uprobe_regs) == sizeof(uprobe::Regs), "uprobe_regs and uprobe::Regs differ in size");
#define UPROBE_SAME_OFFSET(f) \
  static_assert(offsetof(uprobe_regs, f) == offsetof(uprobe::Regs, f), "uprobe_regs." #f " is misplaced")
UPROBE_SAME_OFFSET(r15);
UPROBE_SAME_OFFSET(r14);
UPROBE_SAME_OFFSET(r13);
UPROBE_SAME_OFFSET(r12);
UPROBE_SAME_OFFSET(rbp);
UPROBE_SAME_OFFSET(rbx);
UPROBE_SAME_OFFSET(r11);
UPROBE_SAME_OFFSET(r10);
UPROBE_SAME_OFFSET(r9);
UPROBE_SAME_OFFSET(r8);
UPROBE_SAME_OFFSET(rax);
UPROBE_SAME_OFFSET(rcx);
UPROBE_SAME_OFFSET(rdx);
UPROBE_SAME_OFFSET(rsi);
UPROBE_SAME_OFFSET(rdi);
UPROBE_SAME_OFFSET(rip);
UPROBE_SAME_OFFSET(rflags);
UPROBE_SAME_OFFSET(rsp);
#undef UPROBE_SAME_OFFSET
static_assert(UPROBE_HANDLER_REMOVE == static_cast<int>(uprobe::Action::remove));
static_assert(UPROBE_HANDLER_IGNORE == static_cast<int>(uprobe::Action::ignore));

namespace {

/// The C++ consumer standing for one C consumer. Reads the callbacks from the
/// C struct at every hit, as the kernel does.
class Adapter final : public uprobe::Consumer {
 public:
  /// The kernel's rule: a consumer with both callbacks is a session.
  static uprobe::Callbacks callbacks_of(const uprobe_consumer* uc) noexcept {
    if (uc->handler && uc->ret_handler) return uprobe::Callbacks::entry_and_ret;
    return uc->ret_handler ? uprobe::Callbacks::ret : uprobe::Callbacks::entry;
  }

  explicit Adapter(uprobe_consumer* uc) noexcept : uprobe::Consumer(callbacks_of(uc)), uc_(uc) {}

  uprobe::Action handler(uprobe::Regs& regs) override {
    auto* h = uc_->handler;
    if (!h) return uprobe::Action::keep;
    uprobe_regs r;
    std::memcpy(&r, &regs, sizeof r);
    const int rc = h(uc_, &r, &uprobe::session_cookie());
    std::memcpy(&regs, &r, sizeof r);
    if (rc == UPROBE_HANDLER_REMOVE) return uprobe::Action::remove;
    return rc == UPROBE_HANDLER_IGNORE ? uprobe::Action::ignore : uprobe::Action::keep;
  }

  void ret_handler(uprobe::Regs& regs, std::uint64_t func) override {
    auto* h = uc_->ret_handler;
    if (!h) return;
    uprobe_regs r;
    std::memcpy(&r, &regs, sizeof r);
    h(uc_, func, &r, &uprobe::session_cookie());
    std::memcpy(&regs, &r, sizeof r);
  }

  bool filter(pid_t tid) override {
    auto* f = uc_->filter;
    return !f || f(uc_, tid);
  }

  /// Registrations plus calls in flight; guarded by State::mutex.
  unsigned refs = 0;

 private:
  uprobe_consumer* uc_;
};

/// The C consumers known to the C layer. Never destroyed: probes may still
/// fire while static destructors run.
struct State {
  uprobe::detail::ForkHeldMutex mutex;
  std::unordered_map<uprobe_consumer*, std::unique_ptr<Adapter>> adapters;
};
std::atomic<State*> g_state{nullptr};
/// The state whose mutex the prepare handler took, for the parent and child
/// handlers (glibc runs one fork's handlers at a time).
State* g_fork_held = nullptr;

/// The C layer's state. Its mutex is held across fork() (taken by the
/// prepare handler, given back in parent and child): a child forked while
/// another thread was in a C API call (acquire(), release()) would otherwise
/// find the mutex locked by a thread it does not have, and wait forever at
/// its first call; a fork from the thread that holds it (a consumer's
/// handler on a probe hit inside acquire(): malloc) leaves it as it is
/// (ForkHeldMutex). The adapters come along as they are: the child inherits
/// the registrations that point to them. (Nothing here takes the registry's
/// lock while holding this one: the handler order cannot deadlock.)
/// Made at the first call without a lock (no static's guard: one held while
/// pthread_atfork() waits for another thread's fork would leave that fork's
/// child waiting on it); the fork handlers are registered at load and do
/// nothing before (no call of ours in a traced program's forks).
State& state() { return uprobe::detail::made_once(g_state); }

void fork_prepare() {
  g_fork_held = g_state.load(std::memory_order_acquire);
  if (g_fork_held) g_fork_held->mutex.fork_prepare();
}
void fork_after() {
  if (g_fork_held) g_fork_held->mutex.fork_after();
  g_fork_held = nullptr;
}

__attribute__((constructor)) void c_api_at_load() { ::pthread_atfork(fork_prepare, fork_after, fork_after); }

/// Takes a reference on the adapter of `uc`, creating it if `create`;
/// nullptr if there is none and !create. May throw std::bad_alloc.
Adapter* acquire(uprobe_consumer* uc, bool create) {
  State& s = state();
  // (Held by this thread only inside its own fork(): a program's
  // pthread_atfork handler run after the C layer's prepare handler.)
  if (s.mutex.held_by_this_thread())
    throw uprobe::Error(uprobe::Errc::in_handler, "", 0,
                        "libuprobe: the C API cannot be used while this thread's fork() holds its lock (from a "
                        "pthread_atfork handler?): it would wait for itself");
  std::lock_guard<uprobe::detail::ForkHeldMutex> lock(s.mutex);
  auto it = s.adapters.find(uc);
  if (it == s.adapters.end()) {
    if (!create) return nullptr;
    it = s.adapters.emplace(uc, std::make_unique<Adapter>(uc)).first;
  }
  ++it->second->refs;
  return it->second.get();
}

/// Drops `n` references; frees the adapter with the last one. Only called
/// when no registration of the adapter is left in the runtime at refs == 0.
void release(uprobe_consumer* uc, Adapter* a, unsigned n) noexcept {
  State& s = state();
  std::lock_guard<uprobe::detail::ForkHeldMutex> lock(s.mutex);
  a->refs -= n;
  if (a->refs == 0) s.adapters.erase(uc);
}

// The calling thread's last error: a string, or a static message where
// allocating is not allowed (inside a handler) or failed. (A thread_object():
// a thread_local std::string's first assignment in a thread registers its
// destructor under the dynamic linker's lock.)
struct LastError {
  std::string message;
};
thread_local const char* t_static_message = nullptr;

int fail_static(int err, const char* message) noexcept {
  t_static_message = message;
  return -err;
}

int fail(int err, const std::string& message) noexcept {
  try {
    uprobe::detail::thread_object<LastError>().message = message;
    t_static_message = nullptr;
  } catch (...) {
    t_static_message = "libuprobe: out of memory while formatting an error message";
  }
  return -err;
}

int to_errno(uprobe::Errc code, bool unregistering) noexcept {
  // No default: a new Errc must get its errno here (-Wswitch, -Werror).
  switch (code) {
    case uprobe::Errc::file_not_found: return ENOENT;
    case uprobe::Errc::bad_offset: return EINVAL;
    case uprobe::Errc::not_executable: return ENOEXEC;
    case uprobe::Errc::mid_instruction: return EILSEQ;
    case uprobe::Errc::refused_instruction: return EOPNOTSUPP;
    case uprobe::Errc::not_file_backed: return ENXIO;
    case uprobe::Errc::forbidden_target: return EPERM;
    case uprobe::Errc::conflict: return unregistering ? ENOENT : EEXIST;
    case uprobe::Errc::in_handler: return EDEADLK;
    case uprobe::Errc::system: return EIO;
    case uprobe::Errc::invalid_argument: return EINVAL;
    case uprobe::Errc::ref_ctr_conflict: return EBUSY;
    case uprobe::Errc::too_many_return_consumers: return EUSERS;
  }
  return EIO;
}

/// Runs `f`, turning any exception into a negative errno and a message.
template <class F>
int guarded(bool unregistering, F&& f) noexcept {
  try {
    f();
    return 0;
  } catch (const uprobe::Error& e) {
    // A file that cannot be opened says why in its errno (EACCES, ENOTDIR,
    // ELOOP, ...; EISDIR for a directory), not only -ENOENT / -ENOEXEC.
    // An errno that has its own libuprobe meaning (ENXIO, EPERM, EINVAL, ...)
    // is not passed through: the Errc's value then, and the message says it.
    const bool file = e.code() == uprobe::Errc::file_not_found || e.code() == uprobe::Errc::not_executable;
    const int sys = e.sys_errno();
    const bool own = sys == EINVAL || sys == ENOEXEC || sys == EILSEQ || sys == EOPNOTSUPP || sys == ENXIO ||
                     sys == EPERM || sys == EEXIST || sys == EDEADLK || sys == EIO || sys == ENOMEM || sys == ERANGE ||
                     sys == EBUSY || sys == EUSERS;
    return fail(file && sys > 0 && !own ? sys : to_errno(e.code(), unregistering), e.what());
  } catch (const std::bad_alloc&) {
    return fail_static(ENOMEM, "libuprobe: out of memory");
  } catch (const std::system_error& e) {
    const bool posix = e.code().category() == std::generic_category() || e.code().category() == std::system_category();
    return fail(posix && e.code().value() > 0 ? e.code().value() : EIO, std::string("libuprobe: ") + e.what());
  } catch (const std::exception& e) {
    return fail(EIO, std::string("libuprobe: ") + e.what());
  } catch (...) {
    return fail_static(EIO, "libuprobe: unknown internal error");
  }
}

constexpr const char kInHandler[] =
    "libuprobe: cannot register or unregister from inside a probe handler (it would wait for itself)";

/// Checks shared by both register calls; 0 or a negative errno.
int check_consumer(const uprobe_consumer* uc, const void* probe_out) noexcept {
  if (!uc || !probe_out) return fail_static(EINVAL, "libuprobe: the consumer and the probe pointer must not be NULL");
  if (!uc->handler && !uc->ret_handler)
    return fail_static(EINVAL, "libuprobe: the consumer has neither a handler nor a ret_handler");
  return 0;
}

template <class Register>
int register_common(uprobe_consumer* uc, uprobe_probe** probe, Register&& reg) noexcept {
  return guarded(false, [&] {
    Adapter* a = acquire(uc, true);
    try {
      uprobe::Uprobe* p = reg(static_cast<uprobe::Consumer&>(*a));
      *probe = reinterpret_cast<uprobe_probe*>(p);
    } catch (...) {
      release(uc, a, 1);
      throw;
    }
  });
}

/// The first failure of a batch: its errno and message become the thread's
/// last error at the end of the call.
struct FirstFailure {
  int err = 0;
  size_t index = 0;
  std::string message;
  int count = 0;
  /// Request `i` failed with errno `e`.
  void note(size_t i, int e, const char* m) {
    ++count;
    if (err && i >= index) return;
    err = e;
    index = i;
    message = m;
  }
};

/// Checks of one C request before it reaches the C++ API; 0 or a positive errno.
int check_request(const uprobe_request& q, bool unregistering, const char*& why) noexcept {
  if (!q.uc) {
    why = "libuprobe: the request's consumer is NULL";
    return EINVAL;
  }
  if (unregistering) {
    if (!q.probe) {
      why = "libuprobe: the request's probe is NULL";
      return EINVAL;
    }
    return 0;
  }
  if (!q.uc->handler && !q.uc->ret_handler) {
    why = "libuprobe: the consumer has neither a handler nor a ret_handler";
    return EINVAL;
  }
  if (!q.addr && !q.path) {
    why = "libuprobe: the request has neither a path nor an address";
    return EINVAL;
  }
  return 0;
}

}  // namespace

extern "C" {

int uprobe_register_batch(uprobe_request* reqs, size_t n) {
  if (n == 0) return 0;
  if (!reqs) return fail_static(EINVAL, "libuprobe: the request array is NULL");
  if (uprobe::in_handler()) {
    for (size_t i = 0; i < n; ++i) {
      reqs[i].probe = nullptr;
      reqs[i].err = -EDEADLK;
    }
    return fail_static(EDEADLK, kInHandler);
  }
  std::vector<Adapter*> adapters(n, nullptr);
  FirstFailure first;
  const int rc = guarded(false, [&] {
    std::vector<uprobe::ProbeRequest> cpp;
    std::vector<size_t> index;
    cpp.reserve(n);
    index.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      uprobe_request& q = reqs[i];
      q.probe = nullptr;
      q.err = 0;
      const char* why = nullptr;
      if (int e = check_request(q, false, why)) {
        q.err = -e;
        first.note(i, e, why);
        continue;
      }
      uprobe::ProbeRequest r;
      if (q.addr) r.address = q.addr;
      else r.path = q.path;
      r.offset = q.offset;
      r.ref_ctr_offset = q.ref_ctr_offset;
      adapters[i] = acquire(q.uc, true);
      r.consumer = adapters[i];
      cpp.push_back(std::move(r));
      index.push_back(i);
    }
    std::vector<uprobe::RegisterResult> res = uprobe::register_uprobes(cpp);
    for (size_t k = 0; k < res.size(); ++k) {
      uprobe_request& q = reqs[index[k]];
      if (res[k].probe) {
        q.probe = reinterpret_cast<uprobe_probe*>(res[k].probe);
        adapters[index[k]] = nullptr;  // the registration keeps its reference
        continue;
      }
      const int e = to_errno(res[k].error->code(), false);
      q.err = -e;
      first.note(index[k], e, res[k].error->what());
    }
  });
  for (size_t i = 0; i < n; ++i)  // references of the requests that did not register
    if (adapters[i]) release(reqs[i].uc, adapters[i], 1);
  if (rc) {
    for (size_t i = 0; i < n; ++i)
      if (!reqs[i].err && !reqs[i].probe) reqs[i].err = rc;
    return rc;
  }
  if (first.err) fail(first.err, first.message);
  return first.count;
}

int uprobe_unregister_batch(uprobe_request* reqs, size_t n) {
  if (n == 0) return 0;
  if (!reqs) return fail_static(EINVAL, "libuprobe: the request array is NULL");
  if (uprobe::in_handler()) {
    for (size_t i = 0; i < n; ++i) reqs[i].err = -EDEADLK;
    return fail_static(EDEADLK, kInHandler);
  }
  std::vector<Adapter*> adapters(n, nullptr);
  std::vector<bool> done(n, false);
  FirstFailure first;
  const int rc = guarded(true, [&] {
    std::vector<uprobe::ProbeConsumer> pairs;
    std::vector<size_t> index;
    pairs.reserve(n);
    index.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      uprobe_request& q = reqs[i];
      q.err = 0;
      const char* why = nullptr;
      if (int e = check_request(q, true, why)) {
        q.err = -e;
        first.note(i, e, why);
        continue;
      }
      // A reference for the call keeps the adapter alive (as uprobe_unregister()).
      adapters[i] = acquire(q.uc, false);
      if (!adapters[i]) {
        q.err = -ENOENT;
        first.note(i, ENOENT, "libuprobe: this consumer is not registered on any probe");
        continue;
      }
      pairs.push_back(uprobe::ProbeConsumer{reinterpret_cast<uprobe::Uprobe*>(q.probe), adapters[i]});
      index.push_back(i);
    }
    std::vector<std::optional<uprobe::Error>> res = uprobe::unregister_uprobes(pairs);
    for (size_t k = 0; k < res.size(); ++k) {
      uprobe_request& q = reqs[index[k]];
      if (!res[k]) {
        done[index[k]] = true;
        continue;
      }
      const int e = to_errno(res[k]->code(), true);
      q.err = -e;
      first.note(index[k], e, res[k]->what());
    }
  });
  for (size_t i = 0; i < n; ++i)  // the call's reference, and on success the registration's
    if (adapters[i]) release(reqs[i].uc, adapters[i], done[i] ? 2 : 1);
  if (rc) {
    for (size_t i = 0; i < n; ++i)
      if (!reqs[i].err && !done[i]) reqs[i].err = rc;
    return rc;
  }
  if (first.err) fail(first.err, first.message);
  return first.count;
}

int uprobe_register(const char* path, uint64_t offset, uprobe_consumer* uc, uprobe_probe** probe) {
  if (uprobe::in_handler()) return fail_static(EDEADLK, kInHandler);
  if (!path) return fail_static(EINVAL, "libuprobe: the path must not be NULL");
  if (int rc = check_consumer(uc, probe)) return rc;
  return register_common(uc, probe, [&](uprobe::Consumer& c) { return uprobe::register_uprobe(path, offset, c); });
}

int uprobe_register_ref_ctr(const char* path, uint64_t offset, uint64_t ref_ctr_offset, uprobe_consumer* uc,
                            uprobe_probe** probe) {
  if (uprobe::in_handler()) return fail_static(EDEADLK, kInHandler);
  if (!path) return fail_static(EINVAL, "libuprobe: the path must not be NULL");
  if (int rc = check_consumer(uc, probe)) return rc;
  return register_common(
      uc, probe, [&](uprobe::Consumer& c) { return uprobe::register_uprobe(path, offset, ref_ctr_offset, c); });
}

int uprobe_register_addr(const void* addr, uprobe_consumer* uc, uprobe_probe** probe) {
  if (uprobe::in_handler()) return fail_static(EDEADLK, kInHandler);
  if (int rc = check_consumer(uc, probe)) return rc;
  return register_common(uc, probe, [&](uprobe::Consumer& c) { return uprobe::register_uprobe(addr, c); });
}

int uprobe_unregister(uprobe_probe* probe, uprobe_consumer* uc) {
  if (uprobe::in_handler()) return fail_static(EDEADLK, kInHandler);
  if (!probe || !uc) return fail_static(EINVAL, "libuprobe: the probe and the consumer must not be NULL");
  // A reference for the call itself keeps the adapter alive even if another
  // thread drops the consumer's last registration meanwhile.
  Adapter* a = nullptr;
  if (int rc = guarded(true, [&] { a = acquire(uc, false); })) return rc;
  if (!a) return fail_static(ENOENT, "libuprobe: this consumer is not registered on any probe");
  const int rc = guarded(true, [&] { uprobe::unregister_uprobe(reinterpret_cast<uprobe::Uprobe*>(probe), *a); });
  release(uc, a, rc == 0 ? 2 : 1);  // the call's reference, and on success the registration's
  return rc;
}

int uprobe_resolve_address(const void* addr, char* path, size_t path_size, uint64_t* offset) {
  uprobe::FileOffset fo;
  if (int rc = guarded(false, [&] { fo = uprobe::resolve_address(addr); })) return rc;
  if (path && path_size > 0) {
    if (fo.path.size() >= path_size)
      return fail(ERANGE, "libuprobe: the path mapped at the address (" + fo.path + ") does not fit " +
                              std::to_string(path_size) + " bytes");
    std::memcpy(path, fo.path.c_str(), fo.path.size() + 1);
  }
  if (offset) *offset = fo.offset;
  return 0;
}

const char* uprobe_strerror(int err) {
  switch (err < 0 ? -err : err) {
    case 0: return "success";
    case ENOENT: return "no such file, or the consumer is not registered on this probe";
    case EACCES: return "permission denied: the file cannot be opened for reading";
    case EISDIR: return "the path is a directory, not a regular file";
    case EINVAL: return "offset past the end of the file, or an invalid argument";
    case ENOEXEC: return "not a regular ELF file, or offset outside every executable segment of the file";
    case EILSEQ: return "offset inside an instruction";
    case EOPNOTSUPP: return "instruction cannot be probed, or unsupported request";
    case ENXIO: return "address is not in a file-backed mapping";
    case EPERM: return "target holds code that libuprobe's trap path runs, or libuprobe was loaded after libc";
    case EEXIST: return "consumer already registered on this probe";
    case EBUSY: return "the probe is registered with another USDT semaphore (ref_ctr_offset)";
    case EUSERS: return "the probe has the most consumers with a ret_handler already (10)";
    case EDEADLK: return "called from inside a probe handler";
    case EIO: return "a system call failed";
    case ENOMEM: return "out of memory";
    case ERANGE: return "buffer too small";
    default: {
      // Other open(2)/stat(2) errors of a path (ENOTDIR, ELOOP, ENAMETOOLONG, ...).
      const char* d = ::strerrordesc_np(err < 0 ? -err : err);
      return d ? d : "unknown libuprobe error";
    }
  }
}

const char* uprobe_last_error(void) {
  if (t_static_message) return t_static_message;
  const LastError* e = uprobe::detail::thread_object_if_made<LastError>();
  return e ? e->message.c_str() : "";
}

bool uprobe_in_handler(void) { return uprobe::in_handler(); }

const char* uprobe_version(void) { return UPROBE_VERSION_STRING; }

}  // extern "C"
