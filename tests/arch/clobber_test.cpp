// SPDX-License-Identifier: MIT
// arch::analyze_clobbers() on hand-written functions (clobber_fixtures.S):
// what legacy SSE code can write (xmm0 .. xmmN, direct callees and both ways
// of a branch included, a loop read once, pcmpistrm's implicit xmm0, a
// frame with a frame pointer), and every kind of code it must refuse to
// vouch for (VEX, vzeroupper, EVEX, x87, MMX, ldmxcsr, fxrstor, an indirect
// call or jump, one in a callee, a callee it cannot read, ud2 and int3, a REX
// before a legacy prefix hiding VEX/x87/MMX, a retpoline thunk's store over
// its return address, `push; ret`, a return with the stack unbalanced); and
// on C++ compiled here.

#include <gtest/gtest.h>

#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "arch.hpp"

extern "C" {
void cl_int_only();
void cl_sse_0_2_5();
void cl_stmxcsr();
void cl_syscall();
void cl_callee_xmm9();
void cl_calls();
void cl_tail();
void cl_branches();
void cl_loop();
void cl_pcmpistrm();
void cl_ud2_path();
void cl_vex();
void cl_vzeroupper();
void cl_evex();
void cl_x87();
void cl_mmx();
void cl_ldmxcsr();
void cl_fxrstor();
void cl_indirect_call();
void cl_indirect_jmp();
void cl_behind_indirect();
void cl_unreadable_callee();
void cl_int3();
void cl_rex_before_prefix_vex();
void cl_rex_before_prefix_fldcw();
void cl_rex_before_prefix_emms();
void cl_retpoline_call();
void cl_push_ret();
void cl_frame();
void cl_frame_slot_write();
void cl_unbalanced();
}

namespace {

using uprobe::arch::Clobbers;

/// This process's memory by process_vm_readv (0 where unreadable).
std::size_t read_self(std::uint64_t addr, std::uint8_t* out, std::size_t n) {
  iovec local{out, n}, remote{reinterpret_cast<void*>(addr), n};
  const ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  return got > 0 ? static_cast<std::size_t>(got) : 0;
}

Clobbers of(void (*f)()) {
  return uprobe::arch::analyze_clobbers({reinterpret_cast<const void*>(f)}, read_self);
}

std::string str(const Clobbers& c) { return c.known ? "xmm " + std::to_string(c.xmm) : "unknown"; }

TEST(Clobbers, LegacySseCodeNamesTheXmmRegistersItMayWrite) {
  EXPECT_EQ(str(of(cl_int_only)), "xmm 0");
  EXPECT_EQ(str(of(cl_sse_0_2_5)), "xmm 6");
  EXPECT_EQ(str(of(cl_stmxcsr)), "xmm 0");
  EXPECT_EQ(str(of(cl_syscall)), "xmm 0");
  EXPECT_EQ(str(of(cl_calls)), "xmm 10");
  EXPECT_EQ(str(of(cl_tail)), "xmm 10");
  EXPECT_EQ(str(of(cl_branches)), "xmm 8");
  EXPECT_EQ(str(of(cl_loop)), "xmm 2");
  EXPECT_EQ(str(of(cl_pcmpistrm)), "xmm 3");
  EXPECT_EQ(str(of(cl_frame)), "xmm 3");
}

TEST(Clobbers, AnythingElseIsUnknown) {
  EXPECT_EQ(str(of(cl_vex)), "unknown");
  EXPECT_EQ(str(of(cl_vzeroupper)), "unknown");
  EXPECT_EQ(str(of(cl_evex)), "unknown");
  EXPECT_EQ(str(of(cl_x87)), "unknown");
  EXPECT_EQ(str(of(cl_mmx)), "unknown");
  EXPECT_EQ(str(of(cl_ldmxcsr)), "unknown");
  EXPECT_EQ(str(of(cl_fxrstor)), "unknown");
  EXPECT_EQ(str(of(cl_indirect_call)), "unknown");
  EXPECT_EQ(str(of(cl_indirect_jmp)), "unknown");
  EXPECT_EQ(str(of(cl_behind_indirect)), "unknown");
  EXPECT_EQ(str(of(cl_ud2_path)), "unknown");
  EXPECT_EQ(str(of(cl_int3)), "unknown");
  EXPECT_EQ(str(of(cl_rex_before_prefix_vex)), "unknown");
  EXPECT_EQ(str(of(cl_rex_before_prefix_fldcw)), "unknown");
  EXPECT_EQ(str(of(cl_rex_before_prefix_emms)), "unknown");
  EXPECT_EQ(str(of(cl_retpoline_call)), "unknown");
  EXPECT_EQ(str(of(cl_push_ret)), "unknown");
  EXPECT_EQ(str(of(cl_frame_slot_write)), "unknown");
  EXPECT_EQ(str(of(cl_unbalanced)), "unknown");
  EXPECT_EQ(str(uprobe::arch::analyze_clobbers({nullptr}, read_self)), "unknown");
}

TEST(Clobbers, ACalleeItCannotReadIsUnknown) {
  const auto callee = reinterpret_cast<std::uint64_t>(&cl_callee_xmm9);
  auto reader = [callee](std::uint64_t addr, std::uint8_t* out, std::size_t n) -> std::size_t {
    return addr == callee ? 0 : read_self(addr, out, n);
  };
  EXPECT_EQ(str(uprobe::arch::analyze_clobbers({reinterpret_cast<const void*>(&cl_unreadable_callee)}, reader)),
            "unknown");
  EXPECT_EQ(str(of(cl_unreadable_callee)), "xmm 10");  // (read normally)
}

TEST(Clobbers, SeveralEntryPointsAddUp) {
  EXPECT_EQ(str(uprobe::arch::analyze_clobbers(
                {reinterpret_cast<const void*>(&cl_loop), reinterpret_cast<const void*>(&cl_sse_0_2_5)}, read_self)),
            "xmm 6");
  EXPECT_EQ(str(uprobe::arch::analyze_clobbers(
                {reinterpret_cast<const void*>(&cl_loop), reinterpret_cast<const void*>(&cl_vex)}, read_self)),
            "unknown");
}

// Code the compiler made (this file: x86-64 baseline, legacy SSE): a double
// computation reads as known (unless a sanitizer's calls are in it).
__attribute__((noinline)) double half_plus_one(double x) { return x * 0.5 + 1.0; }

TEST(Clobbers, CompiledDoubleArithmetic) {
  const Clobbers c = uprobe::arch::analyze_clobbers({reinterpret_cast<const void*>(&half_plus_one)}, read_self);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  (void)c;
  GTEST_SKIP() << "sanitizer build";
#else
  ASSERT_TRUE(c.known);
  EXPECT_GE(c.xmm, 1u);
  EXPECT_LE(c.xmm, 2u);
  EXPECT_EQ(half_plus_one(4.0), 3.0);
#endif
}

}  // namespace
