// SPDX-License-Identifier: MIT
// uprobe-coverage: attaches an entry probe to every function a library
// exports (.dynsym STT_FUNC and STT_GNU_IFUNC, one per distinct offset) and
// to every implementation its IFUNCs are bound to here (what a probe on an
// IFUNC's name attaches to: __strlen_evex for strlen), in this process, and reports how many probes ended in each mode (optimized-
// entry, optimized-nop5, int3, refused) and why the others are not optimized;
// then detaches them all and checks that the library's text is back byte for
// byte. The kernel optimizes none of these (none starts with a nop5).
//
//   uprobe-coverage [LIBRARY]        default libc.so.6; a path or a loaded library's name
//   uprobe-coverage -v [LIBRARY]     also lists every function that is not optimized
//   uprobe-coverage --every-instruction [-v] [FILE]
//                                    plans (uprobe::plan_site(), nothing attached) a probe at
//                                    every instruction start of every function of known bounds
//                                    (uprobe::function_sites()), reports how many would take a
//                                    jump (trap-free) by tactic and why the others would not, and
//                                    ends with `trap-free: N of M instruction sites (P%)`
//   uprobe-coverage --every-instruction --attach [--no-evict] [-v] [FILE]   (--no-evict: Config::optimize_evicted off)
//                                    attaches them instead, in 32 rounds (round k: instructions
//                                    k, k + 32, ... of every function, in batches of
//                                    register_uprobes(), then detached: probes of one round are
//                                    32 bytes apart or more, so none blocks another's window),
//                                    reports the mode each took, checks the text is the file's
//                                    again, and ends with the same line. FILE not loaded here (a
//                                    program): its segments are mapped, not run. Slow on a large
//                                    file: hops and slots are kept per site (never freed), so the
//                                    process accumulates mappings (libc: ~20,000 after 100,000
//                                    sites, near vm.max_map_count at 300,000)

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <cctype>
#include <mutex>
#include <thread>
#include <set>
#include <string>
#include <vector>

#include "uprobe/batch.hpp"
#include "uprobe/symbols.hpp"
#include "uprobe/config.hpp"
#include "uprobe/uprobe.hpp"

namespace {

struct Count final : uprobe::Consumer {
  Count() { set_vector_state_unused(); }
  uprobe::Action handler(uprobe::Regs&) override { return uprobe::Action::keep; }
};

/// A reason with its specifics (instructions, numbers, names) taken out, so
/// that reasons of one kind group together.
std::string kind_of(std::string why) {
  const std::string not_nop5 = "is not a 5-byte nop, and ";
  if (auto p = why.find(not_nop5); p != std::string::npos) why = why.substr(p + not_nop5.size());
  std::string out;
  for (std::size_t i = 0; i < why.size(); ++i) {
    const char c = why[i];
    const bool word_start = i == 0 || !std::isalnum(static_cast<unsigned char>(why[i - 1]));
    if (c == '`' || c == '(') {  // `instruction` and (details) -> `...` and (...)
      const char close = c == '`' ? '`' : ')';
      const std::size_t e = why.find(close, i + 1);
      if (e != std::string::npos) {
        out += c == '`' ? "`...`" : "(...)";
        i = e;
        continue;
      }
    }
    if (word_start && std::isdigit(static_cast<unsigned char>(c))) {  // numbers, 0x... -> N
      std::size_t j = i;
      if (c == '0' && j + 1 < why.size() && why[j + 1] == 'x') j += 2;
      while (j < why.size() && std::isxdigit(static_cast<unsigned char>(why[j]))) ++j;
      if (j >= why.size() || !std::isalnum(static_cast<unsigned char>(why[j]))) {
        out += 'N';
        i = j - 1;
        continue;
      }
    }
    out += c;
  }
  return out;
}

std::vector<std::uint8_t> read_file_range(const std::string& path, std::uint64_t off, std::size_t len) {
  std::ifstream f(path, std::ios::binary);
  std::vector<std::uint8_t> v(len);
  f.seekg(static_cast<std::streamoff>(off));
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(len));
  v.resize(static_cast<std::size_t>(f.gcount()));
  return v;
}

