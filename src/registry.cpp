// SPDX-License-Identifier: MIT
// The public attach API (uprobe.hpp, batch.hpp) as thin wrappers over the one
// attach path, the transaction of attach_txn.hpp: register_uprobe() and
// unregister_uprobe() are a transaction of one request, register_uprobes()
// and unregister_uprobes() of many, the dlopen/dlclose resync and
// configure()'s re-optimization a transaction of none. Also probe_info(),
// resolve_address() and Attachment.

#include <exception>
#include <optional>

#include "uprobe/batch.hpp"

#include "arch.hpp"
#include "attach_txn.hpp"
#include "probe.hpp"
#include "runtime.hpp"
#include "sites.hpp"
#include "thread_state.hpp"
#include "vma.hpp"

namespace uprobe::detail {
namespace {

/// A transaction's error as the batch API reports it: the uprobe::Error
/// thrown, or Errc::system naming the request for anything else.
Error as_error(const std::exception_ptr& e, const std::string& path, std::uint64_t offset) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err;
  } catch (const std::exception& x) {
    return Error(Errc::system, path, offset, x.what());
  } catch (...) {
    return Error(Errc::system, path, offset, "unknown exception");
  }
}

}  // namespace
}  // namespace uprobe::detail

namespace uprobe {

using namespace detail;

Uprobe* register_uprobe(const std::string& path, std::uint64_t offset, Consumer& consumer) {
  return register_uprobe(path, offset, 0, consumer);
}

Uprobe* register_uprobe(const std::string& path, std::uint64_t offset, std::uint64_t ref_ctr_offset,
                        Consumer& consumer) {
  if (t_state.depth > 0) throw in_handler_error(path, offset);
  Transaction txn(1);
  txn.begin_attach();
  const std::size_t ticket = txn.add(ProbeRequest::at(path, offset, consumer, ref_ctr_offset));
  txn.commit();
  const Transaction::Added& a = txn.added(ticket);
  if (a.error) std::rethrow_exception(a.error);
  return a.probe;
}

void detail::resync_address_space() {
  if (t_state.depth > 0) return;
  Transaction txn(0);
  if (!txn.registry().started) return;
  txn.resync();
  txn.commit();
}

void detail::reoptimize_all(Registry&) {
  Transaction txn(0, Transaction::HeldLock{});
  txn.reoptimize();
  txn.commit();
}

Uprobe* register_uprobe(const void* address, Consumer& consumer) {
  FileOffset fo = resolve_address(address);
  return register_uprobe(fo.path, fo.offset, consumer);
}

void unregister_uprobe(Uprobe* up, Consumer& consumer) {
  if (t_state.depth > 0) throw in_handler_error(up ? up->path : std::string(), up ? up->key.offset : 0);
  Transaction txn(1);
  const std::size_t ticket = txn.remove(ProbeConsumer{up, &consumer});
  txn.commit();
  if (const std::exception_ptr& e = txn.removed(ticket)) std::rethrow_exception(e);
}

std::vector<RegisterResult> register_uprobes(std::span<const ProbeRequest> requests) {
  std::vector<RegisterResult> out(requests.size());
  if (requests.empty()) return out;
  if (t_state.depth > 0) {
    for (std::size_t i = 0; i < requests.size(); ++i) out[i].error = in_handler_error(requests[i].path, requests[i].offset);
    return out;
  }
  Transaction txn(requests.size());
  try {
    txn.begin_attach();
  } catch (const Error& e) {
    for (RegisterResult& o : out) o.error = e;
    return out;
  }
  for (const ProbeRequest& q : requests) txn.add(q);  // tickets 0..n-1
  txn.commit();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Transaction::Added& a = txn.added(i);
    if (a.probe)
      out[i].probe = a.probe;
    else
      out[i].error = as_error(a.error, a.path, a.offset);
  }
  return out;
}

std::vector<std::optional<Error>> unregister_uprobes(std::span<const ProbeConsumer> registrations) {
  const std::size_t n = registrations.size();
  std::vector<std::optional<Error>> out(n);
  if (n == 0) return out;
  if (t_state.depth > 0) {
    for (std::size_t i = 0; i < n; ++i) {
      const Uprobe* up = registrations[i].probe;
      out[i] = in_handler_error(up ? up->path : std::string(), up ? up->key.offset : 0);
    }
    return out;
  }
  Transaction txn(n);
  for (const ProbeConsumer& pc : registrations) txn.remove(pc);  // tickets 0..n-1
  txn.commit();
  for (std::size_t i = 0; i < n; ++i)
    if (const std::exception_ptr& e = txn.removed(i)) out[i] = as_error(e, "", 0);
  return out;
}

