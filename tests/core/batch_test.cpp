// SPDX-License-Identifier: MIT
// The batch API (uprobe/batch.hpp): exact hit counts through probes
// registered in one batch, per-request errors that leave the other requests
// and the process intact, detaching a batch restoring every byte, several
// consumers of one probe in one batch, batches mixed with single
// registrations, the RAII forms, and batches racing with hits.

#include <dlfcn.h>
#include <pthread.h>
#include <algorithm>
#include <csignal>
#include <sys/wait.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <thread>

#include "common.hpp"
#include "fixtures.hpp"
#include "proc_text.hpp"
#include "uprobe/batch.hpp"
#include "uprobe/symbols.hpp"

using namespace coretest;
using uprobe::Errc;

extern "C" {
/// batch_fixtures.S: batch_fx_N(a) = a + N.
extern std::uint64_t (*const batch_fx[])(std::uint64_t);
extern volatile std::uint16_t batch_sem;
}

namespace {

constexpr std::size_t kFixtures = 256;      // used by most tests
constexpr std::size_t kAllFixtures = 4096;  // batch_fixtures.S

const void* fx(std::size_t i) { return reinterpret_cast<const void*>(batch_fx[i]); }

/// libc's own entry of `name` (not a sanitizer's interceptor of it, which
/// the global scope finds first under ASan/TSan).
void* libc_sym(const char* name) {
  static void* const libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  return libc ? dlsym(libc, name) : nullptr;
}

/// The file offsets of libc's first `max` sized .dynsym functions, in offset order.
std::vector<std::uint64_t> libc_function_offsets(const std::string& libc, std::size_t max) {
  std::vector<std::uint64_t> offsets;
  for (const auto& sym : uprobe::read_symbols(libc))
    if (sym.executable && sym.size > 0 && sym.type == STT_FUNC) offsets.push_back(sym.offset);
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  offsets.resize(std::min(offsets.size(), max));
  return offsets;
}

/// The bytes of a file.
std::vector<char> file_contents(const std::string& path) {
  std::vector<char> out;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[65536];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.insert(out.end(), buf, buf + n);
    std::fclose(f);
  }
  return out;
}



/// Calls batch_fx_i `times` times and checks every return value.
void call(std::size_t i, std::uint64_t times) {
  for (std::uint64_t k = 0; k < times; ++k) ASSERT_EQ(batch_fx[i](k), k + i) << "batch_fx_" << i;
}

/// First 16 bytes of every fixture (each is at most 16 bytes long).
std::vector<std::vector<std::uint8_t>> all_bytes() {
  std::vector<std::vector<std::uint8_t>> out;
  for (std::size_t i = 0; i < kFixtures; ++i) out.push_back(mem_bytes(fx(i), 16));
  return out;
}

std::vector<uprobe::ProbeConsumer> pairs_of(const std::vector<uprobe::RegisterResult>& res,
                                            const std::vector<uprobe::ProbeRequest>& reqs) {
  std::vector<uprobe::ProbeConsumer> out;
  for (std::size_t i = 0; i < res.size(); ++i)
    if (res[i].probe) out.push_back({res[i].probe, reqs[i].consumer});
  return out;
}

/// One batch on batch_fx_[from, to): attach, one call each, detach; the hits counted.
std::uint64_t attach_call_detach(std::size_t from, std::size_t to) {
  Counter c;
  std::vector<uprobe::ProbeRequest> reqs;
  for (std::size_t i = from; i < to; ++i) reqs.push_back(uprobe::ProbeRequest::at(fx(i), c));
  const auto res = uprobe::register_uprobes(reqs);
  for (const auto& r : res) EXPECT_TRUE(r) << r.error->what();
  for (std::size_t i = from; i < to; ++i) call(i, 1);
  for (const auto& e : uprobe::unregister_uprobes(pairs_of(res, reqs))) EXPECT_FALSE(e);
  return c.hits.load();
}

TEST(Batch, ExactHitCountsOnEveryProbeThenDetachRestoresEveryByte) {
  const auto before = all_bytes();
  const MappingSnapshot text_before = snapshot_mapping(fx(0));
  std::vector<Counter> counters(kFixtures);
  std::vector<uprobe::ProbeRequest> reqs;
  for (std::size_t i = 0; i < kFixtures; ++i) {
    counters[i].expect_ip = reinterpret_cast<std::uint64_t>(fx(i));
    reqs.push_back(uprobe::ProbeRequest::at(fx(i), counters[i]));
  }
  const auto res = uprobe::register_uprobes(reqs);
  ASSERT_EQ(res.size(), kFixtures);
  for (std::size_t i = 0; i < kFixtures; ++i) {
    ASSERT_TRUE(res[i]) << i << ": " << (res[i].error ? res[i].error->what() : "");
    EXPECT_FALSE(res[i].error);
    const uprobe::ProbeInfo info = uprobe::probe_info(res[i].probe);
    EXPECT_EQ(info.sites, 1u) << i;
    EXPECT_EQ(info.consumers, 1u) << i;
    EXPECT_EQ(info.mode, uprobe::ProbeMode::int3) << i;
    EXPECT_EQ(*static_cast<const std::uint8_t*>(fx(i)), 0xCC) << i;
  }
  for (std::size_t i = 0; i < kFixtures; ++i) call(i, i % 7 + 1);
  for (std::size_t i = 0; i < kFixtures; ++i) {
    EXPECT_EQ(counters[i].hits.load(), i % 7 + 1) << "batch_fx_" << i;
    EXPECT_EQ(counters[i].bad_ip.load(), 0u) << "batch_fx_" << i;
  }

  const auto errs = uprobe::unregister_uprobes(pairs_of(res, reqs));
  ASSERT_EQ(errs.size(), kFixtures);
  for (std::size_t i = 0; i < kFixtures; ++i) EXPECT_FALSE(errs[i]) << i << ": " << errs[i]->what();
  EXPECT_EQ(all_bytes(), before);
  EXPECT_EQ(diff_snapshot(text_before), "") << "the program's code is byte for byte what it was";
  for (std::size_t i = 0; i < kFixtures; ++i) call(i, 3);
  for (std::size_t i = 0; i < kFixtures; ++i) EXPECT_EQ(counters[i].hits.load(), i % 7 + 1) << i;
}