/// Modes and reasons of --every-instruction (planned or attached), and its
/// report.
struct SiteTally {
  std::map<std::string, long> modes;
  std::map<std::string, std::pair<long, std::string>> reasons;  // kind -> (count, first example)
  std::vector<std::string> details;                               // -v: every site with a reason

  void add(const std::string& mode, const std::string& why, const std::string& site, bool verbose) {
    ++modes[mode];
    if (why.empty()) return;
    auto& r = reasons[(mode == "refused" ? "refused: " : "") + kind_of(why)];
    if (r.first++ == 0) r.second = site + ": " + why;
    if (verbose) details.push_back("  " + mode + " " + site + ": " + why);
  }
  void merge(const SiteTally& o) {
    for (const auto& [k, v] : o.modes) modes[k] += v;
    for (const auto& [k, v] : o.reasons) {
      auto& r = reasons[k];
      if (r.first == 0) r.second = v.second;
      r.first += v.first;
    }
    details.insert(details.end(), o.details.begin(), o.details.end());
  }
  /// The report: `header` after the path, the modes, the reasons, the sites
  /// (-v), `done` (a line of its own), and the trap-free line last.
  void print(const std::string& path, const std::string& header, bool verbose, const std::string& done) {
    long total = 0;
    for (const auto& [k, v] : modes) total += v;
    const long jump =
        modes["optimized-entry"] + modes["optimized-window"] + modes["optimized-punned"] +
        modes["optimized-punned-padded"] + modes["optimized-evicted"] + modes["optimized-nop5"];
    std::printf("uprobe-coverage: %s: %s\n", path.c_str(), header.c_str());
    for (const char* m : {"optimized-entry", "optimized-window", "optimized-punned", "optimized-punned-padded", "optimized-evicted",
                          "optimized-nop5", "int3",
                          "pending", "refused"})
      std::printf("  %-23s %7ld  %5.1f%%\n", m, modes[m], total ? 100.0 * modes[m] / total : 0.0);
    std::vector<std::pair<long, std::string>> by_count;
    for (const auto& [k, v] : reasons) by_count.emplace_back(v.first, k);
    std::sort(by_count.rbegin(), by_count.rend());
    if (!by_count.empty()) std::printf("why not (most frequent first):\n");
    for (const auto& [n, k] : by_count)
      std::printf("  %7ld  %s\n           e.g. %s\n", n, k.c_str(), reasons[k].second.c_str());
    if (verbose)
      for (const std::string& d : details) std::printf("%s\n", d.c_str());
    std::printf("%s\n", done.c_str());
    std::printf("trap-free: %ld of %ld instruction sites (%.1f%%)\n", jump, total, total ? 100.0 * jump / total : 0.0);
  }
  long total() const {
    long t = 0;
    for (const auto& [k, v] : modes) t += v;
    return t;
  }
};

/// The executable PT_LOAD segments of `path`.
std::vector<Elf64_Phdr> exec_segments(const std::string& path, Elf64_Ehdr& eh, std::vector<Elf64_Phdr>& phdrs) {
  std::vector<Elf64_Phdr> out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  if (::pread(fd, &eh, sizeof eh, 0) == static_cast<ssize_t>(sizeof eh) && eh.e_phentsize == sizeof(Elf64_Phdr) &&
      eh.e_phnum < 256) {
    phdrs.resize(eh.e_phnum);
    const auto len = static_cast<ssize_t>(eh.e_phnum * sizeof(Elf64_Phdr));
    if (::pread(fd, phdrs.data(), static_cast<std::size_t>(len), static_cast<off_t>(eh.e_phoff)) != len) phdrs.clear();
  }
  ::close(fd);
  for (const Elf64_Phdr& ph : phdrs)
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) out.push_back(ph);
  return out;
}

