// SPDX-License-Identifier: MIT
#pragma once
/// @file batch.hpp
/// Registering and unregistering many probes at once. A batch does once what
/// register_uprobe() / unregister_uprobe() do per call: one read of the
/// address space (/proc/self/maps), one open and one ELF read per file, one
/// publication of the probe table to the trap path (RCU) and, for
/// unregistering, one RCU grace period for the whole batch. (Both are one
/// transaction of the same attach path: register_uprobe() is a batch of one.) The kernel has no
/// equivalent for uprobes (each perf event or bpf_link attaches and detaches
/// its own uprobe; the multi-uprobe bpf_link of uprobe_multi is the closest).
///
/// Every request has its own outcome: a refused request (any uprobe::Errc)
/// changes nothing in the process and does not affect the other requests of
/// the batch, exactly as if each had been a separate register_uprobe() call
/// made in order (so two requests for the same consumer on the same probe:
/// the second is Errc::conflict).
///
/// Thread-safety: any thread, concurrently with hits and other
/// (un)registrations, not from inside a handler (every request then fails
/// with Errc::in_handler). Not async-signal-safe.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "uprobe/uprobe.hpp"

namespace uprobe {

/// One probe of a batch: where (a file and offset, or an address of this
/// process), which consumer, and optionally a USDT semaphore.
struct ProbeRequest {
  std::string path;                  ///< the file (used when `address` is null)
  std::uint64_t offset = 0;          ///< file offset of the probed instruction (with `path`)
  const void* address = nullptr;     ///< or: an address in this process (as register_uprobe(const void*, ...))
  std::uint64_t ref_ctr_offset = 0;  ///< file offset of the USDT semaphore, 0 = none (see register_uprobe())
  Consumer* consumer = nullptr;      ///< must outlive its registration; null is refused (Errc::invalid_argument)

  /// A request for (path, offset).
  static ProbeRequest at(std::string path, std::uint64_t offset, Consumer& consumer,
                         std::uint64_t ref_ctr_offset = 0) {
    ProbeRequest r;
    r.path = std::move(path);
    r.offset = offset;
    r.ref_ctr_offset = ref_ctr_offset;
    r.consumer = &consumer;
    return r;
  }
  /// A request for an address of this process.
  static ProbeRequest at(const void* address, Consumer& consumer) {
    ProbeRequest r;
    r.address = address;
    r.consumer = &consumer;
    return r;
  }
};

/// The outcome of one ProbeRequest: the registered probe, or why not.
struct RegisterResult {
  Uprobe* probe = nullptr;    ///< the probe the consumer is now registered on (null on error)
  std::optional<Error> error; ///< set exactly when probe is null
  /// How the probe's sites were patched when register_uprobes() returned
  /// (probe_info().mode then, without a call per probe: a tool that attached
  /// thousands of probes learns their modes without running the libc
  /// functions it just probed); ProbeMode::pending on error.
  ProbeMode mode = ProbeMode::pending;
  explicit operator bool() const noexcept { return probe != nullptr; }
};

/// Registers every request (the batch form of register_uprobe()). Returns one
/// result per request, in order. Requests on the same file share its open
/// and ELF read; requests on the same (file, offset) share one probe. No
/// probe of the batch can be hit before the probe table that holds it is
/// published, and the breakpoints are written after that single publication.
/// Thread-safety and errors: see the file comment. Throws only
/// std::bad_alloc.
std::vector<RegisterResult> register_uprobes(std::span<const ProbeRequest> requests);

/// One registration to undo: a probe and a consumer registered on it.
struct ProbeConsumer {
  Uprobe* probe = nullptr;
  Consumer* consumer = nullptr;
};

/// Unregisters every (probe, consumer) pair (the batch form of
/// unregister_uprobe()). Returns one entry per pair, in order: nullopt when it
/// was unregistered, else the error (Errc::conflict: not a registered probe,
/// or the consumer is not registered on it, e.g. a pair given twice;
/// Errc::in_handler). The original bytes of every site whose last consumer
/// went are restored before this returns, and it returns after one RCU grace
/// period: then no thread is still running a callback of any of these
/// registrations. Throws only std::bad_alloc.
std::vector<std::optional<Error>> unregister_uprobes(std::span<const ProbeConsumer> registrations);

/// The outcome of one request of attach_all(): an Attachment (empty on error)
/// or the error.
struct AttachResult {
  Attachment attachment;
  std::optional<Error> error;
  explicit operator bool() const noexcept { return attachment.probe() != nullptr; }
};

/// register_uprobes() with RAII results: each successful request gives an
/// Attachment (which detaches itself when destroyed, one grace period each;
/// detach_all() detaches many with one).
std::vector<AttachResult> attach_all(std::span<const ProbeRequest> requests);

/// Detaches every non-empty Attachment with one RCU grace period
/// (unregister_uprobes()); all of them are empty afterwards. Returns the
/// errors, one entry per attachment in order (nullopt for success and for an
/// attachment that was already empty).
std::vector<std::optional<Error>> detach_all(std::span<Attachment> attachments);

}  // namespace uprobe
