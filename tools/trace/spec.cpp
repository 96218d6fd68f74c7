// SPDX-License-Identifier: MIT
#include "spec.hpp"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uprobe/symbols.hpp>

namespace uptrace {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::uprobe: return "uprobe";
    case Kind::uretprobe: return "uretprobe";
    case Kind::usdt: return "usdt";
  }
  return "?";
}

bool has_glob(std::string_view s) { return s.find_first_of("*?[") != std::string_view::npos; }

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  buf[n] = 0;
  return buf;
}

std::string base_name(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::optional<bool> loaded_here(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  for (const auto& o : uprobe::loaded_objects())
    if (o.path == path || (o.dev == st.st_dev && o.ino == st.st_ino)) return true;
  return false;
}

bool usable_tables_file(const char* path) noexcept {
  struct stat st;
  return path && ::lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= kMaxKeptTablesBytes;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  while (!s.empty()) {
    auto p = s.find(sep);
    std::string_view piece = s.substr(0, p);
    if (!piece.empty()) out.emplace_back(piece);
    if (p == std::string_view::npos) break;
    s.remove_prefix(p + 1);
  }
  return out;
}

std::optional<Spec> parse_spec(std::string_view text, std::string& error) {
  Spec s;
  s.text = std::string(text);
  auto bad = [&](const std::string& why) -> std::optional<Spec> {
    error = "invalid probe `" + s.text + "': " + why;
    return std::nullopt;
  };
  if (text.find_first_of("\n\t") != std::string_view::npos) return bad("tabs and newlines are not allowed");
  auto c1 = text.find(':');
  if (c1 == std::string_view::npos) return bad("expected TYPE:PATH:...");
  std::string_view type = text.substr(0, c1), rest = text.substr(c1 + 1);
  if (type == "uprobe" || type == "u") s.kind = Kind::uprobe;
  else if (type == "uretprobe" || type == "ur") s.kind = Kind::uretprobe;
  else if (type == "usdt" || type == "U") s.kind = Kind::usdt;
  else return bad("unknown probe type `" + std::string(type) + "' (uprobe, uretprobe or usdt)");

  if (s.kind == Kind::usdt) {
    // PATH:PROVIDER:NAME or PATH:NAME.
    auto last = rest.rfind(':');
    if (last == std::string_view::npos || last == 0 || last + 1 == rest.size())
      return bad("expected usdt:PATH:PROVIDER:NAME or usdt:PATH:NAME");
    auto prev = rest.rfind(':', last - 1);
    if (prev != std::string_view::npos && prev > 0 && prev + 1 < last) {
      s.binary = std::string(rest.substr(0, prev));
      s.what = std::string(rest.substr(prev + 1));
    } else {
      s.binary = std::string(rest.substr(0, last));
      s.what = std::string(rest.substr(last + 1));
    }
  } else {
    auto last = rest.rfind(':');
    if (last == std::string_view::npos || last == 0 || last + 1 == rest.size())
      return bad(std::string("expected ") + kind_name(s.kind) + ":PATH:SYMBOL");
    s.binary = std::string(rest.substr(0, last));
    s.what = std::string(rest.substr(last + 1));
    if (s.kind == Kind::uretprobe) {
      auto plus = s.what.rfind('+');
      if (plus != std::string::npos && plus > 0) {
        std::string off = s.what.substr(plus + 1);
        if (off != "0" && off != "0x0") return bad("a uretprobe goes at a function's entry: no +OFFSET");
      }
      if (s.what[0] == '+') return bad("a uretprobe goes at a function's entry: give a symbol");
    }
  }
  if (s.binary.empty()) return bad("empty PATH");
  return s;
}

}  // namespace uptrace
