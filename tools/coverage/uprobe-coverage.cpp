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

#include <elf.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "uprobe/symbols.hpp"
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

}  // namespace

int main(int argc, char** argv) {
  bool verbose = false;
  std::string lib = "libc.so.6";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-v") == 0)
      verbose = true;
    else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::printf("usage: uprobe-coverage [-v] [LIBRARY]   (default libc.so.6)\n");
      return 0;
    } else
      lib = argv[i];
  }
  try {
    const std::string path = uprobe::resolve_library(lib, uprobe::LibrarySearch::search_path);
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
    for (const char* m : {"optimized-entry", "optimized-nop5", "int3", "pending", "refused"})
      std::printf("  %-16s %5d  %5.1f%% of all, %5.1f%% of attached\n", m, modes[m], 100.0 * modes[m] / total,
                  std::strcmp(m, "refused") == 0 ? 0.0 : 100.0 * modes[m] / (attached_n ? attached_n : 1));
    const int optimized = modes["optimized-entry"] + modes["optimized-nop5"];
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
