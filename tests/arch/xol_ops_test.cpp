// SPDX-License-Identifier: MIT
/// @file xol_ops_test.cpp
/// The per-instruction operations (XolOps, the kernel's uprobe_xol_ops) that
/// analyze() chooses: the table each class gets, its emulate against
/// emulate(), and pre_xol/post_xol on a ucontext as the SIGTRAP handler
/// drives them (TF set before the copy; after its step trap: rip, TF and a
/// stored flags word as the program must see them). And plan(): the tactic
/// of the one planning entry point for sites that need no function.

#include <gtest/gtest.h>
#include <ucontext.h>

#include <cstring>
#include <string>
#include <vector>

#include "arch.hpp"
#include "decode.hpp"

namespace uprobe::arch {
namespace {

using Bytes = std::vector<std::uint8_t>;

using uprobe::test::decode;

// Every encoding here: the table analyze() stored is the one xol_ops_for()
// picks, and it says what is_emulated(), xol_safe() and loads_flags() say.
TEST(XolOps, TableAgreesWithTheClassPredicates) {
  const std::vector<Bytes> all = {
      {0x90},                                      // nop
      {0x0f, 0x1f, 0x44, 0x00, 0x00},              // nop5
      {0xf3, 0x0f, 0x1e, 0xfa},                    // endbr64
      {0x55},                                      // push rbp
      {0x41, 0x57},                                // push r15
      {0xeb, 0x10},                                // jmp rel8
      {0xe9, 0x00, 0x01, 0x00, 0x00},              // jmp rel32
      {0xe8, 0x00, 0x01, 0x00, 0x00},              // call rel32
      {0x74, 0x05},                                // je
      {0xe2, 0xfe},                                // loop
      {0xc3},                                      // ret
      {0xc2, 0x10, 0x00},                          // ret 0x10
      {0xff, 0xe0},                                // jmp rax
      {0xff, 0x25, 0x10, 0x00, 0x00, 0x00},        // jmp [rip + 0x10]
      {0xff, 0xd0},                                // call rax
      {0x48, 0x89, 0xe5},                          // mov rbp, rsp
      {0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00},  // mov rax, [rip + 0x100]
      {0x9c},                                      // pushfq
      {0x66, 0x9c},                                // pushfw
      {0x9d},                                      // popfq
      {0xf3, 0xa4},                                // rep movsb
      {0x0f, 0x05},                                // syscall
  };
  for (const Bytes& b : all) {
    const Insn insn = decode(b);
    SCOPED_TRACE(insn.text);
    ASSERT_NE(insn.ops, nullptr);
    EXPECT_EQ(insn.ops, &xol_ops_for(insn));
    EXPECT_EQ(insn.ops->emulate != nullptr, is_emulated(insn));
    EXPECT_EQ(insn.ops->emulate_only, !xol_safe(insn));
    EXPECT_EQ(insn.ops->step_always, loads_flags(insn));
    EXPECT_NE(insn.ops->pre_xol, nullptr);
    EXPECT_NE(insn.ops->post_xol, nullptr);
  }
  EXPECT_EQ(Insn{}.ops, &kDefaultXolOps);
  EXPECT_EQ(kDefaultXolOps.emulate, nullptr);
}

// Each class's emulate does what emulate() does, on the same registers.
TEST(XolOps, EmulateMatchesEmulate) {
  constexpr std::uint64_t kIp = 0x401000;
  alignas(16) std::uint64_t stack[8] = {0, 0, 0, 0, 0x405060, 0, 0, 0};
  const std::vector<Bytes> emulated = {
      {0x90}, {0x55}, {0xeb, 0x10}, {0xe8, 0x00, 0x01, 0x00, 0x00}, {0x74, 0x05}, {0x75, 0x05},
      {0xe2, 0xfe}, {0xc3}, {0xc2, 0x10, 0x00}, {0xff, 0xe0}, {0xff, 0xd0},
  };
  for (const Bytes& b : emulated) {
    const Insn insn = decode(b);
    SCOPED_TRACE(insn.text);
    Regs a{}, e{};
    a.rsp = e.rsp = reinterpret_cast<std::uint64_t>(&stack[4]);
    a.rax = e.rax = 0x402000;
    a.rcx = e.rcx = 3;
    a.rflags = e.rflags = 0x40;  // ZF
    a.rbp = e.rbp = 0x1234;
    ASSERT_NE(insn.ops->emulate, nullptr);
    std::uint64_t saved[8];
    std::memcpy(saved, stack, sizeof stack);
    EXPECT_TRUE(insn.ops->emulate(insn, kIp, a));
    std::uint64_t after_ops[8];
    std::memcpy(after_ops, stack, sizeof stack);
    std::memcpy(stack, saved, sizeof stack);
    EXPECT_TRUE(emulate(insn, kIp, e));
    EXPECT_EQ(std::memcmp(&a, &e, sizeof a), 0);
    EXPECT_EQ(std::memcmp(after_ops, stack, sizeof stack), 0);
    std::memcpy(stack, saved, sizeof stack);
  }
  const Insn mov = decode({0x48, 0x89, 0xe5});
  EXPECT_EQ(mov.ops->emulate, nullptr);
  Regs r{};
  EXPECT_FALSE(emulate(mov, kIp, r));
}

constexpr std::uint64_t kIp = 0x400000, kSlot = 0x9000;

/// A ucontext as the kernel hands a step trap over: ip, sp, flags.
ucontext_t step_trap(std::uint64_t ip, std::uint64_t sp, std::uint64_t flags) {
  ucontext_t uc;
  std::memset(&uc, 0, sizeof uc);
  set_ucontext_ip(&uc, ip);
  uc.uc_mcontext.gregs[REG_RSP] = static_cast<greg_t>(sp);
  set_ucontext_flags(&uc, flags);
  return uc;
}

// A plain copy: pre_xol sets TF and the plan; post_xol ignores a trap
// elsewhere, and at the copy's end continues after the original with our TF
// gone (the program's own TF kept).
TEST(XolOps, PlainCopyStepsOnceAndDropsOurTf) {
  const Insn insn = decode({0x48, 0x89, 0xe5});  // mov rbp, rsp
  Regs regs{};
  regs.rsp = 0x7ff0;
  regs.rip = kSlot;
  regs.rflags = 0x202;
  XolStep step;
  insn.ops->pre_xol(insn, kIp, kSlot, regs, false, step);
  EXPECT_EQ(regs.rflags, 0x302u);
  EXPECT_EQ(regs.rip, kSlot);
  EXPECT_EQ(step.ops, insn.ops);
  EXPECT_EQ(step.plan.ip, kIp);
  EXPECT_EQ(step.plan.slot, kSlot);
  EXPECT_EQ(step.plan.len, 3);
  EXPECT_EQ(step.plan.kind, StepEndKind::next);
  EXPECT_FALSE(step.program_tf);
  EXPECT_FALSE(step.fix_pushf);
  EXPECT_FALSE(step.keep_tf);

  ucontext_t other = step_trap(0x123456, 0x7ff0, 0x302);
  EXPECT_EQ(step.ops->post_xol(step, &other), StepEnd::foreign);
  EXPECT_EQ(ucontext_ip(&other), 0x123456u);
  EXPECT_EQ(ucontext_flags(&other), 0x302u);

  ucontext_t uc = step_trap(kSlot + 3, 0x7ff0, 0x302);
  EXPECT_EQ(step.ops->post_xol(step, &uc), StepEnd::done);
  EXPECT_EQ(ucontext_ip(&uc), kIp + 3);
  EXPECT_EQ(ucontext_flags(&uc), 0x202u);

  // The program stepping itself: its TF stays.
  Regs r2 = regs;
  r2.rflags = 0x302;
  XolStep own;
  insn.ops->pre_xol(insn, kIp, kSlot, r2, true, own);
  EXPECT_TRUE(own.program_tf);
  ucontext_t uc2 = step_trap(kSlot + 3, 0x7ff0, 0x302);
  EXPECT_EQ(own.ops->post_xol(own, &uc2), StepEnd::done);
  EXPECT_EQ(ucontext_ip(&uc2), kIp + 3);
  EXPECT_EQ(ucontext_flags(&uc2), 0x302u);
}

// pushf under our TF stored TF = 1: post_xol clears it in the stored word
// (not when the program's own TF was set: then it is the program's).
TEST(XolOps, PushfClearsOurTfInTheStoredWord) {
  const Insn insn = decode({0x9c});
  EXPECT_FALSE(insn.ops->step_always);
  alignas(8) std::uint64_t stored = 0x346;  // what the copy pushed: TF among ZF, PF, IF
  const std::uint64_t sp = reinterpret_cast<std::uint64_t>(&stored);
  Regs regs{};
  regs.rsp = sp + 8;
  regs.rflags = 0x246;
  XolStep step;
  insn.ops->pre_xol(insn, kIp, kSlot, regs, false, step);
  EXPECT_TRUE(step.fix_pushf);
  EXPECT_FALSE(step.keep_tf);
  ucontext_t uc = step_trap(kSlot + 1, sp, 0x346);
  EXPECT_EQ(step.ops->post_xol(step, &uc), StepEnd::done);
  EXPECT_EQ(ucontext_ip(&uc), kIp + 1);
  EXPECT_EQ(ucontext_flags(&uc), 0x246u);
  EXPECT_EQ(stored, 0x246u);

  stored = 0x346;
  XolStep own;
  insn.ops->pre_xol(insn, kIp, kSlot, regs, true, own);
  EXPECT_FALSE(own.fix_pushf);
  ucontext_t uc2 = step_trap(kSlot + 1, sp, 0x346);
  EXPECT_EQ(own.ops->post_xol(own, &uc2), StepEnd::done);
  EXPECT_EQ(stored, 0x346u);
  EXPECT_EQ(ucontext_flags(&uc2), 0x346u);
}

// popf is always stepped, and TF after it is what it loaded.
TEST(XolOps, PopfKeepsTheTfItLoaded) {
  const Insn insn = decode({0x9d});
  EXPECT_TRUE(insn.ops->step_always);
  Regs regs{};
  regs.rsp = 0x7ff0;
  XolStep step;
  insn.ops->pre_xol(insn, kIp, kSlot, regs, false, step);
  EXPECT_TRUE(step.keep_tf);
  ucontext_t uc = step_trap(kSlot + 1, 0x7ff8, 0x346);  // it loaded TF
  EXPECT_EQ(step.ops->post_xol(step, &uc), StepEnd::done);
  EXPECT_EQ(ucontext_ip(&uc), kIp + 1);
  EXPECT_EQ(ucontext_flags(&uc), 0x346u);
}

// A rep string instruction traps at the slot between iterations: again.
TEST(XolOps, RepStringStepsAgainAtTheSlot) {
  const Insn insn = decode({0xf3, 0xa4});  // rep movsb
  Regs regs{};
  regs.rsp = 0x7ff0;
  XolStep step;
  insn.ops->pre_xol(insn, kIp, kSlot, regs, false, step);
  ucontext_t mid = step_trap(kSlot, 0x7ff0, 0x302);
  EXPECT_EQ(step.ops->post_xol(step, &mid), StepEnd::again);
  EXPECT_EQ(ucontext_ip(&mid), kSlot);
  EXPECT_EQ(ucontext_flags(&mid), 0x302u);
}

TEST(XolOps, UcontextSingleStepping) {
  ucontext_t uc = step_trap(kIp, 0x7ff0, 0x302);
  EXPECT_TRUE(ucontext_single_stepping(&uc));
  set_ucontext_flags(&uc, 0x202);
  EXPECT_FALSE(ucontext_single_stepping(&uc));
}

TEST(HandlerFlags, MergeKeepsTheSystemBits) {
  EXPECT_EQ(kHandlerFlags, 0xdd5u);
  // orig: IF, AC and CF; handled: ZF, TF, DF, plus IF cleared and NT set (ignored).
  EXPECT_EQ(merge_handler_flags(0x40201, 0x4540), 0x40740u);
}

/// A PlanContext with no function: what plan() asks of a site outside any
/// known function, with its file bytes.
struct NoFunction final : PlanContext {
  Bytes bytes;
  int function_calls = 0;
  bool at_function_entry() const override { return false; }
  bool function(std::size_t tail, Function&, std::string& why) override {
    EXPECT_EQ(tail, kJumpLen);
    ++function_calls;
    why = "no function";
    return false;
  }
  bool no_outside_entry(std::size_t, std::string&) override {
    ADD_FAILURE() << "asked with no window";
    return false;
  }
  bool site_bytes(std::uint8_t* out, std::size_t n) override {
    if (bytes.size() < n) return false;
    std::memcpy(out, bytes.data(), n);
    return true;
  }
};

TEST(Plan, TacticsWithoutAFunction) {
  {  // a nop5 is its own window; tactic nop5
    NoFunction ctx;
    ctx.bytes = {0x0f, 0x1f, 0x44, 0x00, 0x00};
    const PatchPlan p = plan(decode(ctx.bytes), ctx);
    EXPECT_EQ(p.tactic, Tactic::nop5);
    EXPECT_EQ(p.window.len, 5);
    EXPECT_EQ(p.why_no_window, "");
    EXPECT_EQ(ctx.function_calls, 0);
  }
  {  // a 7-byte mov: a window of its own (B1)
    NoFunction ctx;
    ctx.bytes = {0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00};
    const PatchPlan p = plan(decode(ctx.bytes), ctx);
    EXPECT_EQ(p.tactic, Tactic::window);
    EXPECT_EQ(p.window.len, 7);
    EXPECT_FALSE(p.window.punned);
  }
  {  // a 3-byte mov followed by bytes: no function, a punned jump (B2)
    NoFunction ctx;
    ctx.bytes = {0x48, 0x89, 0xe5, 0x00, 0x00};
    const PatchPlan p = plan(decode(ctx.bytes), ctx);
    EXPECT_EQ(ctx.function_calls, 1);
    EXPECT_EQ(p.why_no_window, "no function");
    EXPECT_EQ(p.tactic, Tactic::punned);
    EXPECT_TRUE(p.window.punned);
    EXPECT_EQ(p.window.len, 3);
  }
  {  // the same with too few bytes after it: int3, the window's reason kept
    NoFunction ctx;
    ctx.bytes = {0x48, 0x89, 0xe5};
    const PatchPlan p = plan(decode(ctx.bytes), ctx);
    EXPECT_EQ(p.tactic, Tactic::int3);
    EXPECT_EQ(p.window.len, 0);
    EXPECT_EQ(p.why_no_window, "no function");
  }
}

TEST(Plan, IsFiller) {
  const Bytes filler = {0xcc, 0x90, 0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xcc};
  EXPECT_TRUE(is_filler(filler.data(), filler.size()));
  const Bytes code = {0x90, 0xc3};
  EXPECT_FALSE(is_filler(code.data(), code.size()));
}

}  // namespace
}  // namespace uprobe::arch
