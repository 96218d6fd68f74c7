// SPDX-License-Identifier: MIT
// Symbols and addresses of an ELF file -> file offsets (symbols.hpp).
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329); the state must be set before <string> is included.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include "uprobe/symbols.hpp"

#include <elf.h>
#include <fnmatch.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

#include "elf_image.hpp"
#include "ifunc.hpp"
#include "uprobe/uprobe.hpp"

namespace uprobe {

using detail::binding_rank;
using detail::ElfImage;
using detail::ElfSymbol;
using detail::hex_str;
using detail::load_elf_image;
using detail::LoadSegment;

std::string Symbol::full_name() const {
  if (version.empty()) return name;
  return name + (hidden_version ? "@" : "@@") + version;
}

namespace {

std::string canonical(const std::string& p) {
  char buf[PATH_MAX];
  if (::realpath(p.c_str(), buf)) return buf;
  return p;
}

const char* type_name(unsigned t) {
  switch (t) {
    case STT_NOTYPE: return "NOTYPE";
    case STT_OBJECT: return "OBJECT";
    case STT_FUNC: return "FUNC";
    case STT_GNU_IFUNC: return "IFUNC";
    case STT_COMMON: return "COMMON";
    default: return "other";
  }
}

bool is_code(const ElfSymbol& s) {
  return s.in_file && s.executable && (s.type == STT_FUNC || s.type == STT_GNU_IFUNC || s.type == STT_NOTYPE);
}

// The alias to report for one address (`a` with size `asize`, `b` with `bsize`).
bool preferred(const ElfSymbol& a, std::uint64_t asize, const ElfSymbol& b, std::uint64_t bsize) {
  return std::make_tuple(binding_rank(a), a.hidden_version, asize == 0, a.name.size(), a.name, a.dynamic) <
         std::make_tuple(binding_rank(b), b.hidden_version, bsize == 0, b.name.size(), b.name, b.dynamic);
}
bool preferred(const ElfSymbol& a, const ElfSymbol& b) { return preferred(a, a.size, b, b.size); }

/// The code symbols of `img` whose name (full_name() when the glob has an
/// `@`) matches `glob`, one per offset (the preferred alias, with the largest
/// size of the aliases there), by offset.
struct Match {
  const ElfSymbol* sym;
  std::uint64_t size;
};
std::vector<Match> match_in(const ElfImage& img, std::string_view glob) {
  const std::string pat(glob);
  const bool full = pat.find('@') != std::string::npos;
  const bool any = pat == "*";  // (fnmatch("*", name, 0) matches every name)
  // The matching symbols in table order, then grouped by offset (a stable
  // sort keeps that order within an offset).
  std::vector<const ElfSymbol*> hits;
  std::string subject;
  for (const ElfSymbol& s : img.symbols) {
    if (!is_code(s)) continue;
    if (!any) {
      if (full) subject = s.full_name();
      else subject.assign(s.name);
      if (::fnmatch(pat.c_str(), subject.c_str(), 0) != 0) continue;
    }
    hits.push_back(&s);
  }
  std::stable_sort(hits.begin(), hits.end(), [](const ElfSymbol* a, const ElfSymbol* b) { return a->offset < b->offset; });
  std::vector<Match> out;
  for (std::size_t i = 0; i < hits.size(); ++i) {
    const ElfSymbol& s = *hits[i];
    if (out.empty() || i == 0 || hits[i - 1]->offset != s.offset) {
      out.push_back(Match{&s, s.size});
      continue;
    }
    Match& m = out.back();  // the preferred alias at the offset, with the largest size of them
    const std::uint64_t size = std::max(m.size, s.size);
    if (preferred(s, s.size, *m.sym, m.size)) m.sym = &s;
    m.size = size;
  }
  return out;
}

// A parsed NAME / NAME@VER / NAME@@VER.
struct NameSpec {
  std::string name, version;
  bool has_version = false, require_default = false;
};

NameSpec parse_name(std::string_view s) {
  NameSpec n;
  auto at = s.find('@');
  if (at == std::string_view::npos || at == 0) {
    n.name = std::string(s);
    return n;
  }
  n.name = std::string(s.substr(0, at));
  n.has_version = true;
  if (at + 1 < s.size() && s[at + 1] == '@') {
    n.require_default = true;
    n.version = std::string(s.substr(at + 2));
  } else {
    n.version = std::string(s.substr(at + 1));
  }
  return n;
}

bool parse_number(std::string_view s, std::uint64_t& out) {
  if (s.empty()) return false;
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s.remove_prefix(2);
  }
  std::uint64_t v = 0;
  for (char c : s) {
    unsigned d;
    if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
    else if (base == 16 && c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
    else if (base == 16 && c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
    else return false;
    if (v > (UINT64_MAX - d) / static_cast<unsigned>(base)) return false;
    v = v * static_cast<unsigned>(base) + d;
  }
  out = v;
  return true;
}

bool has_glob(std::string_view s) { return s.find_first_of("*?[") != std::string_view::npos; }

std::string stripped_hint(const ElfImage& img) {
  if (!img.has_symtab && !img.has_dynsym)
    return "the file is stripped (no .symtab, no .dynsym): give a link-time address (BINARY:0xADDR) or a file "
           "offset (BINARY:+OFF)";
  if (!img.has_symtab) return "the file has no .symtab (stripped): only its exported .dynsym symbols are known";
  return {};
}

Location location_in(const std::string& path, const LoadSegment* seg, std::uint64_t off, const char* what) {
  if (!seg)
    throw Error(Errc::bad_offset, path, off, std::string(what) + " is outside every PT_LOAD segment's file bytes");
  if (!seg->executable())
    throw Error(Errc::not_executable, path, off,
                std::string(what) + " is in a non-executable segment (vaddr " + hex_str(seg->vaddr) + ", flags " +
                    ((seg->flags & PF_R) ? "R" : "") + ((seg->flags & PF_W) ? "W" : "") + "): not code");
  Location l;
  l.path = path;
  l.offset = off;
  l.address = off - seg->offset + seg->vaddr;
  return l;
}

/// For an IFUNC symbol `s` at +`off`: marks `l` as one and, for +0 when the
/// file is loaded here, moves it to the implementation the dynamic linker
/// bound the name to (symbols.hpp).
template <class Sym>  // Symbol or ElfSymbol
void apply_ifunc(Location& l, const Sym& s, std::uint64_t off) {
  if (s.type != STT_GNU_IFUNC) return;
  l.ifunc = true;
  l.ifunc_resolver = s.offset;
  if (off != 0) return;
  const auto bindings = detail::ifunc_bindings(l.path);
  for (const detail::IfuncBinding& b : *bindings) {
    // (A .symtab entry carries no version; the .dynsym entry of the same
    // name and address is the one bound.)
    if (b.ifunc.name != s.name || b.ifunc.address != s.address || (!s.version.empty() && b.ifunc.version != s.version))
      continue;
    l.path = b.impl_path;
    l.offset = b.impl_offset;
    l.address = b.impl_address;
    l.implementation = b.implementation;
    l.ifunc_bound = true;
    return;
  }
}

}  // namespace

std::vector<Symbol> read_symbols(const std::string& path) {
  auto img = load_elf_image(path);
  std::vector<Symbol> out;
  out.reserve(img->symbols.size());
  for (const ElfSymbol& s : img->symbols) out.push_back(s.to_symbol());
  return out;
}

namespace {

/// find_symbol()'s answer from `img`. With `settled_only`, std::nullopt
/// (never an exception) unless `img` settles it however many symbols a
/// debug file adds: a match, every candidate global or weak, one address.
/// A debug file's .symtab repeats the exported symbols of .dynsym (the
/// same name, address and size; a version only where .dynsym has it too)
/// and adds local symbols, which the rule below drops where a global one
/// with a default version (or none) matches: it can add an entry for the
/// same answer, never another answer. (Where every match has a non-default
/// version, `foo@V1`, a local `foo` would win: not settled.)
std::optional<Symbol> lookup_symbol(const ElfImage& img, const std::string& path, std::string_view name,
                                    bool settled_only) {
  const NameSpec spec = parse_name(name);
  const std::string shown(name);
  if (spec.name.empty()) {
    if (settled_only) return std::nullopt;
    throw Error(Errc::bad_offset, path, 0, "empty symbol name");
  }
  if (img.symbols.empty()) {
    if (settled_only) return std::nullopt;
    throw Error(Errc::bad_offset, path, 0, "symbol `" + shown + "' cannot be looked up: " + stripped_hint(img));
  }

  std::vector<const ElfSymbol*> cands;
  std::vector<const ElfSymbol*> same_name;
  for (const ElfSymbol& s : img.symbols) {
    if (s.name != spec.name) continue;
    same_name.push_back(&s);
    if (spec.has_version && (s.version != spec.version || (spec.require_default && s.hidden_version))) continue;
    cands.push_back(&s);
  }
  if (settled_only &&
      (cands.empty() || std::any_of(cands.begin(), cands.end(), [](const ElfSymbol* c) { return c->binding == STB_LOCAL; })))
    return std::nullopt;
  // A name without a version whose every candidate has a non-default one
  // (only `foo@V1` exported): a local `foo` the debug file adds has no
  // version, and the rule below keeps it over them (not settled here).
  if (settled_only && !spec.has_version &&
      std::all_of(cands.begin(), cands.end(), [](const ElfSymbol* c) { return c->hidden_version; }))
    return std::nullopt;
  if (cands.empty()) {
    std::string why = "symbol `" + shown + "' not found in .symtab or .dynsym";
    if (!same_name.empty()) {
      std::set<std::string> have;
      for (const ElfSymbol* s : same_name) have.insert(s->full_name());
      std::string list;
      for (const auto& h : have) list += (list.empty() ? "" : ", ") + h;
      why = "symbol `" + shown + "' not found; versions present: " + list;
    } else if (std::string h = stripped_hint(img); !h.empty()) {
      why += " (" + h + ")";
    }
    throw Error(Errc::bad_offset, path, 0, why);
  }
  auto distinct = [](const std::vector<const ElfSymbol*>& v) {
    std::set<std::uint64_t> a;
    for (const ElfSymbol* s : v) a.insert(s->address);
    return a.size();
  };
  auto keep_if = [&](auto pred) {
    std::vector<const ElfSymbol*> kept;
    for (const ElfSymbol* s : cands)
      if (pred(*s)) kept.push_back(s);
    if (!kept.empty()) cands = std::move(kept);
  };
  if (distinct(cands) > 1 && !spec.has_version) keep_if([](const ElfSymbol& s) { return !s.hidden_version; });
  if (distinct(cands) > 1) keep_if([](const ElfSymbol& s) { return s.binding != STB_LOCAL; });
  if (distinct(cands) > 1) {
    if (settled_only) return std::nullopt;
    std::string list;
    std::set<std::pair<std::uint64_t, std::string>> seen;
    for (const ElfSymbol* s : cands) seen.insert({s->address, s->full_name()});
    for (const auto& [a, n] : seen) list += (list.empty() ? "" : ", ") + n + " at " + hex_str(a);
    throw Error(Errc::conflict, path, 0, "symbol `" + shown + "' is ambiguous: " + list);
  }
  // Report the most informative entry for that address: sized, versioned.
  const ElfSymbol* best = cands[0];
  for (const ElfSymbol* s : cands) {
    auto score = [](const ElfSymbol& x) { return std::make_tuple(x.size > 0, !x.version.empty(), x.binding != STB_LOCAL); };
    if (score(*s) > score(*best)) best = s;
  }
  return best->to_symbol();
}

}  // namespace

Symbol find_symbol(const std::string& path, std::string_view name) {
  return *lookup_symbol(*load_elf_image(path), path, name, false);
}

std::vector<Symbol> match_symbols(const std::string& path, std::string_view glob) {
  auto img = load_elf_image(path);
  std::vector<Symbol> out;
  for (const Match& m : match_in(*img, glob)) {
    out.push_back(m.sym->to_symbol());
    out.back().size = m.size;
  }
  return out;
}

std::optional<Symbol> symbol_at(const std::string& path, std::uint64_t offset) {
  auto img = load_elf_image(path);
  const ElfSymbol* best = detail::symbols_at(*img, {offset})[0];
  if (!best) return std::nullopt;
  return best->to_symbol();
}

std::uint64_t address_to_offset(const std::string& path, std::uint64_t address) {
  auto img = load_elf_image(path, detail::ImageDepth::file_tables);  // (its segments)
  const LoadSegment* seg = img->segment_of_vaddr(address);
  if (!seg) {
    std::string ranges;
    for (const LoadSegment& s : img->loads)
      ranges += (ranges.empty() ? "" : ", ") + hex_str(s.vaddr) + "-" + hex_str(s.vaddr + s.filesz);
    throw Error(Errc::bad_offset, path, 0,
                "address " + hex_str(address) + " is outside the file bytes of every PT_LOAD segment (" + ranges + ")");
  }
  return address - seg->vaddr + seg->offset;
}

std::uint64_t offset_to_address(const std::string& path, std::uint64_t offset) {
  auto img = load_elf_image(path, detail::ImageDepth::file_tables);  // (its segments)
  const LoadSegment* seg = img->segment_of_offset(offset);
  if (!seg) throw Error(Errc::bad_offset, path, offset, "no PT_LOAD segment maps this file offset");
  return offset - seg->offset + seg->vaddr;
}

Location resolve_symbol(const std::string& path, std::string_view symbol, std::uint64_t offset) {
  const std::string canon = canonical(path);
  // The file's own tables first (ImageDepth): where they settle the name,
  // its debug file would add nothing to the location (lookup_symbol()).
  // (An image that left nothing out answers whole: no second load.)
  const auto own = load_elf_image(canon, detail::ImageDepth::file_tables);
  std::optional<Symbol> settled = lookup_symbol(*own, canon, symbol, own->debug_deferred);
  Symbol s = settled ? std::move(*settled) : find_symbol(canon, symbol);
  const std::string shown = s.full_name() + (offset ? "+" + hex_str(offset) : std::string());
  if (!s.in_file)
    throw Error(Errc::bad_offset, canon, offset,
                "symbol `" + shown + "' at " + hex_str(s.address) + " has no bytes in the file (.bss?)");
  if (!s.executable)
    throw Error(Errc::not_executable, canon, s.offset + offset,
                "symbol `" + s.full_name() + "' (" + type_name(s.type) + ") at " + hex_str(s.address) +
                    " is in a non-executable segment: not code");
  if (s.size > 0 && offset >= s.size)
    throw Error(Errc::bad_offset, canon, s.offset + offset,
                "`" + shown + "' is outside the symbol (size " + std::to_string(s.size) + ")");
  if (s.size == 0 && offset > 0)
    throw Error(Errc::bad_offset, canon, s.offset + offset,
                "`" + shown + "': the symbol has size 0, so only +0 can be checked to lie inside it");
  Location l;
  l.path = canon;
  l.offset = s.offset + offset;
  l.address = s.address + offset;
  l.symbol = s.full_name();
  l.symbol_offset = offset;
  apply_ifunc(l, s, offset);
  return l;
}

std::vector<Location> resolve_location(std::string_view spec, LibrarySearch search) {
  const std::string whole(spec);
  auto colon = spec.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == spec.size())
    throw Error(Errc::bad_offset, whole, 0,
                "malformed probe target `" + whole + "': expected BINARY:SYMBOL[+OFF], BINARY:0xADDR or BINARY:+OFF");
  const std::string path = resolve_library(spec.substr(0, colon), search);
  std::string_view what = spec.substr(colon + 1);
  // (Segments, and a name, need the file's own tables only: resolve_symbol();
  // a glob matches the debug file's symbols too.)
  auto img = load_elf_image(path, has_glob(what) ? detail::ImageDepth::with_debug_file : detail::ImageDepth::file_tables);
  std::uint64_t n = 0;

