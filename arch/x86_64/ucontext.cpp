// SPDX-License-Identifier: MIT
/// @file ucontext.cpp
/// Regs <-> signal ucontext (uc_mcontext.gregs). Async-signal-safe.

#include <cstddef>
#include <cstring>

#include "arch.hpp"
#include "context_layout.h"

#include <setjmp.h>

// The offsets interpose/context.S uses (context_layout.h).
static_assert(offsetof(ucontext_t, uc_mcontext.gregs) + 8 * REG_RDI == UPROBE_UC_RDI);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs) + 8 * REG_RSP == UPROBE_UC_RSP);
static_assert(offsetof(ucontext_t, uc_mcontext.gregs) + 8 * REG_RIP == UPROBE_UC_RIP);
static_assert(offsetof(ucontext_t, uc_sigmask) == UPROBE_UC_SIGMASK);
static_assert(offsetof(struct __jmp_buf_tag, __saved_mask) + 15 * sizeof(unsigned long) == UPROBE_JB_MARK);
static_assert(sizeof(sigset_t) == 16 * sizeof(unsigned long));
static_assert(UPROBE_SIGTRAP_BIT == 1ul << (SIGTRAP - 1));

namespace uprobe::arch {
namespace {

/// The rflags bits a handler may change: CF PF AF ZF SF TF DF OF.
constexpr std::uint64_t kUserFlags = kHandlerFlags;

struct Map {
  std::uint64_t Regs::*field;
  int greg;
};

constexpr Map kMap[] = {
    {&Regs::r8, REG_R8},   {&Regs::r9, REG_R9},   {&Regs::r10, REG_R10}, {&Regs::r11, REG_R11},
    {&Regs::r12, REG_R12}, {&Regs::r13, REG_R13}, {&Regs::r14, REG_R14}, {&Regs::r15, REG_R15},
    {&Regs::rdi, REG_RDI}, {&Regs::rsi, REG_RSI}, {&Regs::rbp, REG_RBP}, {&Regs::rbx, REG_RBX},
    {&Regs::rdx, REG_RDX}, {&Regs::rax, REG_RAX}, {&Regs::rcx, REG_RCX}, {&Regs::rsp, REG_RSP},
    {&Regs::rip, REG_RIP},
};

}  // namespace

void regs_from_ucontext(const ucontext_t* uc, Regs& regs) noexcept {
  const greg_t* g = uc->uc_mcontext.gregs;
  for (const Map& m : kMap) regs.*m.field = static_cast<std::uint64_t>(g[m.greg]);
  regs.rflags = static_cast<std::uint64_t>(g[REG_EFL]);
}

void regs_to_ucontext(const Regs& regs, ucontext_t* uc) noexcept {
  greg_t* g = uc->uc_mcontext.gregs;
  for (const Map& m : kMap) g[m.greg] = static_cast<greg_t>(regs.*m.field);
  const auto old = static_cast<std::uint64_t>(g[REG_EFL]);
  g[REG_EFL] = static_cast<greg_t>((old & ~kUserFlags) | (regs.rflags & kUserFlags));
}

void ret_frame_from_ucontext(const ucontext_t* uc, RetFrame& f) noexcept {
  regs_from_ucontext(uc, f.regs);
  f.regs.rip = 0;
  f.regs.rsp = 0;
  f.ret_slot = 0;
  std::memset(f.xmm0, 0, sizeof f.xmm0);
  std::memset(f.xmm1, 0, sizeof f.xmm1);
  if (const auto* fp = uc->uc_mcontext.fpregs) {
    std::memcpy(f.xmm0, &fp->_xmm[0], sizeof f.xmm0);
    std::memcpy(f.xmm1, &fp->_xmm[1], sizeof f.xmm1);
  }
}

void ret_frame_to_ucontext(const RetFrame& f, ucontext_t* uc) noexcept {
  Regs regs = f.regs;
  regs.rsp = ucontext_sp(uc);
  regs.rip = f.ret_slot;
  regs_to_ucontext(regs, uc);
  if (auto* fp = uc->uc_mcontext.fpregs) {
    std::memcpy(&fp->_xmm[0], f.xmm0, sizeof f.xmm0);
    std::memcpy(&fp->_xmm[1], f.xmm1, sizeof f.xmm1);
  }
}

bool ucontext_single_stepping(const ucontext_t* uc) noexcept { return (ucontext_flags(uc) & kTrapFlag) != 0; }

void clear_stored_trap_flag(const ucontext_t* uc) noexcept {
  *reinterpret_cast<std::uint64_t*>(ucontext_sp(uc)) &= ~kTrapFlag;
}

std::uint64_t ucontext_ip(const ucontext_t* uc) noexcept {
  return static_cast<std::uint64_t>(uc->uc_mcontext.gregs[REG_RIP]);
}

void set_ucontext_ip(ucontext_t* uc, std::uint64_t ip) noexcept {
  uc->uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(ip);
}

std::uint64_t ucontext_flags(const ucontext_t* uc) noexcept {
  return static_cast<std::uint64_t>(uc->uc_mcontext.gregs[REG_EFL]);
}

std::uint64_t ucontext_sp(const ucontext_t* uc) noexcept {
  return static_cast<std::uint64_t>(uc->uc_mcontext.gregs[REG_RSP]);
}

std::uint64_t jmpbuf_sp(const void* env) noexcept {
  constexpr int kJbRsp = 6;  // glibc's sysdeps/x86_64/jmpbuf-offsets.h
  const auto* jb = static_cast<const struct __jmp_buf_tag*>(env);
  std::uint64_t v = static_cast<std::uint64_t>(jb->__jmpbuf[kJbRsp]);
  std::uint64_t guard;
  asm("mov %%fs:0x30, %0" : "=r"(guard));  // tcbhead_t.pointer_guard
  v = (v >> 0x11) | (v << (64 - 0x11));
  return v ^ guard;
}

void set_ucontext_flags(ucontext_t* uc, std::uint64_t flags) noexcept {
  uc->uc_mcontext.gregs[REG_EFL] = static_cast<greg_t>(flags);
}

}  // namespace uprobe::arch
