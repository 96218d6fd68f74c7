// SPDX-License-Identifier: MIT
#pragma once
/// @file runner.hpp
/// The per-instruction-class harness: probe one instruction of an assembly
/// fixture, call the fixture 1000 times, and require identical results to the
/// unprobed run and to an exact model, exactly one hit per call at the right
/// rip, the right continuation counter in Stats, and the original bytes back
/// after unregister. Each case runs twice: registered by address, then by
/// (path, file offset) where the offset comes from our own ELF reader.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "fixtures.hpp"
#include "punned_range.hpp"

namespace coretest {

/// Whether probe_info()'s `why_not_evicted` says eviction is impossible in
/// this address space, and is right: "evicting the successor `INSN`: every
/// trampoline address its bytes allow is mapped (SPANS)", each span
/// ("[0xLO, 0xHI)" or one address "0xA") mapped in every page now (the
/// library read the address space afresh before saying so; the heap, at an
/// address ASLR picks, may lie there). Else false with `err` saying why not
/// (any other reason is a refusal the test does not accept).
inline bool eviction_impossible_here(const std::string& why, std::string& err) {
  static const std::string kHead = "evicting the successor `";
  static const std::string kTramp = "`: every trampoline address its bytes allow is mapped (";
  static const std::string kEither =
      "`: every address its bytes allow for the successor's trampoline or the site's hop is mapped (";
  const bool either = why.find(kEither) != std::string::npos;
  const std::string& kMapped = either ? kEither : kTramp;
  const std::size_t m = why.find(kMapped);
  if (why.rfind(kHead, 0) != 0 || m == std::string::npos || why.back() != ')') {
    err = "eviction refused for another reason than every trampoline address being mapped: \"" + why + "\"";
    return false;
  }
  const std::string spans = why.substr(m + kMapped.size(), why.size() - 1 - (m + kMapped.size()));
  if (spans == "none is a user address") return true;
  std::size_t at = 0;
  while (at < spans.size()) {
    std::uint64_t lo = 0, hi = 0;
    char* end = nullptr;
    if (spans[at] == '[') {
      lo = std::strtoull(spans.c_str() + at + 1, &end, 16);
      if (std::strncmp(end, ", ", 2) != 0) break;
      hi = std::strtoull(end + 2, &end, 16);
      if (*end != ')') break;
      ++end;
    } else {
      lo = std::strtoull(spans.c_str() + at, &end, 16);
      hi = lo + 1;
    }
    if (lo >= hi) break;
    for (std::uint64_t p = lo & ~std::uint64_t{4095}; p < hi; p += 4096)
      if (!mapping_of(reinterpret_cast<const void*>(p)).has_value()) {
        err = "eviction refused as every trampoline address were mapped, but " + hex(p) + " is not: \"" + why + "\"";
        return false;
      }
    at = static_cast<std::size_t>(end - spans.c_str());
    if (at == spans.size()) return true;
    if (spans.compare(at, 2, ", ") != 0) break;
    at += 2;
  }
  err = "cannot read the spans of \"" + why + "\"";
  return false;
}

// punned_range_taken(), punned_ranges_taken(): tests/support/punned_range.hpp.
using uprobe_test::punned_range_taken;
using uprobe_test::punned_ranges_taken;

enum class Cont { emulated, out_of_line, either };

struct Args {
  std::uint64_t a = 0, b = 0;
};

struct ClassCase {
  std::string name;          ///< test-name suffix
  std::string symbol;        ///< ELF symbol of the function holding the site
  const void* fn = nullptr;  ///< its address
  std::uint64_t site = 0;    ///< offset of the probed instruction in fn
  fx_fn call = nullptr;      ///< the function the test calls
  std::function<Args(int)> args;
  std::function<std::uint64_t(std::uint64_t, std::uint64_t)> model;  ///< exact expected result
  Cont cont = Cont::emulated;                                          ///< how the default config continues
  Cont cont_no_emulate = Cont::either;  ///< how it continues with emulation off (either: not checked)
  std::function<void(int)> pre;                                        ///< optional: set up state for call i
  std::function<std::string(int, std::uint64_t)> post;                 ///< optional: extra check, "" = ok
};

inline void PrintTo(const ClassCase& c, std::ostream* os) { *os << c.name; }

/// def / no_emulate / single_step / locked exercise the int3 path (entry
/// optimization off, so a probe at a function entry traps); entry_opt lets
/// function entries become optimized-entry probes (the displaced window runs
/// relocated from its slot). single_step_no_emulate: the kernel-faithful
/// single-step with emulation off, so every class the runtime lets run out of
/// line (returns and indirect jumps too) is single-stepped from its slot.
/// punned: E9Patch's B1/B2 past an entry (SiteTactics::instruction_only);
/// padded: the same with every punned jump of a 2-4 byte instruction padded
/// with redundant prefixes (T1, SiteTactics::instruction_padded); evicted:
/// the same with every punned jump placed by evicting the instruction after
/// it (T2, SiteTactics::instruction_evicted) where that one can be evicted.
enum class Mode { def, no_emulate, single_step, locked, entry_opt, single_step_no_emulate, punned, padded, evicted };

inline const char* mode_name(Mode m) {
  switch (m) {
    case Mode::def: return "default";
    case Mode::no_emulate: return "no_emulate";
    case Mode::single_step: return "single_step";
    case Mode::locked: return "locked_lookup";
    case Mode::entry_opt: return "entry_opt";
    case Mode::punned: return "punned";
    case Mode::padded: return "padded";
    case Mode::evicted: return "evicted";
    case Mode::single_step_no_emulate: return "single_step_no_emulate";
  }
  return "?";
}

inline void PrintTo(Mode m, std::ostream* os) { *os << mode_name(m); }

inline Args default_args(int i) {
  return {static_cast<std::uint64_t>(i) * 7 + 1, static_cast<std::uint64_t>(i) * 13 + 2};
}

/// Mixed 64-bit values (carries, overflows, sign changes).
inline Args mixed_args(int i) {
  std::uint64_t a = (static_cast<std::uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull;
  std::uint64_t b = (static_cast<std::uint64_t>(i) + 7) * 0xC2B2AE3D27D4EB4Full;
  if (i % 5 == 0) b = a;
  if (i % 7 == 0) b = ~a + 1;
  return {a, b};
}

inline constexpr int kCalls = 1000;

inline void run_class_case(const ClassCase& c, Mode mode) {
  ConfigGuard guard;
  uprobe::Config cfg;  // defaults
  if (mode == Mode::no_emulate || mode == Mode::single_step_no_emulate) cfg.emulate = false;
  if (mode == Mode::single_step || mode == Mode::single_step_no_emulate) cfg.xol = uprobe::XolMode::single_step;
  if (mode == Mode::locked) cfg.lookup = uprobe::LookupMode::locked;
  cfg.optimize_entries = mode == Mode::entry_opt;
  const bool e9 = mode == Mode::punned || mode == Mode::padded || mode == Mode::evicted;
  cfg.optimize_windows = mode == Mode::entry_opt || e9;  // a site inside a function: a window too
  // Mode::punned: E9Patch's plan only past an entry (a jump over the
  // instruction alone: B1, or a punned jump B2); entries trap. Mode::padded:
  // the punned jumps padded (T1).
  if (mode == Mode::punned) cfg.site_tactics = uprobe::SiteTactics::instruction_only;
  if (mode == Mode::padded) cfg.site_tactics = uprobe::SiteTactics::instruction_padded;
  if (mode == Mode::evicted) cfg.site_tactics = uprobe::SiteTactics::instruction_evicted;
  uprobe::configure(cfg);

  const std::string exe = self_exe();
  auto sym = elf_symbol(exe, c.symbol);
  ASSERT_TRUE(sym.has_value()) << c.symbol << " not in " << exe;
  ASSERT_GT(sym->size, c.site) << c.symbol;
  const auto* site_addr = static_cast<const std::uint8_t*>(c.fn) + c.site;
  const std::uint64_t file_off = sym->file_offset + c.site;

  const auto orig = mem_bytes(c.fn, sym->size);
  // The site's first 5 bytes in memory, with what follows the function's
  // symbol (a punned jump's rel32 may reach past its end).
  std::uint8_t site_bytes[8];
  std::memcpy(site_bytes, site_addr, sizeof site_bytes);
  ASSERT_EQ(hex_bytes(orig), hex_bytes(file_bytes(exe, sym->file_offset, sym->size)))
      << "fixture bytes in memory differ from the file before any probe";

  uprobe::FileOffset fo = uprobe::resolve_address(site_addr);
  ASSERT_EQ(fo.offset, file_off) << "resolve_address offset vs ELF symbol offset + site";
  ASSERT_EQ(fo.path, exe);

  // Unprobed baseline, checked against the model.
  std::vector<std::uint64_t> base(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    Args a = c.args(i);
    if (c.pre) c.pre(i);
    base[i] = c.call(a.a, a.b);
    ASSERT_EQ(hex(base[i]), hex(c.model(a.a, a.b))) << "fixture/model mismatch without a probe, call " << i
                                                    << " a=" << hex(a.a) << " b=" << hex(a.b);
    if (c.post) {
      std::string why = c.post(i, base[i]);
      ASSERT_EQ(why, "") << "fixture post-check failed without a probe, call " << i;
    }
  }

  for (int how = 0; how < 2; ++how) {
    SCOPED_TRACE(how == 0 ? "registered by address" : "registered by (path, offset) " + fo.path + " " +
                                                          hex(file_off));
    Counter counter;
    counter.expect_ip = reinterpret_cast<std::uint64_t>(site_addr);
    const uprobe::Stats s0 = uprobe::stats();
    uprobe::Uprobe* p = nullptr;
    try {
      p = how == 0 ? uprobe::register_uprobe(site_addr, counter)
                   : uprobe::register_uprobe(fo.path, file_off, counter);
    } catch (const std::exception& e) {
      FAIL() << "register_uprobe threw: " << e.what();
    }
    ASSERT_NE(p, nullptr);
    uprobe::ProbeInfo info = uprobe::probe_info(p);
    EXPECT_EQ(info.consumers, 1u);
    EXPECT_EQ(info.sites, 1u);
    EXPECT_EQ(info.where.offset, file_off);
    EXPECT_EQ(info.where.path, exe);
    EXPECT_FALSE(info.instruction.empty());
    if ((mode == Mode::def || mode == Mode::entry_opt) && c.cont != Cont::either) {
      EXPECT_EQ(info.emulated, c.cont == Cont::emulated) << "probe_info says: " << info.instruction;
    }
    if ((mode == Mode::no_emulate || mode == Mode::single_step_no_emulate) && c.cont_no_emulate != Cont::either) {
      EXPECT_EQ(info.emulated, c.cont_no_emulate == Cont::emulated) << "probe_info says: " << info.instruction;
    }

    auto now = mem_bytes(c.fn, sym->size);
    // An eligible site (a nop5, a displaceable window at or inside a
    // function in Mode::entry_opt) is optimized into `jmp rel32` to its
    // stub; everything else holds int3.
    const bool optimized = info.mode == uprobe::ProbeMode::optimized_nop5 ||
                           info.mode == uprobe::ProbeMode::optimized_entry ||
                           info.mode == uprobe::ProbeMode::optimized_window ||
                           info.mode == uprobe::ProbeMode::optimized_punned ||
                           info.mode == uprobe::ProbeMode::optimized_padded ||
                           info.mode == uprobe::ProbeMode::optimized_evicted;
    const bool evicted = info.mode == uprobe::ProbeMode::optimized_evicted;
    // (A padded jump starts with its first prefix, ES; an evicting one is
    // padded only where no unpadded pair of jumps found its places.)
    EXPECT_EQ(now[c.site], info.mode == uprobe::ProbeMode::optimized_padded ? 0x26
                           : evicted && now[c.site] == 0x26             ? 0x26
                           : optimized                                   ? 0xE9
                                                                         : 0xCC)
        << "no int3/jmp at the site while attached (mode " << info.mode << ")";
    // An evicted successor (at site + displaced) holds its own jump (after
    // 0..3 prefixes); the bytes past that jump are the file's.
    std::size_t changed_to = c.site + (optimized ? 5 : 1);
    if (evicted) {
      const std::size_t succ = c.site + info.displaced;
      static constexpr std::uint8_t kPrefix[] = {0x26, 0x36, 0x3e};  // ES, SS, DS
      std::size_t epad = 0;
      while (epad < 3 && succ + epad < now.size() && now[succ + epad] == kPrefix[epad]) ++epad;
      ASSERT_LT(succ + epad, now.size());
      EXPECT_EQ(now[succ + epad], 0xE9) << "the successor's jump, after " << epad << " prefixes";
      changed_to = std::max(changed_to, succ + epad + 5);
    }
    if (mode == Mode::entry_opt && c.site == 0 && !optimized) {
      // Only the documented reasons keep a function entry on int3.
      const std::string& w = info.why_not_optimized;
      EXPECT_TRUE(w.find("cannot be displaced") != std::string::npos ||
                  w.find("shorter than the 5-byte jump") != std::string::npos ||
                  w.find("branches to +") != std::string::npos || w.find("enters the kernel") != std::string::npos ||
                  w.find("run past the function's end") != std::string::npos)
          << info.instruction << ": " << w;
    }
    // A punned instruction held by int3 only because no form of its jump
    // (nor its successor's eviction) has a free address here (checked).
    bool no_room = false;
    if (e9 && c.site != 0) {
      // Past the entry only the instruction's own bytes may change: a punned
      // jump for one shorter than the jump, B1 for one as long; int3 only
      // for what cannot run displaced.
      const std::size_t len = optimized ? info.displaced : 1;  // a jump over the instruction alone
      if (optimized) {
        // Mode::evicted: evicted wherever the function goes on after the
        // instruction (past its end, after its last jump or return, may be
        // anything: never evicted), unless the library says every address
        // the successor's bytes allow for its trampoline is mapped here
        // (checked: eviction_impossible_here()); any other refusal fails.
        std::string not_evicted;
        const bool must_evict = mode == Mode::evicted && len < 5 && c.site + len < sym->size &&
                                (info.mode == uprobe::ProbeMode::optimized_evicted ||
                                 !eviction_impossible_here(info.why_not_evicted, not_evicted));
        const uprobe::ProbeMode want = len >= 5                            ? uprobe::ProbeMode::optimized_window
                                       : must_evict                        ? uprobe::ProbeMode::optimized_evicted
                                       : mode == Mode::evicted            ? uprobe::ProbeMode::optimized_punned
                                       : mode == Mode::padded && len >= 2 ? uprobe::ProbeMode::optimized_padded
                                                                          : uprobe::ProbeMode::optimized_punned;
        // Mode::punned: padded instead only where every page the unpadded
        // jump's bytes allow for its hop is mapped (the heap may lie there);
        // Mode::padded: unpadded only where every padded form's are; either:
        // evicted only where every form's are.
        const auto site_u = reinterpret_cast<std::uint64_t>(site_addr);
        std::string form_free;
        bool other_form_ok = false;
        if (mode == Mode::punned && want == uprobe::ProbeMode::optimized_punned &&
            info.mode == uprobe::ProbeMode::optimized_padded) {
          other_form_ok = punned_range_taken(site_u, len, 0, site_bytes, form_free);
        } else if (mode == Mode::padded && want == uprobe::ProbeMode::optimized_padded &&
                   info.mode == uprobe::ProbeMode::optimized_punned) {
          other_form_ok = true;
          for (std::size_t pad = 1; other_form_ok && pad < len && pad <= 3; ++pad)
            other_form_ok = punned_range_taken(site_u, len, pad, site_bytes, form_free);
        } else if ((mode == Mode::punned || mode == Mode::padded) && info.mode == uprobe::ProbeMode::optimized_evicted) {
          // (Successor eviction, the fallback when no form has a page.)
          other_form_ok = punned_ranges_taken(site_u, len, 3, site_bytes, form_free);
        }
        if (!other_form_ok) {
          EXPECT_EQ(info.mode, want) << info.instruction << (not_evicted.empty() ? "" : ": ") << not_evicted
                                     << (form_free.empty() ? "" : ": ") << form_free;
        }
        if (info.mode == uprobe::ProbeMode::optimized_padded) {
          // 1 .. len - 1 prefixes (ES, SS, DS in that order; one unless its
          // pages were taken), the opcode inside the instruction.
          static constexpr std::uint8_t kPrefix[] = {0x26, 0x36, 0x3e};
          std::size_t pad = 0;
          while (pad < 3 && pad + 1 < len && now[c.site + pad] == kPrefix[pad]) ++pad;
          EXPECT_GE(pad, 1u) << info.instruction;
          EXPECT_EQ(now[c.site + pad], 0xE9) << info.instruction << " pad " << pad;
        }
        EXPECT_GT(len, 0u) << info.instruction;
      } else {
        // What cannot run displaced at all: loop/jrcxz (rel8 only), traps;
        // or a punned instruction none of whose jumps has a free page here
        // (every form's range mapped, the heap there), nor its successor's
        // eviction (impossible here too, or not planned).
        const uprobe::SitePlan plan = uprobe::plan_site(fo.path, file_off);
        std::string free_form, evict_err;
        // (The plan is the tactic's form: punned, padded or evicted.)
        no_room =
            (plan.tactic == uprobe::ProbeMode::optimized_punned || plan.tactic == uprobe::ProbeMode::optimized_padded ||
             plan.tactic == uprobe::ProbeMode::optimized_evicted) &&
            info.why_not_optimized.rfind("no free page at the addresses the punned jump's bytes after the", 0) == 0 &&
            punned_ranges_taken(reinterpret_cast<std::uint64_t>(site_addr), plan.displaced, 3, site_bytes,
                                free_form) &&
            (info.why_not_evicted.rfind("no successor eviction: ", 0) == 0 ||
             eviction_impossible_here(info.why_not_evicted, evict_err));
        if (!no_room) {
          EXPECT_NE(info.why_not_optimized.find("no punned jump either: the instruction `"), std::string::npos)
              << info.instruction << ": " << info.why_not_optimized << (free_form.empty() ? "" : "; ") << free_form
              << (evict_err.empty() ? "" : "; ") << evict_err;
        }
      }
      for (std::size_t k = evicted ? changed_to : c.site + len; k < now.size(); ++k)
        EXPECT_EQ(now[k], orig[k]) << "byte " << k << " past the instruction changed while attached";
    }
    for (std::size_t k = 0; k < now.size(); ++k)
      if (k != c.site && !(optimized && k > c.site && k < changed_to)) {
        EXPECT_EQ(now[k], orig[k]) << "byte " << k << " changed while attached";
      }

    int mismatches = 0;
    std::string first;
    for (int i = 0; i < kCalls; ++i) {
      Args a = c.args(i);
      if (c.pre) c.pre(i);
      std::uint64_t r = c.call(a.a, a.b);
      std::string why;
      if (r != base[i]) why = "result " + hex(r) + " != unprobed " + hex(base[i]);
      if (why.empty() && c.post) why = c.post(i, r);
      if (!why.empty() && mismatches++ == 0)
        first = "call " + std::to_string(i) + " (a=" + hex(a.a) + ", b=" + hex(a.b) + "): " + why;
    }
    const uprobe::Stats d = stats_delta(s0, uprobe::stats());
    EXPECT_EQ(mismatches, 0) << "first: " << first << " [" << info.instruction << "]";
    EXPECT_EQ(counter.hits.load(), static_cast<std::uint64_t>(kCalls)) << info.instruction;
    EXPECT_EQ(counter.bad_ip.load(), 0u) << "handler saw rip != probe address";
    EXPECT_EQ(d.hits, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
    EXPECT_EQ(d.recursion_misses, 0u) << stats_str(d);
    EXPECT_EQ(d.redirected, 0u) << stats_str(d);
    EXPECT_EQ(d.foreign_traps, 0u) << stats_str(d);
    if (optimized) {
      // The jump into the stub replaces the trap: the nop5 is simply skipped.
      EXPECT_EQ(d.optimized, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
      EXPECT_EQ(d.emulated + d.out_of_line, 0u) << stats_str(d);
    } else {
      EXPECT_EQ(d.emulated + d.out_of_line, static_cast<std::uint64_t>(kCalls)) << stats_str(d);
    }
    if (optimized) {
    } else if (no_room) {
      // Its jump's window has a slot (made for the jump): each hit runs the
      // displaced instruction there (trap.cpp's window_xol), never emulated.
      EXPECT_EQ(d.out_of_line, static_cast<std::uint64_t>(kCalls)) << stats_str(d) << " [" << info.instruction << "]";
    } else if (mode != Mode::no_emulate) {
      Cont expect = c.cont;
      // With emulation off, probe_info() says which classes still are (the
      // relative branches and calls, whose copies would count from the slot).
      if (expect == Cont::either || mode == Mode::single_step_no_emulate)
        expect = info.emulated ? Cont::emulated : Cont::out_of_line;
      if (expect == Cont::emulated) {
        EXPECT_EQ(d.emulated, static_cast<std::uint64_t>(kCalls)) << stats_str(d) << " [" << info.instruction << "]";
      } else {
        EXPECT_EQ(d.out_of_line, static_cast<std::uint64_t>(kCalls))
            << stats_str(d) << " [" << info.instruction << "]";
      }
    } else {
      std::printf("[ info ] %s no_emulate: emulated %llu, out_of_line %llu\n", c.name.c_str(),
                  static_cast<unsigned long long>(d.emulated), static_cast<unsigned long long>(d.out_of_line));
    }

    try {
      uprobe::unregister_uprobe(p, counter);
    } catch (const std::exception& e) {
      FAIL() << "unregister_uprobe threw: " << e.what();
    }
    EXPECT_EQ(hex_bytes(mem_bytes(c.fn, sym->size)), hex_bytes(orig)) << "bytes not restored after unregister";
    // Unprobed again: no hits, same results.
    const std::uint64_t before = counter.hits.load();
    for (int i = 0; i < 10; ++i) {
      Args a = c.args(i);
      if (c.pre) c.pre(i);
      EXPECT_EQ(c.call(a.a, a.b), base[i]);
    }
    EXPECT_EQ(counter.hits.load(), before);
  }
}

/// Arithmetic flags (CF PF AF ZF SF OF as in rflags) of a - b and a + b.
inline std::uint64_t sub_flags(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = a - b;
  std::uint64_t cf = a < b, pf = !__builtin_parityll(r & 0xff), af = ((a ^ b ^ r) >> 4) & 1, zf = r == 0,
                sf = r >> 63, of = (((a ^ b) & (a ^ r)) >> 63) & 1;
  return cf | pf << 2 | af << 4 | zf << 6 | sf << 7 | of << 11;
}
inline std::uint64_t add_flags(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = a + b;
  std::uint64_t cf = r < a, pf = !__builtin_parityll(r & 0xff), af = ((a ^ b ^ r) >> 4) & 1, zf = r == 0,
                sf = r >> 63, of = ((~(a ^ b) & (a ^ r)) >> 63) & 1;
  return cf | pf << 2 | af << 4 | zf << 6 | sf << 7 | of << 11;
}

inline std::string case_name(const testing::TestParamInfo<std::tuple<ClassCase, Mode>>& info) {
  return std::get<0>(info.param).name + "_" + mode_name(std::get<1>(info.param));
}

}  // namespace coretest
