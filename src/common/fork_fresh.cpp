// SPDX-License-Identifier: MIT
// fork_fresh<T>()'s list of slots and the one pthread_atfork child handler
// that empties them.

#include "fork_fresh.hpp"

#include <pthread.h>

namespace uprobe::detail {

namespace {

std::atomic<ForkFreshNode*> g_nodes{nullptr};
std::atomic<bool> g_handler{false};

/// The child handler: one thread runs, the list is as the fork left it.
/// Stores only (a traced program's every fork runs it: uprobe-trace counts
/// no call of ours).
void renew_all() noexcept {
  for (ForkFreshNode* n = g_nodes.load(std::memory_order_acquire); n; n = n->next) n->renew();
}

/// Registers renew_all() once. (pthread_atfork() waits while a fork() is in
/// progress; no lock of ours is held meanwhile.)
void install_handler() noexcept {
  if (!g_handler.exchange(true, std::memory_order_acq_rel)) ::pthread_atfork(nullptr, nullptr, renew_all);
}

/// At load, before the program's threads can use a cache.
__attribute__((constructor)) void install_at_load() noexcept { install_handler(); }

}  // namespace

bool fork_fresh_list(ForkFreshNode& n) noexcept {
  int state = n.listed.load(std::memory_order_acquire);
  if (state == 0 && n.listed.compare_exchange_strong(state, 1, std::memory_order_acq_rel)) {
    install_handler();
    ForkFreshNode* head = g_nodes.load(std::memory_order_relaxed);
    do n.next = head;
    while (!g_nodes.compare_exchange_weak(head, &n, std::memory_order_release, std::memory_order_relaxed));
    n.listed.store(2, std::memory_order_release);
    return true;
  }
  return state == 2;
}

}  // namespace uprobe::detail
