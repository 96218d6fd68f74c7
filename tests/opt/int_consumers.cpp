// SPDX-License-Identifier: MIT
// Compiled with -mgeneral-regs-only (see CMakeLists.txt): nothing here may
// touch a vector or x87 register.
#include "int_consumers.hpp"

namespace opttest {

IntRecorder::IntRecorder() { set_vector_state_unused(); }

uprobe::Action IntRecorder::handler(uprobe::Regs& regs) {
  hits.fetch_add(1, std::memory_order_relaxed);
  seen = regs;
  return uprobe::Action::keep;
}

IntCounter::IntCounter() { set_vector_state_unused(); }

uprobe::Action IntCounter::handler(uprobe::Regs&) {
  hits.fetch_add(1, std::memory_order_relaxed);
  return uprobe::Action::keep;
}

IntSession::IntSession() : uprobe::Consumer(uprobe::Callbacks::entry_and_ret) { set_vector_state_unused(); }

uprobe::Action IntSession::handler(uprobe::Regs& regs) {
  entries.fetch_add(1, std::memory_order_relaxed);
  (void)regs;
  uprobe::session_cookie() = kCookieSalt;
  return uprobe::Action::keep;
}

void IntSession::ret_handler(uprobe::Regs& regs, std::uint64_t fn) {
  (void)regs;
  returns.fetch_add(1, std::memory_order_relaxed);
  if (fn != func) bad_func.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t c = uprobe::session_cookie();
  if (c != kCookieSalt) bad_cookie.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace opttest
