// SPDX-License-Identifier: MIT
/// @file fixtures.cpp
/// Asm thunks and code pages for the arch tests.

#include "fixtures.hpp"

#include <sys/mman.h>

#include <cstring>

asm(R"(
    .text
    .globl uprobe_test_call
    .type uprobe_test_call, @function
uprobe_test_call:
    mov %rsi, %rax
    call *%rdi
    ret
    .size uprobe_test_call, .-uprobe_test_call

    .globl uprobe_test_branch
    .type uprobe_test_branch, @function
uprobe_test_branch:
    mov %rcx, %r8
    mov %rdx, %rcx
    push %rsi
    popfq
    mov $0, %eax
    call *%rdi
    mov %rcx, (%r8)
    ret
    .size uprobe_test_branch, .-uprobe_test_branch

    .globl uprobe_test_call_ac
    .type uprobe_test_call_ac, @function
uprobe_test_call_ac:
    pushfq
    orl $0x40000, (%rsp)
    popfq
    mov %rsi, %rax
    call *%rdi
    pushfq
    andl $~0x40000, (%rsp)
    popfq
    ret
    .size uprobe_test_call_ac, .-uprobe_test_call_ac

    .globl uprobe_test_body
    .type uprobe_test_body, @function
uprobe_test_body:
    .byte 0xf3, 0x0f, 0x1e, 0xfa        # 0: endbr64
    .byte 0x55                          # 4: push rbp
    .byte 0x48, 0x89, 0xe5              # 5: mov rbp, rsp
    .byte 0x0f, 0x1f, 0x44, 0x00, 0x00  # 8: nop dword ptr [rax + rax]
    .byte 0xb8, 0x2a, 0x00, 0x00, 0x00  # 13: mov eax, 0x2a
    .byte 0x5d                          # 18: pop rbp
    .byte 0xc3                          # 19: ret
    .globl uprobe_test_body_end
uprobe_test_body_end:
    .size uprobe_test_body, .-uprobe_test_body
)");

namespace uprobe::test {

CodePage::CodePage(std::uint64_t hint) {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (hint != 0) flags |= MAP_FIXED_NOREPLACE;
  void* p = mmap(reinterpret_cast<void*>(hint), kSize, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return;
  if (hint != 0 && reinterpret_cast<std::uint64_t>(p) != hint) {  // pre-4.17 kernel: a hint
    munmap(p, kSize);
    return;
  }
  base_ = p;
  std::memset(base_, 0xcc, kSize);
}

CodePage::~CodePage() {
  if (base_ != nullptr) munmap(base_, kSize);
}

void CodePage::write(std::size_t at, const std::vector<std::uint8_t>& bytes) {
  write(at, bytes.data(), bytes.size());
}

void CodePage::write(std::size_t at, const std::uint8_t* bytes, std::size_t n) {
  std::memcpy(data() + at, bytes, n);
}

bool CodePage::seal() { return mprotect(base_, kSize, PROT_READ | PROT_EXEC) == 0; }

std::uint64_t find_free_near(std::uint64_t near, std::uint64_t min_distance,
                             std::uint64_t max_distance) {
  constexpr std::uint64_t kStep = 16ull << 20;
  const std::uint64_t base = near & ~(CodePage::kSize - 1);
  for (std::uint64_t d = min_distance; d + CodePage::kSize <= max_distance; d += kStep) {
    for (int sign = 0; sign < 2; ++sign) {
      const std::uint64_t at = sign == 0 ? base + d : base - d;
      if (at < (1ull << 20) || at >= (1ull << 47) - CodePage::kSize) continue;
      void* p = mmap(reinterpret_cast<void*>(at), CodePage::kSize, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      if (p == MAP_FAILED) continue;
      munmap(p, CodePage::kSize);
      if (reinterpret_cast<std::uint64_t>(p) == at) return at;
    }
  }
  return 0;
}

}  // namespace uprobe::test
