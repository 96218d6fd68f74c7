// SPDX-License-Identifier: MIT
// libFuzzer target: the relocator and the emulator, differentially.
//
// An input is an instruction (bytes 0..14) plus the state to run it from
// (byte 15: arithmetic flags and DF; bytes 16..31: one selector per GPR;
// the rest: the fill pattern of memory and the xmm registers). Instructions
// that Capstone decodes and uprobe::arch::analyze() accepts are run in a
// forked sandbox (xol_sandbox.hpp) from the same registers and memory:
//   original  the bytes at their address A (kCode + 0x800), followed by int3;
//   xol       the copy build_xol() makes for a slot B in another page
//             (kSlot), when the runtime would run it out of line
//             (arch::xol_safe()): rip-relative operands re-aimed, absolute
//             jump back to A + len;
//   emulated  arch::emulate() on the signal context in a SIGTRAP handler, as
//             the runtime's trap path does, when the class is emulated;
//   window    the relocated copy build_window_xol() makes of a window of
//             that one instruction in a window slot W (a third page), as an
//             optimized probe runs it after its stub: a punned jump's window
//             (plan_punned(), shorter than the jump) or E9Patch's B1 (the
//             jump fits the instruction: plan_window()), when the planner
//             accepts the instruction as a window's last; jumps and Jcc
//             re-encoded with rel32, calls pushing the original return
//             address, the jump back to A + len.
// Every run must end in the same state as the original: the same signal
// (si_signo, si_code, si_addr), every GPR, rflags, rip, the error code, trap
// number and fault address, xmm0-15, MXCSR and the x87 state, and the bytes of
// every writable page (the 64 KiB scratch area the registers point into, the
// fs and gs segments, which point into it too, and the pages around a
// rip-relative target, which are mapped for both runs). A fault inside the
// copy is compared with rip mapped back from the slot to A. A fault inside
// emulate() (e.g. `ret` with an unmapped rsp) ends the handler, not the
// instruction: then only the signal and the fault address are compared.
//
// Branch targets (rel8, rel32) land on int3 pads: the code page is filled
// with int3 and a page of int3 is mapped at a rel32 target, so each run
// reports where it went.
//
// Not compared (documented in tests/fuzz/README.md): the upper halves of
// ymm/zmm and the other XSAVE components; the x87 FIP/FDP/FOP fields (they
// hold the address of the last x87 instruction, which is the slot's for a
// copy); fs/gs bases after the run; memory outside the plan's pages (an
// absolute 64-bit address, moffs); the int3 byte the real probe leaves at A
// (both runs see the original bytes there). Not run: system calls and
// software interrupts (syscall, sysenter, int n, int1, int3, into),
// instructions whose results vary between two runs (rdtsc, rdtscp, rdrand,
// rdseed, rdpid, rdpmc, cpuid, umwait, tpause), and rflags.AC (alignment
// checks), which emulate() does not model.

#include <capstone/capstone.h>
#include <signal.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "arch.hpp"
#include "xol_sandbox.hpp"

