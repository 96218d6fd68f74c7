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

#include <cstddef>
#include <cstdint>

extern "C" {
/// The calling thread's SIGTRAP bit as the program sees its own mask: 1 when
/// the program asked for SIGTRAP blocked (it never is for real). Initial-exec
/// TLS, defined in src/interpose/masks.cpp, read by arch/x86_64/context.S
/// (getcontext(), __sigsetjmp()) and by the SIGTRAP handler, which keeps a
/// consumer's change from outliving it (as sigreturn restores the mask).
extern __thread unsigned char uprobe_view_blocked __attribute__((tls_model("initial-exec")));
}

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
