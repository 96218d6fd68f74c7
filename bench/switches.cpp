// SPDX-License-Identifier: MIT
// The ablation switches of uprobe::Config as command-line flags, and the
// before/after pairs of --compare (one per seed technique).

#include <algorithm>

#include "bench.hpp"

namespace bench {
namespace {

std::string canon(std::string s) {
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

bool parse_bool(const std::string& v, bool& out) {
  if (v == "on" || v == "1" || v == "true" || v == "yes") out = true;
  else if (v == "off" || v == "0" || v == "false" || v == "no") out = false;
  else return false;
  return true;
}

const char* name(uprobe::LookupMode m) { return m == uprobe::LookupMode::locked ? "locked" : "speculative"; }
const char* name(uprobe::XolMode m) { return m == uprobe::XolMode::single_step ? "single-step" : "jump-back"; }
const char* name(uprobe::SignalMask m) { return m == uprobe::SignalMask::defer ? "defer" : "nodefer"; }
const char* name(uprobe::RiPool m) { return m == uprobe::RiPool::freelist ? "freelist" : "objpool"; }
const char* name(uprobe::RiLock m) { return m == uprobe::RiLock::global ? "global" : "none"; }
const char* name(bool b) { return b ? "on" : "off"; }

// The switches as (CLI name, value) pairs, only those set.
std::vector<std::pair<std::string, std::string>> set_fields(const Switches& s) {
  std::vector<std::pair<std::string, std::string>> out;
  if (s.lookup) out.emplace_back("lookup", name(*s.lookup));
  if (s.xol) out.emplace_back("xol", name(*s.xol));
  if (s.signal_mask) out.emplace_back("signal-mask", name(*s.signal_mask));
  if (s.emulate) out.emplace_back("emulate", name(*s.emulate));
  if (s.ri_pool) out.emplace_back("ri-pool", name(*s.ri_pool));
  if (s.ri_lock) out.emplace_back("ri-lock", name(*s.ri_lock));
  if (s.optimize) out.emplace_back("optimize", name(*s.optimize));
  return out;
}

Switches make(const std::string& n, const std::string& v) {
  Switches s;
  std::string error;
  set_switch(s, n, v, error);
  return s;
}

}  // namespace

bool Switches::empty() const noexcept {
  return !lookup && !xol && !signal_mask && !emulate && !ri_pool && !ri_lock && !optimize;
}

bool Switches::has(const std::string& n) const {
  for (const auto& [k, v] : set_fields(*this))
    if (k == canon(n)) return true;
  return false;
}

void Switches::merge(const Switches& o) {
  if (o.lookup) lookup = o.lookup;
  if (o.xol) xol = o.xol;
  if (o.signal_mask) signal_mask = o.signal_mask;
  if (o.emulate) emulate = o.emulate;
  if (o.ri_pool) ri_pool = o.ri_pool;
  if (o.ri_lock) ri_lock = o.ri_lock;
  if (o.optimize) optimize = o.optimize;
}

bool set_switch(Switches& s, const std::string& raw_name, const std::string& raw_value, std::string& error) {
  const std::string n = canon(raw_name), v = canon(raw_value);
  bool ok = true;
  if (n == "lookup") {
    if (v == "locked") s.lookup = uprobe::LookupMode::locked;
    else if (v == "speculative") s.lookup = uprobe::LookupMode::speculative;
    else ok = false;
  } else if (n == "xol") {
    if (v == "jump-back") s.xol = uprobe::XolMode::jump_back;
    else if (v == "single-step") s.xol = uprobe::XolMode::single_step;
    else ok = false;
  } else if (n == "signal-mask" || n == "signal") {
    if (v == "defer") s.signal_mask = uprobe::SignalMask::defer;
    else if (v == "nodefer") s.signal_mask = uprobe::SignalMask::nodefer;
    else ok = false;
  } else if (n == "emulate") {
    bool b;
    if ((ok = parse_bool(v, b))) s.emulate = b;
  } else if (n == "ri-pool") {
    if (v == "objpool") s.ri_pool = uprobe::RiPool::objpool;
    else if (v == "freelist") s.ri_pool = uprobe::RiPool::freelist;
    else ok = false;
  } else if (n == "ri-lock") {
    if (v == "none") s.ri_lock = uprobe::RiLock::none;
    else if (v == "global") s.ri_lock = uprobe::RiLock::global;
    else ok = false;
  } else if (n == "optimize") {
    bool b;
    if ((ok = parse_bool(v, b))) s.optimize = b;
  } else {
    error = "unknown switch '" + raw_name +
            "' (lookup, xol, signal-mask, emulate, ri-pool, ri-lock, optimize)";
    return false;
  }
  if (!ok) {
    static const char* const values[][2] = {
        {"lookup", "speculative|locked"}, {"xol", "jump-back|single-step"},
        {"signal-mask", "nodefer|defer"}, {"signal", "nodefer|defer"},
        {"emulate", "on|off"},            {"ri-pool", "objpool|freelist"},
        {"ri-lock", "none|global"},       {"optimize", "on|off"},
    };
    std::string allowed;
    for (const auto& nv : values)
      if (n == nv[0]) allowed = nv[1];
    error = "bad value '" + raw_value + "' for " + raw_name + " (" + allowed + ")";
  }
  return ok;
}

bool parse_config(const std::string& text, Switches& out, std::string& error) {
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) {
      error = "bad --config item '" + item + "' (KEY=VALUE)";
      return false;
    }
    if (!set_switch(out, item.substr(0, eq), item.substr(eq + 1), error)) {
      error = "--config: " + error;
      return false;
    }
  }
  return true;
}

