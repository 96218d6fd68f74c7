// SPDX-License-Identifier: MIT
#pragma once
// Where are the other threads? Before an optimized function-entry jump
// overwrites the displaced window, no thread may be stopped inside it (the
// kernel's x86 kprobes optimizer waits for that with synchronize_rcu_tasks()
// in arch/x86/kernel/kprobes/opt.c; user space has no such primitive, so the
// threads are observed instead).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace uprobe::detail {

/// An address range [first, second).
using AddrRange = std::pair<std::uint64_t, std::uint64_t>;

/// Observes the instruction pointer of every other thread of the process
/// once and returns true when none is inside any of `ranges` (strictly after
/// its first byte). A thread is observed when it is blocked in the kernel (a
/// system call, a page fault): its user rip is read from
/// /proc/self/task/<tid>/syscall. A runnable thread (on a CPU, or preempted)
/// cannot be read: it is polled for up to 2 ms; then, when a sample signal is
/// configured (Config::sample_signal), it is sent that signal, whose handler
/// records the interrupted rip (or, inside libuprobe's SIGTRAP handler, the
/// rip its pending sigreturn goes to; a thread that blocks the signal, such
/// as a sanitizer runtime's own thread, is polled as without one); without
/// one, or without an answer in 50 ms, the answer is false with `why` naming the thread (the caller
/// retries later). The sample is a real-time signal and never SIGTRAP: a
/// SIGTRAP queued while the thread executes an int3 would swallow the int3's
/// own SIGTRAP (standard signals do not queue). Call after the int3 at the start of each range has been
/// made visible to every core: from then on no thread enters a range except
/// by a branch into it, which the caller excluded, so one observation per
/// thread suffices. Not seen: a context a signal handler interrupted inside a
/// range (the thread is observed where the handler is), and tasks sharing the
/// address space outside the thread group (vfork children, clone(CLONE_VM)).
/// Registry mutex held; not async-signal-safe.
/// When the answer is false because a thread was seen at a known address
/// inside one of the ranges, `*culprit` (if given) is that address (else 0):
/// the caller may drop the ranges holding it and ask again for the others.
/// `wait` false: a running thread that no sample signal can observe gives
/// false at once (not polled for 2 ms, not marked busy for the next calls):
/// for a caller that asks again later anyway, at no cost to the window checks.
bool threads_outside(const std::vector<AddrRange>& ranges, std::string& why, std::uint64_t* culprit = nullptr,
                     bool wait = true);

/// Config::sample_signal: 0, or a real-time signal libuprobe then owns.
/// @throws std::invalid_argument (not 0 or SIGRTMIN..SIGRTMAX; the signal has
/// a handler that is not ours). Registry mutex held.
void set_sample_signal(int sig);
/// The configured sample signal (0 = none).
int sample_signal() noexcept;

}  // namespace uprobe::detail
