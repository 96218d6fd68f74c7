// SPDX-License-Identifier: MIT
#include "thread_sample.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <signal.h>
#include <ucontext.h>

#include <stdexcept>

#include "arch.hpp"
#include "format.hpp"
#include "sanitize.hpp"
#include "thread_state.hpp"

extern "C" int __sigaction(int, const struct sigaction*, struct sigaction*);

namespace uprobe::detail {

namespace {

constexpr long kTimeoutNs = 2'000'000;
constexpr long kAnswerNs = 50'000'000;
/// Tag in the upper half of si_value ("UPRO"); the lower half is the request
/// generation, so a late answer to an expired request is consumed unused.
constexpr std::uint64_t kTag = 0x5550524FULL << 32;
constexpr std::size_t kMaxAnswers = 4096;
constexpr std::uint64_t kInTrap = ~0ull;
/// How far below its ucontext the rest of a signal delivery's frame can be.
constexpr std::uint64_t kFrameReach = 64 * 1024;

int g_sample_sig = 0;

struct Request {
  std::atomic<std::uint64_t> live{0};  ///< tag | generation while a request is open, else 0
  std::atomic<std::uint32_t> claimed{0};
  std::atomic<std::uint32_t> answered{0};
  std::uint64_t ips[kMaxAnswers];
  std::uint64_t resumes[kMaxAnswers];  ///< the rip a pending sigreturn of an int3 hit goes to, 0 = none
  std::uint64_t trap_ips[kMaxAnswers];  ///< the probe a thread in our SIGTRAP handler is handling (ips[] = kInTrap)
};
Request g_req;
std::uint32_t g_gen = 0;

/// The sample signal's handler. Async-signal-safe, no system call. Not
/// instrumented: in ThreadSanitizer builds it is installed past TSan (see
/// set_handler()) and may interrupt the TSan runtime itself.
UPROBE_NO_SANITIZE void on_sample(int, siginfo_t* info, void* ctx) {
  if (info->si_code != SI_QUEUE) return;
  const auto v = reinterpret_cast<std::uint64_t>(info->si_value.sival_ptr);
  if ((v & ~0xFFFFFFFFull) != kTag || v != g_req.live.load(std::memory_order_acquire)) return;
  const auto* uc = static_cast<const ucontext_t*>(ctx);
  // Inside our SIGTRAP handler before it decided where the thread goes:
  // counts as inside. Past the decision but not through sigreturn yet (the
  // rest of the handler, or __restore_rt): the stack pointer is still inside
  // the int3's signal frame, and the thread goes to that frame's rip.
  const StatBlock* st = t_state.stats;  // none yet: this thread never hit a probe
  const std::uint64_t trap_ip = st ? st->trap_ip.load(std::memory_order_relaxed) : 0;
  const std::uint64_t ip = trap_ip ? kInTrap : arch::ucontext_ip(uc);
  const auto* tuc = static_cast<const ucontext_t*>(t_state.trap_uc);
  const std::uint64_t sp = arch::ucontext_sp(uc);
  const auto top = reinterpret_cast<std::uint64_t>(tuc) + sizeof(ucontext_t);
  std::uint64_t resume = 0;
  if (ip != kInTrap && tuc && sp <= top && sp + kFrameReach >= top) resume = arch::ucontext_ip(tuc);
  const std::uint32_t i = g_req.claimed.fetch_add(1, std::memory_order_relaxed);
  if (i < kMaxAnswers) {
    g_req.ips[i] = ip;
    g_req.resumes[i] = resume;
    g_req.trap_ips[i] = trap_ip;
  }
  g_req.answered.fetch_add(1, std::memory_order_release);
}


/// A thread handling the probe at `trap_ip` has not decided where it goes
/// next: a continuation inside a window is only possible for a probe at most
/// one instruction before the window's end (the fall-through; a branch into
/// a window was excluded), so it counts as inside when [trap_ip, trap_ip +
/// 15] meets a range.
bool handling_near(const std::vector<AddrRange>& ranges, std::uint64_t trap_ip) {
  for (const AddrRange& r : ranges)
    if (trap_ip < r.second && trap_ip + arch::kMaxInsnLen >= r.first) return true;
  return false;
}

bool inside(const std::vector<AddrRange>& ranges, std::uint64_t ip) {
  if (ip == kInTrap) return true;
  for (const AddrRange& r : ranges)
    if (ip > r.first && ip < r.second) return true;  // at r.first the thread meets the int3 or the jump
  return false;
}

/// Installs `sa` for the sample signal through glibc's __sigaction, as the
/// SIGTRAP handler is (signals.cpp): libuprobe's own handler, not one of the
/// program's (which the interposed sigaction() wraps to give them the
/// program's view of the mask), and past TSan's sigaction interceptor: TSan
/// would defer the signal to the thread's next intercepted call and run
/// on_sample then with the delivery's ucontext, so a thread that was inside
/// our SIGTRAP handler would answer with that handler's ip after it resumed
/// (possibly inside a window), and a thread that computes without libc calls
/// would not answer within kAnswerNs at all.
void set_handler(int sig, const struct sigaction& sa) { __sigaction(sig, &sa, nullptr); }

constexpr int kRunning = 0, kBlocked = 1, kGone = 2;

/// The user rip of a thread blocked in the kernel, from
/// /proc/self/task/<tid>/syscall ("nr a1..a6 sp pc" in a system call, "-1 sp
/// pc" blocked elsewhere, e.g. in a page fault): kBlocked with `ip`;
/// kRunning when it is runnable ("running": on a CPU or preempted); kGone
/// when the thread has exited.
int blocked_ip(long tid, std::uint64_t& ip) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", tid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? kGone : kRunning;
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return kGone;
  buf[n] = '\0';
  if (std::strncmp(buf, "running", 7) == 0) return kRunning;
  const char* last = std::strrchr(buf, ' ');
  if (!last) return kRunning;
  char* end = nullptr;
  ip = std::strtoull(last + 1, &end, 16);
  return end != last + 1 ? kBlocked : kRunning;
}

/// Whether thread `tid` blocks signal `sig` (SigBlk in
/// /proc/self/task/<tid>/status): then it cannot answer a sample (e.g. a
/// sanitizer runtime's own thread, which blocks every signal).
bool blocks_signal(long tid, int sig) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%ld/status", tid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* p = std::strstr(buf, "\nSigBlk:");
  if (!p) return false;
  const unsigned long long mask = std::strtoull(p + 8, nullptr, 16);
  return (mask >> (sig - 1)) & 1;
}

