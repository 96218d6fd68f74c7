// SPDX-License-Identifier: MIT
// bpftrace's language for uprobe-trace, part 3 of 3: the CLI's printing of
// printf events, stacks and maps (text and -f json), byte for byte as
// bpftrace 0.17 prints them. The parser is bt_parse.cpp, the compiler
// bt_compile.cpp.

#include "bt_lang.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>

namespace uptrace::bt {

namespace {
Symbolizer g_symbolizer = nullptr;

std::string hex_addr(std::uint64_t a, bool prefix) {
  if (prefix && a == 0) return "0";  // (as bpftrace prints (void*)0)
  char b[32];
  std::snprintf(b, sizeof b, prefix ? "0x%" PRIx64 : "%" PRIx64, a);
  return b;
}
}  // namespace

void set_symbolizer(Symbolizer f) { g_symbolizer = f; }

std::string stack_text(std::uint64_t image, const std::uint64_t* frames, std::size_t n, bool perf, int indent) {
  std::string out = "\n";
  for (std::size_t i = 0; i < n && frames[i]; ++i) {
    UserSym u;
    const bool ok = g_symbolizer && g_symbolizer(image, frames[i], u);
    const std::string sym = ok ? u.name + "+" + std::to_string(u.offset) : hex_addr(frames[i], true);
    if (perf) out += "\t" + hex_addr(frames[i], false) + " " + sym + " (" + (ok ? u.module : "[unknown]") + ")\n";
    else out += std::string(static_cast<std::size_t>(indent), ' ') + sym + "\n";
  }
  return out;
}

std::string usym_text(std::uint64_t image, std::uint64_t addr) {
  UserSym u;
  return g_symbolizer && g_symbolizer(image, addr, u) ? u.name : hex_addr(addr, true);
}

namespace {

/// strftime(FORMAT, NS)'s text, as bpftrace 0.17's resolve_timestamp(): the
/// local time NS after the boot (CLOCK_MONOTONIC's zero here, as nsecs
/// counts), `%f` its microseconds (6 digits), into 64 bytes; "(?)" and
/// bpftrace's "strftime returned 0" on standard error when it does not fit.
std::string timestamp_text(const Program& p, std::uint32_t fmt, std::int64_t ns) {
  timespec mono{}, real{};
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_REALTIME, &real);
  // The boot time: the real time less the monotonic clock's, to the ns.
  std::int64_t boot_s = static_cast<std::int64_t>(real.tv_sec) - mono.tv_sec;
  std::int64_t boot_ns = static_cast<std::int64_t>(real.tv_nsec) - mono.tv_nsec;
  if (boot_ns < 0) boot_ns += 1000000000, --boot_s;
  const std::uint64_t since = static_cast<std::uint64_t>(boot_ns) + static_cast<std::uint64_t>(ns);
  const time_t secs = static_cast<time_t>(boot_s + static_cast<std::int64_t>(since / 1000000000u));
  tm local{};
  if (!localtime_r(&secs, &local)) return "(?)";
  char us[8];
  std::snprintf(us, sizeof us, "%06llu", static_cast<unsigned long long>((since % 1000000000u) / 1000u));
  std::string f = p.strtab + p.fmts[fmt].text;
  for (std::size_t at = f.find("%f"); at != std::string::npos; at = f.find("%f", at + 6)) f.replace(at, 2, us);
  char text[64];  // (bpftrace's STRING_SIZE)
  const std::size_t n = std::strftime(text, sizeof text, f.c_str(), &local);
  if (n == 0) {
    std::fputs("ERROR: strftime returned 0\n", stderr);
    return "(?)";
  }
  return std::string(text, n);
}

}  // namespace

bool format_time(std::string& out, const Program& p, std::uint32_t fmt, std::uint64_t ts_ns) {
  timespec mono{}, real{};
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_REALTIME, &real);
  const auto ns = [](const timespec& t) { return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec; };
  const std::int64_t at = ns(real) - (ns(mono) - static_cast<std::int64_t>(ts_ns));
  const time_t secs = static_cast<time_t>(at >= 0 ? at / 1000000000 : (at - 999999999) / 1000000000);
  tm local{};
  if (!localtime_r(&secs, &local)) return false;
  char text[64];  // (bpftrace's STRING_SIZE)
  const std::size_t n = std::strftime(text, sizeof text, p.strtab + p.fmts[fmt].text, &local);
  if (n == 0) return false;
  out.append(text, n);
  return true;
}

