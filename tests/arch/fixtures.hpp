// SPDX-License-Identifier: MIT
#pragma once
/// @file fixtures.hpp
/// Shared helpers of the arch tests: asm thunks that run generated code, and
/// code pages that are written RW and then sealed R-X (never RWX).

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" {
/// Calls `code` with rax = rax_in; returns rax after it returns.
std::uint64_t uprobe_test_call(const void* code, std::uint64_t rax_in);
/// uprobe_test_call() with rflags.AC (alignment check) set around the call:
/// an unaligned data access in `code` raises SIGBUS. Clears AC on return.
std::uint64_t uprobe_test_call_ac(const void* code, std::uint64_t rax_in);
/// Sets rflags (arithmetic bits only) and rcx, zeroes eax without touching the
/// flags, calls `code`; stores rcx after the call in *rcx_out and returns rax.
std::uint64_t uprobe_test_branch(const void* code, std::uint64_t rflags, std::uint64_t rcx_in,
                                 std::uint64_t* rcx_out);
/// A known function body: endbr64; push rbp; mov rbp, rsp; nopl 0(rax,rax);
/// mov eax, 42; pop rbp; ret.
int uprobe_test_body(void);
extern const std::uint8_t uprobe_test_body_end[];
}

namespace uprobe::test {

/// One page mapped RW (at `hint` exactly when non-zero), then sealed R-X.
class CodePage {
 public:
  static constexpr std::size_t kSize = 4096;
  explicit CodePage(std::uint64_t hint = 0);
  ~CodePage();
  CodePage(const CodePage&) = delete;
  CodePage& operator=(const CodePage&) = delete;

  bool ok() const { return base_ != nullptr; }
  std::uint64_t addr() const { return reinterpret_cast<std::uint64_t>(base_); }
  std::uint8_t* data() { return static_cast<std::uint8_t*>(base_); }
  /// Copies `bytes` to offset `at` (page must not be sealed yet).
  void write(std::size_t at, const std::vector<std::uint8_t>& bytes);
  void write(std::size_t at, const std::uint8_t* bytes, std::size_t n);
  /// mprotect R-X; returns false on failure.
  bool seal();

 private:
  void* base_ = nullptr;
};

/// A free page-aligned address at least `min_distance` and less than
/// `max_distance` bytes from `near` (probed with MAP_FIXED_NOREPLACE, then
/// released); 0 if none.
std::uint64_t find_free_near(std::uint64_t near, std::uint64_t min_distance,
                             std::uint64_t max_distance);

}  // namespace uprobe::test