namespace {

using uprobe::arch::Insn;
using xolfuzz::kPage;
using xolfuzz::Outcome;
using xolfuzz::Page;
using xolfuzz::Plan;
using xolfuzz::Result;
using xolfuzz::Stage;

constexpr std::uint64_t kCode = 0x300000000000;  // the original instruction's page
constexpr std::uint64_t kIp = kCode + 0x800;     // A
constexpr std::uint64_t kSlot = kCode + 0x20000 + 0x400;  // B: the XOL slot
constexpr std::uint64_t kWin = kCode + 0x40000 + 0x200;   // W: the window slot
constexpr std::uint64_t kData = 0x100000;        // scratch: 16 pages
constexpr std::size_t kDataPages = 16;
constexpr std::uint64_t kDataMid = kData + kDataPages * kPage / 2;
constexpr std::uint64_t kFsBase = kData + 0x4000, kGsBase = kData + 0xc000;

/// rflags from the input's flags byte: bits 0 (CF), 2 (PF), 4 (AF), 6 (ZF),
/// 7 (SF) as they are, bit 1 -> DF, bit 3 -> OF; IF and the reserved bit 1
/// set; never TF or AC.
std::uint64_t input_flags(std::uint8_t b) {
  return 0x202 | (b & 0xd5u) | ((b & 0x02) ? 0x400 : 0) | ((b & 0x08) ? 0x800 : 0);
}

Plan g_plan;
Result* g_results = nullptr;  // Plan::kMaxVariants blocks, shared with the sandbox child

/// Printed at exit: how many instructions were compared, and how.
struct Stats {
  unsigned long inputs = 0, accepted = 0, xol_compared = 0, emulated_compared = 0, window_compared = 0, timeouts = 0,
                setup_failed = 0;
} g_stats;

csh capstone() {
  static csh h = [] {
    csh c = 0;
    if (cs_open(CS_ARCH_X86, CS_MODE_64, &c) != CS_ERR_OK) std::abort();
    cs_option(c, CS_OPT_DETAIL, CS_OPT_ON);
    return c;
  }();
  return h;
}

/// Instructions the sandbox does not run (see the file comment).
bool excluded(const std::uint8_t* code, std::size_t n) {
  cs_insn* ci = nullptr;
  const std::size_t got = cs_disasm(capstone(), code, n, kIp, 1, &ci);
  if (got == 0) return true;
  bool out = false;
  for (std::uint8_t i = 0; i < ci->detail->groups_count; ++i)
    if (ci->detail->groups[i] == CS_GRP_INT) out = true;
  switch (ci->id) {
    case X86_INS_SYSCALL: case X86_INS_SYSENTER: case X86_INS_SYSEXIT: case X86_INS_SYSRET:
    case X86_INS_INT: case X86_INS_INT1: case X86_INS_INT3: case X86_INS_INTO:
    case X86_INS_RDTSC: case X86_INS_RDTSCP: case X86_INS_RDRAND: case X86_INS_RDSEED:
    case X86_INS_RDPMC: case X86_INS_CPUID:
      out = true;
      break;
    default:
      break;
  }
  cs_free(ci, got);
  // By the bytes too, for what Capstone 4 does not name (rdpid, umwait,
  // tpause): 0f 31 rdtsc, 0f 33 rdpmc, 0f a2 cpuid, 0f 01 f9 rdtscp,
  // 0f c7 /6 /7 with a register (rdrand, rdseed, rdpid), 0f ae /6 with a
  // register (umwait, tpause, umonitor).
  std::size_t i = 0;
  while (i < n && (code[i] == 0x66 || code[i] == 0x67 || code[i] == 0xf0 || code[i] == 0xf2 || code[i] == 0xf3 ||
                   code[i] == 0x2e || code[i] == 0x36 || code[i] == 0x3e || code[i] == 0x26 || code[i] == 0x64 ||
                   code[i] == 0x65 || (code[i] & 0xf0) == 0x40))
    ++i;
  if (i + 1 < n && code[i] == 0x0f) {
    const std::uint8_t op = code[i + 1], modrm = i + 2 < n ? code[i + 2] : 0;
    const unsigned reg = (modrm >> 3) & 7;
    if (op == 0x31 || op == 0x33 || op == 0xa2 || (op == 0x01 && modrm == 0xf9)) out = true;
    if (op == 0xc7 && (modrm & 0xc0) == 0xc0 && (reg == 6 || reg == 7)) out = true;
    if (op == 0xae && (modrm & 0xc0) == 0xc0 && reg == 6) out = true;
  }
  return out;
}

struct Fill {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t at(std::size_t i) const {
    if (n == 0) return static_cast<std::uint8_t>((i * 0x9e3779b1u) >> 11);
    return static_cast<std::uint8_t>(p[i % n] + (i / n) * 0x3b);
  }
};

Page* add_page(Plan& p, std::uint64_t addr, int prot, const Fill* fill, std::uint8_t byte) {
  addr &= ~(kPage - 1);
  for (int i = 0; i < p.npages; ++i)
    if (p.pages[i].addr == addr) return nullptr;  // already mapped (shared by every run)
  if (p.npages == xolfuzz::kMaxPages) std::abort();
  Page& pg = p.pages[p.npages++];
  pg.addr = addr;
  pg.prot = prot;
  for (std::size_t i = 0; i < kPage; ++i) pg.bytes[i] = fill ? fill->at(addr + i) : byte;
  return &pg;
}

std::uint64_t reg_value(std::uint8_t sel) {
  if (sel >= 0xf0) return sel & 0x0f;  // small counts and null-ish pointers
  return kDataMid + static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int8_t>(sel)) * 64) +
         (sel & 7);
}

