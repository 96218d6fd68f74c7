// SPDX-License-Identifier: MIT
// probe_read_user() and probe_read_user_str() (include/uprobe/uprobe.hpp):
// the answers bpf_probe_read_user()/bpf_probe_read_user_str() give, for
// NULL, an unmapped page, a PROT_NONE page, a file page past its end
// (SIGBUS), strings that run into an unreadable page, non-canonical and
// kernel addresses, byte for byte the same whether the read is made in the
// process (armed, the thread's SIGSEGV and SIGBUS unblocked) or with
// process_vm_readv (not armed; a thread blocking SIGSEGV or SIGBUS; a signal
// handler whose sa_mask blocks SIGSEGV). Which of the two a read took is
// shown under a seccomp filter that fails process_vm_readv: only the
// in-process read still reads good memory. The program's own SIGSEGV
// disposition is untouched: its handler runs exactly once per fault of its
// own (none for the reads' faults), on its sigaltstack when it asked
// SA_ONSTACK; sigaction() shows it as set; SIG_DFL still kills by SIGSEGV or
// SIGBUS, SIG_IGN drops a sent SIGSEGV and dies of a fault, SA_RESETHAND
// handles one fault. Consumers of int3 and optimized probes read bad
// pointers without faulting the program, and an int3 hit's consumers follow
// the trapped code's mask even where libuprobe could not track it (a raw
// rt_sigprocmask). Every case runs in a fork()ed child: arming is for the
// process's life.

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "life_common.hpp"

using namespace lifetest;

