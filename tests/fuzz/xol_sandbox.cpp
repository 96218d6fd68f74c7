// SPDX-License-Identifier: MIT
// The forked sandbox of the differential XOL fuzzer (see xol_sandbox.hpp).
// Compiled without instrumentation: everything the child runs after fork()
// is raw system calls and plain loops.

#include "xol_sandbox.hpp"

#include <asm/prctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace xolfuzz {
namespace {

long raw(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0, long f = 0) {
  long ret;
  register long r10 asm("r10") = d;
  register long r8 asm("r8") = e;
  register long r9 asm("r9") = f;
  asm volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
  return ret;
}

[[noreturn]] void die(int code) {
  for (;;) raw(SYS_exit_group, code);
}

void copy(void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<volatile std::uint8_t*>(dst);
  const auto* s = static_cast<const volatile std::uint8_t*>(src);
  for (std::size_t i = 0; i < n; ++i) d[i] = s[i];
}

// The kernel's struct sigaction (arch/x86/include/uapi/asm/signal.h).
struct KernelSigaction {
  void (*handler)(int, siginfo_t*, void*);
  unsigned long flags;
  void (*restorer)();
  unsigned long mask;
};

extern "C" void xolfuzz_restore_rt();
asm(".text\n"
    ".globl xolfuzz_restore_rt\n"
    ".type xolfuzz_restore_rt,@function\n"
    "xolfuzz_restore_rt:\n"
    "  mov $15, %eax\n"  // rt_sigreturn
    "  syscall\n"
    "  hlt\n"
    ".size xolfuzz_restore_rt, .-xolfuzz_restore_rt\n");

constexpr unsigned long kSaRestorer = 0x04000000;

// The handler's entry: rflags.AC off before any compiled code runs. The
// kernel delivers a signal with the interrupted code's AC (only DF, RF and
// TF are cleared), and a variant that sets AC (the `popf_ac' seed) would then
// fault in the handler on AMD, which checks the alignment of movdqu and
// friends under AC (Intel does not): the nested SIGBUS was recorded as the
// next variant's result. pushfq is an 8-byte store at the 8-byte aligned
// entry rsp; the frame's rflags (what record() compares) keep AC.
extern "C" void xolfuzz_on_signal(int, siginfo_t*, void*);
extern "C" void xolfuzz_on_signal_entry(int, siginfo_t*, void*);
asm(".text\n"
    ".globl xolfuzz_on_signal_entry\n"
    ".type xolfuzz_on_signal_entry,@function\n"
    "xolfuzz_on_signal_entry:\n"
    "  pushfq\n"
    "  andl $~0x40000, (%rsp)\n"
    "  popfq\n"
    "  jmp xolfuzz_on_signal\n"
    ".size xolfuzz_on_signal_entry, .-xolfuzz_on_signal_entry\n");

const Plan* g_plan = nullptr;
Result* g_results = nullptr;
int g_variant = 0;
volatile Stage g_stage = Stage::start;
float g_x87_scratch = 0;  // the operand of the child's first x87 instruction
long g_own_fs = 0, g_own_gs = 0;  // the child's own bases (TLS): instrumented code needs them

// FXSAVE image offsets (Intel SDM vol. 1, 10.5.1).
constexpr std::size_t kFxFcw = 0, kFxFsw = 2, kFxFtw = 4, kFxFop = 6, kFxMxcsr = 24, kFxSt = 32, kFxXmm = 160;
constexpr std::size_t kFxPointersLen = 18;  // FOP, FIP (with FCS), FDP (with FDS): bytes 6..23
constexpr std::size_t kFxSwBytes = 464;     // struct _fpx_sw_bytes (Linux)
constexpr std::uint32_t kFpXstateMagic1 = 0x46505853;
constexpr std::size_t kXstateBv = 512;      // XSAVE header: XSTATE_BV

void load_plan(ucontext_t* uc, std::uint64_t rip) {
  const Plan& p = *g_plan;
  greg_t* g = uc->uc_mcontext.gregs;
  g[REG_R8] = static_cast<greg_t>(p.regs.r8);
  g[REG_R9] = static_cast<greg_t>(p.regs.r9);
  g[REG_R10] = static_cast<greg_t>(p.regs.r10);
  g[REG_R11] = static_cast<greg_t>(p.regs.r11);
  g[REG_R12] = static_cast<greg_t>(p.regs.r12);
  g[REG_R13] = static_cast<greg_t>(p.regs.r13);
  g[REG_R14] = static_cast<greg_t>(p.regs.r14);
  g[REG_R15] = static_cast<greg_t>(p.regs.r15);
  g[REG_RDI] = static_cast<greg_t>(p.regs.rdi);
  g[REG_RSI] = static_cast<greg_t>(p.regs.rsi);
  g[REG_RBP] = static_cast<greg_t>(p.regs.rbp);
  g[REG_RBX] = static_cast<greg_t>(p.regs.rbx);
  g[REG_RDX] = static_cast<greg_t>(p.regs.rdx);
  g[REG_RAX] = static_cast<greg_t>(p.regs.rax);
  g[REG_RCX] = static_cast<greg_t>(p.regs.rcx);
  g[REG_RSP] = static_cast<greg_t>(p.regs.rsp);
  g[REG_RIP] = static_cast<greg_t>(rip);
  g[REG_EFL] = static_cast<greg_t>(p.regs.rflags);
  auto* fx = reinterpret_cast<std::uint8_t*>(uc->uc_mcontext.fpregs);
  if (!fx) die(5);
  const std::uint16_t fcw = 0x37f, zero16 = 0;
  const std::uint32_t mxcsr = 0x1f80;
  copy(fx + kFxFcw, &fcw, 2);
  copy(fx + kFxFsw, &zero16, 2);
  copy(fx + kFxFtw, &zero16, 2);  // abridged tag word: all empty
  // The last x87 instruction's opcode and pointers: zero, not what the
  // previous variant (or the parent) left, since fnsave, fnstenv, fxsave and
  // xsave store them to memory (CI found `fnsave [rax]' differing by them).
  for (std::size_t i = 0; i < kFxPointersLen; ++i) fx[kFxFop + i] = 0;
  copy(fx + kFxMxcsr, &mxcsr, 4);
  for (std::size_t i = 0; i < 8 * 16; ++i) fx[kFxSt + i] = 0;
  copy(fx + kFxXmm, p.xmm, sizeof p.xmm);
  // With an XSAVE frame: x87 and SSE state marked present (else XRSTOR would
  // put them in their init state instead of loading ours), every other
  // component (AVX upper halves, AVX-512, PKRU, ...) in its init state, so that
  // no variant inherits what an earlier one left there.
  std::uint32_t magic;
  copy(&magic, fx + kFxSwBytes, 4);
  if (magic == kFpXstateMagic1) {
    const std::uint64_t bv = 3;
    copy(fx + kXstateBv, &bv, 8);
  }
}

void record(int sig, siginfo_t* si, ucontext_t* uc) {
  Result& r = g_results[g_variant];
  r.stage = g_stage;
  r.sig = sig;
  r.code = si->si_code;
  r.addr = reinterpret_cast<std::uint64_t>(si->si_addr);
  copy(r.gregs, uc->uc_mcontext.gregs, sizeof r.gregs);
  if (uc->uc_mcontext.fpregs) copy(r.fx, uc->uc_mcontext.fpregs, sizeof r.fx);
  std::size_t at = 0;
  for (int i = 0; i < g_plan->npages; ++i) {
    const Page& pg = g_plan->pages[i];
    if (!(pg.prot & PROT_WRITE) || at + kPage > kMaxWritable) continue;
    copy(r.mem + at, reinterpret_cast<const void*>(pg.addr), kPage);
    at += kPage;
  }
  r.done = 1;
}

/// Puts the plan's bytes back into every writable page.
void reset_memory() {
  for (int i = 0; i < g_plan->npages; ++i) {
    const Page& pg = g_plan->pages[i];
    if (pg.prot & PROT_WRITE) copy(reinterpret_cast<void*>(pg.addr), pg.bytes, kPage);
  }
}

void arm_timer() {
  struct itimerval t{};
  t.it_value.tv_usec = 250000;
  raw(SYS_setitimer, ITIMER_REAL, reinterpret_cast<long>(&t), 0);
}

/// Turns the signal context `uc` into the start of variant g_variant.
void begin_variant(ucontext_t* uc) {
  const Plan::Variant& v = g_plan->variants[g_variant];
  load_plan(uc, v.rip);
  if (v.emulate) {
    uprobe::Regs regs;
    uprobe::arch::regs_from_ucontext(uc, regs);
    g_stage = Stage::emulating;
    const bool ok = uprobe::arch::emulate(*v.emulate, regs.rip, regs);
    if (!ok) die(6);
    uprobe::arch::regs_to_ucontext(regs, uc);
  }
  if (raw(SYS_arch_prctl, ARCH_SET_FS, static_cast<long>(g_plan->fs_base)) != 0) die(7);
  if (raw(SYS_arch_prctl, ARCH_SET_GS, static_cast<long>(g_plan->gs_base)) != 0) die(7);
  arm_timer();
  g_stage = Stage::running;
}

}  // namespace
}  // namespace xolfuzz

