// SPDX-License-Identifier: MIT
#pragma once
/// @file storm.hpp
/// uprobe-storm (tests/stress): probe kinds, their fixtures and the per-window
/// consumers. A *kind* is one consumer style at one probe site; each attach of
/// a kind creates a fresh consumer (a *window*) that counts its hits per
/// producer thread, so that every window's count can be checked exactly
/// against the calls the producers made while it was attached.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "uprobe/uprobe.hpp"

extern "C" {
std::uint64_t storm_mid(std::uint64_t);         // 3x + 10
std::uint64_t storm_nop5(std::uint64_t);        // x + 5
std::uint64_t storm_entry(std::uint64_t);       // 7x
std::uint64_t storm_ret(std::uint64_t);         // x + 11
std::uint64_t storm_usdt_sema(std::uint64_t);   // 2x + 1 while the semaphore is set, else 2x
std::uint64_t storm_usdt_plain(std::uint64_t);  // x ^ 0x5a
std::uint64_t storm_pun(std::uint64_t);         // x < 2^63: 2x + 1, else x + 1
std::uint64_t storm_win(std::uint64_t);         // 4x
std::uint64_t storm_pad(std::uint64_t);         // x < 2^63: 2x - 0xe2f6, else x - 0xe2f6
std::uint64_t storm_ev(std::uint64_t);          // x < 2^63: x + 0x5679, else x + 0x5678
extern const std::uint64_t storm_mid_lea_site, storm_mid_rip_site, storm_nop5_site, storm_pun_site, storm_win_site,
    storm_pad_site, storm_ev_site;
}

namespace storm {

/// Producer threads at most; hits by any other thread land in slot kMaxProducers.
constexpr int kMaxProducers = 16;

/// The probed functions.
enum class Fn : int { mid, nop5, entry, ret, usdt_sema, usdt_plain, dl, pun, win, pad, ev };
constexpr int kFns = 11;
const char* fn_name(Fn f);
/// Calls `f(x)`. Fn::dl calls storm_dl_fn of libuprobe_storm_dl.so through
/// the calling thread's own dlopen() handle (see DlHandle).
std::uint64_t call(Fn f, std::uint64_t x);

/// The calling producer's handle on libuprobe_storm_dl.so: reopen() dlclose()s
/// it (the library is unmapped when no other producer holds it, and its probe
/// becomes pending) and dlopen()s it again (the interposed dlopen installs the
/// pending probe before it returns).
struct DlHandle {
  static const char* path();  ///< the library's path (next to the executable)
  void reopen();
  void* handle = nullptr;
  std::uint64_t (*fn)(std::uint64_t) = nullptr;
  std::uint64_t opens = 0;
};
/// constinit: no TLS wrapper, no init-function check. Without it, GCC 12's
/// -fsanitize=null check of `&t_dl` tests the flags of the initial-exec
/// `add %fs:0`, which the linker relaxes to a flag-less `lea` in a PIE: every
/// member call then reports "member call on null pointer" (ASan+UBSan build).
extern thread_local constinit DlHandle t_dl;
/// True when `r` is a correct result of f(x); `sema_on` tells which of
/// storm_usdt_sema's two results it gave.
bool result_ok(Fn f, std::uint64_t x, std::uint64_t r, bool& sema_on);

/// How a window consumes hits.
enum class Style {
  entry,    ///< handler counts and checks rip
  filter,   ///< like entry, behind a filter that passes only even-numbered producers
  once,     ///< handler counts once and returns Action::remove
  ret,      ///< ret_handler only (a uretprobe): counts returns, checks func
  session,  ///< entry stores x in the cookie; the return checks rax == x + 11 and counts
};

/// One probe kind: a consumer style at a probe site.
struct Kind {
  std::string name;
  Fn fn;
  Style style;
  std::string path;           ///< the probed file
  std::uint64_t offset = 0;   ///< file offset of the site
  std::uint64_t ref_ctr = 0;  ///< USDT semaphore file offset (0: none)
  std::uint64_t ip = 0;       ///< runtime address of the site
  /// The mode an attach must take while Config::optimize is on (the storm
  /// fails when none did); ProbeMode::pending: not checked.
  uprobe::ProbeMode optimized_as = uprobe::ProbeMode::pending;
};

/// The kinds of this run (resolved from the fixtures and the USDT notes).
/// @throws uprobe::Error when a USDT probe cannot be found.
std::vector<Kind> make_kinds();

/// The calling thread's producer index (kMaxProducers on other threads); read
/// by the consumers on the hitting thread.
extern thread_local constinit int t_producer;
/// gettid() of each producer, for the filter style.
extern std::atomic<pid_t> g_producer_tid[kMaxProducers];
/// The producers the filter style passes.
inline bool filter_passes(int producer) { return producer < kMaxProducers && producer % 2 == 0; }

/// Checker self-test (--inject): 0 none; 1 every 997th hit is not counted; 2
/// every 997th hit is counted twice. Set before any thread starts.
extern int g_inject;

/// One attach of a kind: counts per producer. Callbacks are async-signal-safe.
class Window : public uprobe::Consumer {
 public:
  explicit Window(const Kind& kind);
  /// Entries (entry, filter, once) or returns (ret, session) per producer.
  std::atomic<std::uint64_t> hits[kMaxProducers + 1] = {};
  /// Callbacks that saw a wrong rip, func, cookie, return value or producer.
  std::atomic<std::uint64_t> bad{0};

  uprobe::Action handler(uprobe::Regs& regs) override;
  void ret_handler(uprobe::Regs& regs, std::uint64_t func) override;
  bool filter(pid_t tid) override;

 private:
  void count(int producer) noexcept;
  Style style_;
  std::uint64_t ip_;
};

}  // namespace storm