namespace {

constexpr std::size_t kPage = 4096;

/// Page A (readable, 'a' bytes, no NUL), B (unmapped), C (PROT_NONE), and a
/// 100-byte file ("0123456789" x 10) mapped over two pages, D and E (E past
/// the file's end: SIGBUS).
struct Layout {
  char* a = nullptr;
  char* b = nullptr;
  char* c = nullptr;
  char* d = nullptr;
  char* e = nullptr;
};

Layout make_layout() {
  Layout l;
  // Far below where mmap() places what it is not told where to (top-down,
  // under the stack): the hole left at B is not filled by a later mapping
  // (a thread's stack, libuprobe's XOL pages). In the range of PIE programs,
  // application memory for ASan and TSan too (their shadow is elsewhere).
  char* p = nullptr;
  for (std::uintptr_t at = 0x560000000000; !p && at < 0x568000000000; at += 0x1000000000) {
    void* m = mmap(reinterpret_cast<void*>(at), 3 * kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (m == reinterpret_cast<void*>(at)) p = static_cast<char*>(m);
    else if (m != MAP_FAILED) munmap(m, 3 * kPage);
  }
  if (!p) std::abort();
  std::memset(p, 'a', kPage);
  munmap(p + kPage, kPage);
  mprotect(p + 2 * kPage, kPage, PROT_NONE);
  l.a = p, l.b = p + kPage, l.c = p + 2 * kPage;
  char path[] = "/tmp/uprobe-user-read.XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) std::abort();
  unlink(path);
  for (int i = 0; i < 10; ++i)
    if (write(fd, "0123456789", 10) != 10) std::abort();
  auto* f = static_cast<char*>(mmap(nullptr, 2 * kPage, PROT_READ, MAP_SHARED, fd, 0));
  close(fd);
  if (f == MAP_FAILED) std::abort();
  l.d = f, l.e = f + kPage;
  return l;
}

/// One read and the answer the kernel's helpers give for it.
struct Case {
  bool str;
  const char* name;
  const void* src;
  std::uint32_t size;
  long ret;              ///< expected return
  std::string content;   ///< expected bytes (str: up to the NUL; read: all size bytes)
};

std::vector<Case> cases(const Layout& l) {
  static const char hello[] = "xhello, world";
  const std::string as(63, 'a');
  std::string digits;  // the file's 100 bytes (its page is zero after them)
  for (int i = 0; i < 10; ++i) digits += "0123456789";
  return {
      {true, "null", nullptr, 64, -EFAULT, ""},
      {true, "unmapped", l.b, 64, -EFAULT, ""},
      {true, "prot_none", l.c, 64, -EFAULT, ""},
      {true, "past_eof", l.e, 64, -EFAULT, ""},
      {true, "non_canonical", reinterpret_cast<const void*>(0xdead000000000000ull), 64, -EFAULT, ""},
      {true, "kernel", reinterpret_cast<const void*>(-4096L), 64, -EFAULT, ""},
      {true, "runs_into_unmapped", l.a + kPage - 10, 64, -EFAULT, ""},
      {true, "63_readable_of_64", l.a + kPage - 63, 64, -EFAULT, ""},
      {true, "64_readable_cut", l.a + kPage - 64, 64, 64, as},
      {true, "3_readable_of_3", l.a + kPage - 3, 3, 3, "aa"},
      {true, "unaligned_string", hello + 1, 64, 13, "hello, world"},
      {true, "empty_string", hello + sizeof hello - 1, 64, 1, ""},
      {true, "file_then_zeros", l.d, 200, 101, digits},
      {false, "read_8_before_unmapped", l.a + kPage - 8, 8, 0, std::string(8, 'a')},
      {false, "read_8_into_unmapped", l.a + kPage - 7, 8, -EFAULT, std::string(8, '\0')},
      {false, "read_prot_none", l.c, 1, -EFAULT, std::string(1, '\0')},
      {false, "read_file_tail", l.d + kPage - 4, 4, 0, std::string(4, '\0')},
      {false, "read_past_eof", l.e, 16, -EFAULT, std::string(16, '\0')},
      {false, "read_null", nullptr, 8, -EFAULT, std::string(8, '\0')},
      {false, "read_size_0", nullptr, 0, 0, ""},
  };
}

/// Runs every case; returns the number that differ (the first ones in msg).
int run_cases(const Layout& l, char* msg, std::size_t msg_len) {
  int bad = 0;
  for (const Case& c : cases(l)) {
    unsigned char buf[256];
    std::memset(buf, 0x5a, sizeof buf);
    const long r = c.str ? uprobe::probe_read_user_str(buf, c.size, c.src) : uprobe::probe_read_user(buf, c.size, c.src);
    std::string got;
    if (c.str) {
      got = r > 0 ? std::string(reinterpret_cast<char*>(buf), static_cast<std::size_t>(r) - 1) : "";
      // On an error all size bytes are zero; on success the NUL is there.
      bool ok = true;
      if (r < 0)
        for (std::uint32_t i = 0; i < c.size; ++i) ok = ok && buf[i] == 0;
      if (r > 0) ok = buf[r - 1] == 0;
      if (!ok) got += "<bad bytes>";
    } else {
      got.assign(reinterpret_cast<char*>(buf), c.size);
    }
    if (r != c.ret || got != c.content) {
      if (bad++ < 3 && msg)
        std::snprintf(msg + std::strlen(msg), msg_len - std::strlen(msg), "%s: %ld [%s]; ", c.name, r, got.c_str());
    }
  }
  return bad;
}

/// Makes process_vm_readv fail with EPERM from now on (the calling thread
/// and those it creates): a read that still succeeds was made in process.
int fail_process_vm_readv() {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {static_cast<unsigned short>(sizeof f / sizeof f[0]), f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0 ? 2 : 0;
}

const char kGood[] = "a good string";

bool reads_good() {
  char buf[64];
  return uprobe::probe_read_user_str(buf, sizeof buf, kGood) == sizeof kGood && std::strcmp(buf, kGood) == 0;
}

int block(int sig, int how) {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, sig);
  return pthread_sigmask(how, &s, nullptr);
}

void expect_child(int status, bool got, const ChildReport& r) {
  ASSERT_TRUE(got) << status_str(status) << " " << r.msg;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status_str(status) << " " << r.msg;
}

// ------------------------------------------------------------ the answers ----

TEST(UserRead, AnswersAsTheKernelWithoutArming) {
  ChildReport r;
  bool got = false;
  const int st = in_child(
      [](ChildReport& out) {
        const Layout l = make_layout();
        out.v[0] = static_cast<std::uint64_t>(run_cases(l, out.msg, sizeof out.msg));
        out.v[1] = reads_good();
        // Not armed: every read is a system call.
        out.v[2] = fail_process_vm_readv();
        out.v[3] = reads_good();
      },
      r, got);
  expect_child(st, got, r);
  EXPECT_EQ(r.v[0], 0u) << r.msg;
  EXPECT_EQ(r.v[1], 1u);
  EXPECT_EQ(r.v[2], 0u);
  EXPECT_EQ(r.v[3], 0u) << "not armed: the read must have been process_vm_readv";
}

TEST(UserRead, AnswersAsTheKernelInProcess) {
  ChildReport r;
  bool got = false;
  const int st = in_child(
      [](ChildReport& out) {
        const Layout l = make_layout();
        out.v[0] = uprobe::enable_fault_safe_reads();
        out.v[1] = uprobe::enable_fault_safe_reads();  // idempotent
        out.v[2] = fail_process_vm_readv();
        out.v[3] = static_cast<std::uint64_t>(run_cases(l, out.msg, sizeof out.msg));
        out.v[4] = reads_good();
        // The same from a new thread (its state starts unknown: one
        // rt_sigprocmask, then in process).
        std::thread([&] { out.v[5] = static_cast<std::uint64_t>(run_cases(l, out.msg, sizeof out.msg)) + 10 * !reads_good(); })
            .join();
      },
      r, got);
  expect_child(st, got, r);
  EXPECT_EQ(r.v[0], 1u);
  EXPECT_EQ(r.v[1], 1u);
  EXPECT_EQ(r.v[2], 0u);
  EXPECT_EQ(r.v[3], 0u) << r.msg;
  EXPECT_EQ(r.v[4], 1u) << "armed: the read must have been made in process";
  EXPECT_EQ(r.v[5], 0u) << r.msg;
}

/// A thread that blocks `sig` reads with process_vm_readv (in process, a
/// fault would kill the process): same answers; under the filter even good
/// memory then fails, and unblocking it brings the in-process reads back.
void blocked_thread_case(int sig) {
  ChildReport r;
  bool got = false;
  const int st = in_child(
      [sig](ChildReport& out) {
        const Layout l = make_layout();
        out.v[0] = uprobe::enable_fault_safe_reads();
        std::thread([&] {
          out.v[1] = static_cast<std::uint64_t>(block(sig, SIG_BLOCK));
          out.v[2] = static_cast<std::uint64_t>(run_cases(l, out.msg, sizeof out.msg));
          out.v[3] = fail_process_vm_readv();
          out.v[4] = reads_good();  // blocked: the system call, which fails now
          out.v[5] = static_cast<std::uint64_t>(block(sig, SIG_UNBLOCK));
          out.v[6] = reads_good();  // in process again
          // All signals blocked (sigfillset, as a worker thread does).
          sigset_t all;
          sigfillset(&all);
          pthread_sigmask(SIG_SETMASK, &all, nullptr);
          char buf[8];
          out.v[7] = uprobe::probe_read_user_str(buf, sizeof buf, l.b) == -EFAULT;  // no fault: the call, failing
          out.v[8] = reads_good();
        }).join();
      },
      r, got);
  expect_child(st, got, r);
  EXPECT_EQ(r.v[0], 1u);
  EXPECT_EQ(r.v[1], 0u);
  EXPECT_EQ(r.v[2], 0u) << r.msg;
  EXPECT_EQ(r.v[3], 0u);
  EXPECT_EQ(r.v[4], 0u) << "blocked: the read must have been process_vm_readv";
  EXPECT_EQ(r.v[5], 0u);
  EXPECT_EQ(r.v[6], 1u) << "unblocked: the read must have been made in process";
  EXPECT_EQ(r.v[7], 1u);
  EXPECT_EQ(r.v[8], 0u);
}

TEST(UserRead, ThreadBlockingSigsegvReadsBySystemCall) { blocked_thread_case(SIGSEGV); }
TEST(UserRead, ThreadBlockingSigbusReadsBySystemCall) { blocked_thread_case(SIGBUS); }

// A SIGUSR1 handler whose sa_mask blocks SIGSEGV: its reads are system
// calls; the interrupted code's are in process again after it returns.
std::atomic<int> g_usr1_reads{-1}, g_usr1_good{-1};
const char* g_bad = nullptr;

void usr1_reads(int) {
  char buf[16];
  g_usr1_reads = uprobe::probe_read_user_str(buf, sizeof buf, g_bad) == -EFAULT;
  g_usr1_good = reads_good();
}

TEST(UserRead, HandlerMaskingSigsegvReadsBySystemCall) {
  ChildReport r;
  bool got = false;
  const int st = in_child(
      [](ChildReport& out) {
        const Layout l = make_layout();
        g_bad = l.b;
        out.v[0] = uprobe::enable_fault_safe_reads();
        struct sigaction sa {};
        sa.sa_handler = usr1_reads;
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGSEGV);
        sigaction(SIGUSR1, &sa, nullptr);
        out.v[1] = reads_good();  // (the state known before the handler)
        out.v[2] = fail_process_vm_readv();
        raise(SIGUSR1);
        out.v[3] = static_cast<std::uint64_t>(g_usr1_reads.load());
        out.v[4] = static_cast<std::uint64_t>(g_usr1_good.load());  // by the call: fails under the filter
        out.v[5] = reads_good();                                      // in process again
      },
      r, got);
  expect_child(st, got, r);
  EXPECT_EQ(r.v[0], 1u);
  EXPECT_EQ(r.v[1], 1u);
  EXPECT_EQ(r.v[2], 0u);
  EXPECT_EQ(r.v[3], 1u);
  EXPECT_EQ(r.v[4], 0u) << "SIGSEGV blocked in the handler: the read must have been process_vm_readv";
  EXPECT_EQ(r.v[5], 1u);
}

// ------------------------------------------------ the program's SIGSEGV ----

std::atomic<int> g_segv_runs{0};
std::atomic<int> g_segv_on_alt{0};
std::atomic<int> g_segv_info_ok{0};
sigjmp_buf g_jmp;
std::uintptr_t g_alt_lo = 0, g_alt_hi = 0;
volatile char* g_fault_at = nullptr;

void on_segv(int sig, siginfo_t* si, void*) {
  const auto here = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  if (here >= g_alt_lo && here < g_alt_hi) g_segv_on_alt.fetch_add(1);
  if (sig == SIGSEGV && si->si_code == SEGV_MAPERR && si->si_addr == g_fault_at) g_segv_info_ok.fetch_add(1);
  g_segv_runs.fetch_add(1);
  siglongjmp(g_jmp, 1);
}

/// `n` faults of the program's own (a load at g_fault_at), each recovered
/// by its handler; returns how many came back through it.
int g_own_back = 0, g_own_left = 0;  // (not locals: they outlive the longjmps)

int own_faults(int n) {
  g_own_back = 0;
  g_own_left = n;
  if (sigsetjmp(g_jmp, 1) != 0) ++g_own_back;  // back from the handler
  if (g_own_left > 0) {
    --g_own_left;
    (void)*g_fault_at;
  }
  return g_own_back;
}

/// The program's handler (installed before or after arming, on a
/// sigaltstack with SA_ONSTACK) runs exactly once per fault of its own and
/// never for the reads' faults.
void program_handler_case(bool handler_first) {
  ChildReport r;
  bool got = false;
  const int st = in_child(
      [handler_first](ChildReport& out) {
        const Layout l = make_layout();
        g_fault_at = l.b + 8;
        static char alt[64 * 1024];
        stack_t ss{};
        ss.ss_sp = alt;
        ss.ss_size = sizeof alt;
        sigaltstack(&ss, nullptr);
        g_alt_lo = reinterpret_cast<std::uintptr_t>(alt), g_alt_hi = g_alt_lo + sizeof alt;
        struct sigaction sa {};
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGUSR2);
        if (!handler_first) out.v[0] = uprobe::enable_fault_safe_reads();
        sigaction(SIGSEGV, &sa, nullptr);
        if (handler_first) out.v[0] = uprobe::enable_fault_safe_reads();
        int bad = 0;
        char buf[64];
        for (int i = 0; i < 100; ++i) bad += uprobe::probe_read_user_str(buf, sizeof buf, l.b) != -EFAULT;
        out.v[1] = static_cast<std::uint64_t>(own_faults(5));
        for (int i = 0; i < 100; ++i) bad += uprobe::probe_read_user(buf, 8, l.c) != -EFAULT;
        out.v[2] = static_cast<std::uint64_t>(bad);
        out.v[3] = static_cast<std::uint64_t>(g_segv_runs.load());
        out.v[4] = static_cast<std::uint64_t>(g_segv_on_alt.load());
        out.v[5] = static_cast<std::uint64_t>(g_segv_info_ok.load());
        struct sigaction now {};
        sigaction(SIGSEGV, nullptr, &now);
        out.v[6] = now.sa_sigaction == on_segv;
        out.v[7] = static_cast<std::uint64_t>(now.sa_flags & (SA_SIGINFO | SA_ONSTACK | SA_RESETHAND | SA_NODEFER | SA_RESTART));
        out.v[8] = sigismember(&now.sa_mask, SIGUSR2) == 1 && sigismember(&now.sa_mask, SIGTRAP) == 0;
      },
      r, got);
  expect_child(st, got, r);
  EXPECT_EQ(r.v[0], 1u);
  EXPECT_EQ(r.v[1], 5u);
  EXPECT_EQ(r.v[2], 0u);
  EXPECT_EQ(r.v[3], 5u) << "the program's handler runs for its own faults only";
  EXPECT_EQ(r.v[4], 5u) << "on its sigaltstack (SA_ONSTACK)";
  EXPECT_EQ(r.v[5], 5u) << "with the fault's siginfo";
  EXPECT_EQ(r.v[6], 1u);
  EXPECT_EQ(r.v[7], static_cast<std::uint64_t>(SA_SIGINFO | SA_ONSTACK));
  EXPECT_EQ(r.v[8], 1u);
}