extern "C" void xolfuzz_on_signal(int sig, siginfo_t* si, void* ctx) {
  using namespace xolfuzz;
  auto* uc = static_cast<ucontext_t*>(ctx);
  if (g_stage == Stage::start) {
    if (sig != SIGTRAP) die(9);
    begin_variant(uc);
    return;
  }
  // The end of a variant (possibly a fault inside emulate(), whose frame is
  // abandoned: the next variant starts from this context).
  record(sig, si, uc);
  if (++g_variant == g_plan->nvariants) die(0);
  raw(SYS_arch_prctl, ARCH_SET_FS, g_own_fs);
  raw(SYS_arch_prctl, ARCH_SET_GS, g_own_gs);
  reset_memory();
  begin_variant(uc);
}

namespace xolfuzz {
namespace {

[[noreturn]] void child(const Plan& plan, Result* results, int first) {
  g_plan = &plan;
  g_results = results;
  g_variant = first;
  g_stage = Stage::start;
  if (raw(SYS_arch_prctl, ARCH_GET_FS, reinterpret_cast<long>(&g_own_fs)) != 0) die(4);
  if (raw(SYS_arch_prctl, ARCH_GET_GS, reinterpret_cast<long>(&g_own_gs)) != 0) die(4);
  for (int i = 0; i < plan.npages; ++i) {
    const Page& pg = plan.pages[i];
    long a = raw(SYS_mmap, static_cast<long>(pg.addr), kPage, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (a != static_cast<long>(pg.addr)) die(3);
    copy(reinterpret_cast<void*>(pg.addr), pg.bytes, kPage);
    if (raw(SYS_mprotect, a, kPage, pg.prot) != 0) die(3);
  }
  constexpr std::size_t kAltSize = 256 * 1024;
  long alt = raw(SYS_mmap, 0, kAltSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (alt < 0 && alt > -4096) die(4);
  stack_t ss{};
  ss.ss_sp = reinterpret_cast<void*>(alt);
  ss.ss_size = kAltSize;
  if (raw(SYS_sigaltstack, reinterpret_cast<long>(&ss), 0) != 0) die(4);
  KernelSigaction ka{};
  ka.handler = xolfuzz_on_signal_entry;
  ka.flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER | kSaRestorer;
  ka.restorer = xolfuzz_restore_rt;
  ka.mask = 0;
  for (int s : {SIGTRAP, SIGSEGV, SIGBUS, SIGILL, SIGFPE})
    if (raw(SYS_rt_sigaction, s, reinterpret_cast<long>(&ka), 0, 8) != 0) die(4);
  KernelSigaction dfl{};  // SIGALRM (the timeout) kills: not libFuzzer's inherited handler
  dfl.handler = nullptr;
  if (raw(SYS_rt_sigaction, SIGALRM, reinterpret_cast<long>(&dfl), 0, 8) != 0) die(4);
  unsigned long none = 0;
  raw(SYS_rt_sigprocmask, SIG_SETMASK, reinterpret_cast<long>(&none), 0, 8);
  // A non-control x87 instruction first: the x87 last-instruction and
  // last-operand pointers (FIP, FDP, FOP) are then not zero when variant 0
  // starts, so a variant that inherited them from the one before it (they
  // are not part of the plan's state unless load_plan() sets them) would be
  // caught by any instruction storing them (fnsave, fnstenv, fxsave, xsave).
  asm volatile("fldz\n\tfstps %0" : "=m"(g_x87_scratch));
  asm volatile("int3" ::: "memory");
  die(8);  // the handler never returns here
}

}  // namespace

void run(const Plan& plan, Result* results, Outcome* out) {
  for (int k = 0; k < plan.nvariants; ++k) {
    results[k].done = 0;
    results[k].stage = Stage::start;
    results[k].sig = results[k].code = 0;
  }
  int first = 0;
  while (first < plan.nvariants) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (int k = first; k < plan.nvariants; ++k) out[k] = Outcome::setup_failed;
      return;
    }
    if (pid == 0) child(plan, results, first);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0) {
      if (errno != EINTR) break;
    }
    int k = first;
    while (k < plan.nvariants && results[k].done) out[k++] = Outcome::signal;
    if (k == plan.nvariants) return;
    const bool exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    // Variant k did not finish: a timeout (then go on with the next one in a
    // new child), or a failure to set up (or an unexpected exit) for the rest.
    if (!exited_ok && WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
      out[k] = Outcome::timeout;
      first = k + 1;
      continue;
    }
    for (; k < plan.nvariants; ++k) out[k] = Outcome::setup_failed;
    return;
  }
}

}  // namespace xolfuzz