const char* const kGregNames[NGREG] = {"r8",  "r9",  "r10", "r11", "r12", "r13",  "r14",    "r15",
                                       "rdi", "rsi", "rbp", "rbx", "rdx", "rax",  "rcx",    "rsp",
                                       "rip", "efl", "csgsfs", "err", "trapno", "oldmask", "cr2"};

[[noreturn]] void mismatch(const Insn& insn, const char* variant, const char* what, const Result& a,
                           const Result& b) {
  std::fprintf(stderr, "xol_fuzz: `%s' (", insn.text.c_str());
  for (unsigned i = 0; i < insn.len; ++i) std::fprintf(stderr, i ? " %02x" : "%02x", insn.bytes[i]);
  std::fprintf(stderr, "): %s run differs from the original: %s\n", variant, what);
  std::fprintf(stderr, "  original: stage %u signal %d code %d addr %#llx\n  %-8s: stage %u signal %d code %d addr %#llx\n",
               static_cast<unsigned>(a.stage), a.sig, a.code, static_cast<unsigned long long>(a.addr), variant,
               static_cast<unsigned>(b.stage), b.sig, b.code, static_cast<unsigned long long>(b.addr));
  for (int i = 0; i < NGREG; ++i)
    if (a.gregs[i] != b.gregs[i])
      std::fprintf(stderr, "  %-7s original %#llx, %s %#llx\n", kGregNames[i],
                   static_cast<unsigned long long>(a.gregs[i]), variant, static_cast<unsigned long long>(b.gregs[i]));
  std::abort();
}

bool canonical(std::uint64_t a) {
  return static_cast<std::uint64_t>(static_cast<std::int64_t>(a << 16) >> 16) == a;
}

/// The offset of writable address `addr` in Result::mem (the plan's
/// writable pages in plan order), or -1.
long mem_offset(std::uint64_t addr) {
  long off = 0;
  for (int i = 0; i < g_plan.npages; ++i) {
    const Page& pg = g_plan.pages[i];
    if (!(pg.prot & PROT_WRITE)) continue;
    if (addr >= pg.addr && addr < pg.addr + kPage) return off + static_cast<long>(addr - pg.addr);
    off += static_cast<long>(kPage);
  }
  return -1;
}

