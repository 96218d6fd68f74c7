// SPDX-License-Identifier: MIT
// --config key=value,... -> uprobe::configure().

#include <cstdio>

#include "bench.hpp"

namespace bench {
namespace {

const char* name(uprobe::LookupMode m) { return m == uprobe::LookupMode::locked ? "locked" : "speculative"; }
const char* name(uprobe::XolMode m) { return m == uprobe::XolMode::single_step ? "single_step" : "jump_back"; }
const char* name(uprobe::SignalMask m) { return m == uprobe::SignalMask::defer ? "defer" : "nodefer"; }

bool set(const std::string& key, const std::string& value, ConfigOverrides& out) {
  if (key == "lookup") {
    if (value == "locked") out.lookup = uprobe::LookupMode::locked;
    else if (value == "speculative") out.lookup = uprobe::LookupMode::speculative;
    else return false;
  } else if (key == "xol") {
    if (value == "jump_back" || value == "jump-back") out.xol = uprobe::XolMode::jump_back;
    else if (value == "single_step" || value == "single-step") out.xol = uprobe::XolMode::single_step;
    else return false;
  } else if (key == "signal") {
    if (value == "defer") out.signal_mask = uprobe::SignalMask::defer;
    else if (value == "nodefer") out.signal_mask = uprobe::SignalMask::nodefer;
    else return false;
  } else if (key == "emulate") {
    if (value == "on" || value == "1" || value == "true") out.emulate = true;
    else if (value == "off" || value == "0" || value == "false") out.emulate = false;
    else return false;
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool parse_config(const std::string& text, ConfigOverrides& out, std::string& error) {
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || !set(item.substr(0, eq), item.substr(eq + 1), out)) {
      error = "bad --config item '" + item +
              "' (lookup=locked|speculative, xol=jump_back|single_step, signal=defer|nodefer, emulate=on|off)";
      return false;
    }
    pos = end + 1;
  }
  return true;
}

void apply_config(const ConfigOverrides& o) {
  uprobe::Config c = uprobe::configuration();
  if (o.lookup) c.lookup = *o.lookup;
  if (o.xol) c.xol = *o.xol;
  if (o.signal_mask) c.signal_mask = *o.signal_mask;
  if (o.emulate) c.emulate = *o.emulate;
  if (o.lookup || o.xol || o.signal_mask || o.emulate) uprobe::configure(c);
  c = uprobe::configuration();
  std::printf("Config: lookup=%s, xol=%s, signal=%s, emulate=%s\n", name(c.lookup), name(c.xol),
              name(c.signal_mask), c.emulate ? "on" : "off");
}

}  // namespace bench