TEST(Batch, ABatchLargerThanOneXolRegion) {
  // 4096 out-of-line and emulated sites: 4096 XOL slots of 32 bytes, more
  // than one 64 KiB region holds, all placed against the batch's one
  // address-space snapshot.
  std::vector<Counter> counters(kAllFixtures);
  std::vector<uprobe::ProbeRequest> reqs;
  for (std::size_t i = 0; i < kAllFixtures; ++i) reqs.push_back(uprobe::ProbeRequest::at(fx(i), counters[i]));
  const auto res = uprobe::register_uprobes(reqs);
  std::size_t ok = 0;
  for (const auto& r : res) ok += r.probe != nullptr;
  EXPECT_EQ(ok, kAllFixtures) << (res.back().error ? res.back().error->what() : "");
  for (std::size_t i = 0; i < kAllFixtures; ++i) call(i, 1 + i % 3);
  for (std::size_t i = 0; i < kAllFixtures; ++i) ASSERT_EQ(counters[i].hits.load(), 1 + i % 3) << i;
  for (const auto& e : uprobe::unregister_uprobes(pairs_of(res, reqs))) EXPECT_FALSE(e);
  for (std::size_t i = 0; i < kAllFixtures; ++i) ASSERT_NE(*static_cast<const std::uint8_t*>(fx(i)), 0xCC) << i;
}

TEST(Batch, BytesMatchTheFileAfterDetach) {
  const std::string exe = self_exe();
  std::vector<std::uint64_t> offsets;
  for (std::size_t i = 0; i < 32; ++i) offsets.push_back(uprobe::resolve_address(fx(i)).offset);
  Counter c;
  std::vector<uprobe::ProbeRequest> reqs;
  for (std::uint64_t off : offsets) reqs.push_back(uprobe::ProbeRequest::at(exe, off, c));
  const auto res = uprobe::register_uprobes(reqs);
  for (const auto& r : res) ASSERT_TRUE(r) << r.error->what();
  for (std::size_t i = 0; i < 32; ++i) call(i, 2);
  EXPECT_EQ(c.hits.load(), 64u);
  for (const auto& e : uprobe::unregister_uprobes(pairs_of(res, reqs))) EXPECT_FALSE(e);
  for (std::size_t i = 0; i < 32; ++i) EXPECT_EQ(mem_bytes(fx(i), 8), file_bytes(exe, offsets[i], 8)) << i;
}

TEST(Batch, ManyRequestsOnOneFileAnalyzeAsSingleRequestsDo) {
  // Past 16 requests on one file a batch maps the file's executable segment
  // once and analyzes from that mapping: every probe is described exactly as
  // the same request made alone describes it, a mid-instruction offset
  // after the 16th request is refused with its own error, and the mapping is
  // gone when the batch returns.
  const std::string exe = self_exe();
  auto mappings_of_exe = [&] {
    std::size_t n = 0;
    for (const auto& m : uprobe_test::read_maps()) n += m.path == exe;
    return n;
  };
  const std::size_t exe_mappings = mappings_of_exe();
  const std::uint64_t off1 = uprobe::resolve_address(fx(1)).offset;  // lea 1(%rdi), %rax: 4 bytes
  Counter c;
  std::vector<uprobe::ProbeRequest> reqs;
  for (std::size_t i = 20; i < 60; ++i) reqs.push_back(uprobe::ProbeRequest::at(fx(i), c));
  reqs.push_back(uprobe::ProbeRequest::at(exe, off1 + 1, c));  // request 40
  const auto res = uprobe::register_uprobes(reqs);
  ASSERT_EQ(res.size(), 41u);
  EXPECT_EQ(mappings_of_exe(), exe_mappings);
  ASSERT_FALSE(res[40]);
  EXPECT_EQ(res[40].error->code(), Errc::mid_instruction) << res[40].error->what();
  std::vector<uprobe::ProbeInfo> batch_info;
  for (std::size_t k = 0; k < 40; ++k) {
    ASSERT_TRUE(res[k]) << k << ": " << res[k].error->what();
    batch_info.push_back(uprobe::probe_info(res[k].probe));
  }
  for (std::size_t i = 20; i < 60; ++i) call(i, 2);
  EXPECT_EQ(c.hits.load(), 80u);
  std::vector<uprobe::ProbeRequest> good(reqs.begin(), reqs.begin() + 40);
  for (const auto& e : uprobe::unregister_uprobes(pairs_of(std::vector<uprobe::RegisterResult>(res.begin(), res.begin() + 40), good)))
    EXPECT_FALSE(e);
  for (std::size_t k = 0; k < 40; ++k) {
    uprobe::Uprobe* up = uprobe::register_uprobe(fx(20 + k), c);
    const uprobe::ProbeInfo alone = uprobe::probe_info(up);
    EXPECT_EQ(alone.instruction, batch_info[k].instruction) << k;
    EXPECT_EQ(alone.emulated, batch_info[k].emulated) << k;
    EXPECT_EQ(alone.mode, batch_info[k].mode) << k;
    EXPECT_EQ(alone.displaced, batch_info[k].displaced) << k;
    EXPECT_EQ(alone.why_not_optimized, batch_info[k].why_not_optimized) << k;
    uprobe::unregister_uprobe(up, c);
  }
  try {
    uprobe::register_uprobe(exe, off1 + 1, c);
    ADD_FAILURE() << "a mid-instruction offset was accepted alone";
  } catch (const uprobe::Error& e) {
    EXPECT_EQ(e.code(), Errc::mid_instruction);
    EXPECT_STREQ(e.what(), res[40].error->what());
  }
}