std::string format_event(const Program& p, std::uint32_t fmt, const unsigned char* args) {
  std::string out;
  format_event(out, p, fmt, args);
  return out;
}

void format_event(std::string& out, const Program& p, std::uint32_t fmt, const unsigned char* args) {
  const FmtDesc& fd = p.fmts[fmt];
  // Each format parsed once (the CLI's one program, one thread).
  static const Program* parsed_for = nullptr;
  static std::vector<std::vector<FmtPiece>> parsed;
  static std::vector<char> done;
  if (parsed_for != &p) parsed_for = &p, parsed.assign(p.h->nfmts, {}), done.assign(p.h->nfmts, 0);
  if (!done[fmt]) {
    std::string err;
    parse_format(p.strtab + fd.text, parsed[fmt], err);
    done[fmt] = 1;
  }
  const std::vector<FmtPiece>& pieces = parsed[fmt];
  std::uint32_t argi = 0;  // the conversion's argument
  auto put = [&out](const char* spec, auto v) {
    char buf[256];  // (one snprintf for the usual short conversion; a longer one is made again in place)
    const int n = std::snprintf(buf, sizeof buf, spec, v);
    if (n <= 0) return;
    if (static_cast<std::size_t>(n) < sizeof buf) {
      out.append(buf, static_cast<std::size_t>(n));
      return;
    }
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(n) + 1);
    std::snprintf(&out[at], static_cast<std::size_t>(n) + 1, spec, v);
    out.resize(at + static_cast<std::size_t>(n));
  };
  for (const FmtPiece& pc : pieces) {
    if (!pc.conv) {  // the text after the last conversion: as it is
      out += pc.text;
      continue;
    }
    // The text before: `%%` is `%`, another `%` stays (bpftrace hands it
    // to printf; one printf would take as a conversion, with no argument
    // for it, prints garbage there). A `%` that pairs with the
    // conversion's own `%` makes `%%`: the conversion is then text.
    bool swallowed = false;
    for (std::size_t i = 0; i < pc.text.size(); ++i) {
      if (pc.text[i] == '%' && i + 1 < pc.text.size() && pc.text[i + 1] == '%') out += '%', ++i;
      else if (pc.text[i] == '%' && i + 1 == pc.text.size()) out += '%', swallowed = true;
      else out += pc.text[i];
    }
    if (pc.conv == 's' && fd.arg_is_str[argi] == 4) {  // strftime(): the time
      std::int64_t ns = 0;
      std::memcpy(&ns, args, 8);
      args += 8;
      const std::string t = timestamp_text(p, fd.arg_limit[argi], ns);
      ++argi;
      if (swallowed) out += pc.match.substr(1);
      else put(pc.spec.c_str(), t.c_str());
      continue;
    }
    if (pc.conv == 's' && fd.arg_is_str[argi] >= 2) {  // ustack, usym: words
      std::uint64_t w[2];
      std::memcpy(w, args, sizeof w);
      std::string t;
      if (fd.arg_is_str[argi] == 3) {
        t = usym_text(w[0], w[1]);
        args += 16;
      } else {
        const std::size_t nf = std::min<std::size_t>(w[1] & 0xffffffffu, kMaxFrames);
        std::vector<std::uint64_t> frames(nf);
        std::memcpy(frames.data(), args + 16, 8 * nf);
        t = stack_text(w[0], frames.data(), nf, (w[1] >> 32) != 0, 8);
        args += 16 + 8 * nf;
      }
      ++argi;
      if (swallowed) out += pc.match.substr(1);
      else put(pc.spec.c_str(), t.c_str());
      continue;
    }
    ++argi;
    if (pc.conv == 's') {
      char s[kStrLen + 1] = {};
      std::size_t j = 0;
      while (j < kStrLen && args[j]) s[j] = static_cast<char>(args[j]), ++j;
      const std::size_t len = j;
      do ++j;  // the NUL and the padding
      while (j % 8);
      args += j;
      if (swallowed) out += pc.match.substr(1);
      else if (pc.spec == "%s") out.append(s, len);  // (no flag, width or precision: as it is)
      else put(pc.spec.c_str(), static_cast<const char*>(s));
      continue;
    }
    std::int64_t v;
    std::memcpy(&v, args, 8);
    args += 8;
    if (swallowed) {
      out += pc.match.substr(1);
      continue;
    }
    std::string spec = pc.spec;
    if (pc.conv == 'p') put(spec.c_str(), reinterpret_cast<void*>(v));
    else if (pc.conv == 'c') put(spec.c_str(), static_cast<int>(v));
    else if (pc.len == 'l') put(spec.insert(spec.size() - 1, "ll").c_str(), static_cast<long long>(v));
    else if (pc.len == 'h') put(spec.insert(spec.size() - 1, "h").c_str(), static_cast<int>(v));
    else if (pc.len == 'H') put(spec.insert(spec.size() - 1, "hh").c_str(), static_cast<int>(v));
    else put(spec.c_str(), static_cast<int>(v));
  }
}

