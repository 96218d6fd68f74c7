// SPDX-License-Identifier: MIT
#pragma once
/// @file fixtures.hpp
/// Declarations of the assembly fixtures in fixtures.S. Unless noted a
/// fixture is `uint64_t f(uint64_t a, uint64_t b)`; `X_site` is the offset
/// of X's probed instruction.

#include <cstdint>

extern "C" {

using fx_fn = std::uint64_t (*)(std::uint64_t, std::uint64_t);

#define FX_DECL(name)                                   \
  std::uint64_t name(std::uint64_t, std::uint64_t);     \
  extern const std::uint64_t name##_site;

// Emulated classes.
FX_DECL(fx_nop1)
FX_DECL(fx_nop2)
FX_DECL(fx_nop5)
FX_DECL(fx_nop9)
FX_DECL(fx_endbr)
FX_DECL(fx_push_rbp)
FX_DECL(fx_push_r12)
FX_DECL(fx_push_rdi)
FX_DECL(fx_jmp8)
FX_DECL(fx_jmp32)
FX_DECL(fx_jmp8_back)
FX_DECL(fx_call32)
FX_DECL(fx_call32_mid)
FX_DECL(fx_jrcxz)
FX_DECL(fx_jecxz)
FX_DECL(fx_loop)
FX_DECL(fx_loope)
FX_DECL(fx_loopne)
FX_DECL(fx_ret0)
FX_DECL(fx_repret)
FX_DECL(fx_retimm)
FX_DECL(fx_jmp_rax)
FX_DECL(fx_call_rax)
FX_DECL(fx_call_r11)
FX_DECL(fx_jmp_tab)
FX_DECL(fx_call_mem)
std::uint64_t fx_ret0_caller(std::uint64_t, std::uint64_t);
std::uint64_t fx_repret_caller(std::uint64_t, std::uint64_t);
std::uint64_t fx_retimm_caller(std::uint64_t, std::uint64_t);

#define FX_JCC(cc) FX_DECL(fx_jcc8_##cc) FX_DECL(fx_jcc32_##cc)
FX_JCC(o) FX_JCC(no) FX_JCC(b) FX_JCC(ae) FX_JCC(e) FX_JCC(ne) FX_JCC(be) FX_JCC(a)
FX_JCC(s) FX_JCC(ns) FX_JCC(p) FX_JCC(np) FX_JCC(l) FX_JCC(ge) FX_JCC(le) FX_JCC(g)
#undef FX_JCC

// Out-of-line classes.
FX_DECL(fx_movabs)
FX_DECL(fx_mov_r10)
FX_DECL(fx_rip_load)
FX_DECL(fx_rip_store)
FX_DECL(fx_rip_lea)
FX_DECL(fx_rip_cmp)
FX_DECL(fx_call_riprel)
FX_DECL(fx_jmp_riprel)
FX_DECL(fx_movsd_bits)
FX_DECL(fx_addsd_rip)
FX_DECL(fx_movdqu_load)
FX_DECL(fx_movdqu_store)
FX_DECL(fx_movaps_load_rip)
FX_DECL(fx_movaps_store_rip)
FX_DECL(fx_add_imm)
FX_DECL(fx_add_flags)
FX_DECL(fx_imul)
FX_DECL(fx_xchg)
FX_DECL(fx_cmov)
FX_DECL(fx_sub_rsp)
FX_DECL(fx_mov_rsp_rbp)
FX_DECL(fx_xadd)
FX_DECL(fx_movl_imm_rip)
FX_DECL(fx_rip_r9)
FX_DECL(fx_movzb_rip)
FX_DECL(fx_push_rip)
FX_DECL(fx_pushf)
FX_DECL(fx_popf_ac)
FX_DECL(fx_ac_on)
FX_DECL(fx_rep_movsb)
FX_DECL(fx_repne_scasb)
FX_DECL(fx_syscall)
std::uint64_t fx_fp_target(std::uint64_t, std::uint64_t);
std::uint64_t fx_fp2_target(std::uint64_t, std::uint64_t);

// C-03.
double fx_c03_movsd();
const void* fx_c03_lea();
std::uint64_t fx_c03_mov();
std::uint64_t fx_c03_cmp();
std::uint64_t fx_c03_callfp();
std::uint64_t fx_c03_target();

// C-06: add $1,%rdi (4) | mov $0x12345678,%rax (7) | add %rdi,%rax (3) | ret.
std::uint64_t fx_c06(std::uint64_t);

// C-09 and refusals.
std::uint64_t fx_int3();          // int3; mov $0x77,%eax; ret
void fx_undecodable();            // 0x06 (invalid in 64-bit mode); never called

// Register context.
std::uint64_t fx_args(std::uint64_t, std::uint64_t);
std::uint64_t fx_args_caller();   // records rsp in fx_saved_rsp, calls fx_args(11, 22)
extern const std::uint64_t fx_args_caller_site;  // offset of the return address
FX_DECL(fx_ret_rax)
std::uint64_t fx_redir_from(std::uint64_t, std::uint64_t);
std::uint64_t fx_redir_to(std::uint64_t, std::uint64_t);
std::uint64_t fx_allregs_nop();
std::uint64_t fx_allregs_xol();
extern const std::uint64_t fx_allregs_nop_site, fx_allregs_xol_site;
FX_DECL(fx_xmm_keep_nop)
FX_DECL(fx_xmm_keep_xol)
FX_DECL(fx_ymm_keep)
void fx_clobber_xmm();
void fx_clobber_ymm();
FX_DECL(fx_redzone_nop)
FX_DECL(fx_redzone_xol)

// Concurrency targets: fx_conc(a) = 7a + 3, fx_conc2(a) = 5a + 1.
std::uint64_t fx_conc(std::uint64_t, std::uint64_t);
std::uint64_t fx_conc2(std::uint64_t, std::uint64_t);

#undef FX_DECL

// Data.
extern std::uint64_t fx_var, fx_store, fx_flag, fx_ctr;
extern std::uint32_t fx_store32;
extern std::uint64_t fx_vecout[2];
extern std::uint64_t fx_c03_sym, fx_c03_flag;
extern std::uint64_t fx_saved_rsp, fx_redir_count;
extern std::uint64_t fx_regs_out[16];
extern std::uint64_t fx_flags_out;
extern std::uint64_t fx_xmm_out[3];
extern const std::uint64_t fx_vec16[2];
extern const double fx_c325;
extern const std::uint8_t fx_byte;
extern const std::uint64_t fx_rodata_word;
}

/// Address of byte `off` of function `fn`.
inline const void* fx_at(const void* fn, std::uint64_t off) {
  return static_cast<const std::uint8_t*>(fn) + off;
}
template <typename F>
inline const void* fx_addr(F* fn) {
  return reinterpret_cast<const void*>(fn);
}