std::vector<AttachResult> attach_all(std::span<const ProbeRequest> requests) {
  std::vector<RegisterResult> regs = register_uprobes(requests);
  std::vector<AttachResult> out(regs.size());
  for (std::size_t i = 0; i < regs.size(); ++i) {
    if (regs[i].probe)
      out[i].attachment = Attachment::adopt(regs[i].probe, *requests[i].consumer);
    else
      out[i].error = std::move(regs[i].error);
  }
  return out;
}

std::vector<std::optional<Error>> detach_all(std::span<Attachment> attachments) {
  std::vector<ProbeConsumer> pairs;
  std::vector<std::size_t> where;
  pairs.reserve(attachments.size());
  for (std::size_t i = 0; i < attachments.size(); ++i) {
    if (!attachments[i].probe()) continue;
    pairs.push_back(ProbeConsumer{attachments[i].probe(), attachments[i].consumer()});
    where.push_back(i);
  }
  std::vector<std::optional<Error>> errs = unregister_uprobes(pairs);
  std::vector<std::optional<Error>> out(attachments.size());
  for (std::size_t k = 0; k < where.size(); ++k) {
    attachments[where[k]].release();
    out[where[k]] = std::move(errs[k]);
  }
  return out;
}

FileOffset resolve_address(const void* address) {
  if (auto fo = file_offset_from_snapshot(reinterpret_cast<std::uint64_t>(address))) return *fo;
  VmaSnapshot snap(read_proc_maps());
  return file_offset_of(snap, reinterpret_cast<std::uint64_t>(address));
}

ProbeInfo probe_info(const Uprobe* up) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!up || !probe_registered(r, up)) throw Error(Errc::conflict, "", 0, "not a registered probe");
  ProbeInfo info;
  info.where = FileOffset{up->path, up->key.offset, up->key.dev, up->key.ino};
  const SiteSet* ss = up->sites.load(std::memory_order_relaxed);
  info.sites = up->applied && ss ? static_cast<unsigned>(ss->sites.size()) : 0;
  info.consumers = static_cast<unsigned>(up->consumers.load(std::memory_order_relaxed)->regs.size());
  info.emulated = arch::is_emulated(up->insn) &&
                  (g_hot.emulate.load(std::memory_order_relaxed) || !arch::xol_safe(up->insn));
  info.instruction = up->insn.text;
  info.why_not_optimized = why_not_optimized(up);
  bool optimized = false;
  if (ss)
    for (const Site& s : ss->sites) optimized = optimized || site_is_optimized(s);
  info.mode = info.sites == 0 ? "pending"
              : !optimized        ? "int3"
              : arch::is_nop5(up->insn) ? "optimized-nop5"
                                        : "optimized-entry";
  if (info.mode == "optimized-entry") info.displaced = up->window.len;
  info.signals_blocked = signals_blocked_windows(up->key.dev, up->key.ino, up->key.offset);
  if (optimized) info.why_not_optimized.clear();
  else if (info.why_not_optimized.empty() && info.sites) info.why_not_optimized = "no stub memory within reach";
  return info;
}

Attachment::Attachment(const std::string& path, std::uint64_t offset, Consumer& consumer)
    : probe_(register_uprobe(path, offset, consumer)), consumer_(&consumer) {}
Attachment::Attachment(const void* address, Consumer& consumer)
    : probe_(register_uprobe(address, consumer)), consumer_(&consumer) {}
Attachment::Attachment(Attachment&& o) noexcept : probe_(o.probe_), consumer_(o.consumer_) {
  o.probe_ = nullptr;
  o.consumer_ = nullptr;
}
Attachment& Attachment::operator=(Attachment&& o) noexcept {
  if (this != &o) {
    detach();
    probe_ = o.probe_;
    consumer_ = o.consumer_;
    o.probe_ = nullptr;
    o.consumer_ = nullptr;
  }
  return *this;
}
Attachment::~Attachment() {
  try {
    detach();
  } catch (...) {
  }
}
void Attachment::detach() {
  if (!probe_) return;
  Uprobe* p = probe_;
  probe_ = nullptr;
  unregister_uprobe(p, *consumer_);
}

}  // namespace uprobe

uprobe::Attachment uprobe::Attachment::adopt(Uprobe* probe, Consumer& consumer) noexcept {
  Attachment a;
  if (probe) {
    a.probe_ = probe;
    a.consumer_ = &consumer;
  }
  return a;
}
