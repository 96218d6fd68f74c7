// SPDX-License-Identifier: MIT
// With Config::detach_patched_pages (the default), a page libuprobe writes is first replaced by an anonymous copy of itself
// (src/attach/text_pages.hpp), out of the reach of the kernel's own uprobes:
// a system-wide kernel uprobe (bpftrace, perf) on a function this process
// patched used to write its int3 into our jump and, on unregister, the
// file's byte back over our rel32, killing the program. The copy is what the
// VMA model knows as the file (a later probe in the same page resolves), and
// a kernel breakpoint already in the page is left out of it. The kernel's
// uprobes are set through tracefs (root, /sys/kernel/tracing mounted); those
// tests are skipped elsewhere.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "opt_common.hpp"
#include "proc_text.hpp"

using namespace opttest;

extern "C" {
std::uint64_t kup_entry_a(std::uint64_t);
std::uint64_t kup_nop5_a(std::uint64_t);
std::uint64_t kup_entry_b(std::uint64_t);
std::uint64_t kup_entry_c(std::uint64_t);
std::uint64_t kup_entry_d(std::uint64_t);
std::uint64_t kup_entry_e(std::uint64_t);
std::uint64_t kup_entry_f(std::uint64_t);
std::uint64_t kup_nop5_f(std::uint64_t);
}

namespace {

constexpr std::uint64_t kPage = 4096;
constexpr int kCalls = 1000;
const std::string kTracing = "/sys/kernel/tracing";

std::uint64_t page_of(const void* p) { return reinterpret_cast<std::uint64_t>(p) & ~(kPage - 1); }

/// Calls `fn` kCalls times; the number of wrong results.
int call_all(std::uint64_t (*fn)(std::uint64_t), std::uint64_t add) {
  int bad = 0;
  for (int i = 0; i < kCalls; ++i)
    if (fn(static_cast<std::uint64_t>(i)) != static_cast<std::uint64_t>(i) + add) ++bad;
  return bad;
}

/// The executable's file and the file offset of `fn`, while its page is
/// still the file's mapping.
struct FileSpot {
  std::string path;
  std::uint64_t offset = 0;
};
FileSpot file_spot(const void* fn) {
  const auto a = reinterpret_cast<std::uint64_t>(fn);
  const std::optional<Mapping> m = mapping_of(a);
  EXPECT_TRUE(m && !m->path.empty() && m->path[0] == '/') << "not a file mapping at " << hex(a);
  return m ? FileSpot{m->path, m->offset + (a - m->start)} : FileSpot{};
}

/// One kernel uprobe through tracefs (kernel/trace/trace_uprobe.c), enabled
/// while it lives; its hit count from uprobe_profile.
class KernelUprobe {
 public:
  KernelUprobe(const FileSpot& at, const std::string& tag) {
    name_ = "libuprobe_test/k" + std::to_string(::getpid()) + "_" + tag;
    char off[32];
    std::snprintf(off, sizeof off, "0x%" PRIx64, at.offset);
    if (!append(kTracing + "/uprobe_events", "p:" + name_ + " " + at.path + ":" + off)) {
      why_ = "cannot add a kernel uprobe through " + kTracing + "/uprobe_events";
      return;
    }
    defined_ = true;
    if (!append(kTracing + "/events/" + name_ + "/enable", "1")) {
      why_ = "cannot enable " + name_;
      return;
    }
    enabled_ = true;
  }
  ~KernelUprobe() { remove(); }
  KernelUprobe(const KernelUprobe&) = delete;
  KernelUprobe& operator=(const KernelUprobe&) = delete;