TEST(UserRead, ProgramHandlerInstalledBeforeArmingRunsExactlyForItsFaults) { program_handler_case(true); }
TEST(UserRead, ProgramHandlerInstalledAfterArmingRunsExactlyForItsFaults) { program_handler_case(false); }

/// The child's end after arming, bad reads and `then`: its wait status.
template <typename Then>
int after_reads(Then then) {
  ChildReport r;
  bool got = false;
  return in_child(
      [&then](ChildReport&) {
        const Layout l = make_layout();
        if (!uprobe::enable_fault_safe_reads()) _exit(7);
        char buf[64];
        for (int i = 0; i < 10; ++i)
          if (uprobe::probe_read_user_str(buf, sizeof buf, l.b) != -EFAULT || uprobe::probe_read_user(buf, 8, l.e) != -EFAULT)
            _exit(8);
        then(l);
      },
      r, got);
}

TEST(UserRead, DefaultActionStillKills) {
  int st = after_reads([](const Layout& l) { (void)*static_cast<volatile char*>(l.b); });
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV) << status_str(st);
  st = after_reads([](const Layout& l) { (void)*static_cast<volatile char*>(l.e); });
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS) << status_str(st);
  st = after_reads([](const Layout&) { raise(SIGSEGV); });
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV) << status_str(st);
  // What sigaction() shows: SIG_DFL and no flags, as set.
  st = after_reads([](const Layout&) {
    struct sigaction now {};
    sigaction(SIGSEGV, nullptr, &now);
    _exit(now.sa_handler == SIG_DFL && now.sa_flags == 0 ? 0 : 9);
  });
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st);
}