TEST(Batch, OwnTextReadsAndWritesHitNoProbeOnLibcWrappers) {
  // libuprobe reads and writes probed text with system calls of its own
  // (raw_syscall.hpp), not through libc's wrappers: a probe on libc's
  // process_vm_readv() sees the program's calls and none of the runtime's
  // reads while a batch attaches and detaches (with libc's wrapper, every
  // page of the attach and every site of the detach was a hit).
  using Fn = ssize_t (*)(pid_t, const struct iovec*, unsigned long, const struct iovec*, unsigned long, unsigned long);
  const auto libc_pvr = reinterpret_cast<Fn>(libc_sym("process_vm_readv"));
  ASSERT_NE(libc_pvr, nullptr);
  Counter pvr;
  uprobe::Uprobe* probe = uprobe::register_uprobe(reinterpret_cast<const void*>(libc_pvr), pvr);
  EXPECT_EQ(attach_call_detach(100, 140), 40u);
  EXPECT_EQ(pvr.hits.load(), 0u);
  // The program's own call is a hit.
  std::uint8_t byte = 0;
  const struct iovec local = {&byte, 1}, remote = {const_cast<void*>(fx(100)), 1};
  EXPECT_EQ(libc_pvr(getpid(), &local, 1, &remote, 1, 0), 1);
  EXPECT_EQ(pvr.hits.load(), 1u);
  uprobe::unregister_uprobe(probe, pvr);
}

TEST(Batch, LibcOpenPwriteCloseCanBeProbedAndThePatcherIsNotSeen) {
  // The text patcher (batches, detaches, and Action::remove from inside a
  // handler) opens /proc/self/mem, writes and closes it with system calls of
  // its own: libc's open, pwrite64 and close are probe targets like any
  // other (they were refused while the patcher went through them, as a
  // handler would have hit them), and none of the patcher's calls is a hit.
  // (Registering opens and reads /proc/self/maps and ELF files through libc,
  // as any library in the process does: those opens are the process's.)
  const std::string libc = uprobe::resolve_library("libc.so.6");
  using Open = int (*)(const char*, int, ...);
  using Pwrite = ssize_t (*)(int, const void*, std::size_t, off_t);
  using Close = int (*)(int);
  const auto open_fn = reinterpret_cast<Open>(libc_sym("open"));
  const auto pwrite_fn = reinterpret_cast<Pwrite>(libc_sym("pwrite64"));
  const auto close_fn = reinterpret_cast<Close>(libc_sym("close"));
  ASSERT_TRUE(open_fn && pwrite_fn && close_fn);
  const void* fns[3] = {reinterpret_cast<const void*>(open_fn), reinterpret_cast<const void*>(pwrite_fn),
                        reinterpret_cast<const void*>(close_fn)};
  Counter on[3];
  uprobe::Uprobe* probes[3];
  std::vector<std::uint8_t> file[3];
  for (int k = 0; k < 3; ++k) {
    const uprobe::FileOffset where = uprobe::resolve_address(fns[k]);
    ASSERT_EQ(where.path, libc);
    file[k] = file_bytes(libc, where.offset, 8);
    probes[k] = uprobe::register_uprobe(fns[k], on[k]);
  }
  struct RemoveOnce : uprobe::Consumer {
    std::atomic<int> hits{0};
    uprobe::Action handler(uprobe::Regs&) override {
      hits.fetch_add(1);
      return uprobe::Action::remove;
    }
  } remover;
  uprobe::Uprobe* removing = uprobe::register_uprobe(fx(150), remover);
  auto counts = [&] { return std::array<std::uint64_t, 3>{on[0].hits.load(), on[1].hits.load(), on[2].hits.load()}; };
  const auto before = counts();
  // The program's own calls: one hit each.
  const int fd = open_fn("/dev/null", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(pwrite_fn(fd, "x", 1, 0), 1);
  EXPECT_EQ(close_fn(fd), 0);
  auto now = counts();
  for (int k = 0; k < 3; ++k) EXPECT_EQ(now[k], before[k] + 1) << k;
  // A probe whose only consumer removes it: its handler rewrites the text
  // (open, pwrite, close of /proc/self/mem from inside the SIGTRAP handler).
  call(150, 3);
  EXPECT_EQ(remover.hits.load(), 1);
  EXPECT_NE(*static_cast<const std::uint8_t*>(fx(150)), 0xCC);
  EXPECT_EQ(counts(), now);
  uprobe::unregister_uprobe(removing, remover);
  // A batch attach and detach write every site: no pwrite64 hit.
  EXPECT_EQ(attach_call_detach(160, 200), 40u);
  EXPECT_EQ(on[1].hits.load(), now[1]);
  for (int k = 0; k < 3; ++k) uprobe::unregister_uprobe(probes[k], on[k]);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(mem_bytes(fns[k], 8), file[k]) << k;
}

TEST(Batch, LibcGetpidAndSyscallStayRefusedWithTheirReasons) {
  // Both run with every signal blocked in glibc or liburcu-bp, where an int3
  // hit is fatal: pthread_kill()/pthread_cancel() of another thread block
  // all signals and then call getpid() (glibc 2.36); liburcu-bp's grace
  // period calls syscall(membarrier) with signals blocked. (libuprobe's own
  // trap path calls neither: it makes those system calls itself.)
  struct {
    const char* name;
    const char* reason;
  } const cases[] = {{"getpid", "runs with SIGTRAP blocked (glibc's pthread_kill and pthread_cancel"},
                     {"syscall", "runs with SIGTRAP blocked (liburcu-bp's grace period"}};
  for (const auto& k : cases) {
    const void* fn = libc_sym(k.name);
    ASSERT_NE(fn, nullptr) << k.name;
    try {
      Counter nobody;
      uprobe::register_uprobe(fn, nobody);
      ADD_FAILURE() << k.name << "() was accepted";
    } catch (const uprobe::Error& e) {
      EXPECT_EQ(e.code(), Errc::forbidden_target) << k.name;
      EXPECT_NE(std::string(e.what()).find(k.reason), std::string::npos) << e.what();
    }
  }
  // And a pthread_kill() of another thread, which runs getpid() with every
  // signal blocked, is unaffected by probes elsewhere.
  Counter c;
  uprobe::Attachment a(fx(210), c);
  std::atomic<bool> got{false};
  struct sigaction sa {}, old{};
  static std::atomic<bool>* flag;
  flag = &got;
  sa.sa_handler = [](int) { flag->store(true); };
  ASSERT_EQ(sigaction(SIGUSR2, &sa, &old), 0);
  std::atomic<bool> ready{false}, done{false};
  std::thread t([&] {
    ready.store(true);
    while (!got.load()) call(210, 1);
    done.store(true);
  });
  while (!ready.load()) {
  }
  ASSERT_EQ(pthread_kill(t.native_handle(), SIGUSR2), 0);
  t.join();
  sigaction(SIGUSR2, &old, nullptr);
  EXPECT_TRUE(done.load());
  EXPECT_GT(c.hits.load(), 0u);
}

TEST(Batch, AFileRewrittenDuringBatchesGivesErrorsNotACrash) {
  // Another process rewrites the probed file in place, as `cp new old` does
  // (O_TRUNC, then writes), while batches of a thousand requests on it are
  // analysed: every request is accepted or refused with its own error, and
  // nothing faults (the batch reads the file, it never maps it: a mapped
  // page past a truncation raised SIGBUS in the attaching process).
  const std::string libc = uprobe::resolve_library("libc.so.6");
  const std::vector<std::uint64_t> offsets = libc_function_offsets(libc, 1000);
  ASSERT_EQ(offsets.size(), 1000u);
  const std::vector<char> image = file_contents(libc);
  ASSERT_FALSE(image.empty());
  char dir[] = "/tmp/uprobe-rewrite-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/lib.so";
  auto write_all = [&](int fd) {
    for (std::size_t done = 0; done < image.size();) {
      const ssize_t n = ::write(fd, image.data() + done, std::min<std::size_t>(65536, image.size() - done));
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
  };
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    write_all(fd);
    ::close(fd);
  }
  const pid_t parent = ::getpid();
  const pid_t writer = ::fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // not left writing (and holding ctest's pipe) if this test dies
    if (::getppid() != parent) ::_exit(1);
    for (;;) {
      const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
      if (fd < 0) ::_exit(1);
      write_all(fd);
      ::close(fd);
    }
  }
  Counter c;
  std::size_t accepted = 0, refused = 0;
  for (int round = 0; round < 100; ++round) {
    std::vector<uprobe::ProbeRequest> reqs;
    for (std::uint64_t off : offsets) reqs.push_back(uprobe::ProbeRequest::at(path, off, c));
    const auto res = uprobe::register_uprobes(reqs);
    std::vector<uprobe::ProbeConsumer> undo;
    for (const auto& r : res) {
      if (r) {
        undo.push_back({r.probe, &c});
        ++accepted;
      } else {
        ++refused;
        EXPECT_NE(std::string(r.error->what()).find(path), std::string::npos) << r.error->what();
      }
    }
    for (const auto& e : uprobe::unregister_uprobes(undo)) EXPECT_FALSE(e);
  }
  ::kill(writer, SIGKILL);
  ::waitpid(writer, nullptr, 0);
  ::unlink(path.c_str());
  ::rmdir(dir);
  EXPECT_EQ(accepted + refused, 100u * offsets.size());
  EXPECT_EQ(c.hits.load(), 0u);  // the file is not mapped here: pending probes only
}

