// SPDX-License-Identifier: MIT
// uprobe-storm: the probe kinds, the fixtures' models and the window consumers.
#include <dlfcn.h>
#include <sys/mman.h>
#include <limits.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>

#include "storm.hpp"
#include "uprobe/symbols.hpp"
#include "uprobe/usdt.hpp"

namespace storm {

constinit thread_local int t_producer __attribute__((tls_model("initial-exec"))) = kMaxProducers;
std::atomic<pid_t> g_producer_tid[kMaxProducers];
int g_inject = 0;

namespace {
std::atomic<std::uint64_t> g_inject_tick{0};
}  // namespace

constinit thread_local DlHandle t_dl;

const char* DlHandle::path() {
  static const std::string p = [] {
    char exe[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    std::string dir = n > 0 ? std::string(exe, static_cast<std::size_t>(n)) : std::string(".");
    dir = dir.substr(0, dir.rfind('/'));
    return dir + "/libuprobe_storm_dl.so";
  }();
  return p.c_str();
}

void DlHandle::reopen() {
  // ld.so serialises dlopen/dlclose with its own lock, which ThreadSanitizer
  // does not see (it reports ld.so's calloc in one thread's dlopen against the
  // free in another's dlclose). The same order, made visible: nothing changes
  // for the runtime under test, whose mapping updates follow each call.
  static std::mutex dl_lock;
  std::lock_guard<std::mutex> lock(dl_lock);
  if (handle) ::dlclose(handle);
  handle = ::dlopen(path(), RTLD_NOW);
  if (!handle) {
    std::fprintf(stderr, "storm: dlopen %s: %s\n", path(), ::dlerror());
    std::abort();
  }
  fn = reinterpret_cast<std::uint64_t (*)(std::uint64_t)>(::dlsym(handle, "storm_dl_fn"));
  if (!fn) std::abort();
  ++opens;
}

const char* fn_name(Fn f) {
  static const char* const names[kFns] = {"storm_mid",       "storm_nop5",       "storm_entry", "storm_ret",
                                          "storm_usdt_sema", "storm_usdt_plain", "storm_dl_fn",
                                          "storm_pun",       "storm_win",        "storm_pad",   "storm_ev"};
  return names[static_cast<int>(f)];
}

std::uint64_t call(Fn f, std::uint64_t x) {
  switch (f) {
    case Fn::mid: return storm_mid(x);
    case Fn::nop5: return storm_nop5(x);
    case Fn::entry: return storm_entry(x);
    case Fn::ret: return storm_ret(x);
    case Fn::usdt_sema: return storm_usdt_sema(x);
    case Fn::usdt_plain: return storm_usdt_plain(x);
    case Fn::dl:
      if (!t_dl.fn) t_dl.reopen();
      return t_dl.fn(x);
    case Fn::pun: return storm_pun(x);
    case Fn::win: return storm_win(x);
    case Fn::pad: return storm_pad(x);
    case Fn::ev: return storm_ev(x);
  }
  std::abort();
}

bool result_ok(Fn f, std::uint64_t x, std::uint64_t r, bool& sema_on) {
  switch (f) {
    case Fn::mid: return r == 3 * x + 10;
    case Fn::nop5: return r == x + 5;
    case Fn::entry: return r == 7 * x;
    case Fn::ret: return r == x + 11;
    case Fn::usdt_sema:
      sema_on = r == 2 * x + 1;
      return r == 2 * x || r == 2 * x + 1;
    case Fn::usdt_plain: return r == (x ^ 0x5a);
    case Fn::dl: return r == 5 * x + 1;
    case Fn::pun: return r == (static_cast<std::int64_t>(x) < 0 ? x + 1 : 2 * x + 1);
    case Fn::win: return r == 4 * x;
    case Fn::pad: return r == (static_cast<std::int64_t>(x) < 0 ? x : 2 * x) - 0xe2f6;
    case Fn::ev: return r == x + (static_cast<std::int64_t>(x) < 0 ? 0x5678 : 0x5679);
  }
  return false;
}

std::vector<Kind> make_kinds() {
  std::vector<Kind> k;
  auto add = [&](const char* name, Fn fn, Style style, const void* fn_addr, std::uint64_t off) {
    const void* at = static_cast<const std::uint8_t*>(fn_addr) + off;
    const uprobe::FileOffset fo = uprobe::resolve_address(at);
    k.push_back(Kind{name, fn, style, fo.path, fo.offset, 0, reinterpret_cast<std::uint64_t>(at)});
  };
  const auto mid = reinterpret_cast<const void*>(&storm_mid);
  const auto nop5 = reinterpret_cast<const void*>(&storm_nop5);
  const auto entry = reinterpret_cast<const void*>(&storm_entry);
  const auto ret = reinterpret_cast<const void*>(&storm_ret);
  add("int3-lea", Fn::mid, Style::entry, mid, storm_mid_lea_site);
  add("int3-rip-relative", Fn::mid, Style::entry, mid, storm_mid_rip_site);
  add("entry-push", Fn::mid, Style::entry, mid, 0);
  add("nop5", Fn::nop5, Style::entry, nop5, storm_nop5_site);
  add("nop5-filter", Fn::nop5, Style::filter, nop5, storm_nop5_site);
  add("entry", Fn::entry, Style::entry, entry, 0);
  add("entry-once", Fn::entry, Style::once, entry, 0);
  add("uretprobe", Fn::ret, Style::ret, ret, 0);
  add("session", Fn::ret, Style::session, ret, 0);
  add("punned", Fn::pun, Style::entry, reinterpret_cast<const void*>(&storm_pun), storm_pun_site);
  k.back().optimized_as = uprobe::ProbeMode::optimized_punned;
  add("punned-once", Fn::pun, Style::once, reinterpret_cast<const void*>(&storm_pun), storm_pun_site);
  add("window", Fn::win, Style::entry, reinterpret_cast<const void*>(&storm_win), storm_win_site);
  k.back().optimized_as = uprobe::ProbeMode::optimized_window;
  {
    // The pages the unpadded punned jump at storm_pad's site aims at, taken
    // for good: rel32 = [free, free, 49, 2d] from site + 5 (64 KiB). The site
    // then takes one prefix: [free, 49, 2d, f6] from site + 6.
    const std::uint64_t site = reinterpret_cast<std::uint64_t>(&storm_pad) + storm_pad_site;
    const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t lo = (site + 5 + 0x2d490000) & ~(page - 1), hi = (site + 5 + 0x2d4a0000 + page - 1) & ~(page - 1);
    void* m = ::mmap(reinterpret_cast<void*>(lo), hi - lo, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                     -1, 0);
    if (m == MAP_FAILED || reinterpret_cast<std::uint64_t>(m) != lo)
      throw uprobe::Error(uprobe::Errc::system, "", lo, "cannot take the pages storm_pad's punned jump aims at");
  }
  add("padded", Fn::pad, Style::entry, reinterpret_cast<const void*>(&storm_pad), storm_pad_site);
  k.back().optimized_as = uprobe::ProbeMode::optimized_padded;
  {
    // The page the punned jump at storm_ev's 1-byte site aims at (rel32 =
    // [48 15 78 56], one address), taken for good: the site evicts its
    // successor (Config::optimize_evicted, on by default).
    const std::uint64_t site = reinterpret_cast<std::uint64_t>(&storm_ev) + storm_ev_site;
    const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    const std::uint64_t lo = (site + 5 + 0x56781548) & ~(page - 1);
    void* m = ::mmap(reinterpret_cast<void*>(lo), page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                     -1, 0);
    if (m == MAP_FAILED || reinterpret_cast<std::uint64_t>(m) != lo)
      throw uprobe::Error(uprobe::Errc::system, "", lo, "cannot take the page storm_ev's punned jump aims at");
  }
  add("evicted", Fn::ev, Style::entry, reinterpret_cast<const void*>(&storm_ev), storm_ev_site);
  k.back().optimized_as = uprobe::ProbeMode::optimized_evicted;
  // USDT sites, from this executable's .note.stapsdt.
  const std::string exe = k[0].path;
  for (auto [name, probe, fn] : {std::tuple{"usdt-semaphore", "tick", Fn::usdt_sema},
                                 std::tuple{"usdt", "plain", Fn::usdt_plain}}) {
    const std::vector<uprobe::usdt::Probe> sites = uprobe::usdt::find(exe, "storm", probe);
    if (sites.size() != 1)
      throw uprobe::Error(uprobe::Errc::bad_offset, exe, 0,
                          std::string("expected one site of USDT storm:") + probe + ", found " +
                              std::to_string(sites.size()));
    const auto addrs = uprobe::runtime_addresses(exe, sites[0].offset);
    if (addrs.size() != 1)
      throw uprobe::Error(uprobe::Errc::bad_offset, exe, sites[0].offset, "the USDT site is not mapped once");
    k.push_back(Kind{name, fn, Style::entry, exe, sites[0].offset, sites[0].semaphore_offset, addrs[0]});
  }
  // A function of a library that comes and goes (pending probes): by symbol,
  // whether or not it is mapped now.
  const uprobe::Location dl = uprobe::resolve_symbol(DlHandle::path(), "storm_dl_fn");
  k.push_back(Kind{"dlopen-pending", Fn::dl, Style::entry, dl.path, dl.offset, 0, 0});
  return k;
}

namespace {
uprobe::Callbacks callbacks_of(Style s) {
  return s == Style::ret ? uprobe::Callbacks::ret
         : s == Style::session ? uprobe::Callbacks::entry_and_ret
                               : uprobe::Callbacks::entry;
}
int producer_slot() {
  const int p = t_producer;
  return p >= 0 && p < kMaxProducers ? p : kMaxProducers;
}
}  // namespace

void Window::count(int p) noexcept {
  if (g_inject && g_inject_tick.fetch_add(1, std::memory_order_relaxed) % 997 == 0) {
    if (g_inject == 1) return;
    hits[p].fetch_add(1, std::memory_order_relaxed);
  }
  hits[p].fetch_add(1, std::memory_order_relaxed);
}

Window::Window(const Kind& kind) : uprobe::Consumer(callbacks_of(kind.style)), style_(kind.style), ip_(kind.ip) {}

uprobe::Action Window::handler(uprobe::Regs& regs) {
  const int p = producer_slot();
  // ip_ 0: a library mapped at a different address after each dlopen; the
  // producer's own handle says where.
  const std::uint64_t ip = ip_ ? ip_ : reinterpret_cast<std::uint64_t>(t_dl.fn);
  if (regs.rip != ip) bad.fetch_add(1, std::memory_order_relaxed);
  switch (style_) {
    case Style::session:
      uprobe::session_cookie() = regs.rdi + 1;  // never 0
      return uprobe::Action::keep;
    case Style::filter:
      if (!filter_passes(p)) bad.fetch_add(1, std::memory_order_relaxed);  // the filter should have said no
      break;
    default:
      break;
  }
  count(p);
  return style_ == Style::once ? uprobe::Action::remove : uprobe::Action::keep;
}

void Window::ret_handler(uprobe::Regs& regs, std::uint64_t func) {
  const int p = producer_slot();
  if (func != ip_) bad.fetch_add(1, std::memory_order_relaxed);
  if (style_ == Style::session) {
    const std::uint64_t c = uprobe::session_cookie();
    if (c == 0 || regs.rax != c - 1 + 11) bad.fetch_add(1, std::memory_order_relaxed);
  }
  count(p);
}

bool Window::filter(pid_t tid) {
  if (style_ != Style::filter) return true;
  for (int i = 0; i < kMaxProducers; ++i)
    if (g_producer_tid[i].load(std::memory_order_relaxed) == tid) return filter_passes(i);
  return false;
}

}  // namespace storm
