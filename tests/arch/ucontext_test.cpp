// SPDX-License-Identifier: MIT
/// @file ucontext_test.cpp
/// ucontext <-> Regs mapping and rflags masking, on a synthetic ucontext and
/// on the real one of a SIGTRAP.

#include <gtest/gtest.h>

#include <csetjmp>
#include <csignal>
#include <cstring>

#include "arch.hpp"

namespace uprobe::arch {
namespace {

/// A ucontext whose every greg is distinct (gregs[i] = 0x1000 * (i + 1) + i).
ucontext_t filled_ucontext() {
  ucontext_t uc;
  std::memset(&uc, 0, sizeof uc);
  for (int i = 0; i < NGREG; ++i) uc.uc_mcontext.gregs[i] = 0x1000 * (i + 1) + i;
  return uc;
}

TEST(Ucontext, RegsFromUcontextMapsEveryField) {
  const ucontext_t uc = filled_ucontext();
  const greg_t* g = uc.uc_mcontext.gregs;
  Regs r{};
  regs_from_ucontext(&uc, r);
  EXPECT_EQ(r.r8, static_cast<std::uint64_t>(g[REG_R8]));
  EXPECT_EQ(r.r9, static_cast<std::uint64_t>(g[REG_R9]));
  EXPECT_EQ(r.r10, static_cast<std::uint64_t>(g[REG_R10]));
  EXPECT_EQ(r.r11, static_cast<std::uint64_t>(g[REG_R11]));
  EXPECT_EQ(r.r12, static_cast<std::uint64_t>(g[REG_R12]));
  EXPECT_EQ(r.r13, static_cast<std::uint64_t>(g[REG_R13]));
  EXPECT_EQ(r.r14, static_cast<std::uint64_t>(g[REG_R14]));
  EXPECT_EQ(r.r15, static_cast<std::uint64_t>(g[REG_R15]));
  EXPECT_EQ(r.rdi, static_cast<std::uint64_t>(g[REG_RDI]));
  EXPECT_EQ(r.rsi, static_cast<std::uint64_t>(g[REG_RSI]));
  EXPECT_EQ(r.rbp, static_cast<std::uint64_t>(g[REG_RBP]));
  EXPECT_EQ(r.rbx, static_cast<std::uint64_t>(g[REG_RBX]));
  EXPECT_EQ(r.rdx, static_cast<std::uint64_t>(g[REG_RDX]));
  EXPECT_EQ(r.rax, static_cast<std::uint64_t>(g[REG_RAX]));
  EXPECT_EQ(r.rcx, static_cast<std::uint64_t>(g[REG_RCX]));
  EXPECT_EQ(r.rsp, static_cast<std::uint64_t>(g[REG_RSP]));
  EXPECT_EQ(r.rip, static_cast<std::uint64_t>(g[REG_RIP]));
  EXPECT_EQ(r.rflags, static_cast<std::uint64_t>(g[REG_EFL]));
  // Concrete values, in case the REG_* indices were mixed up consistently.
  EXPECT_EQ(r.r8, 0x1000u * 1 + 0);     // REG_R8 == 0
  EXPECT_EQ(r.rip, 0x1000u * 17 + 16);  // REG_RIP == 16
  EXPECT_EQ(r.rflags, 0x1000u * 18 + 17);
  EXPECT_EQ(r.rsp, 0x1000u * 16 + 15);
}

TEST(Ucontext, RoundTripKeepsEverything) {
  ucontext_t uc = filled_ucontext();
  // A realistic rflags: IF, reserved bit 1, ZF PF.
  uc.uc_mcontext.gregs[REG_EFL] = 0x246;
  const ucontext_t before = uc;
  Regs r{};
  regs_from_ucontext(&uc, r);
  regs_to_ucontext(r, &uc);
  EXPECT_EQ(0, std::memcmp(&uc, &before, sizeof uc));
}

TEST(Ucontext, RegsToUcontextWritesGprsRipRspOnly) {
  ucontext_t uc = filled_ucontext();
  const ucontext_t before = uc;
  Regs r{};
  regs_from_ucontext(&uc, r);
  r.rax = 0xaaaa;
  r.r15 = 0xf15f15;
  r.rsp = 0x7ffc'0000'1000ull;
  r.rip = 0x4011'22ull;
  regs_to_ucontext(r, &uc);
  const greg_t* g = uc.uc_mcontext.gregs;
  EXPECT_EQ(g[REG_RAX], 0xaaaa);
  EXPECT_EQ(g[REG_R15], 0xf15f15);
  EXPECT_EQ(g[REG_RSP], 0x7ffc'0000'1000ll);
  EXPECT_EQ(g[REG_RIP], 0x4011'22ll);
  // The segment/err/trapno/oldmask/cr2 slots are untouched.
  for (int i : {REG_CSGSFS, REG_ERR, REG_TRAPNO, REG_OLDMASK, REG_CR2})
    EXPECT_EQ(g[i], before.uc_mcontext.gregs[i]) << i;
  EXPECT_EQ(0, std::memcmp(&uc.uc_mcontext.fpregs, &before.uc_mcontext.fpregs,
                           sizeof uc.uc_mcontext.fpregs));
}

TEST(Ucontext, FlagsMaskedToArithmeticDirectionTrap) {
  ucontext_t uc = filled_ucontext();
  Regs r{};
  regs_from_ucontext(&uc, r);
  // Handler sets every bit: only CF PF AF ZF SF TF DF OF may change.
  uc.uc_mcontext.gregs[REG_EFL] = 0x0000'0202;  // IF + reserved
  r.rflags = ~0ull;
  regs_to_ucontext(r, &uc);
  EXPECT_EQ(uc.uc_mcontext.gregs[REG_EFL], 0x0202 | 0x0dd5);
  // Handler clears every bit: IF, AC, ID and the reserved bit stay.
  uc.uc_mcontext.gregs[REG_EFL] = 0x0024'0ed7;  // ID AC OF DF IF SF ZF AF PF CF + bit 1
  r.rflags = 0;
  regs_to_ucontext(r, &uc);
  EXPECT_EQ(uc.uc_mcontext.gregs[REG_EFL], 0x0024'0202);
  // Individual bits go through.
  for (std::uint64_t bit :
       {0x1ull, 0x4ull, 0x10ull, 0x40ull, 0x80ull, 0x100ull, 0x400ull, 0x800ull}) {
    uc.uc_mcontext.gregs[REG_EFL] = 0x202;
    r.rflags = bit;
    regs_to_ucontext(r, &uc);
    EXPECT_EQ(static_cast<std::uint64_t>(uc.uc_mcontext.gregs[REG_EFL]), 0x202 | bit) << bit;
  }
  // Bits outside the mask do not.
  for (std::uint64_t bit :
       {0x2ull, 0x200ull, 0x1000ull, 0x4000ull, 0x1'0000ull, 0x4'0000ull, 0x20'0000ull}) {
    uc.uc_mcontext.gregs[REG_EFL] = 0;
    r.rflags = bit;
    regs_to_ucontext(r, &uc);
    EXPECT_EQ(uc.uc_mcontext.gregs[REG_EFL], 0) << bit;
  }
}

TEST(Ucontext, IpAndFlagsAccessors) {
  ucontext_t uc = filled_ucontext();
  EXPECT_EQ(ucontext_ip(&uc), static_cast<std::uint64_t>(uc.uc_mcontext.gregs[REG_RIP]));
  set_ucontext_ip(&uc, 0x5555'0000'1235ull);
  EXPECT_EQ(uc.uc_mcontext.gregs[REG_RIP], 0x5555'0000'1235ll);
  EXPECT_EQ(ucontext_ip(&uc), 0x5555'0000'1235ull);
  EXPECT_EQ(breakpoint_address(&uc), 0x5555'0000'1234ull);
  set_ucontext_flags(&uc, 0x346);  // raw: TF included, nothing masked
  EXPECT_EQ(uc.uc_mcontext.gregs[REG_EFL], 0x346);
  EXPECT_EQ(ucontext_flags(&uc), 0x346u);
}

/// The sp setjmp() saved (glibc mangles it with the thread's pointer
/// guard), demangled: the caller's stack pointer at the call, which lies
/// between the callee's frame and the caller's; and the same after a
/// longjmp back (the buffer unchanged).
__attribute__((noinline)) std::uint64_t saved_sp_of_this_frame(std::uint64_t* frame) {
  jmp_buf env;
  *frame = reinterpret_cast<std::uint64_t>(__builtin_frame_address(0));
  if (setjmp(env) != 0) return 0;
  return jmpbuf_sp(env);
}

TEST(Ucontext, JmpbufSpIsTheCallersStackPointer) {
  std::uint64_t frame = 0;
  const std::uint64_t sp = saved_sp_of_this_frame(&frame);
  // setjmp saves rsp as it is after its return: in saved_sp_of_this_frame's
  // frame, below its frame pointer, within the frame's few hundred bytes.
  EXPECT_LT(sp, frame);
  EXPECT_GT(sp, frame - 4096);
  EXPECT_EQ(sp % 8, 0u);
  const auto here = reinterpret_cast<std::uint64_t>(__builtin_frame_address(0));
  EXPECT_LT(sp, here);
}

}  // namespace
}  // namespace uprobe::arch