TEST(Batch, AHandlerRemovingItsProbeDuringABatchDoesNotFailTheBatchRequestOnIt) {
  // A probe whose consumer returns Action::remove is taken out by the handler
  // on another thread (without the registry mutex) while a batch analyses a
  // request for a new consumer on that same probe, after it has read the
  // page (its per-thread page copy, then 1500 pending requests): the request
  // must succeed, and the new consumer then count. Before the page copy
  // knew of other threads' writes, ~20% of such batches refused it ("the
  // byte in memory is 0xcc ... another breakpoint is there").
  const std::size_t a = 220, b = 221;  // neighbours: one page
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(fx(a)) >> 12, reinterpret_cast<std::uintptr_t>(fx(b)) >> 12);
  const std::string libc = uprobe::resolve_library("libc.so.6");
  const std::vector<std::uint64_t> offsets = libc_function_offsets(libc, 1500);
  // The pending requests name a file this process has not mapped.
  char dir[] = "/tmp/uprobe-pending-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string copy = std::string(dir) + "/lib.so";
  {
    const std::vector<char> image = file_contents(libc);
    FILE* out = std::fopen(copy.c_str(), "wb");
    ASSERT_TRUE(out && !image.empty());
    ASSERT_EQ(std::fwrite(image.data(), 1, image.size(), out), image.size());
    std::fclose(out);
  }
  struct Remover : uprobe::Consumer {
    std::atomic<long> hits{0};
    uprobe::Action handler(uprobe::Regs&) override {
      hits.fetch_add(1);
      return uprobe::Action::remove;
    }
  };
  Counter on_b_always, filler;
  uprobe::Attachment keep_b(fx(b), on_b_always);  // fx(b)'s probe: published, on the same page
  std::atomic<int> go{0};
  std::atomic<long> delay_us{0};
  std::atomic<bool> stop{false};
  std::thread hitter([&] {
    while (!stop.load()) {
      while (!go.load() && !stop.load()) {
      }
      if (stop.load()) break;
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us.load()));
      batch_fx[a](1);
      go.store(0);
    }
  });
  std::uint64_t seed = 3;
  int refused = 0;
  std::string first;
  for (int it = 0; it < 100; ++it) {
    Remover remover;
    Counter ca, cb;
    uprobe::Uprobe* p = uprobe::register_uprobe(fx(a), remover);
    std::vector<uprobe::ProbeRequest> reqs;
    reqs.push_back(uprobe::ProbeRequest::at(fx(b), cb));
    for (std::uint64_t off : offsets) reqs.push_back(uprobe::ProbeRequest::at(copy, off, filler));
    reqs.push_back(uprobe::ProbeRequest::at(fx(a), ca));
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    delay_us.store(static_cast<long>((seed >> 33) % 4000));
    go.store(1);
    const auto res = uprobe::register_uprobes(reqs);
    while (go.load()) {
    }
    std::vector<uprobe::ProbeConsumer> undo;
    for (std::size_t i = 0; i < res.size(); ++i)
      if (res[i]) undo.push_back({res[i].probe, reqs[i].consumer});
    if (!res.back()) {
      ++refused;
      if (first.empty()) first = res.back().error->what();
    } else {
      const std::uint64_t before = ca.hits.load();  // 0 or 1: the hitter's call may come after the batch
      batch_fx[a](5);
      EXPECT_EQ(ca.hits.load(), before + 1) << it;
    }
    for (const auto& e : uprobe::unregister_uprobes(undo)) EXPECT_FALSE(e);
    uprobe::unregister_uprobe(p, remover);
  }
  stop.store(true);
  go.store(1);
  hitter.join();
  ::unlink(copy.c_str());
  ::rmdir(dir);
  EXPECT_EQ(refused, 0) << first;
}

