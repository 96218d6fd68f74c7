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

const Plan* g_plan = nullptr;
Result* g_result = nullptr;
volatile Stage g_stage = Stage::start;

// FXSAVE image offsets (Intel SDM vol. 1, 10.5.1).
constexpr std::size_t kFxFcw = 0, kFxFsw = 2, kFxFtw = 4, kFxMxcsr = 24, kFxSt = 32, kFxXmm = 160;
constexpr std::size_t kFxSwBytes = 464;     // struct _fpx_sw_bytes (Linux)
constexpr std::uint32_t kFpXstateMagic1 = 0x46505853;
constexpr std::size_t kXstateBv = 512;      // XSAVE header: XSTATE_BV

void load_plan(ucontext_t* uc) {
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
  g[REG_RIP] = static_cast<greg_t>(p.regs.rip);
  g[REG_EFL] = static_cast<greg_t>(p.regs.rflags);
  auto* fx = reinterpret_cast<std::uint8_t*>(uc->uc_mcontext.fpregs);
  if (!fx) die(5);
  const std::uint16_t fcw = 0x37f, zero16 = 0;
  const std::uint32_t mxcsr = 0x1f80;
  copy(fx + kFxFcw, &fcw, 2);
  copy(fx + kFxFsw, &zero16, 2);
  copy(fx + kFxFtw, &zero16, 2);  // abridged tag word: all empty
  copy(fx + kFxMxcsr, &mxcsr, 4);
  for (std::size_t i = 0; i < 8 * 16; ++i) fx[kFxSt + i] = 0;
  copy(fx + kFxXmm, p.xmm, sizeof p.xmm);
  // With an XSAVE frame, x87 and SSE state must be marked present, or
  // XRSTOR would put them in their init state instead of loading ours.
  std::uint32_t magic;
  copy(&magic, fx + kFxSwBytes, 4);
  if (magic == kFpXstateMagic1) {
    std::uint64_t bv;
    copy(&bv, fx + kXstateBv, 8);
    bv |= 3;
    copy(fx + kXstateBv, &bv, 8);
  }
}

void record(int sig, siginfo_t* si, ucontext_t* uc) {
  Result& r = *g_result;
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

void on_signal(int sig, siginfo_t* si, void* ctx) {
  auto* uc = static_cast<ucontext_t*>(ctx);
  if (g_stage == Stage::start && sig == SIGTRAP) {
    load_plan(uc);
    if (g_plan->emulate) {
      uprobe::Regs regs;
      uprobe::arch::regs_from_ucontext(uc, regs);
      g_stage = Stage::emulating;
      const bool ok = uprobe::arch::emulate(*g_plan->emulate, regs.rip, regs);
      if (!ok) die(6);
      uprobe::arch::regs_to_ucontext(regs, uc);
    }
    if (raw(SYS_arch_prctl, ARCH_SET_FS, static_cast<long>(g_plan->fs_base)) != 0) die(7);
    if (raw(SYS_arch_prctl, ARCH_SET_GS, static_cast<long>(g_plan->gs_base)) != 0) die(7);
    g_stage = Stage::running;
    return;
  }
  record(sig, si, uc);
  die(0);
}

[[noreturn]] void child(const Plan& plan, Result* result) {
  g_plan = &plan;
  g_result = result;
  g_stage = Stage::start;
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
  ka.handler = on_signal;
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
  struct itimerval t{};
  t.it_value.tv_usec = 250000;
  raw(SYS_setitimer, ITIMER_REAL, reinterpret_cast<long>(&t), 0);
  asm volatile("int3" ::: "memory");
  die(8);  // the handler never returns here
}

}  // namespace

Outcome run(const Plan& plan, Result* shared) {
  shared->done = 0;
  shared->stage = Stage::start;
  shared->sig = shared->code = 0;
  const pid_t pid = ::fork();
  if (pid < 0) return Outcome::setup_failed;
  if (pid == 0) child(plan, shared);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Outcome::setup_failed;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && shared->done) return Outcome::signal;
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) return Outcome::timeout;
  return Outcome::setup_failed;
}

}  // namespace xolfuzz