TEST(UserRead, IgnoredSigsegvDropsASentOneAndDiesOfAFault) {
  int st = after_reads([](const Layout&) {
    signal(SIGSEGV, SIG_IGN);
    raise(SIGSEGV);
    kill(getpid(), SIGSEGV);
    struct sigaction now {};
    sigaction(SIGSEGV, nullptr, &now);
    _exit(now.sa_handler == SIG_IGN ? 0 : 9);
  });
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << status_str(st);
  st = after_reads([](const Layout& l) {
    signal(SIGSEGV, SIG_IGN);
    (void)*static_cast<volatile char*>(l.c);
  });
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV) << status_str(st);
}

std::atomic<int> g_reset_runs{0};
char* g_reset_page = nullptr;

void on_segv_once(int) {
  g_reset_runs.fetch_add(1);
  mprotect(g_reset_page, kPage, PROT_READ);  // the faulting load then succeeds
}

TEST(UserRead, ResetHandHandlesOneFault) {
  const int st = after_reads([](const Layout& l) {
    g_reset_page = l.c;
    struct sigaction sa {};
    sa.sa_handler = on_segv_once;
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGSEGV, &sa, nullptr);
    (void)*static_cast<volatile char*>(l.c);  // handled, then SIG_DFL
    struct sigaction now {};
    sigaction(SIGSEGV, nullptr, &now);
    if (g_reset_runs.load() != 1 || now.sa_handler != SIG_DFL || now.sa_flags != static_cast<int>(SA_RESETHAND)) _exit(9);
    char buf[8];
    if (uprobe::probe_read_user(buf, 8, l.b) != -EFAULT) _exit(10);  // the reads still go on
    (void)*static_cast<volatile char*>(l.b);  // the default action
  });
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV) << status_str(st);
}