TEST(Batch, EachBadRequestGetsItsOwnErrorAndChangesNothing) {
  const std::string exe = self_exe();
  const MappingSnapshot text_before = snapshot_mapping(fx(0));
  const MappingSnapshot lib_before = snapshot_mapping(reinterpret_cast<const void*>(&uprobe::register_uprobes));
  const std::uint8_t fx13_before = *static_cast<const std::uint8_t*>(fx(13));
  const std::uint64_t off1 = uprobe::resolve_address(fx(1)).offset;  // lea 1(%rdi), %rax: 4 bytes
  static const char rodata_text[64] = "data, not code";
  Counter good_a, good_b, dup, nobody;
  std::vector<uprobe::ProbeRequest> reqs = {
      uprobe::ProbeRequest::at(fx(10), good_a),                          // 0 ok
      uprobe::ProbeRequest::at("/nonexistent/libuprobe-batch", 0, dup),  // 1 file_not_found
      uprobe::ProbeRequest::at(exe, 1ull << 40, dup),                    // 2 bad_offset
      uprobe::ProbeRequest::at(exe, 0, dup),                             // 3 not_executable (ELF header)
      uprobe::ProbeRequest::at(exe, off1 + 1, dup),                      // 4 mid_instruction
      uprobe::ProbeRequest::at(rodata_text, dup),                          // 5 rodata: not executable
      uprobe::ProbeRequest::at(fx(11), good_b),                          // 6 ok
      uprobe::ProbeRequest::at(fx(11), good_b),                          // 7 conflict (same consumer twice)
      uprobe::ProbeRequest::at(reinterpret_cast<const void*>(&uprobe::register_uprobes), dup),  // 8 forbidden
      uprobe::ProbeRequest::at(exe, uprobe::resolve_address(fx(12)).offset, good_a),  // 9 ok, by (path, offset)
  };
  reqs.push_back(uprobe::ProbeRequest{});  // 10: no consumer
  reqs.back().address = fx(13);
  std::vector<uprobe::RegisterResult> res = uprobe::register_uprobes(reqs);
  ASSERT_EQ(res.size(), reqs.size());
  const std::vector<int> ok = {0, 6, 9};
  for (int i : ok) ASSERT_TRUE(res[i]) << i << ": " << res[i].error->what();
  auto code = [&](std::size_t i) { return res[i].error ? static_cast<int>(res[i].error->code()) : -1; };
  EXPECT_EQ(code(1), static_cast<int>(Errc::file_not_found));
  EXPECT_EQ(code(2), static_cast<int>(Errc::bad_offset));
  EXPECT_EQ(code(3), static_cast<int>(Errc::not_executable));
  EXPECT_EQ(code(4), static_cast<int>(Errc::mid_instruction));
  EXPECT_EQ(code(5), static_cast<int>(Errc::not_executable));
  EXPECT_EQ(code(7), static_cast<int>(Errc::conflict));
  EXPECT_EQ(code(8), static_cast<int>(Errc::forbidden_target));
  EXPECT_EQ(code(10), static_cast<int>(Errc::invalid_argument));
  for (std::size_t i : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 10u}) {
    EXPECT_FALSE(res[i]) << i;
    EXPECT_EQ(res[i].probe, nullptr) << i;
  }
  EXPECT_EQ(res[2].error->path(), exe);
  EXPECT_EQ(res[2].error->offset(), 1ull << 40);
  EXPECT_TRUE(names_offset(res[4].error->what(), off1 + 1)) << res[4].error->what();
  EXPECT_EQ(res[6].probe, uprobe::register_uprobes(std::vector<uprobe::ProbeRequest>{uprobe::ProbeRequest::at(
                                                       fx(11), nobody)})[0]
                              .probe)
      << "a later request on the same site shares the probe";
  // The good ones count exactly; the refused ones were never applied.
  call(10, 5);
  call(11, 7);
  call(12, 9);
  call(13, 4);
  EXPECT_EQ(good_a.hits.load(), 5u + 9u);
  EXPECT_EQ(good_b.hits.load(), 7u);
  EXPECT_EQ(nobody.hits.load(), 7u);
  EXPECT_EQ(dup.hits.load(), 0u);
  EXPECT_EQ(*static_cast<const std::uint8_t*>(fx(13)), fx13_before) << "the request without a consumer wrote nothing";
  EXPECT_EQ(diff_snapshot(lib_before), "") << "the refused request on libuprobe's own code wrote nothing";

  std::vector<uprobe::ProbeConsumer> pairs = {{res[0].probe, &good_a}, {res[6].probe, &good_b},
                                              {res[6].probe, &nobody}, {res[9].probe, &good_a}};
  for (const auto& e : uprobe::unregister_uprobes(pairs)) EXPECT_FALSE(e) << e->what();
  EXPECT_EQ(diff_snapshot(text_before), "");
}

