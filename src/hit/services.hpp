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

}  // namespace uprobe::detail