// ---------------------------------------------------------------- maps

namespace {

// Folds one table's value words `val` for a key into the merged `o` (a key
// seen before), as bpftrace's one map would hold them.
void merge_value(const MapDesc& m, std::vector<std::uint64_t>& o, const std::vector<std::uint64_t>& val) {
  switch (m.agg) {
    case Agg::count: case Agg::sum: case Agg::hist: case Agg::lhist: case Agg::avg: case Agg::stats:
      for (std::uint32_t k = 0; k < m.value_words; ++k) o[k] += val[k];
      break;
    case Agg::min:
    case Agg::max:
      if (val[1] && (!o[1] || (m.agg == Agg::min ? static_cast<std::int64_t>(val[0]) < static_cast<std::int64_t>(o[0])
                                                 : static_cast<std::int64_t>(val[0]) > static_cast<std::int64_t>(o[0]))))
        o = val;
      break;
    case Agg::assign:  // (the store's time: the last word)
      if (val.back() > o.back()) o = val;
      break;
  }
}

// A slot's value words (all 0 for a zeroed slot).
std::vector<std::uint64_t> slot_value(const MapDesc& m, const std::uint64_t* s) {
  std::vector<std::uint64_t> val(m.value_words);
  if (const std::uint64_t* v = Vm::value_of(m, s))
    for (std::uint32_t k = 0; k < m.value_words; ++k) val[k] = load(v + k);
  return val;
}

}  // namespace

void merge_table(const Program& p, std::uint32_t mi, const std::uint64_t* area, MapData& into) {
  const MapDesc& m = p.maps[mi];
  const std::uint64_t* table = area + m.offset;
  const std::uint32_t sw = m.slot_words();
  for (std::uint32_t i = 0; i < m.nslots; ++i) {
    const std::uint64_t* s = table + std::uint64_t{i} * sw;
    const std::uint64_t st = __atomic_load_n(s, __ATOMIC_ACQUIRE) & kSlotStateMask;
    if (st != kSlotLive && st != kSlotZeroed) continue;
    std::vector<std::uint64_t> key(s + 1, s + 1 + m.key_words);
    std::vector<std::uint64_t> val = slot_value(m, s);
    auto [it, fresh] = into.try_emplace(key, val);
    if (!fresh) merge_value(m, it->second, val);
  }
}

bool merged_read(const Program& p, std::uint32_t mi, const std::vector<std::uint64_t*>& areas,
                 const std::uint64_t* key, std::int64_t& value) {
  const MapDesc& m = p.maps[mi];
  std::vector<std::uint64_t> o;
  for (std::uint64_t* area : areas) {
    const std::uint64_t* s = Vm::slot(m, area, key, false);
    if (!s) continue;
    if (o.empty()) o = slot_value(m, s);
    else merge_value(m, o, slot_value(m, s));
  }
  if (o.empty()) return false;
  value = static_cast<std::int64_t>(m.agg == Agg::avg ? (o[0] ? o[1] / o[0] : 0) : o[0]);
  return true;
}