long now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1'000'000'000L + ts.tv_nsec;
}

}  // namespace

/// Sends the sample signal to `running` and checks their answers.
bool sample_running(const std::vector<long>& running, const std::vector<AddrRange>& ranges, std::string& why,
                    std::uint64_t* culprit);

bool threads_outside(const std::vector<AddrRange>& ranges, std::string& why, std::uint64_t* culprit, bool wait) {
  why.clear();
  if (culprit) *culprit = 0;
  if (ranges.empty()) return true;
  const long self = ::syscall(SYS_gettid);
  DIR* d = ::opendir("/proc/self/task");
  if (!d) {
    why = std::string("cannot list the threads (/proc/self/task): ") + std::strerror(errno);
    return false;
  }
  std::vector<long> tids;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9') tids.push_back(std::strtol(e->d_name, nullptr, 10));
  ::closedir(d);
  // A thread that just kept running through a whole poll is not polled again
  // for 50 ms (one read only): attaching many entries while a thread computes
  // does not wait 2 ms per entry.
  static long busy_tid = 0, busy_until = 0;
  const long start = now_ns();
  const long deadline = start + (g_sample_sig ? kTimeoutNs / 10 : kTimeoutNs);
  std::vector<long> running;
  for (long tid : tids) {
    if (tid == self) continue;
    std::uint64_t ip = 0;
    bool no_sample = !g_sample_sig;  // observed by polling only
    for (;;) {
      const int st = blocked_ip(tid, ip);
      if (st == kGone) break;
      if (st == kBlocked) {
        if (inside(ranges, ip)) {
          why = "thread " + std::to_string(tid) + " is stopped at " + hex(ip) +
                ", inside the instructions the jump would displace";
          if (culprit) *culprit = ip;
          return false;
        }
        break;
      }
      if (!no_sample && now_ns() >= deadline) {
        if (!blocks_signal(tid, g_sample_sig)) {
          running.push_back(tid);
          break;
        }
        no_sample = true;  // it would never answer: poll it as without a sample signal
      }
      if (no_sample && !wait) {
        why = "thread " + std::to_string(tid) + " is running, and no sample signal (Config::sample_signal) observes it";
        return false;
      }
      if (no_sample && (now_ns() >= start + kTimeoutNs || (tid == busy_tid && start < busy_until))) {
        if (tid != busy_tid || start >= busy_until) {
          busy_tid = tid;
          busy_until = now_ns() + 50'000'000;
        }
        why = "thread " + std::to_string(tid) + " kept running for " + std::to_string(kTimeoutNs / 1000000) +
              " ms, so it could not be observed outside the displaced instructions";
        return false;
      }
      ::sched_yield();
    }
  }
  if (!running.empty() && !sample_running(running, ranges, why, culprit)) return false;
  // A thread stopped inside our SIGTRAP handler was observed where the
  // handler is; where it resumes is decided only at the handler's end.
  for (std::uint64_t ip : trap_ips_in_flight())
    if (ip != 0 && handling_near(ranges, ip)) {
      why = "a thread is handling the probe hit at " + hex(ip) + " and may resume inside the displaced instructions";
      return false;
    }
  return true;
}

