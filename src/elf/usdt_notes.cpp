// SPDX-License-Identifier: MIT
// USDT notes -> probe sites with file offsets and semaphore (ref_ctr)
// offsets (usdt.hpp).
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329); the state must be set before <string> is included.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <fnmatch.h>

#include <set>
#include <unordered_map>

#include "elf_image.hpp"
#include "uprobe/uprobe.hpp"
#include "uprobe/usdt.hpp"

namespace uprobe::usdt {

using detail::ElfImage;
using detail::hex_str;
using detail::load_elf_image;
using detail::LoadSegment;

namespace {

bool has_glob(std::string_view s) { return s.find_first_of("*?[") != std::string_view::npos; }

bool matches(std::string_view pattern, const std::string& s) {
  if (!has_glob(pattern)) return pattern == s;
  return ::fnmatch(std::string(pattern).c_str(), s.c_str(), 0) == 0;
}

std::vector<Probe> probes_of(const std::string& path, const ElfImage& img) {
  // Symbol operands (`sym+8(%rip)`): name -> link-time address. A name with
  // several addresses (e.g. function statics "counter.0" of two files) is
  // ambiguous: the note does not say which file it came from, so such an
  // operand is refused rather than read from the wrong object.
  constexpr std::uint64_t kAmbiguous = ~std::uint64_t{0};
  std::unordered_map<std::string, std::uint64_t> syms;
  bool syms_built = false;
  auto lookup = [&](std::string_view name) -> std::optional<std::uint64_t> {
    if (!syms_built) {
      syms_built = true;
      for (const detail::ElfSymbol& s : img.symbols) {
        auto [it, inserted] = syms.emplace(s.name, s.address);
        if (!inserted && it->second != s.address) it->second = kAmbiguous;
      }
    }
    auto it = syms.find(std::string(name));
    if (it == syms.end() || it->second == kAmbiguous) return std::nullopt;
    return it->second;
  };

  std::vector<Probe> out;
  out.reserve(img.notes.size());
  for (const detail::StapsdtNote& n : img.notes) {
    Probe p;
    p.path = path;
    p.provider = n.provider;
    p.name = n.name;
    p.note_pc = n.pc;
    p.note_base = n.base;
    p.note_semaphore = n.semaphore;
    p.args_text = n.args;
    // Prelink compensation: the note holds link-time addresses of the
    // original link; .stapsdt.base's sh_addr says where that base is now.
    const std::uint64_t delta = img.stapsdt_base && *img.stapsdt_base ? *img.stapsdt_base - n.base : 0;
    p.pc = n.pc + delta;
    p.semaphore = n.semaphore ? n.semaphore + delta : 0;

    if (const LoadSegment* seg = img.segment_of_vaddr(p.pc); !seg) {
      p.error = "pc " + hex_str(p.pc) + " is outside the file bytes of every PT_LOAD segment";
    } else if (!seg->executable()) {
      p.error = "pc " + hex_str(p.pc) + " is in a non-executable segment";
    } else {
      p.offset = p.pc - seg->vaddr + seg->offset;
    }
    if (p.semaphore && p.error.empty()) {
      if (const LoadSegment* seg = img.segment_of_vaddr(p.semaphore); !seg) {
        p.error = "semaphore " + hex_str(p.semaphore) +
                  " is outside the file bytes of every PT_LOAD segment (in .bss? the kernel's ref_ctr needs file "
                  "bytes)";
      } else if (seg->executable()) {
        p.error = "semaphore " + hex_str(p.semaphore) + " is in an executable segment";
      } else {
        p.semaphore_offset = p.semaphore - seg->vaddr + seg->offset;
      }
    }
    if (!p.error.empty()) p.offset = p.semaphore_offset = 0;

    ParseContext ctx;
    ctx.pc = p.pc;
    ctx.lookup = lookup;
    ParseResult r = parse_args(p.args_text, ctx);
    p.args = r.args;
    p.args_error = r.error;
    out.push_back(std::move(p));
  }
  return out;
}

std::string listing(const std::vector<Probe>& all) {
  std::set<std::string> names;
  for (const Probe& p : all) names.insert(p.full_name());
  std::string s;
  std::size_t k = 0;
  for (const auto& n : names) {
    if (k++ == 24) {
      s += ", ... (" + std::to_string(names.size()) + " probes)";
      break;
    }
    s += (s.empty() ? "" : ", ") + n;
  }
  return s;
}

}  // namespace

std::vector<Probe> probes(std::string_view binary, LibrarySearch search) {
  const std::string path = resolve_library(binary, search);
  auto img = load_elf_image(path);
  return probes_of(path, *img);
}

std::vector<Probe> find(std::string_view binary, std::string_view provider, std::string_view name,
                        LibrarySearch search) {
  const std::string path = resolve_library(binary, search);
  auto img = load_elf_image(path);
  const std::string wanted = std::string(provider) + ":" + std::string(name);
  if (!img->has_stapsdt_section)
    throw Error(Errc::bad_offset, path, 0,
                "no USDT probe `" + wanted + "': the file has no .note.stapsdt section (built without sys/sdt.h probes?)");
  std::vector<Probe> all = probes_of(path, *img);
  std::vector<Probe> hits;
  for (Probe& p : all)
    if (matches(provider, p.provider) && matches(name, p.name)) hits.push_back(p);
  if (hits.empty())
    throw Error(Errc::bad_offset, path, 0,
                "no USDT probe `" + wanted + "' in this file; it has: " +
                    (all.empty() ? std::string("none") : listing(all)));
  for (const Probe& p : hits)
    if (!p.error.empty())
      throw Error(Errc::bad_offset, path, 0, "USDT probe `" + p.full_name() + "' (note pc " + hex_str(p.note_pc) +
                                                 "): " + p.error);
  return hits;
}

std::vector<Probe> find(std::string_view spec, LibrarySearch search) {
  const std::string whole(spec);
  auto c2 = spec.rfind(':');
  if (c2 == std::string_view::npos || c2 == 0 || c2 + 1 == spec.size())
    throw Error(Errc::bad_offset, whole, 0,
                "malformed USDT target `" + whole + "': expected BINARY:PROVIDER:NAME or BINARY:NAME");
  std::string_view name = spec.substr(c2 + 1);
  std::string_view head = spec.substr(0, c2);
  auto c1 = head.rfind(':');
  if (c1 != std::string_view::npos && c1 > 0 && c1 + 1 < head.size())
    return find(head.substr(0, c1), head.substr(c1 + 1), name, search);
  std::vector<Probe> hits = find(head, "*", name, search);
  std::set<std::string> providers;
  for (const Probe& p : hits) providers.insert(p.provider);
  if (providers.size() > 1) {
    std::string list;
    for (const auto& pr : providers) list += (list.empty() ? "" : ", ") + pr + ":" + std::string(name);
    throw Error(Errc::conflict, hits[0].path, 0,
                "USDT probe name `" + std::string(name) + "' is ambiguous (" + list + "); give PROVIDER:NAME");
  }
  return hits;
}

const ArgSpec& require_args(const Probe& p) {
  if (!p.args_error.empty())
    throw Error(Errc::bad_offset, p.path, p.offset, "USDT probe `" + p.full_name() + "': " + p.args_error);
  return p.args;
}

}  // namespace uprobe::usdt
