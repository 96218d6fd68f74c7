// SPDX-License-Identifier: MIT
#pragma once
/// @file int_consumers.hpp
/// Consumers that declared set_vector_state_unused(): their callbacks are
/// compiled with -mgeneral-regs-only (int_consumers.cpp), so they really
/// touch no vector or x87 register.

#include <atomic>
#include <cstdint>

#include "uprobe/uprobe.hpp"

namespace opttest {

/// Records the registers of the last hit and counts hits (integer work only).
struct IntRecorder : uprobe::Consumer {
  IntRecorder();
  std::atomic<std::uint64_t> hits{0};
  uprobe::Regs seen{};
  uprobe::Action handler(uprobe::Regs& regs) override;
};

/// Counts hits only (integer work only).
struct IntCounter : uprobe::Consumer {
  IntCounter();
  std::atomic<std::uint64_t> hits{0};
  uprobe::Action handler(uprobe::Regs& regs) override;
};

/// A session consumer (entry_and_ret): the entry stores kCookieSalt in the
/// session cookie, the return checks it came back and counts (integer work only).
struct IntSession : uprobe::Consumer {
  static constexpr std::uint64_t kCookieSalt = 0xC00C1E5A17ull;
  IntSession();
  std::atomic<std::uint64_t> entries{0}, returns{0}, bad_cookie{0}, bad_func{0};
  std::uint64_t func = 0;
  uprobe::Action handler(uprobe::Regs& regs) override;
  void ret_handler(uprobe::Regs& regs, std::uint64_t fn) override;
};

}  // namespace opttest