std::vector<std::string> switch_args(const Switches& s) {
  std::vector<std::string> args;
  for (const auto& [k, v] : set_fields(s)) args.push_back("--" + k + "=" + v);
  return args;
}

uprobe::Config apply(const Switches& s, uprobe::Config c) {
  if (s.lookup) c.lookup = *s.lookup;
  if (s.xol) c.xol = *s.xol;
  if (s.signal_mask) c.signal_mask = *s.signal_mask;
  if (s.emulate) c.emulate = *s.emulate;
  if (s.ri_pool) c.ri_pool = *s.ri_pool;
  if (s.ri_lock) c.ri_lock = *s.ri_lock;
  if (s.optimize) c.optimize = *s.optimize;
  return c;
}

std::vector<std::pair<std::string, std::string>> config_fields(const uprobe::Config& c) {
  return {{"lookup", name(c.lookup)},   {"xol", name(c.xol)},         {"signal_mask", name(c.signal_mask)},
          {"emulate", name(c.emulate)}, {"ri_pool", name(c.ri_pool)}, {"ri_lock", name(c.ri_lock)},
          {"optimize", name(c.optimize)}};
}

std::string describe(const uprobe::Config& c) {
  std::string out;
  for (const auto& [k, v] : config_fields(c)) {
    if (!out.empty()) out += ' ';
    out += k + "=" + v;
  }
  return out;
}

std::string describe(const Switches& s) {
  std::string out;
  for (const auto& [k, v] : set_fields(s)) out += " " + k + "=" + v;
  return out;
}

std::string ignored_switches(const Switches& s, const uprobe::Config& effective) {
  const auto want = config_fields(apply(s, effective));
  const auto got = config_fields(effective);
  std::string out;
  for (const auto& [k, v] : set_fields(s)) {
    (void)v;
    const std::string field = [&] {
      std::string f = k;
      std::replace(f.begin(), f.end(), '-', '_');
      return f;
    }();
    for (std::size_t i = 0; i < got.size(); ++i)
      if (got[i].first == field && got[i].second != want[i].second)
      {
        if (!out.empty()) out += ", ";
        out += k + "=" + want[i].second;
      }
  }
  return out;
}

const std::vector<Comparison>& comparisons() {
  static const std::vector<Comparison> table = [] {
    std::vector<Comparison> t;
    auto add = [&](const char* sw, const char* seed, const char* before, const char* after,
                   std::vector<std::string> vars, Switches implied = {}) {
      Comparison c;
      c.name = sw;
      c.seed = seed;
      c.before = make(sw, before);
      c.after = make(sw, after);
      c.before_label = std::string(sw) + "=" + before;
      c.after_label = std::string(sw) + "=" + after;
      c.default_variants = std::move(vars);
      c.implied = implied;
      t.push_back(std::move(c));
    };
    add("lookup", "000: speculative lockless VMA to inode resolution", "locked", "speculative", {"uprobe-nop"});
    add("signal-mask", "001: no shared lock on the trap path (siglock)", "defer", "nodefer", {"uprobe-nop"});
    // The int3 path's signal round trip hides the pool and its lock; the
    // optimized path (uretprobe-nop5: no signal) shows them.
    add("ri-pool", "002: objpool for return instances", "freelist", "objpool", {"uretprobe-nop", "uretprobe-nop5"});
    add("ri-lock", "004: no global kretprobe lock", "global", "none", {"uretprobe-nop", "uretprobe-nop5"});
    add("optimize", "003: optimized uprobes on nop5", "off", "on", {"uprobe-nop5", "uretprobe-nop5"});
    // XOL only matters for instructions run out of line: switch emulation off.
    add("xol", "XOL continuation: single-step (kernel) vs jump back", "single-step", "jump-back",
        {"uprobe-nop", "uprobe-push"}, make("emulate", "off"));
    add("emulate", "emulation vs out-of-line execution", "off", "on", {"uprobe-nop", "uprobe-push"});
    return t;
  }();
  return table;
}

const Comparison* find_comparison(const std::string& n) {
  for (const Comparison& c : comparisons())
    if (c.name == canon(n) || (canon(n) == "signal" && c.name == "signal-mask")) return &c;
  return nullptr;
}

}  // namespace bench