/// Maps the PT_LOAD segments of `path` (not loaded in this process: a
/// program) as its loader would, without running anything: at the link
/// addresses for ET_EXEC, at a free base for ET_DYN; text R-X, the rest R.
/// False with `why` when it cannot; `base`: what its addresses are offset by.
bool map_object(const std::string& path, std::uint64_t& base, std::string& why) {
  Elf64_Ehdr eh{};
  std::vector<Elf64_Phdr> phdrs;
  exec_segments(path, eh, phdrs);
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::uint64_t lo = ~0ull, hi = 0;
  for (const Elf64_Phdr& ph : phdrs)
    if (ph.p_type == PT_LOAD) lo = std::min(lo, ph.p_vaddr & ~(page - 1)), hi = std::max(hi, ph.p_vaddr + ph.p_memsz);
  if (hi <= lo) return why = "no PT_LOAD segment", false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return why = std::string("cannot open: ") + std::strerror(errno), false;
  base = 0;
  if (eh.e_type == ET_DYN) {
    void* r = ::mmap(nullptr, hi - lo, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return ::close(fd), why = "no room for the object", false;
    ::munmap(r, hi - lo);
    base = reinterpret_cast<std::uint64_t>(r) - lo;
  }
  for (const Elf64_Phdr& ph : phdrs) {
    if (ph.p_type != PT_LOAD || ph.p_filesz == 0) continue;
    const std::uint64_t a = (base + ph.p_vaddr) & ~(page - 1), skew = (base + ph.p_vaddr) - a;
    const int prot = PROT_READ | ((ph.p_flags & PF_X) ? PROT_EXEC : 0);
    void* m = ::mmap(reinterpret_cast<void*>(a), ph.p_filesz + skew, prot, MAP_PRIVATE | MAP_FIXED_NOREPLACE, fd,
                     static_cast<off_t>(ph.p_offset - skew));
    if (m == MAP_FAILED || reinterpret_cast<std::uint64_t>(m) != a) {
      ::close(fd);
      return why = "cannot map its segment at " + std::to_string(a) + ": " + std::strerror(errno), false;
    }
  }
  ::close(fd);
  return true;
}

/// The lines of /proc/self/maps (the process's mappings), and how many of
/// them are libuprobe's XOL memory (slots, stubs, hops: memfd "libuprobe-xol").
std::pair<std::size_t, std::size_t> mapping_counts() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::size_t all = 0, xol = 0;
  while (std::getline(maps, line)) {
    ++all;
    xol += line.find("libuprobe-xol") != std::string::npos;
  }
  return {all, xol};
}