bool sample_running(const std::vector<long>& running, const std::vector<AddrRange>& ranges, std::string& why,
                    std::uint64_t* culprit) {
  const pid_t pid = ::getpid();
  const std::uint64_t tag = kTag | ++g_gen;
  g_req.claimed.store(0, std::memory_order_relaxed);
  g_req.answered.store(0, std::memory_order_relaxed);
  g_req.live.store(tag, std::memory_order_release);
  std::uint32_t sent = 0;
  for (long tid : running) {
    if (sent >= kMaxAnswers) break;
    siginfo_t si;
    std::memset(&si, 0, sizeof si);
    si.si_signo = g_sample_sig;
    si.si_code = SI_QUEUE;
    si.si_pid = pid;
    si.si_uid = ::getuid();
    si.si_value.sival_ptr = reinterpret_cast<void*>(tag);
    if (::syscall(SYS_rt_tgsigqueueinfo, pid, tid, g_sample_sig, &si) == 0) ++sent;  // ESRCH: it exited
  }
  bool ok = true;
  const long deadline = now_ns() + kAnswerNs;
  while (g_req.answered.load(std::memory_order_acquire) < sent && now_ns() < deadline) {
    timespec ts{0, 20'000};
    ::nanosleep(&ts, nullptr);
  }
  const std::uint32_t got = g_req.answered.load(std::memory_order_acquire);
  if (running.size() > kMaxAnswers) {
    why = "more than " + std::to_string(kMaxAnswers) + " running threads to sample";
    ok = false;
  } else if (got < sent) {
    why = std::to_string(sent - got) + " of " + std::to_string(sent) + " running threads did not answer signal " +
          std::to_string(g_sample_sig) + " within 50 ms (blocked?)";
    ok = false;
  } else {
    for (std::uint32_t i = 0; i < got && i < kMaxAnswers; ++i)
      if ((g_req.ips[i] == kInTrap ? handling_near(ranges, g_req.trap_ips[i]) : inside(ranges, g_req.ips[i])) ||
          (g_req.resumes[i] && inside(ranges, g_req.resumes[i]))) {
        why = g_req.ips[i] == kInTrap ? "a running thread was handling the probe hit at " + hex(g_req.trap_ips[i])
                                      : "a running thread was at " + hex(g_req.ips[i]) +
                                            (g_req.resumes[i] ? " (returning from a probe hit to " +
                                                                    hex(g_req.resumes[i]) + ")"
                                                              : "") +
                                            ", inside the instructions the jump would displace";
        if (culprit && g_req.ips[i] != kInTrap)
          *culprit = inside(ranges, g_req.ips[i]) ? g_req.ips[i] : g_req.resumes[i];
        ok = false;
        break;
      }
  }
  g_req.live.store(0, std::memory_order_release);
  return ok;
}

void set_sample_signal(int sig) {
  if (sig == g_sample_sig) return;
  if (sig != 0 && (sig < SIGRTMIN || sig > SIGRTMAX))
    throw std::invalid_argument("libuprobe: Config::sample_signal must be 0 or a real-time signal (" +
                                std::to_string(SIGRTMIN) + ".." + std::to_string(SIGRTMAX) + "), not " +
                                std::to_string(sig));
  if (sig != 0) {
    struct sigaction old;
    if (::sigaction(sig, nullptr, &old) != 0)
      throw std::invalid_argument("libuprobe: Config::sample_signal " + std::to_string(sig) + ": " +
                                  std::strerror(errno));
    const bool ours = (old.sa_flags & SA_SIGINFO) && old.sa_sigaction == on_sample;
    if (!ours && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)
      throw std::invalid_argument("libuprobe: Config::sample_signal " + std::to_string(sig) +
                                  " already has a handler in this program; choose a signal it does not use");
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sample;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    set_handler(sig, sa);
  }
  if (g_sample_sig != 0) {
    // Give the old one back to its default (late answers are ignored by the tag).
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_IGN;
    set_handler(g_sample_sig, dfl);
  }
  g_sample_sig = sig;
}

int sample_signal() noexcept { return g_sample_sig; }

}  // namespace uprobe::detail