TEST(Batch, SeveralConsumersOfOneNewProbeInOneBatch) {
  Counter a, b, c;
  std::vector<uprobe::ProbeRequest> reqs = {uprobe::ProbeRequest::at(fx(20), a),
                                            uprobe::ProbeRequest::at(fx(20), b),
                                            uprobe::ProbeRequest::at(fx(21), c),
                                            uprobe::ProbeRequest::at(fx(20), c)};
  const auto res = uprobe::register_uprobes(reqs);
  for (const auto& r : res) ASSERT_TRUE(r) << r.error->what();
  EXPECT_EQ(res[0].probe, res[1].probe);
  EXPECT_EQ(res[0].probe, res[3].probe);
  EXPECT_NE(res[0].probe, res[2].probe);
  EXPECT_EQ(uprobe::probe_info(res[0].probe).consumers, 3u);
  call(20, 10);
  call(21, 3);
  EXPECT_EQ(a.hits.load(), 10u);
  EXPECT_EQ(b.hits.load(), 10u);
  EXPECT_EQ(c.hits.load(), 13u);
  // Remove b (and a pair that is not registered) in one batch: the probe stays.
  Counter stranger;
  auto errs = uprobe::unregister_uprobes(std::vector<uprobe::ProbeConsumer>{{res[1].probe, &b},
                                                                             {res[1].probe, &stranger},
                                                                             {res[1].probe, &b}});
  EXPECT_FALSE(errs[0]);
  ASSERT_TRUE(errs[1]);
  EXPECT_EQ(errs[1]->code(), Errc::conflict);
  ASSERT_TRUE(errs[2]) << "the same pair twice: the second finds nothing to remove";
  EXPECT_EQ(errs[2]->code(), Errc::conflict);
  EXPECT_EQ(uprobe::probe_info(res[0].probe).consumers, 2u);
  call(20, 4);
  EXPECT_EQ(a.hits.load(), 14u);
  EXPECT_EQ(b.hits.load(), 10u);
  EXPECT_EQ(c.hits.load(), 17u);
  errs = uprobe::unregister_uprobes(
      std::vector<uprobe::ProbeConsumer>{{res[0].probe, &a}, {res[3].probe, &c}, {res[2].probe, &c}});
  for (const auto& e : errs) EXPECT_FALSE(e) << e->what();
  EXPECT_EQ(*static_cast<const std::uint8_t*>(fx(20)), 0x90);
  call(20, 2);
  call(21, 2);
  EXPECT_EQ(a.hits.load(), 14u);
  EXPECT_EQ(c.hits.load(), 17u);
  // The probe is gone: unregistering it again is refused, not a crash.
  errs = uprobe::unregister_uprobes(std::vector<uprobe::ProbeConsumer>{{nullptr, &a}});
  ASSERT_TRUE(errs[0]);
  EXPECT_EQ(errs[0]->code(), Errc::conflict);
}

TEST(Batch, MixesWithSingleRegistrations) {
  Counter single, batched;
  uprobe::Uprobe* p = uprobe::register_uprobe(fx(30), single);
  std::vector<uprobe::ProbeRequest> reqs = {uprobe::ProbeRequest::at(fx(30), batched),
                                            uprobe::ProbeRequest::at(fx(31), batched)};
  const auto res = uprobe::register_uprobes(reqs);
  for (const auto& r : res) ASSERT_TRUE(r) << r.error->what();
  EXPECT_EQ(res[0].probe, p);
  call(30, 6);
  call(31, 2);
  EXPECT_EQ(single.hits.load(), 6u);
  EXPECT_EQ(batched.hits.load(), 8u);
  // A batch-registered consumer removed one by one, a single one in a batch.
  uprobe::unregister_uprobe(res[1].probe, batched);
  auto errs = uprobe::unregister_uprobes(std::vector<uprobe::ProbeConsumer>{{p, &single}, {p, &batched}});
  for (const auto& e : errs) EXPECT_FALSE(e) << e->what();
  call(30, 3);
  call(31, 3);
  EXPECT_EQ(single.hits.load(), 6u);
  EXPECT_EQ(batched.hits.load(), 8u);
  EXPECT_EQ(*static_cast<const std::uint8_t*>(fx(30)), 0x90);
}

TEST(Batch, AttachAllAndDetachAll) {
  const auto before = all_bytes();
  Counter c;
  std::vector<uprobe::ProbeRequest> reqs;
  for (std::size_t i = 40; i < 60; ++i) reqs.push_back(uprobe::ProbeRequest::at(fx(i), c));
  reqs.push_back(uprobe::ProbeRequest::at("/nonexistent/x", 0, c));
  std::vector<uprobe::AttachResult> res = uprobe::attach_all(reqs);
  ASSERT_EQ(res.size(), 21u);
  for (std::size_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(res[i]) << res[i].error->what();
    EXPECT_EQ(res[i].attachment.consumer(), &c);
  }
  EXPECT_FALSE(res[20]);
  EXPECT_EQ(res[20].error->code(), Errc::file_not_found);
  for (std::size_t i = 40; i < 60; ++i) call(i, 1);
  EXPECT_EQ(c.hits.load(), 20u);
  std::vector<uprobe::Attachment> atts;
  for (auto& r : res) atts.push_back(std::move(r.attachment));
  const auto errs = uprobe::detach_all(atts);
  ASSERT_EQ(errs.size(), 21u);
  for (const auto& e : errs) EXPECT_FALSE(e);
  for (const auto& a : atts) EXPECT_EQ(a.probe(), nullptr);
  EXPECT_EQ(all_bytes(), before);
  for (std::size_t i = 40; i < 60; ++i) call(i, 1);
  EXPECT_EQ(c.hits.load(), 20u);
  // Destroying the detached Attachments does nothing more; a second batch
  // on the same sites works (their XOL slots are reused).
  atts.clear();
  {
    std::vector<uprobe::AttachResult> again = uprobe::attach_all(std::span(reqs).first(20));
    for (const auto& r : again) ASSERT_TRUE(r);
    for (std::size_t i = 40; i < 60; ++i) call(i, 2);
    EXPECT_EQ(c.hits.load(), 60u);
  }  // each Attachment detaches itself
  EXPECT_EQ(all_bytes(), before);
}