// ----------------------------------------------------------- in a probe ----

class UserReadProbe : public ::testing::TestWithParam<Kind> {};
INSTANTIATE_TEST_SUITE_P(Kinds, UserReadProbe, ::testing::Values(Kind::int3, Kind::optimized),
                         [](const auto& info) { return std::string(kind_name(info.param)); });

/// Reads the string rdi points to: counts the reads that failed and that
/// gave kGood.
struct StrReader : uprobe::Consumer {
  std::atomic<std::uint64_t> failed{0}, good{0};
  uprobe::Action handler(uprobe::Regs& r) override {
    char buf[64];
    const long n = uprobe::probe_read_user_str(buf, sizeof buf, reinterpret_cast<const void*>(r.rdi));
    if (n < 0) failed.fetch_add(1, std::memory_order_relaxed);
    else if (std::strcmp(buf, kGood) == 0) good.fetch_add(1, std::memory_order_relaxed);
    return uprobe::Action::keep;
  }
};

TEST_P(UserReadProbe, ConsumersReadBadPointers) {
  const Kind kind = GetParam();
  ChildReport r;
  bool got = false;
  const int st = in_child(
      [kind](ChildReport& out) {
        use_kind(kind);
        const Layout l = make_layout();
        out.v[0] = uprobe::enable_fault_safe_reads();
        static StrReader reader;
        uprobe::Attachment a(vaddr(lf_add), reader);
        out.v[1] = uprobe::probe_info(a.probe()).mode == kind_mode(kind);
        const std::uint64_t bad[] = {0, 1, reinterpret_cast<std::uint64_t>(l.b), reinterpret_cast<std::uint64_t>(l.c),
                                     reinterpret_cast<std::uint64_t>(l.e), reinterpret_cast<std::uint64_t>(l.a + kPage - 5),
                                     0xdead000000000000ull};
        for (int i = 0; i < 100; ++i)
          for (std::uint64_t p : bad) lf_add(p, 1);
        out.v[2] = fail_process_vm_readv();
        for (int i = 0; i < 50; ++i) lf_add(reinterpret_cast<std::uint64_t>(kGood), 1);
        out.v[3] = reader.failed.load();
        out.v[4] = reader.good.load();
        if (kind == Kind::int3) {
          // SIGSEGV blocked with a raw system call (libuprobe's state still
          // says unblocked): the int3 hit's consumers follow the trap's mask.
          sigset_t s;
          sigemptyset(&s);
          sigaddset(&s, SIGSEGV);
          syscall(SYS_rt_sigprocmask, SIG_BLOCK, &s, nullptr, 8);
          lf_add(reinterpret_cast<std::uint64_t>(l.b), 1);       // would kill the process in process
          lf_add(reinterpret_cast<std::uint64_t>(kGood), 1);     // by the call: fails under the filter
          syscall(SYS_rt_sigprocmask, SIG_UNBLOCK, &s, nullptr, 8);
          lf_add(reinterpret_cast<std::uint64_t>(kGood), 1);     // in process again
          out.v[5] = reader.failed.load();
          out.v[6] = reader.good.load();
        }
      },
      r, got);
  expect_child(st, got, r);
  EXPECT_EQ(r.v[0], 1u);
  EXPECT_EQ(r.v[1], 1u);
  EXPECT_EQ(r.v[2], 0u);
  EXPECT_EQ(r.v[3], 700u);
  EXPECT_EQ(r.v[4], 50u) << "armed: the consumers' reads must be made in process";
  if (kind == Kind::int3) {
    EXPECT_EQ(r.v[5], 702u);
    EXPECT_EQ(r.v[6], 51u);
  }
}

}  // namespace