namespace {

// A key's components as bpftrace prints them.
std::vector<std::string> key_parts(const MapDesc& m, const std::vector<std::uint64_t>& key) {
  std::vector<std::string> out;
  const auto* b = reinterpret_cast<const unsigned char*>(key.data());
  for (unsigned k = 0; k < m.nkeys; ++k) {
    if (m.key_is_str[k] == 3 || m.key_is_str[k] == 4) {
      const std::size_t nw = m.key_is_str[k] == 3 ? 1u + m.stack_limit : 2u;
      std::vector<std::uint64_t> w(nw);
      std::memcpy(w.data(), b, 8 * nw);
      b += 8 * nw;
      out.push_back(m.key_is_str[k] == 3 ? stack_text(w[0], w.data() + 1, nw - 1, m.stack_perf != 0, 4)
                                         : usym_text(w[0], w[1]));
      continue;
    }
    if (m.key_is_str[k] == 1) {
      char s[kStrLen + 1] = {};
      std::memcpy(s, b, kStrLen);
      out.emplace_back(s);
      b += kStrLen;
    } else {
      std::int64_t v;
      std::memcpy(&v, b, 8);
      out.push_back(std::to_string(v));  // (bpftrace 0.17 prints 64-bit integer keys signed, (uint64)-1 as -1)
      b += 8;
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string key_text(const MapDesc& m, const std::vector<std::uint64_t>& key) {
  if (m.nkeys == 0) return "";
  return "[" + join(key_parts(m, key), ", ") + "]";
}

// bpftrace's hist bucket labels: 1K, 2M, ...
std::string size_label(std::uint64_t v) {
  static const char* const kSuffix[] = {"", "K", "M", "G", "T", "P", "E"};
  int i = 0;
  while (v >= 1024 && v % 1024 == 0 && i < 6) v /= 1024, ++i;
  return std::to_string(v) + kSuffix[i];
}

std::string bar_line(const std::string& label, std::uint64_t n, std::uint64_t max) {
  char buf[256];
  const std::size_t w = max ? static_cast<std::size_t>(n * 52 / max) : 0;
  std::snprintf(buf, sizeof buf, "%-16s%8" PRIu64 " |%s%s|\n", label.c_str(), n, std::string(w, '@').c_str(),
                std::string(52 - w, ' ').c_str());
  return buf;
}

std::string hist_text(const MapDesc& m, const std::vector<std::uint64_t>& v) {
  // Rows from the first to the last non-empty bucket.
  std::size_t first = v.size(), last = 0;
  std::uint64_t max = 0;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i]) first = std::min(first, i), last = i, max = std::max(max, v[i]);
  if (first == v.size()) return "";
  std::string out;
  for (std::size_t i = first; i <= last; ++i) {
    std::string label;
    if (m.agg == Agg::hist) {
      if (i == 0) label = "(..., 0)";
      else if (i == 1) label = "[0]";
      else if (i == 2) label = "[1]";
      else {
        const std::uint64_t lo = std::uint64_t{1} << (i - 2);
        label = "[" + size_label(lo) + ", " + size_label(lo * 2) + ")";
      }
    } else {
      if (i == 0) label = "(..., " + std::to_string(m.lmin) + ")";
      else if (i == v.size() - 1) label = "[" + std::to_string(m.lmax) + ", ...)";
      else {
        const std::int64_t lo = m.lmin + static_cast<std::int64_t>(i - 1) * m.lstep;
        label = "[" + std::to_string(lo) + ", " + std::to_string(lo + m.lstep) + ")";
      }
    }
    out += bar_line(label, v[i], max);
  }
  return out;
}

}  // namespace

namespace {
std::vector<std::uint32_t> name_order(const Program& p) {
  std::vector<std::uint32_t> order(p.h->nmaps);
  for (std::uint32_t i = 0; i < p.h->nmaps; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::strcmp(p.strtab + p.maps[a].name, p.strtab + p.maps[b].name) < 0;
  });
  return order;
}
}  // namespace

std::string format_maps(const Program& p, const std::vector<MapData>& maps) {
  std::string out;
  for (std::uint32_t mi : name_order(p)) out += format_map(p, mi, maps[mi]);
  return out;
}