/// Compares a run with the original; `slot` != 0 maps rip from the slot
/// back (a window copy: `slot_len` bytes there, `window` set).
void compare(const Insn& insn, const char* variant, const Result& a, Result& b, std::uint64_t slot,
             std::size_t slot_len = 0, bool window = false) {
  if (window && insn.cls == uprobe::arch::InsnClass::call_ind) {
    // The relocated indirect call leaves its target in the quadword below
    // the callee's stack pointer (dead stack: the original rsp - 16), which
    // the original call does not write.
    const long o = mem_offset(g_plan.regs.rsp - 16);
    if (o >= 0 && static_cast<std::size_t>(o) + 8 <= sizeof b.mem) std::memcpy(b.mem + o, a.mem + o, 8);
    // A call to a non-canonical address raises #GP on the call itself (rip,
    // rsp unchanged); relocated, on the closing `jmp *-8(%rsp)` in the slot
    // after the pushes. SIGSEGV either way; accepted as this pair only.
    if (a.sig == SIGSEGV && b.sig == SIGSEGV && a.code == SI_KERNEL && b.code == SI_KERNEL &&
        static_cast<std::uint64_t>(a.gregs[REG_RIP]) == kIp &&
        static_cast<std::uint64_t>(b.gregs[REG_RIP]) == slot + slot_len - 4)
      return;
  }
  if (b.stage == Stage::emulating) {
    // emulate() faulted in the handler: the instruction itself must fault
    // on the same address.
    if (a.stage != Stage::running || a.sig != b.sig || a.addr != b.addr)
      mismatch(insn, variant, "emulate() faulted, the instruction did not fault the same way", a, b);
    return;
  }
  if (a.stage != Stage::running || b.stage != Stage::running) mismatch(insn, variant, "a run did not start", a, b);
  // A branch to a non-canonical address raises #GP on the branch itself
  // (rip, rsp unchanged); emulated, the branch is taken and the fault comes
  // from the target (the process dies by the same signal either way; see
  // tests/fuzz/README.md).
  if (!slot && a.sig == SIGSEGV && b.sig == SIGSEGV && a.code == SI_KERNEL && b.code == SI_KERNEL &&
      static_cast<std::uint64_t>(a.gregs[REG_RIP]) == kIp && !canonical(static_cast<std::uint64_t>(b.gregs[REG_RIP])))
    return;
  if (slot) {
    // In a window copy the instruction may be re-encoded (rel32, a call's
    // pushes): a fault anywhere in it is the instruction's.
    const std::size_t span = window ? slot_len : insn.len;
    auto& rip = b.gregs[REG_RIP];
    if (static_cast<std::uint64_t>(rip) >= slot && static_cast<std::uint64_t>(rip) < slot + span)
      rip = static_cast<greg_t>(window ? kIp : static_cast<std::uint64_t>(rip) - slot + kIp);
    if ((b.sig == SIGILL || b.sig == SIGFPE) && b.addr >= slot && b.addr < slot + span)
      b.addr = window ? kIp : b.addr - slot + kIp;
  }
  // An instruction that sets TF (popf) is followed natively by one more
  // instruction before the single-step trap; the copy's jump back is that
  // instruction, so the trap comes at A + len before the code there ran (a
  // known divergence, see tests/fuzz/README.md).
  if (slot && (a.gregs[REG_EFL] & 0x100) && b.sig == SIGTRAP && b.code == TRAP_TRACE &&
      static_cast<std::uint64_t>(b.gregs[REG_RIP]) == kIp + insn.len)
    return;
  if (a.sig != b.sig || a.code != b.code || a.addr != b.addr) mismatch(insn, variant, "different signal", a, b);
  for (int i = 0; i < NGREG; ++i) {
    if (i == REG_OLDMASK) continue;
    if (a.gregs[i] != b.gregs[i]) mismatch(insn, variant, "different registers", a, b);
  }
  // FXSAVE image without FOP/FIP/FDP (bytes 6..23) and the software-reserved tail.
  if (std::memcmp(a.fx, b.fx, 6) != 0 || std::memcmp(a.fx + 24, b.fx + 24, 416 - 24) != 0)
    mismatch(insn, variant, "different x87/SSE state (xmm0-15, MXCSR, st0-7, x87 status)", a, b);
  std::size_t used = 0;
  for (int i = 0; i < g_plan.npages; ++i)
    if (g_plan.pages[i].prot & PROT_WRITE) used += kPage;
  if (std::memcmp(a.mem, b.mem, used) != 0) {
    std::size_t i = 0;
    while (a.mem[i] == b.mem[i]) ++i;
    std::fprintf(stderr, "xol_fuzz: first differing byte at writable-page offset %#zx: %02x vs %02x\n", i, a.mem[i],
                 b.mem[i]);
    mismatch(insn, variant, "different memory", a, b);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  void* m = ::mmap(nullptr, Plan::kMaxVariants * sizeof(Result), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
  if (m == MAP_FAILED) std::abort();
  g_results = static_cast<Result*>(m);
  std::atexit([] {
    std::fprintf(stderr,
                 "xol_fuzz: %lu inputs, %lu instructions run, %lu xol copies, %lu emulations and %lu window copies "
                 "compared with the original, %lu timeouts, %lu not mappable\n",
                 g_stats.inputs, g_stats.accepted, g_stats.xol_compared, g_stats.emulated_compared,
                 g_stats.window_compared, g_stats.timeouts, g_stats.setup_failed);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ++g_stats.inputs;
  const std::size_t n = size < uprobe::arch::kMaxInsnLen ? size : uprobe::arch::kMaxInsnLen;
  Insn insn;
  std::string why;
  if (n == 0 || !uprobe::arch::analyze(data, n, insn, why)) return 0;
  if (excluded(insn.bytes, insn.len)) return 0;
  const bool via_xol = uprobe::arch::xol_safe(insn);
  const bool via_emulation = uprobe::arch::is_emulated(insn);
  std::uint8_t slot_code[uprobe::arch::kXolSlotSize];
  std::size_t slot_len = 0;
  if (via_xol) {
    slot_len = uprobe::arch::build_xol(insn, kIp, kSlot, slot_code, why);
    if (slot_len == 0 && !insn.rip_relative) {
      std::fprintf(stderr, "xol_fuzz: build_xol refused `%s': %s\n", insn.text.c_str(), why.c_str());
      std::abort();
    }
  }
  // The window of this one instruction, when the planner takes it as a
  // window's last (what a punned jump or B1 displaces).
  std::uint8_t win_code[uprobe::arch::kWindowSlotSize];
  std::size_t win_len = 0;
  {
    uprobe::arch::EntryWindow w;
    std::string wwhy;
    bool planned = false;
    if (insn.len >= uprobe::arch::kJumpLen) {
      planned = uprobe::arch::plan_window(insn.bytes, insn.len, 0, w, wwhy, &insn);
    } else {
      std::uint8_t five[uprobe::arch::kJumpLen];
      std::memset(five, uprobe::arch::kBreakpoint, sizeof five);
      std::memcpy(five, insn.bytes, insn.len);
      planned = uprobe::arch::plan_punned(five, sizeof five, insn, w, wwhy);
    }
    if (planned) win_len = uprobe::arch::build_window_xol(w, kIp, kWin, win_code, wwhy);
  }
  if (slot_len == 0 && !via_emulation && win_len == 0) return 0;  // the runtime would refuse the probe (out of reach)

  auto at = [&](std::size_t i) -> std::uint8_t { return i < size ? data[i] : 0; };
  const Fill fill{size > 32 ? data + 32 : nullptr, size > 32 ? size - 32 : 0};

  Plan& p = g_plan;
  p.npages = 0;
  Page* code = add_page(p, kCode, PROT_READ | PROT_EXEC, nullptr, uprobe::arch::kBreakpoint);
  std::memcpy(code->bytes + (kIp - kCode), insn.bytes, insn.len);
  Page* slot = add_page(p, kSlot, PROT_READ | PROT_EXEC, nullptr, uprobe::arch::kBreakpoint);
  if (slot_len) std::memcpy(slot->bytes + (kSlot & (kPage - 1)), slot_code, slot_len);
  if (win_len) {
    Page* win = add_page(p, kWin, PROT_READ | PROT_EXEC, nullptr, uprobe::arch::kBreakpoint);
    std::memcpy(win->bytes + (kWin & (kPage - 1)), win_code, win_len);
  }
  for (std::size_t i = 0; i < kDataPages; ++i) add_page(p, kData + i * kPage, PROT_READ | PROT_WRITE, &fill, 0);
  if (insn.rip_relative) {
    // The operand (up to 64 bytes, zmm) and its neighbours, for every run.
    const std::uint64_t t = uprobe::arch::rip_target(insn, kIp);
    for (std::uint64_t a = (t - 64) & ~(kPage - 1); a <= ((t + 127) & ~(kPage - 1)); a += kPage)
      add_page(p, a, PROT_READ | PROT_WRITE, &fill, 0);
  }
  using uprobe::arch::InsnClass;
  if (insn.cls == InsnClass::jmp_rel || insn.cls == InsnClass::call_rel || insn.cls == InsnClass::jcc_rel ||
      insn.cls == InsnClass::loop_rel) {
    const std::uint64_t t = kIp + insn.len + static_cast<std::uint64_t>(insn.rel);
    add_page(p, t, PROT_READ | PROT_EXEC, nullptr, uprobe::arch::kBreakpoint);  // a landing pad
  }

  uprobe::Regs& r = p.regs;
  std::uint64_t* gpr[16] = {&r.rax, &r.rcx, &r.rdx, &r.rbx, &r.rsp, &r.rbp, &r.rsi, &r.rdi,
                            &r.r8,  &r.r9,  &r.r10, &r.r11, &r.r12, &r.r13, &r.r14, &r.r15};
  for (std::size_t i = 0; i < 16; ++i) *gpr[i] = reg_value(at(16 + i));
  r.rflags = input_flags(at(15));
  r.rip = 0;  // per variant
  for (std::size_t i = 0; i < sizeof p.xmm; ++i) p.xmm[i / 16][i % 16] = fill.at(0x5000 + i);
  p.fs_base = kFsBase;
  p.gs_base = kGsBase;

  // Original first, then the copy and/or the emulation.
  p.nvariants = 0;
  p.variants[p.nvariants++] = {kIp, nullptr};
  const int xol_at = slot_len ? p.nvariants++ : -1;
  if (xol_at >= 0) p.variants[xol_at] = {kSlot, nullptr};
  const int emu_at = via_emulation ? p.nvariants++ : -1;
  if (emu_at >= 0) p.variants[emu_at] = {kIp, &insn};
  const int win_at = win_len ? p.nvariants++ : -1;
  if (win_at >= 0) p.variants[win_at] = {kWin, nullptr};
  Outcome out[Plan::kMaxVariants];
  xolfuzz::run(p, g_results, out);
  if (out[0] == Outcome::setup_failed) {  // an address already taken in this process
    ++g_stats.setup_failed;
    return 0;
  }
  ++g_stats.accepted;
  const bool orig_timeout = out[0] == Outcome::timeout;
  if (orig_timeout) ++g_stats.timeouts;
  const Result& orig = g_results[0];
  if (std::getenv("XOL_FUZZ_VERBOSE")) {  // what each run ended with (reproducing one input)
    for (int k = 0; k < p.nvariants; ++k)
      std::fprintf(stderr, "xol_fuzz: `%s' variant %d (rip %#llx%s): outcome %d stage %u signal %d code %d rip %#llx rflags %#llx\n",
                   insn.text.c_str(), k, static_cast<unsigned long long>(p.variants[k].rip),
                   p.variants[k].emulate ? ", emulated" : "", static_cast<int>(out[k]),
                   static_cast<unsigned>(g_results[k].stage), g_results[k].sig, g_results[k].code,
                   static_cast<unsigned long long>(g_results[k].gregs[REG_RIP]),
                   static_cast<unsigned long long>(g_results[k].gregs[REG_EFL]));
  }
  for (int k : {xol_at, emu_at, win_at}) {
    if (k < 0) continue;
    const char* variant = k == xol_at ? "xol" : k == emu_at ? "emulated" : "window";
    if (out[k] == Outcome::setup_failed) {
      std::fprintf(stderr, "xol_fuzz: the %s run could not start\n", variant);
      std::abort();
    }
    if ((out[k] == Outcome::timeout) != orig_timeout) mismatch(insn, variant, "one run timed out", orig, g_results[k]);
    if (!orig_timeout) {
      if (k == win_at) compare(insn, variant, orig, g_results[k], kWin, win_len, true);
      else compare(insn, variant, orig, g_results[k], k == xol_at ? kSlot : 0);
    }
    ++(k == xol_at ? g_stats.xol_compared : k == emu_at ? g_stats.emulated_compared : g_stats.window_compared);
  }
  return 0;
}
