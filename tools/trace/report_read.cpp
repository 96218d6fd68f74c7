// SPDX-License-Identifier: MIT
// report_read.hpp: the record files and counts file read back, and the
// warnings about specs that did not attach.

#include "report_read.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "counts.hpp"
#include "launch.hpp"

namespace uptrace {

namespace {

/// The whole of file `path` ("" when it cannot be read). With read(2), not
/// a stream: the report is the CLI's critical path after the program ends,
/// and a first stream builds libstdc++'s locale (~30 page faults, ~0.4 ms on
/// a 2-vCPU PVM guest).
std::string read_small_file(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

Report read_report(const std::string& dir, int counts_fd) {
  std::map<std::uint64_t, ImageRecord> images;  // by layout
  std::vector<ImageRecord> unmapped;             // layout 0: the process could not map the counts file
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() < 5 || n.substr(n.size() - 4) != ".rec") continue;
      if (auto r = parse_image(read_small_file(dir + "/" + n))) {
        if (r->layout == 0) unmapped.push_back(std::move(*r));
        else images.emplace(r->layout, std::move(*r));
      }
    }
    closedir(d);
  }
  Report rep;
  void* m = mmap(nullptr, counts::kHeaderBytes, PROT_READ, MAP_SHARED, counts_fd, 0);
  if (m == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    remove_tree(dir);
    die(dir + "/" + counts::kFileName + ": mmap: " + why);
  }
  const auto* h = static_cast<const counts::Header*>(m);
  // Processes, in the order they registered: (pid, layout) -> record.
  std::map<std::pair<long, std::uint64_t>, std::size_t> index;
  std::vector<std::pair<std::size_t, ProcessRecord>> procs;  // (registration order, record)
  auto add_proc = [&](const ImageRecord& img, long pid, long ppid, std::size_t order) -> ProcessRecord& {
    auto [it, fresh] = index.try_emplace({pid, img.layout}, procs.size());
    if (fresh) procs.emplace_back(order, process_of(img, pid, ppid));
    return procs[it->second].second;
  };
  const std::uint64_t nprocs = std::min<std::uint64_t>(h->nprocs.load(), counts::kMaxProcs);
  for (std::uint64_t i = 0; i < nprocs; ++i) {
    const counts::Proc& p = h->procs[i];
    if (p.ready.load(std::memory_order_acquire) != 1) continue;
    auto img = images.find(p.layout);
    if (img != images.end()) add_proc(img->second, static_cast<long>(p.pid), static_cast<long>(p.ppid), i);
  }
  for (const auto& [layout, img] : images)  // (the process table was full)
    add_proc(img, img.pid, img.ppid, counts::kMaxProcs);
  // Blocks.
  const std::uint64_t nslots = std::min<std::uint64_t>(h->nslots.load(), counts::kMaxSlots);
  // Each block's header first, then only what add_block() reads: a block
  // with a bpftrace program's area (its printf ring and map tables, read by
  // bt_run.cpp) counts no key here, and reading it whole (a megabyte, into
  // fresh pages) took ~0.8 ms of a traced program's end.
  std::vector<std::uint64_t> buf(counts::kHeaderWords);
  for (std::uint64_t i = 0; i < nslots; ++i) {
    const std::uint64_t w = h->slots[i].load(std::memory_order_acquire);
    if (w == 0) continue;
    const std::size_t bytes = counts::slot_pages(w) * counts::kPage;
    const auto at = static_cast<off_t>(counts::slot_first_page(w) * counts::kPage);
    const std::size_t head = counts::kHeaderWords * sizeof(std::uint64_t);
    if (bytes < head || pread(counts_fd, buf.data(), head, at) != static_cast<ssize_t>(head)) continue;
    if (buf[counts::kBlockMagicWord] != counts::kBlockMagic) continue;
    const std::size_t words = buf[counts::kBlockWords];
    auto img = images.find(buf[counts::kBlockLayout]);
    if (words > bytes / sizeof(std::uint64_t) || words < counts::kHeaderWords || img == images.end()) continue;
    ProcessRecord& r = add_proc(img->second, static_cast<long>(static_cast<std::int64_t>(buf[counts::kBlockPid])), 0,
                                counts::kMaxProcs);
    if (buf[counts::kBlockBt] != 0) continue;  // (no key counted here: add_block() would refuse its size)
    buf.resize(words);
    const std::size_t rest = (words - counts::kHeaderWords) * sizeof(std::uint64_t);
    if (rest && pread(counts_fd, buf.data() + counts::kHeaderWords, rest, at + static_cast<off_t>(head)) !=
                    static_cast<ssize_t>(rest))
      continue;
    add_block(r, img->second, buf.data(), words);
  }
  rep.unrecorded = h->unrecorded.load();
  rep.missed = h->missed.load();
  munmap(m, counts::kHeaderBytes);
  for (const auto& img : unmapped) procs.emplace_back(counts::kMaxProcs, process_of(img, img.pid, img.ppid));
  std::stable_sort(procs.begin(), procs.end(), [](const auto& a, const auto& b) {
    return a.second.pid != b.second.pid ? a.second.pid < b.second.pid : a.first < b.first;
  });
  for (const auto& [order, r] : procs) rep.add(r);
  return rep;
}

void warn_unattached(const Report& rep) {
  const std::vector<std::string> unattached = rep.unattached();
  for (const auto& s : rep.spec_attached) {
    const bool none = std::find(unattached.begin(), unattached.end(), s.first) != unattached.end();
    std::set<std::string> seen;
    if (none) std::fprintf(stderr, "uprobe-trace: WARNING: %s attached in no process\n", s.first.c_str());
    for (const auto& m : rep.messages) {
      if (m.spec != s.first || !seen.insert(m.text).second || seen.size() > 3) continue;
      const bool absent = m.text.rfind("not loaded here", 0) == 0;
      if (none) std::fprintf(stderr, "uprobe-trace:   pid %ld (%s): %s\n", m.pid, m.exe.c_str(), m.text.c_str());
      else if (!absent)
        std::fprintf(stderr, "uprobe-trace: WARNING: %s: pid %ld (%s): %s\n", m.spec.c_str(), m.pid, m.exe.c_str(),
                     m.text.c_str());
    }
  }
  std::set<std::string> notes;  // about a process, not a spec: each text once
  for (const auto& m : rep.messages)
    if (m.spec.empty() && notes.insert(m.text).second)
      std::fprintf(stderr, "uprobe-trace: WARNING: pid %ld (%s): %s\n", m.pid, m.exe.c_str(), m.text.c_str());
}

}  // namespace uptrace