/// --every-instruction (attached): every instruction start of `path`, in
/// rounds (see the file comment); prints the tactics, the reasons, whether
/// the text is the file's again, and the trap-free line last.
int every_instruction_attached(const std::string& path, bool verbose) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<uprobe::FunctionSites> fns = uprobe::function_sites(path);
  bool mapped_here = false;  // mapped by map_object(), at `base` (not by the dynamic linker)
  std::uint64_t base = 0;
  if (!fns.empty() && uprobe::runtime_addresses(path, fns[0].offset).empty()) {
    std::string why;
    mapped_here = true;
    if (!map_object(path, base, why)) {
      std::fprintf(stderr, "uprobe-coverage: %s is not loaded here and cannot be mapped: %s\n", path.c_str(),
                   why.c_str());
      return 2;
    }
  }
  // Round k takes instruction starts k, k + kRounds, k + 2 kRounds, ... of
  // the file (numbered below): sites of one round are at least kRounds bytes
  // apart (an instruction is at least a byte), past any window (at most 19
  // bytes) or kept punned bytes (4), so no probe of a round changes
  // another's plan.
  constexpr std::size_t kRounds = 32;
  const std::size_t rounds = kRounds;
  Count c;
  SiteTally tally;
  constexpr std::size_t kBatch = 4096;
  std::vector<uprobe::ProbeRequest> requests;
  std::vector<std::string> names;
  auto flush = [&] {
    if (requests.empty()) return;
    const std::vector<uprobe::RegisterResult> res = uprobe::register_uprobes(requests);
    std::vector<uprobe::ProbeConsumer> undo;
    for (std::size_t i = 0; i < res.size(); ++i) {
      if (!res[i]) {
        tally.add("refused", res[i].error->what(), names[i], verbose);
        continue;
      }
      undo.push_back({res[i].probe, &c});
      const bool trapping = res[i].mode == uprobe::ProbeMode::int3 || res[i].mode == uprobe::ProbeMode::pending;
      tally.add(uprobe::to_string(res[i].mode), trapping ? uprobe::probe_info(res[i].probe).why_not_optimized : "",
                names[i], verbose);
    }
    for (const auto& e : uprobe::unregister_uprobes(undo))
      if (e) std::fprintf(stderr, "uprobe-coverage: unregister: %s\n", e->what());
    requests.clear();
    names.clear();
  };
  // Instruction starts are numbered across the whole file, in the order of
  // fns (by address): the last instruction of a function and the entry of
  // the next one fall in different rounds, as do any two starts fewer than
  // kRounds apart (a per-function count put them in one round, where each
  // saw the other inside the bytes its jump would displace).
  std::vector<std::size_t> first_index(fns.size(), 0);
  for (std::size_t j = 1; j < fns.size(); ++j) first_index[j] = first_index[j - 1] + fns[j - 1].starts.size();
  long done = 0;
  for (std::size_t k = 0; k < rounds; ++k) {
    for (std::size_t j = 0; j < fns.size(); ++j) {
      const uprobe::FunctionSites& f = fns[j];
      for (std::size_t i = (k + kRounds - first_index[j] % kRounds) % kRounds; i < f.starts.size(); i += kRounds) {
        requests.push_back(uprobe::ProbeRequest::at(path, f.offset + f.starts[i], c));
        names.push_back((f.name.empty() ? "fde@" + std::to_string(f.offset) : f.name) + "+" +
                        std::to_string(f.starts[i]));
        if (requests.size() == kBatch) done += static_cast<long>(requests.size()), flush();
      }
    }
    done += static_cast<long>(requests.size());
    flush();  // a round's probes are gone before the next round's come
    if (verbose) {
      const auto [maps, xol] = mapping_counts();
      std::fprintf(stderr, "uprobe-coverage: round %zu of %zu: %ld sites so far, %.1f s, %zu mappings (%zu of XOL memory)\n",
                   k + 1, rounds, done, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                   maps, xol);
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  // The text is the file's again, every byte of every executable segment.
  Elf64_Ehdr eh{};
  std::vector<Elf64_Phdr> phdrs;
  std::size_t differ = 0, compared = 0;
  for (const Elf64_Phdr& ph : exec_segments(path, eh, phdrs)) {
    const std::vector<std::uint8_t> file = read_file_range(path, ph.p_offset, static_cast<std::size_t>(ph.p_filesz));
    const std::vector<std::uintptr_t> at = mapped_here ? std::vector<std::uintptr_t>{base + ph.p_vaddr}
                                                       : uprobe::runtime_addresses(path, ph.p_offset);
    for (std::uintptr_t a : at) {
      for (std::size_t i = 0; i < file.size(); ++i) differ += reinterpret_cast<const std::uint8_t*>(a)[i] != file[i];
      compared += file.size();
    }
  }
  char summary[160];
  std::snprintf(summary, sizeof summary, "attached and detached in %.1f s; text bytes differing from the file after detach: %zu of %zu",
                std::chrono::duration<double>(t1 - t0).count(), differ, compared);
  tally.print(path,
              std::to_string(fns.size()) + " functions of known bounds, " + std::to_string(tally.total()) +
                  " instruction starts, attached in " + std::to_string(rounds) + " rounds",
              verbose, summary);
  return differ == 0 && compared > 0 ? 0 : 1;
}

/// --every-instruction --plan: plans every instruction start of `path` on two
/// threads; prints the tactics, the trap-free share and the reasons.
int every_instruction(const std::string& path, bool verbose) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<uprobe::FunctionSites> fns = uprobe::function_sites(path);
  std::mutex mu;
  SiteTally tally;
  std::size_t next = 0;
  auto work = [&] {
    SiteTally mine;
    for (;;) {
      std::size_t i;
      {
        std::lock_guard<std::mutex> l(mu);
        if (next == fns.size()) break;
        i = next++;
      }
      const uprobe::FunctionSites& f = fns[i];
      const std::string name = f.name.empty() ? "fde@" + std::to_string(f.offset) : f.name;
      for (const std::uint32_t at : f.starts) {
        const std::string site = name + "+" + std::to_string(at);
        try {
          const uprobe::SitePlan p = uprobe::plan_site(path, f.offset + at);
          mine.add(uprobe::to_string(p.tactic), p.why_int3, site, verbose);
        } catch (const uprobe::Error& e) {
          mine.add("refused", e.what(), site, verbose);
        }
      }
    }
    std::lock_guard<std::mutex> l(mu);
    tally.merge(mine);
  };
  std::thread helper(work);
  work();
  helper.join();
  const auto t1 = std::chrono::steady_clock::now();
  char done[64];
  std::snprintf(done, sizeof done, "planned in %.1f s", std::chrono::duration<double>(t1 - t0).count());
  tally.print(path,
              std::to_string(fns.size()) + " functions of known bounds, " + std::to_string(tally.total()) +
                  " instruction starts (plans, nothing attached)",
              verbose, done);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool verbose = false, every = false, attach = false;
  std::string lib = "libc.so.6";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-v") == 0) {
      verbose = true;
    } else if (std::strcmp(argv[i], "--every-instruction") == 0) {
      every = true;
    } else if (std::strcmp(argv[i], "--attach") == 0) {
      attach = true;
    } else if (std::strcmp(argv[i], "--evict") == 0 || std::strcmp(argv[i], "--no-evict") == 0) {
      // Successor eviction (E9Patch's T2) where no punned form finds a page:
      // on by default (--evict kept for scripts), --no-evict to compare.
      uprobe::Config c = uprobe::configuration();
      c.optimize_evicted = std::strcmp(argv[i], "--evict") == 0;
      uprobe::configure(c);
    } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::printf("usage: uprobe-coverage [-v] [LIBRARY]   (default libc.so.6)\n"
                  "       uprobe-coverage --every-instruction [--attach] [--no-evict] [-v] [FILE]\n");
      return 0;
    } else {
      lib = argv[i];
    }
  }
  try {
    const std::string path = uprobe::resolve_library(lib, uprobe::LibrarySearch::search_path);
    if (every) return attach ? every_instruction_attached(path, verbose) : every_instruction(path, verbose);
    std::set<std::uint64_t> seen;
    struct Fn {
      std::string name;
      std::uint64_t offset, size;
    };
    std::vector<Fn> fns;
    for (const uprobe::Symbol& s : uprobe::read_symbols(path))
      if (s.dynamic && (s.type == STT_FUNC || s.type == STT_GNU_IFUNC) && s.executable && s.in_file &&
          seen.insert(s.offset).second)
        fns.push_back({s.name, s.offset, s.size});
    // The implementations the dynamic linker bound the IFUNCs to (their
    // resolvers, above, run only at binding time).
    int impls = 0;
    for (const uprobe::Symbol& s : uprobe::read_symbols(path)) {
      if (!s.dynamic || s.type != STT_GNU_IFUNC || !s.in_file) continue;
      const uprobe::Location l = uprobe::resolve_symbol(path, s.full_name());
      if (!l.ifunc_bound || l.path != path || !seen.insert(l.offset).second) continue;
      fns.push_back({l.implementation.empty() ? s.name + " (implementation)" : l.implementation, l.offset, 0});
      ++impls;
    }
    std::sort(fns.begin(), fns.end(), [](const Fn& a, const Fn& b) { return a.offset < b.offset; });

    Count c;
    std::map<std::string, int> modes;
    std::map<std::string, std::pair<int, std::string>> reasons, refusals;
    std::vector<std::string> details;
    std::vector<uprobe::Uprobe*> attached;
    const auto t0 = std::chrono::steady_clock::now();
    for (const Fn& f : fns) {
      try {
        uprobe::Uprobe* up = uprobe::register_uprobe(path, f.offset, c);
        attached.push_back(up);
        const uprobe::ProbeInfo info = uprobe::probe_info(up);
        ++modes[uprobe::to_string(info.mode)];
        if (info.mode == uprobe::ProbeMode::int3 || info.mode == uprobe::ProbeMode::pending) {
          auto& r = reasons[kind_of(info.why_not_optimized)];
          if (r.first++ == 0) r.second = f.name + ": " + info.why_not_optimized;
          details.push_back("  int3     " + f.name + ": " + info.why_not_optimized);
        }
      } catch (const uprobe::Error& e) {
        ++modes["refused"];
        std::string w = e.what();
        // "the function NAME (ALIAS) runs on ...": group by what follows the names.
        if (auto p = w.find(") "); p != std::string::npos && w.find("the function ") != std::string::npos)
          w = "the function ... " + w.substr(p + 2);
        else
          w = kind_of(w);
        auto& r = refusals[w];
        r.second += (r.first++ ? ", " : "") + f.name;
        details.push_back("  refused  " + f.name + ": " + e.what());
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (uprobe::Uprobe* up : attached) uprobe::unregister_uprobe(up, c);
    const auto t2 = std::chrono::steady_clock::now();

    // Every function's bytes are the file's again.
    std::size_t differ = 0;
    for (const Fn& f : fns) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(f.size ? f.size : 16, 64));
      const auto file = read_file_range(path, f.offset, n);
      for (std::uintptr_t a : uprobe::runtime_addresses(path, f.offset))
        if (std::memcmp(reinterpret_cast<const void*>(a), file.data(), file.size()) != 0) ++differ;
    }

    const int total = static_cast<int>(fns.size());
    const int attached_n = total - modes["refused"];
    std::printf("uprobe-coverage: %s: %d function entries (.dynsym STT_FUNC/STT_GNU_IFUNC and the %d IFUNC "
                "implementations bound here, distinct offsets)\n",
                path.c_str(), total, impls);
    for (const char* m : {"optimized-entry", "optimized-window", "optimized-punned", "optimized-punned-padded", "optimized-evicted",
                          "optimized-nop5", "int3", "pending", "refused"})
      std::printf("  %-23s %5d  %5.1f%% of all, %5.1f%% of attached\n", m, modes[m], 100.0 * modes[m] / total,
                  std::strcmp(m, "refused") == 0 ? 0.0 : 100.0 * modes[m] / (attached_n ? attached_n : 1));
    const int optimized =
        modes["optimized-entry"] + modes["optimized-window"] + modes["optimized-punned"] +
        modes["optimized-punned-padded"] + modes["optimized-evicted"] + modes["optimized-nop5"];
    std::printf("  optimized        %5d  %5.1f%% of all, %5.1f%% of attached\n", optimized, 100.0 * optimized / total,
                100.0 * optimized / (attached_n ? attached_n : 1));
    if (!reasons.empty()) std::printf("why int3:\n");
    for (const auto& [k, v] : reasons) std::printf("  %5d  %s\n         e.g. %s\n", v.first, k.c_str(), v.second.c_str());
    if (!refusals.empty()) std::printf("why refused:\n");
    for (const auto& [k, v] : refusals) std::printf("  %5d  %s\n         %s\n", v.first, k.c_str(), v.second.c_str());
    std::printf("attach %.1f ms (%.3f ms per probe), detach %.1f ms; bytes differing from the file after detach: %zu\n",
                std::chrono::duration<double, std::milli>(t1 - t0).count(),
                std::chrono::duration<double, std::milli>(t1 - t0).count() / (attached_n ? attached_n : 1),
                std::chrono::duration<double, std::milli>(t2 - t1).count(), differ);
    if (verbose)
      for (const std::string& d : details) std::printf("%s\n", d.c_str());
    return differ == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "uprobe-coverage: %s\n", e.what());
    return 2;
  }
}
