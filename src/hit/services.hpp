// SPDX-License-Identifier: MIT
#pragma once
// What the hit path calls outside src/hit/: every function and variable it
// uses from the attach side and from the interposers is declared here, the
// hit path's own list of needs, and defined there (the file named at each).
// Nothing in src/hit/ includes a header of src/attach/ or src/interpose/;
// those headers include this one for the declarations they implement. Each
// entry is async-signal-safe: it runs in the SIGTRAP handler or on the
// optimized path.

#include <signal.h>

#include "arch.hpp"  // uprobe_view_blocked

#include <cstddef>
#include <cstdint>

// uprobe_view_blocked (the calling thread's SIGTRAP bit as the program sees
// its own mask, defined in src/interpose/masks.cpp) is declared with the
// other core symbols that arch code names, at the end of arch.hpp: the
// SIGTRAP handler keeps a consumer's change to it from outliving the
// consumer (as sigreturn restores the mask).

/// The calling thread's SIGSEGV/SIGBUS mask as libuprobe knows it, for
/// user_copy_faults_recoverable(): kFaultsUnknown (0: ask the kernel),
/// kFaultsOk (neither blocked), kFaultsBlocked. Written where the mask
/// changes through libc (src/interpose/masks.cpp: sigprocmask and its
/// family, handler entry and return, setcontext, longjmp, a vfork child's
/// sigaction) and, for the consumers of an int3 hit, from the trap's
/// ucontext (src/hit/trap.cpp). Initial-exec TLS, zero (unknown) in a new thread.
extern "C" __thread unsigned char uprobe_fault_state __attribute__((tls_model("initial-exec")));

namespace uprobe::detail {
enum : unsigned char { kFaultsUnknown = 0, kFaultsOk = 1, kFaultsBlocked = 2 };

/// The state for a mask (its first word).
constexpr unsigned char fault_state_of(unsigned long mask_word) noexcept {
  return (mask_word & ((1ul << (SIGSEGV - 1)) | (1ul << (SIGBUS - 1)))) ? kFaultsBlocked : kFaultsOk;
}
}  // namespace uprobe::detail

namespace uprobe {
class Uprobe;  // probe.hpp
}  // namespace uprobe

namespace uprobe::detail {

struct SiteSet;  // probe.hpp

/// Reads `len` bytes at `addr` (mapped readable memory): the text as it is
/// now, our breakpoints included (src/attach/patch.cpp). Async-signal-safe.
void peek_text(std::uint64_t addr, std::uint8_t* out, std::size_t len) noexcept;

/// Restores the original bytes at every site of `up` that holds our int3 or
/// our jump (un-optimizing through int3): what a hit does when every
/// consumer said Action::remove, as the kernel's handler_chain() calls
/// unapply_uprobe() (src/attach/sites.cpp). The caller holds up->patch_lock.
/// Async-signal-safe (open/pwrite/membarrier made directly).
void restore_sites(Uprobe* up, const SiteSet& ss) noexcept;

/// Passes a SIGTRAP that is not ours to the program's disposition, as the
/// kernel's do_int3_user() would have (src/interpose/signals.cpp).
/// Async-signal-safe.
void forward_foreign_trap(int sig, siginfo_t* info, void* uc) noexcept;

/// True when the program's SIGTRAP disposition is a handler (not SIG_DFL or
/// SIG_IGN): only then can the program be single-stepping itself, and only
/// then does the SIGTRAP handler hand it the single-step trap of a probed
/// instruction (a TF without a handler is a debugger's, which sees its own
/// traps through ptrace) (src/interpose/signals.cpp). Async-signal-safe.
bool program_handles_sigtrap() noexcept;

/// Sets the calling thread's view bit (uprobe_view_blocked); when it becomes
/// clear, delivers a held SIGTRAP (src/interpose/masks.cpp).
/// Async-signal-safe.
void set_view(bool blocked) noexcept;

/// Whether SIGSEGV and SIGBUS are armed: their faults in arch::copy_user()
/// and copy_user_str() are resumed at the routines' fixup
/// (src/interpose/signals.cpp, arm_user_faults()). Async-signal-safe (a load).
bool user_faults_armed() noexcept;

/// Whether a fault of arch::copy_user() or copy_user_str() on the calling
/// thread now would reach the fixup: armed, and neither SIGSEGV nor SIGBUS
/// blocked in the thread's mask (the kernel kills a process whose
/// synchronous fault finds its signal blocked). From the thread's tracked
/// state (uprobe_fault_state); when it is not known, one rt_sigprocmask(2)
/// asks the kernel, and the answer is kept for the thread
/// (src/interpose/masks.cpp). Async-signal-safe.
bool user_copy_faults_recoverable() noexcept;

}  // namespace uprobe::detail