namespace {

// A site where glibc runs with every signal blocked (getuid: in posix_spawn's
// child, ProbeInfo::signals_blocked): its consumers' reads are system calls
// whatever the thread's own mask, never a load that could fault there.
TEST_P(UserReadProbe, SitesWhereGlibcBlocksSignalsReadBySystemCall) {
  const Kind kind = GetParam();
  ChildReport r;
  bool got = false;
  const int st = in_child(
      [kind](ChildReport& out) {
        use_kind(kind);
        const Layout l = make_layout();
        out.v[0] = uprobe::enable_fault_safe_reads();
        static StrReader in_glibc, plain;
        auto* const getuid_fn = reinterpret_cast<long (*)(const void*)>(reinterpret_cast<void*>(&getuid));
        uprobe::Attachment a(reinterpret_cast<const void*>(getuid_fn), in_glibc), b(vaddr(lf_add), plain);
        out.v[1] = !uprobe::probe_info(a.probe()).signals_blocked.empty();
        for (int i = 0; i < 10; ++i) getuid_fn(l.b), getuid_fn(nullptr);  // (getuid ignores its "argument": rdi)
        getuid_fn(kGood);
        out.v[2] = fail_process_vm_readv();
        getuid_fn(kGood);  // by the call: fails under the filter
        lf_add(reinterpret_cast<std::uint64_t>(kGood), 1);  // in process
        out.v[3] = in_glibc.failed.load();
        out.v[4] = in_glibc.good.load();
        out.v[5] = plain.good.load();
      },
      r, got);
  expect_child(st, got, r);
  EXPECT_EQ(r.v[0], 1u);
  EXPECT_EQ(r.v[1], 1u);
  EXPECT_EQ(r.v[2], 0u);
  EXPECT_EQ(r.v[3], 21u) << "20 bad pointers, and the good string once the system call fails";
  EXPECT_EQ(r.v[4], 1u);
  EXPECT_EQ(r.v[5], 1u);
}

}  // namespace
