// SPDX-License-Identifier: MIT
// The fuzz build links libuprobe's parsers and its user-memory reads
// (src/hit/user_read.cpp) without the runtime's signal interposition
// (src/interpose/: it would clash with the sanitizers' own handlers). With
// no SIGSEGV/SIGBUS handler of libuprobe's, a read that faults could not be
// resumed: probe_read_user() asks this and reads with process_vm_readv(2)
// instead, as in a process that never enabled fault-safe reads.

namespace uprobe::detail {

bool user_copy_faults_recoverable() noexcept { return false; }

}  // namespace uprobe::detail