namespace {

using Row = std::pair<std::vector<std::uint64_t>, std::vector<std::uint64_t>>;

// A map's rows in bpftrace's order (by value, hist by total count; keys
// with equal values in key order). A key-less count() map with no value
// has one row, 0, as in bpftrace 0.17.
std::vector<Row> sorted_rows(const MapDesc& m, const MapData& contents) {
    MapData data = contents;
    if (data.empty() && m.nkeys == 0 && m.agg == Agg::count)
      data[std::vector<std::uint64_t>(m.key_words, 0)] = std::vector<std::uint64_t>(m.value_words, 0);
    std::vector<Row> rows(data.begin(), data.end());
    auto sort_by = [&](auto f) {
      std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) { return f(a.second) < f(b.second); });
    };
    if (m.value_is_str) {  // bpftrace 0.17's sort_by_key(): by each integer or string component, the last first
      std::size_t off = 0;
      std::vector<std::size_t> offs;
      for (unsigned k = 0; k < m.nkeys; ++k) {
        offs.push_back(off);
        off += 8 * (m.key_is_str[k] == 1 ? kStrLen / 8 : m.key_is_str[k] == 3 ? 1u + m.stack_limit : m.key_is_str[k] == 4 ? 2 : 1);
      }
      for (unsigned k = m.nkeys; k-- > 0;) {
        const std::size_t at = offs[k];
        const std::uint8_t kind = m.key_is_str[k];
        if (kind != 0 && kind != 1 && kind != 2) continue;  // (other types are not sorted)
        std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
          const auto* pa = reinterpret_cast<const char*>(a.first.data()) + at;
          const auto* pb = reinterpret_cast<const char*>(b.first.data()) + at;
          if (kind == 1) return std::strncmp(pa, pb, kStrLen) < 0;
          std::uint64_t x, y;
          std::memcpy(&x, pa, 8), std::memcpy(&y, pb, 8);
          return x < y;
        });
      }
      return rows;
    }
    switch (m.agg) {
      case Agg::count: case Agg::sum: case Agg::min: case Agg::max: case Agg::assign:
        sort_by([](const std::vector<std::uint64_t>& v) { return static_cast<std::int64_t>(v[0]); });
        break;
      case Agg::avg: case Agg::stats:
        sort_by([](const std::vector<std::uint64_t>& v) {
          return v[0] ? static_cast<std::int64_t>(v[1]) / static_cast<std::int64_t>(v[0]) : 0;
        });
        break;
      case Agg::hist: case Agg::lhist:
        sort_by([](const std::vector<std::uint64_t>& v) {
          std::uint64_t t = 0;
          for (auto x : v) t += x;
          return t;
        });
        break;
    }
    return rows;
}

std::int64_t average(const std::vector<std::uint64_t>& v) {
  return v[0] ? static_cast<std::int64_t>(v[1]) / static_cast<std::int64_t>(v[0]) : 0;
}

std::string str_value(const MapDesc& m, const std::vector<std::uint64_t>& v) {
  std::string s(reinterpret_cast<const char*>(v.data()), 8 * (m.value_words - 1));
  return s.substr(0, s.find('\0'));
}

std::string value_text(const MapDesc& m, const std::vector<std::uint64_t>& v) {
  if (m.value_is_str) return str_value(m, v);
  return m.value_signed ? std::to_string(static_cast<std::int64_t>(v[0])) : std::to_string(v[0]);
}