TEST(Batch, UsdtSemaphoreCountsPerRegistration) {
  const std::string exe = self_exe();
  const std::uint64_t sem = uprobe::resolve_address(const_cast<std::uint16_t*>(&batch_sem)).offset;
  ASSERT_EQ(batch_sem, 0);
  Counter a, b, c;
  std::vector<uprobe::ProbeRequest> reqs = {
      uprobe::ProbeRequest::at(exe, uprobe::resolve_address(fx(60)).offset, a, sem),
      uprobe::ProbeRequest::at(exe, uprobe::resolve_address(fx(61)).offset, a, sem),
      uprobe::ProbeRequest::at(exe, uprobe::resolve_address(fx(60)).offset, b, sem),
      uprobe::ProbeRequest::at(exe, uprobe::resolve_address(fx(60)).offset, c, sem + 2),  // another semaphore
  };
  const auto res = uprobe::register_uprobes(reqs);
  for (std::size_t i = 0; i < 3; ++i) ASSERT_TRUE(res[i]) << res[i].error->what();
  ASSERT_FALSE(res[3]);
  EXPECT_EQ(res[3].error->code(), Errc::ref_ctr_conflict);
  EXPECT_NE(std::string(res[3].error->what())
                .find("the probe's USDT semaphore (ref_ctr_offset) is " + hex(sem) + ", not " + hex(sem + 2)),
            std::string::npos)
      << res[3].error->what();
  EXPECT_EQ(batch_sem, 3) << "one increment per registration";
  call(60, 2);
  call(61, 1);
  EXPECT_EQ(a.hits.load(), 3u);
  EXPECT_EQ(b.hits.load(), 2u);
  auto errs = uprobe::unregister_uprobes(std::vector<uprobe::ProbeConsumer>{{res[2].probe, &b}});
  EXPECT_FALSE(errs[0]);
  EXPECT_EQ(batch_sem, 2);
  errs = uprobe::unregister_uprobes(std::vector<uprobe::ProbeConsumer>{{res[0].probe, &a}, {res[1].probe, &a}});
  for (const auto& e : errs) EXPECT_FALSE(e);
  EXPECT_EQ(batch_sem, 0);
}

