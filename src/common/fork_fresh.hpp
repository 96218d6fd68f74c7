// SPDX-License-Identifier: MIT
#pragma once
// fork_fresh<T>(): a process-wide T (a cache and its lock) that a fork child
// replaces with a fresh one.

#include <pthread.h>

namespace uprobe::detail {

/// The process's one T, made at the first call and never destroyed (probes
/// fire and libraries load during exit, and a destructor's free() would be
/// the traced program's). A fork child gets a new, default-constructed T and
/// leaves the old one as it is: a thread that did not come along may have
/// held its lock, or been changing it, when the process forked (symbol
/// resolution and uprobe::plan_site() run beside the registry, whose mutex is
/// held across a fork), and the child's first use would wait forever.
/// Thread-safe (the first call's static initialization); the pointer changes
/// only in a fork child, where one thread runs. `Tag` tells apart two uses of one T.
template <class T, class Tag = T>
T& fork_fresh() {
  static T* instance = [] {
    ::pthread_atfork(nullptr, nullptr, [] { instance = new T; });
    return new T;
  }();
  return *instance;
}

}  // namespace uprobe::detail
