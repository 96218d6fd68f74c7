// SPDX-License-Identifier: MIT
// The public attach API (uprobe.hpp, batch.hpp) as thin wrappers over the one
// attach path, the transaction of attach_txn.hpp: register_uprobe() and
// unregister_uprobe() are a transaction of one request, register_uprobes()
// and unregister_uprobes() of many, the dlopen/dlclose resync and
// configure()'s re-optimization a transaction of none. Also probe_info(),
// resolve_address() and Attachment.

// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329); the state must be set before <string> is included.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <elf.h>

#include <exception>
#include <mutex>
#include <optional>

#include "uprobe/batch.hpp"

#include "arch.hpp"
#include "attach_txn.hpp"
#include "dispatch.hpp"
#include "elf_image.hpp"
#include "forbidden.hpp"
#include "format.hpp"
#include "ifunc.hpp"
#include "probe.hpp"
#include "runtime.hpp"
#include "sites.hpp"
#include "thread_state.hpp"
#include "vma.hpp"

namespace uprobe::detail {
namespace {

/// ProbeInfo::mode of a registered probe (registry mutex held). Calls no
/// libc function (peek_text_checked(), same_bytes()): register_uprobes()
/// asks it for every probe it just attached, libc's included.
ProbeMode probe_mode(const Uprobe* up) noexcept {
  const SiteSet* ss = up->sites.load(std::memory_order_relaxed);
  if (!up->applied || !ss || ss->sites.empty()) return ProbeMode::pending;
  bool optimized = false, padded = false, evicted = false;
  for (const Site& s : ss->sites) {
    const bool opt = site_is_optimized(s);
    optimized = optimized || opt;
    padded = padded || (opt && s.pad > 0);
    evicted = evicted || (opt && s.evict_hop);
  }
  return !optimized                           ? ProbeMode::int3
         : up->tactic == arch::Tactic::nop5   ? ProbeMode::optimized_nop5
         : evicted                            ? ProbeMode::optimized_evicted
         : padded                             ? ProbeMode::optimized_padded
         : up->tactic == arch::Tactic::punned ? ProbeMode::optimized_punned
         : up->function_entry                 ? ProbeMode::optimized_entry
                                              : ProbeMode::optimized_window;
}

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

/// The handles (ProbeHandle), in blocks that are never freed: a return
/// instance pending since before a uprobe went away may still read one.
struct HandlePool {
  std::mutex mutex;
  ProbeHandle* free = nullptr;
  std::size_t used = 0;  // of the newest block
  ProbeHandle* block = nullptr;
  static constexpr std::size_t kBlock = 256;
};

HandlePool& handle_pool() {
  static auto* p = new HandlePool;  // never destroyed: threads may still return through it at exit
  return *p;
}

}  // namespace

ProbeHandle* probe_handle_acquire(Uprobe* up) {
  HandlePool& p = handle_pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  ProbeHandle* h = p.free;
  if (h) {
    p.free = h->next_free;
    h->next_free = nullptr;
  } else {
    if (!p.block || p.used == HandlePool::kBlock) {
      p.block = new ProbeHandle[HandlePool::kBlock];
      p.used = 0;
    }
    h = &p.block[p.used++];
  }
  h->up.store(up, std::memory_order_release);
  return h;
}

void probe_handle_release(ProbeHandle* h) noexcept {
  if (!h) return;
  HandlePool& p = handle_pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  h->up.store(nullptr, std::memory_order_relaxed);
  h->next_free = p.free;
  p.free = h;
}

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
    if (a.probe) {
      out[i].probe = a.probe;
      out[i].mode = probe_mode(a.probe);
    } else
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

namespace {

ProbeInfo probe_state(const Uprobe* up);

/// ProbeInfo::symbol and ProbeInfo::ifunc: the code symbol holding the probe,
/// and the GNU indirect functions bound to it (or whose resolver it is in).
/// Reads the file's symbols (cached) and asks the dynamic linker: not under
/// the registry mutex.
void describe_code(ProbeInfo& info) {
  try {
    const std::string& path = info.where.path;
    const std::uint64_t off = info.where.offset;
    const std::optional<Symbol> at = symbol_at(path, off);
    if (at) {
      info.symbol = at->full_name();
      if (off > at->offset) info.symbol += "+" + hex(off - at->offset);
    }
    if (const detail::FuncSym* fn = detail::load_elf_image(path)->enclosing_function(off)) {
      info.bounds = std::string(detail::bounds_source_name(fn->source)) + " " + hex(fn->file_offset) + "+" +
                    hex(fn->size);
    }
    const auto shared_bindings = detail::ifunc_bindings(path);
    const std::vector<detail::IfuncBinding>& bindings = *shared_bindings;
    if (bindings.empty()) return;
    // An implementation by its symbol, else by its file offset (glibc's
    // libc.so.6 as Debian ships it has no .symtab: __strlen_evex is unnamed).
    auto impl_name = [&](const std::string& p, std::uint64_t o, bool same_file) {
      const std::optional<Symbol> s = symbol_at(p, o);
      if (s && s->offset == o) return s->full_name();
      return "offset " + hex(o) + (same_file ? std::string() : " of " + p);
    };
    if (at && at->type == STT_GNU_IFUNC) {
      std::string bound;
      for (const detail::IfuncBinding& b : bindings)
        if (b.ifunc.offset == at->offset && b.ifunc.name == at->name)
          bound = impl_name(b.impl_path, b.impl_offset, b.impl_dev == info.where.dev && b.impl_ino == info.where.ino);
      info.ifunc = "resolver of IFUNC " + at->name +
                   (bound.empty() ? std::string(" (a probe here sees no calls)")
                                  : " (bound to " + bound + ": a probe here sees no calls)");
      return;
    }
    // The function holding the probe starts at the symbol; unnamed code is
    // recognised at its first byte only.
    const std::uint64_t fn = at ? at->offset : off;
    std::string names;
    for (const detail::IfuncBinding& b : bindings)
      if (b.impl_offset == fn && b.impl_dev == info.where.dev && b.impl_ino == info.where.ino)
        names += (names.empty() ? "" : ", ") + b.ifunc.full_name();
    if (!names.empty()) info.ifunc = "IFUNC " + names + " -> " + impl_name(path, fn, true);
  } catch (const Error&) {
  }
}

}  // namespace

ProbeInfo probe_info(const Uprobe* up) { return probe_info(up, ProbeDetail::full); }

ProbeInfo probe_info(const Uprobe* up, ProbeDetail detail) {
  ProbeInfo info = probe_state(up);
  if (detail == ProbeDetail::full) describe_code(info);
  return info;
}

namespace {

/// Why a punned site found no hop: its range, and each padded form's
/// (E9Patch's T1) when planned, or why none was.
std::string no_hop_reason(const arch::EntryWindow& w) {
  std::string why = "no free page at the addresses the punned jump's bytes after the instruction select";
  if (w.max_pad > 0)
    return why + ", nor at those its " + std::to_string(w.max_pad) +
           (w.max_pad == 1 ? " padded form (a redundant prefix before the opcode) selects"
                           : " padded forms (1 to " + std::to_string(w.max_pad) +
                                 " redundant prefixes before the opcode) select");
  return why + (w.len == 1 ? " (a 1-byte instruction has no room for a padded form)"
                           : " (no padded form: the file ends within the bytes it would keep)");
}

/// The probe's state (everything but describe_code()), under the registry mutex.
/// ProbeInfo::entry_state / return_state of a save mode and its SSE-only count.
std::string saved_state(arch::SaveMode save, std::uint8_t sse) {
  if (save == arch::SaveMode::none) return "none";
  if (sse != kSseUnknown)
    return sse == 0 ? "none (code read)" : sse == 1 ? "xmm0, MXCSR" : "xmm0-xmm" + std::to_string(sse - 1) + ", MXCSR";
  return save == arch::SaveMode::entry ? "entry" : save == arch::SaveMode::ret ? "return" : "full";
}

ProbeInfo probe_state(const Uprobe* up) {
  Registry& r = registry();
  if (r.mutex.held_by_this_thread())  // (a pthread_atfork handler inside its fork(): before_fork())
    throw Error(Errc::in_handler, "", 0,
                "cannot read a probe's state while this thread's fork() holds libuprobe's registry");
  std::unique_lock<ForkHeldMutex> lock(r.mutex, std::defer_lock);
  lock_registry(lock);  // (never a dynamic-linker call under the mutex)
  if (!up || !probe_registered(r, up)) throw Error(Errc::conflict, "", 0, "not a registered probe");
  ProbeInfo info;
  info.where = FileOffset{up->path, up->key.offset, up->key.dev, up->key.ino};
  const SiteSet* ss = up->sites.load(std::memory_order_relaxed);
  info.sites = up->applied && ss ? static_cast<unsigned>(ss->sites.size()) : 0;
  info.consumers = static_cast<unsigned>(up->consumers.load(std::memory_order_relaxed)->regs.size());
  info.emulated = up->insn.ops->emulate &&
                  (g_hot.emulate.load(std::memory_order_relaxed) || up->insn.ops->emulate_only);
  info.instruction = up->insn.text;
  info.why_not_optimized = why_not_optimized(up);
  info.mode = probe_mode(up);
  const bool optimized = info.mode != ProbeMode::pending && info.mode != ProbeMode::int3;
  if (optimized && info.mode != ProbeMode::optimized_nop5) info.displaced = up->window.len;
  info.signals_blocked = signals_blocked_windows(up->key.dev, up->key.ino, up->key.offset);
  const ConsumerSet* cs = up->consumers.load(std::memory_order_relaxed);
  info.entry_state = saved_state(effective_save(cs->entry_save), cs->entry_sse);
  info.return_state = saved_state(effective_save(cs->ret_save), cs->ret_sse);
  if (info.mode != ProbeMode::optimized_evicted && up->window.punned)
    info.why_not_evicted = up->window.evict.len ? up->evict_failure
                           : up->evict_why.empty() ? ""
                                                   : "no successor eviction: " + up->evict_why;
  if (optimized) info.why_not_optimized.clear();
  else if (info.why_not_optimized.empty() && info.sites)
    info.why_not_optimized = up->window.punned && ss && std::any_of(ss->sites.begin(), ss->sites.end(), [](const Site& s) { return !s.hop; })
                                 ? no_hop_reason(up->window) +
                                       (!up->window.evict.len ? "; no successor eviction: " + up->evict_why
                                        : up->evict_failure.empty()
                                            ? "; nor both jumps of evicting the successor `" + up->window.evict.text + "`"
                                            : "; nor " + up->evict_failure)
                                 : "no stub memory within reach";
  return info;
}

}  // namespace

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
Attachment::Attachment(const std::string& path, std::uint64_t offset, std::uint64_t ref_ctr_offset,
                       Consumer& consumer)
    : probe_(register_uprobe(path, offset, ref_ctr_offset, consumer)), consumer_(&consumer) {}
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