  if (what[0] == '+') {
    if (!parse_number(what.substr(1), n))
      throw Error(Errc::bad_offset, path, 0, "malformed file offset `" + std::string(what) + "'");
    return {location_in(path, img->segment_of_offset(n), n, "file offset")};
  }
  if (parse_number(what, n)) {
    const std::uint64_t off = address_to_offset(path, n);  // throws with the segment list
    return {location_in(path, img->segment_of_vaddr(n), off, "address")};
  }
  if (has_glob(what)) {
    const std::vector<Match> m = match_in(*img, what);
    if (m.empty()) {
      std::string why = "no code symbol matches `" + std::string(what) + "'";
      if (std::string h = stripped_hint(*img); !h.empty()) why += " (" + h + ")";
      throw Error(Errc::bad_offset, path, 0, why);
    }
    std::vector<Location> out;
    std::set<std::pair<std::string, std::uint64_t>> bound;
    out.reserve(m.size());
    for (const Match& mm : m) {
      const ElfSymbol& s = *mm.sym;
      Location l;
      l.path = path;
      l.offset = s.offset;
      l.address = s.address;
      l.symbol = s.full_name();
      apply_ifunc(l, s, 0);
      if (l.ifunc_bound) bound.insert({l.path, l.offset});
      out.push_back(std::move(l));
    }
    // An implementation that a matching IFUNC stands for is not listed again
    // under its own name.
    std::erase_if(out, [&](const Location& l) { return !l.ifunc_bound && bound.count({l.path, l.offset}); });
    return out;
  }
  std::uint64_t off = 0;
  std::string_view sym = what;
  if (auto plus = what.rfind('+'); plus != std::string_view::npos && plus > 0) {
    if (!parse_number(what.substr(plus + 1), off))
      throw Error(Errc::bad_offset, path, 0,
                  "malformed offset in `" + std::string(what) + "': expected SYMBOL+DECIMAL or SYMBOL+0xHEX");
    sym = what.substr(0, plus);
  }
  return {resolve_symbol(path, sym, off)};
}

}  // namespace uprobe

namespace uprobe::detail {

std::vector<const ElfSymbol*> symbols_at(const ElfImage& img, const std::vector<std::uint64_t>& offsets) {
  std::vector<const ElfSymbol*> best(offsets.size(), nullptr);
  // Tightest sized symbol; among equals the preferred alias.
  auto span = [](const ElfSymbol& x) { return x.size ? x.size : UINT64_MAX; };
  for (const ElfSymbol& s : img.symbols) {
    if (!is_code(s)) continue;
    // The offsets it holds: [offset, offset + size), or offset alone when unsized.
    auto it = std::lower_bound(offsets.begin(), offsets.end(), s.offset);
    const std::uint64_t end = s.size ? s.offset + s.size : s.offset + 1;
    for (; it != offsets.end() && *it < end; ++it) {
      const ElfSymbol*& b = best[static_cast<std::size_t>(it - offsets.begin())];
      if (!b || span(s) < span(*b) || (span(s) == span(*b) && preferred(s, *b))) b = &s;
    }
  }
  return best;
}

}  // namespace uprobe::detail