TEST(AddressSpace, AFileMappedWithRawMmapIsSeenByTheNextRegistration) {
  // The registry keeps its snapshot of the address space while the file-backed
  // mappings are unchanged; a mapping made with mmap() (no dlopen(), nothing
  // libuprobe interposes) must still be seen by the next registration, and
  // its going away by the next unregistration.
  const std::string exe = self_exe();
  Counter first, second;
  uprobe::Uprobe* p0 = uprobe::register_uprobe(fx(70), first);  // the runtime has a snapshot now
  const std::uint64_t off = uprobe::resolve_address(fx(80)).offset;
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::uint64_t page_off = off & ~static_cast<std::uint64_t>(page - 1);
  const int fd = ::open(exe.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  void* m = ::mmap(nullptr, static_cast<std::size_t>(page), PROT_READ | PROT_EXEC, MAP_PRIVATE, fd,
                   static_cast<off_t>(page_off));
  ::close(fd);
  ASSERT_NE(m, MAP_FAILED);
  auto copy = reinterpret_cast<std::uint64_t (*)(std::uint64_t)>(static_cast<char*>(m) + (off - page_off));
  ASSERT_EQ(copy(5), 85u);

  uprobe::Uprobe* p = uprobe::register_uprobe(exe, off, second);
  EXPECT_EQ(uprobe::probe_info(p).sites, 2u) << "the program's own mapping and the raw mmap() of the file";
  EXPECT_EQ(copy(5), 85u);
  call(80, 3);
  EXPECT_EQ(second.hits.load(), 4u) << "one hit through the raw mapping, three through the program's";

  ASSERT_EQ(::munmap(m, static_cast<std::size_t>(page)), 0);
  // (Not probe_info(p) yet: it would read the vanished site; only a
  // registration on p brings p's sites in line.)
  Counter third;
  EXPECT_EQ(uprobe::register_uprobe(exe, off, third), p);
  EXPECT_EQ(uprobe::probe_info(p).sites, 1u) << "the vanished mapping's site is dropped, without a write";
  call(80, 2);
  EXPECT_EQ(second.hits.load(), 6u);
  EXPECT_EQ(third.hits.load(), 2u);
  uprobe::unregister_uprobe(p, second);
  uprobe::unregister_uprobe(p, third);
  uprobe::unregister_uprobe(p0, first);
  EXPECT_EQ(mem_bytes(fx(80), 8), file_bytes(exe, off, 8));
}

TEST(AddressSpace, AnAddressInAReplacedReadOnlyMappingNamesTheFileMappedNow) {
  // The snapshot stays while the file mappings holding code or writable data
  // are unchanged; a read-only one may have been replaced meanwhile. A
  // request by address there must name the file mapped now (a bug report:
  // a batch request named the file mapped before, and an address where an
  // anonymous mapping had been was refused as anonymous memory).
  const std::string exe = self_exe();
  char dir_tmpl[] = "/tmp/uprobe-ro-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_tmpl), nullptr);
  const std::string dir = dir_tmpl, a = dir + "/a.bin", b = dir + "/b.bin";
  for (const std::string& f : {a, b}) {
    const std::vector<std::uint8_t> bytes = file_bytes(exe, 0, 8192);
    const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  const long page = ::sysconf(_SC_PAGESIZE);
  const auto map = [&](const std::string& f, void* at) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    void* m = ::mmap(at, static_cast<std::size_t>(page), PROT_READ, MAP_PRIVATE | (at ? MAP_FIXED : 0), fd, 0);
    ::close(fd);
    return m;
  };
  Counter c;
  // Two registrations first: the XOL memory they map is in the next
  // snapshot, which then stays (nothing below maps code or writable data).
  uprobe::Uprobe* p0 = uprobe::register_uprobe(fx(71), c);
  uprobe::Uprobe* p1 = uprobe::register_uprobe(fx(72), c);
  for (const bool anonymous_first : {false, true}) {
    SCOPED_TRACE(anonymous_first ? "anonymous PROT_NONE first" : "a.bin read-only first");
    void* x = anonymous_first ? ::mmap(nullptr, static_cast<std::size_t>(page), PROT_NONE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                              : map(a, nullptr);
    ASSERT_NE(x, MAP_FAILED);
    uprobe::Uprobe* p2 = uprobe::register_uprobe(fx(73), c);  // the kept snapshot has not seen x
    ASSERT_EQ(map(b, x), x);  // b.bin read-only over it: no code or writable data changed
    const char* at = static_cast<const char*>(x) + 0x40;
    const std::vector<uprobe::ProbeRequest> req{uprobe::ProbeRequest::at(at, c)};
    auto res = uprobe::register_uprobes(req);
    ASSERT_EQ(res.size(), 1u);
    ASSERT_FALSE(res[0]) << "a read-only mapping holds no code";
    EXPECT_EQ(res[0].error->code(), Errc::not_executable) << res[0].error->what();
    EXPECT_EQ(res[0].error->path(), b) << res[0].error->what();
    EXPECT_EQ(res[0].error->offset(), 0x40u);
    EXPECT_EQ(uprobe::resolve_address(at).path, b);
    uprobe::unregister_uprobe(p2, c);
    ASSERT_EQ(::munmap(x, static_cast<std::size_t>(page)), 0);
  }
  uprobe::unregister_uprobe(p1, c);
  uprobe::unregister_uprobe(p0, c);
  ::unlink(a.c_str());
  ::unlink(b.c_str());
  ::rmdir(dir.c_str());
}

TEST(Batch, EmptyBatchesAndHandlerRefusal) {
  EXPECT_TRUE(uprobe::register_uprobes({}).empty());
  EXPECT_TRUE(uprobe::unregister_uprobes({}).empty());
  // A handler that tries a batch gets Errc::in_handler for every request.
  struct Nested : uprobe::Consumer {
    std::atomic<int> codes[2] = {-1, -1};
    std::atomic<int> unreg = -1;
    uprobe::Action handler(uprobe::Regs&) override {
      // (Allocation in a handler: acceptable here, the probed code is ours.)
      std::vector<uprobe::ProbeRequest> reqs = {uprobe::ProbeRequest::at(fx(51), *this),
                                                uprobe::ProbeRequest::at(fx(52), *this)};
      auto res = uprobe::register_uprobes(reqs);
      for (int i = 0; i < 2; ++i) codes[i] = res[i].error ? static_cast<int>(res[i].error->code()) : -2;
      auto errs = uprobe::unregister_uprobes(std::vector<uprobe::ProbeConsumer>{{nullptr, this}});
      unreg = errs[0] ? static_cast<int>(errs[0]->code()) : -2;
      return uprobe::Action::keep;
    }
  } nested;
  uprobe::Uprobe* p = uprobe::register_uprobe(fx(50), nested);
  call(50, 1);
  uprobe::unregister_uprobe(p, nested);
  EXPECT_EQ(nested.codes[0].load(), static_cast<int>(Errc::in_handler));
  EXPECT_EQ(nested.codes[1].load(), static_cast<int>(Errc::in_handler));
  EXPECT_EQ(nested.unreg.load(), static_cast<int>(Errc::in_handler));
  EXPECT_EQ(*static_cast<const std::uint8_t*>(fx(51)), 0x48) << "lea: never probed";
  EXPECT_EQ(*static_cast<const std::uint8_t*>(fx(52)), 0x90) << "nop: never probed";
}

TEST(Batch, BatchesRaceWithHitsOnOtherThreads) {
  // Two threads call 64 probed functions while the main thread attaches and
  // detaches them in batches: every call returns the right value, and the hit
  // count equals the calls made while attached as the consumer saw them.
  constexpr std::size_t kFirst = 100, kCount = 64;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> wrong{0}, calls{0};
  auto worker = [&](std::uint64_t seed) {
    std::uint64_t k = seed;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::size_t i = kFirst + k % kCount;
      if (batch_fx[i](k) != k + i) wrong.fetch_add(1);
      calls.fetch_add(1, std::memory_order_relaxed);
      ++k;
    }
  };
  std::thread t1(worker, 1), t2(worker, 7);
  Counter c;
  std::vector<uprobe::ProbeRequest> reqs;
  for (std::size_t i = kFirst; i < kFirst + kCount; ++i) reqs.push_back(uprobe::ProbeRequest::at(fx(i), c));
  for (int round = 0; round < 30; ++round) {
    const auto res = uprobe::register_uprobes(reqs);
    for (const auto& r : res) ASSERT_TRUE(r) << r.error->what();
    const auto errs = uprobe::unregister_uprobes(pairs_of(res, reqs));
    for (const auto& e : errs) ASSERT_FALSE(e) << e->what();
  }
  const std::uint64_t hits_after = c.hits.load();
  stop = true;
  t1.join();
  t2.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(calls.load(), 0u);
  EXPECT_LE(hits_after, calls.load());
  EXPECT_EQ(c.hits.load(), hits_after) << "no hit after the last detach returned";
  for (std::size_t i = kFirst; i < kFirst + kCount; ++i) EXPECT_EQ(*static_cast<const std::uint8_t*>(fx(i)), i % 2 ? 0x48 : 0x90) << i;
}

}  // namespace