  bool ok() const { return enabled_; }
  const std::string& why() const { return why_; }
  /// Disabled (the kernel takes its breakpoints out) and deleted.
  void remove() {
    if (enabled_) append(kTracing + "/events/" + name_ + "/enable", "0");
    if (defined_) append(kTracing + "/uprobe_events", "-:" + name_);
    enabled_ = defined_ = false;
  }
  /// Hits so far: uprobe_profile's "PATH EVENT HITS" line of this event.
  std::uint64_t hits() const {
    std::ifstream in(kTracing + "/uprobe_profile");
    const std::string event = name_.substr(name_.find('/') + 1);
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::string path, ev;
      std::uint64_t n = 0;
      if (f >> path >> ev >> n && ev == event) return n;
    }
    ADD_FAILURE() << "no line of " << event << " in uprobe_profile";
    return ~0ull;
  }

 private:
  static bool append(const std::string& file, const std::string& text) {
    const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    return ok;
  }
  std::string name_, why_;
  bool defined_ = false, enabled_ = false;
};

/// Config::detach_patched_pages on while it lives.
struct DetachGuard : ConfigGuard {
  DetachGuard() {
    uprobe::Config c = saved;
    c.detach_patched_pages = true;
    uprobe::configure(c);
  }
};

bool tracefs_writable() { return ::access((kTracing + "/uprobe_events").c_str(), W_OK) == 0; }

/// The kernel's mapping at `page`, as /proc/self/maps shows it: "r-xp
/// anonymous" for a copy, else the permissions and the file.
std::string page_mapping(std::uint64_t page) {
  for (const uprobe_test::MapLine& m : uprobe_test::read_maps_raw())
    if (page >= m.start && page < m.end) return m.perms + (m.path.empty() ? " anonymous" : " " + m.path);
  return "unmapped";
}

/// The page's bytes against the file's (read before it was detached).
void expect_page_is_file(std::uint64_t page, const std::vector<std::uint8_t>& file) {
  const std::vector<std::uint8_t> now = mem(reinterpret_cast<const void*>(page), kPage);
  ASSERT_EQ(now.size(), file.size());
  std::size_t differing = 0, first = 0;
  for (std::size_t k = 0; k < kPage; ++k)
    if (now[k] != file[k] && differing++ == 0) first = k;
  EXPECT_EQ(differing, 0u) << "first at page+" << hex(first) << ": memory " << hex(now[first]) << ", file "
                           << hex(file[first]);
}

/// The end of a test with the kernel's uprobe gone: `fn` runs right and
/// counts in `ours` only (kCalls more), then `p` goes and the page is the
/// file's again, byte for byte (no breakpoint of the kernel's kept).
void expect_ours_alone_then_the_file(std::uint64_t (*fn)(std::uint64_t), std::uint64_t add, Counter& ours,
                                     uprobe::Uprobe* p, std::uint64_t page, const std::vector<std::uint8_t>& file) {
  EXPECT_EQ(call_all(fn, add), 0);
  EXPECT_EQ(ours.hits.load(), 2u * kCalls);
  EXPECT_EQ(ours.bad_ip.load(), 0u);
  uprobe::unregister_uprobe(p, ours);
  expect_page_is_file(page, file);
}

}  // namespace