// A hist/lhist value as bpftrace's JSON: the buckets from the first to the
// last non-empty one.
std::string hist_json(const MapDesc& m, const std::vector<std::uint64_t>& v) {
  std::size_t first = v.size(), last = 0;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i]) first = std::min(first, i), last = i;
  if (first == v.size()) return "";
  std::string out = "[";
  for (std::size_t i = first; i <= last; ++i) {
    if (i > first) out += ", ";
    out += "{";
    if (m.agg == Agg::hist) {
      if (i == 0) out += "\"max\": -1, ";
      else if (i == 1) out += "\"min\": 0, \"max\": 0, ";
      else if (i == 2) out += "\"min\": 1, \"max\": 1, ";
      else {
        const std::uint64_t lo = std::uint64_t{1} << (i - 2);
        out += "\"min\": " + std::to_string(lo) + ", \"max\": " + std::to_string(lo * 2 - 1) + ", ";
      }
    } else {
      if (i == 0) out += "\"max\": " + std::to_string(m.lmin - 1) + ", ";
      else if (i == v.size() - 1) out += "\"min\": " + std::to_string(m.lmax) + ", ";
      else {
        const std::int64_t lo = m.lmin + static_cast<std::int64_t>(i - 1) * m.lstep;
        out += "\"min\": " + std::to_string(lo) + ", \"max\": " + std::to_string(lo + m.lstep - 1) + ", ";
      }
    }
    out += "\"count\": " + std::to_string(v[i]) + "}";
  }
  return out + "]";
}

}  // namespace

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c >= 0 && c <= 0x1f) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string format_map_json(const Program& p, std::uint32_t mi, const MapData& contents) {
  const MapDesc& m = p.maps[mi];
  const std::vector<Row> rows = sorted_rows(m, contents);
  if (rows.empty()) return "";  // (bpftrace prints nothing for an empty map)
  const char* type = m.agg == Agg::hist || m.agg == Agg::lhist ? "hist"
                     : m.agg == Agg::avg || m.agg == Agg::stats ? "stats" : "map";
  std::string out = std::string("{\"type\": \"") + type + "\", \"data\": {\"" + json_escape(p.strtab + m.name) + "\": ";
  if (m.nkeys) out += "{";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::vector<std::uint64_t>& v = rows[i].second;
    if (i) out += ", ";
    if (m.nkeys) out += "\"" + json_escape(join(key_parts(m, rows[i].first), ",")) + "\": ";
    switch (m.agg) {
      case Agg::hist: case Agg::lhist: out += hist_json(m, v); break;
      case Agg::avg: out += std::to_string(average(v)); break;
      case Agg::stats:
        out += "{\"count\": " + std::to_string(v[0]) + ", \"average\": " + std::to_string(average(v)) +
               ", \"total\": " + std::to_string(static_cast<std::int64_t>(v[1])) + "}";
        break;
      case Agg::count: out += std::to_string(v[0]); break;
      default: out += m.value_is_str ? "\"" + json_escape(str_value(m, v)) + "\"" : value_text(m, v); break;
    }
  }
  if (m.nkeys) out += "}";
  return out + "}}\n";
}

std::string format_maps_json(const Program& p, const std::vector<MapData>& maps) {
  std::string out;
  for (std::uint32_t mi : name_order(p)) out += format_map_json(p, mi, maps[mi]);
  return out;
}

std::string format_map(const Program& p, std::uint32_t mi, const MapData& contents) {
  std::string out;
  {
    const MapDesc& m = p.maps[mi];
    const std::string name = p.strtab + m.name;
    const std::vector<Row> rows = sorted_rows(m, contents);
    // (bpftrace 0.17: an empty map prints an empty line; avg and stats add theirs)
    if (rows.empty()) out += "\n";
    for (const Row& r : rows) {
      const std::string head = name + key_text(m, r.first) + ": ";
      const std::vector<std::uint64_t>& v = r.second;
      switch (m.agg) {
        case Agg::hist:
        case Agg::lhist: out += head + "\n" + hist_text(m, v) + "\n"; break;
        case Agg::avg:
          out += head + std::to_string(v[0] ? static_cast<std::int64_t>(v[1]) / static_cast<std::int64_t>(v[0]) : 0) +
                 "\n";
          break;
        case Agg::stats:
          out += head + "count " + std::to_string(v[0]) + ", average " +
                 std::to_string(v[0] ? static_cast<std::int64_t>(v[1]) / static_cast<std::int64_t>(v[0]) : 0) +
                 ", total " + std::to_string(static_cast<std::int64_t>(v[1])) + "\n";
          break;
        case Agg::count: out += head + std::to_string(v[0]) + "\n"; break;
        default:
          out += head + value_text(m, v) + "\n";
          break;
      }
    }
    if (m.agg == Agg::avg || m.agg == Agg::stats) out += "\n";
  }
  return out;
}

}  // namespace uptrace::bt