TEST(KernelUprobes, PatchedPagesBecomeCopiesThatLaterProbesStillResolve) {
  DetachGuard detach;
  const std::uint64_t page = page_of(reinterpret_cast<const void*>(&kup_entry_a));
  ASSERT_EQ(page, page_of(reinterpret_cast<const void*>(&kup_nop5_a)));
  ASSERT_EQ(page_mapping(page).substr(0, 5), "r-xp ") << "the fixture's page is not the file's before the test";
  ASSERT_NE(page_mapping(page).find('/'), std::string::npos) << page_mapping(page);
  const std::vector<std::uint8_t> file = file_bytes_at(reinterpret_cast<const void*>(page), kPage);
  ASSERT_EQ(file.size(), kPage);
  const std::string exe = mapping_of(page)->path;

  Counter entry(reinterpret_cast<std::uint64_t>(&kup_entry_a)), nop5(reinterpret_cast<std::uint64_t>(&kup_nop5_a));
  uprobe::Uprobe* pe = uprobe::register_uprobe(reinterpret_cast<const void*>(&kup_entry_a), entry);
  EXPECT_EQ(uprobe::probe_info(pe).mode, uprobe::ProbeMode::optimized_entry)
      << uprobe::probe_info(pe).why_not_optimized;
  EXPECT_EQ(page_mapping(page), "r-xp anonymous") << "the written page is still the file's mapping";
  EXPECT_TRUE(rwx_mappings().empty()) << rwx_mappings()[0];

  // The same page again, by address: the model knows it as the file's.
  uprobe::Uprobe* pn = uprobe::register_uprobe(reinterpret_cast<const void*>(&kup_nop5_a), nop5);
  const uprobe::ProbeInfo info = uprobe::probe_info(pn);
  EXPECT_EQ(info.mode, uprobe::ProbeMode::optimized_nop5) << info.why_not_optimized;
  EXPECT_EQ(info.where.path, exe);
  EXPECT_EQ(info.where.offset, uprobe::probe_info(pe).where.offset + (reinterpret_cast<std::uint64_t>(&kup_nop5_a) -
                                                                       reinterpret_cast<std::uint64_t>(&kup_entry_a)));

  EXPECT_EQ(call_all(&kup_entry_a, 1), 0);
  EXPECT_EQ(call_all(&kup_nop5_a, 2), 0);
  EXPECT_EQ(entry.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(nop5.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(entry.bad_ip.load() + nop5.bad_ip.load(), 0u);

  uprobe::unregister_uprobe(pe, entry);
  uprobe::unregister_uprobe(pn, nop5);
  // Every byte of the page is the file's again; the copy stays (documented).
  expect_page_is_file(page, file);
  EXPECT_EQ(page_mapping(page), "r-xp anonymous");
  EXPECT_EQ(call_all(&kup_entry_a, 1), 0);
  EXPECT_EQ(entry.hits.load(), static_cast<std::uint64_t>(kCalls));
}

TEST(KernelUprobes, AKernelUprobeSetOverOurJumpNeverReachesIt) {
  DetachGuard detach;
  if (!tracefs_writable()) GTEST_SKIP() << kTracing << "/uprobe_events not writable (root and tracefs needed)";
  const std::uint64_t page = page_of(reinterpret_cast<const void*>(&kup_entry_b));
  const std::vector<std::uint8_t> file = file_bytes_at(reinterpret_cast<const void*>(page), kPage);
  ASSERT_EQ(file.size(), kPage);
  const FileSpot at = file_spot(reinterpret_cast<const void*>(&kup_entry_b));
  FileSpot inside = at;
  inside.offset += 1;  // `mov %rsp,%rbp`: in the bytes our jump displaced

  Counter ours(reinterpret_cast<std::uint64_t>(&kup_entry_b));
  uprobe::Uprobe* p = uprobe::register_uprobe(reinterpret_cast<const void*>(&kup_entry_b), ours);
  ASSERT_EQ(uprobe::probe_info(p).mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(p).why_not_optimized;
  const std::vector<std::uint8_t> jump = mem(reinterpret_cast<const void*>(&kup_entry_b), 8);
  {
    KernelUprobe k0(at, "b0"), k1(inside, "b1");
    ASSERT_TRUE(k0.ok()) << k0.why();
    ASSERT_TRUE(k1.ok()) << k1.why();
    // The kernel wrote nothing into the copy: our jump is whole.
    EXPECT_EQ(hex_bytes(mem(reinterpret_cast<const void*>(&kup_entry_b), 8)), hex_bytes(jump));
    EXPECT_EQ(call_all(&kup_entry_b, 3), 0);
    EXPECT_EQ(ours.hits.load(), static_cast<std::uint64_t>(kCalls));
    EXPECT_EQ(k0.hits(), 0u);  // (the kernel's uprobes miss this process's copies: documented)
    EXPECT_EQ(k1.hits(), 0u);
    k0.remove();
    k1.remove();
    EXPECT_EQ(hex_bytes(mem(reinterpret_cast<const void*>(&kup_entry_b), 8)), hex_bytes(jump));
  }
  expect_ours_alone_then_the_file(&kup_entry_b, 3, ours, p, page, file);
}

TEST(KernelUprobes, AKernelBreakpointAlreadyThereIsLeftOutOfTheCopy) {
  DetachGuard detach;
  if (!tracefs_writable()) GTEST_SKIP() << kTracing << "/uprobe_events not writable (root and tracefs needed)";
  const std::uint64_t page = page_of(reinterpret_cast<const void*>(&kup_entry_c));
  const std::vector<std::uint8_t> file = file_bytes_at(reinterpret_cast<const void*>(page), kPage);
  ASSERT_EQ(file.size(), kPage);
  const FileSpot at = file_spot(reinterpret_cast<const void*>(&kup_entry_c));

  KernelUprobe k(at, "c");
  ASSERT_TRUE(k.ok()) << k.why();
  ASSERT_EQ(hex(mem(reinterpret_cast<const void*>(&kup_entry_c), 1)[0]), "0xcc") << "the kernel's breakpoint is not in";
  EXPECT_EQ(call_all(&kup_entry_c, 5), 0);
  EXPECT_EQ(k.hits(), static_cast<std::uint64_t>(kCalls));

  Counter ours(reinterpret_cast<std::uint64_t>(&kup_entry_c));
  uprobe::Uprobe* p = uprobe::register_uprobe(reinterpret_cast<const void*>(&kup_entry_c), ours);
  ASSERT_EQ(uprobe::probe_info(p).mode, uprobe::ProbeMode::optimized_entry) << uprobe::probe_info(p).why_not_optimized;
  EXPECT_EQ(page_mapping(page), "r-xp anonymous");
  EXPECT_EQ(call_all(&kup_entry_c, 5), 0);
  EXPECT_EQ(ours.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(k.hits(), static_cast<std::uint64_t>(kCalls));
  k.remove();
  expect_ours_alone_then_the_file(&kup_entry_c, 5, ours, p, page, file);
}

TEST(KernelUprobes, TheSwitchIsOnByDefaultAndOffLeavesPagesTheFilesMappings) {
  ConfigGuard keep;
  ASSERT_TRUE(uprobe::configuration().detach_patched_pages) << "the default changed";
  uprobe::Config off = uprobe::configuration();
  off.detach_patched_pages = false;
  uprobe::configure(off);
  EXPECT_FALSE(uprobe::configuration().detach_patched_pages);
  const std::uint64_t page = page_of(reinterpret_cast<const void*>(&kup_entry_d));
  const std::string before = page_mapping(page);
  ASSERT_NE(before.find('/'), std::string::npos) << before;
  Counter ours(reinterpret_cast<std::uint64_t>(&kup_entry_d));
  uprobe::Uprobe* p = uprobe::register_uprobe(reinterpret_cast<const void*>(&kup_entry_d), ours);
  EXPECT_EQ(uprobe::probe_info(p).mode, uprobe::ProbeMode::optimized_entry);
  EXPECT_EQ(page_mapping(page), before);
  EXPECT_EQ(call_all(&kup_entry_d, 7), 0);
  EXPECT_EQ(ours.hits.load(), static_cast<std::uint64_t>(kCalls));
  uprobe::unregister_uprobe(p, ours);
}

// madvise() on a copied page: MADV_DONTNEED would leave a zero page to run
// (the file's mapping gives the file's bytes back): the copies are left out
// of it; MADV_FREE and MADV_WIPEONFORK, refused for a file mapping, are
// refused as for one (src/interpose/text_advice.cpp).
TEST(KernelUprobes, MadviseOnACopiedPageKeepsItsBytes) {
  DetachGuard detach;
  const std::uint64_t page = page_of(reinterpret_cast<const void*>(&kup_entry_e));
  const std::vector<std::uint8_t> file = file_bytes_at(reinterpret_cast<const void*>(page), kPage);
  ASSERT_EQ(file.size(), kPage);
  Counter ours(reinterpret_cast<std::uint64_t>(&kup_entry_e));
  uprobe::Uprobe* p = uprobe::register_uprobe(reinterpret_cast<const void*>(&kup_entry_e), ours);
  ASSERT_EQ(uprobe::probe_info(p).mode, uprobe::ProbeMode::optimized_entry);
  ASSERT_EQ(page_mapping(page), "r-xp anonymous");
  const std::vector<std::uint8_t> patched = mem(reinterpret_cast<const void*>(page), kPage);
  void* const at = reinterpret_cast<void*>(page);
  EXPECT_EQ(::madvise(at, kPage, MADV_DONTNEED), 0);
  EXPECT_EQ(::madvise(reinterpret_cast<void*>(page - kPage), 3 * kPage, MADV_DONTNEED), 0);  // (the file's pages around)
  EXPECT_EQ(hex_bytes(mem(at, kPage)), hex_bytes(patched));
  errno = 0;
  EXPECT_EQ(::madvise(at, kPage, MADV_FREE), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(::madvise(at, kPage, MADV_WIPEONFORK), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(call_all(&kup_entry_e, 9), 0);
  EXPECT_EQ(ours.hits.load(), static_cast<std::uint64_t>(kCalls));
  uprobe::unregister_uprobe(p, ours);
  expect_page_is_file(page, file);
}

// A page written in place (the switch off) is never copied later: its copy
// would take our own int3s for the kernel's and leave them out (the probe
// silently gone). The second probe's page stays the file's mapping, and
// both probes count every call.
TEST(KernelUprobes, APageWrittenInPlaceIsNotCopiedLater) {
  ConfigGuard keep;
  uprobe::Config off = uprobe::configuration();
  off.detach_patched_pages = false;
  off.optimize = false;  // (int3s: what a copy would have taken for the kernel's)
  uprobe::configure(off);
  const std::uint64_t page = page_of(reinterpret_cast<const void*>(&kup_entry_f));
  ASSERT_EQ(page, page_of(reinterpret_cast<const void*>(&kup_nop5_f)));
  const std::vector<std::uint8_t> file = file_bytes_at(reinterpret_cast<const void*>(page), kPage);
  const std::string before = page_mapping(page);
  ASSERT_NE(before.find('/'), std::string::npos) << before;
  Counter first(reinterpret_cast<std::uint64_t>(&kup_entry_f)), second(reinterpret_cast<std::uint64_t>(&kup_nop5_f));
  uprobe::Uprobe* p1 = uprobe::register_uprobe(reinterpret_cast<const void*>(&kup_entry_f), first);
  uprobe::Config on = uprobe::configuration();
  on.detach_patched_pages = true;
  uprobe::configure(on);
  uprobe::Uprobe* p2 = uprobe::register_uprobe(reinterpret_cast<const void*>(&kup_nop5_f), second);
  EXPECT_EQ(uprobe::probe_info(p1).mode, uprobe::ProbeMode::int3);
  EXPECT_EQ(hex(mem(reinterpret_cast<const void*>(&kup_entry_f), 1)[0]), "0xcc");
  EXPECT_EQ(page_mapping(page), before);
  EXPECT_EQ(call_all(&kup_entry_f, 11), 0);
  EXPECT_EQ(call_all(&kup_nop5_f, 13), 0);
  EXPECT_EQ(first.hits.load(), static_cast<std::uint64_t>(kCalls));
  EXPECT_EQ(second.hits.load(), static_cast<std::uint64_t>(kCalls));
  uprobe::unregister_uprobe(p1, first);
  uprobe::unregister_uprobe(p2, second);
  expect_page_is_file(page, file);
}
