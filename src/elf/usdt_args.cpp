// SPDX-License-Identifier: MIT
// USDT argument specs (x86-64, AT&T operand syntax): the parser and the
// handler-time evaluator (usdt.hpp).
// GCC 12 reports a false -Wrestrict inside std::string's operator+ once it is
// inlined (GCC PR 105329); the state must be set before <string> is included.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "uprobe/uprobe.hpp"  // probe_read_user()
#include "uprobe/usdt.hpp"

namespace uprobe::usdt {

namespace {

struct RegName {
  const char* name;
  Reg reg;
  std::uint8_t width;
};

// Every name gas accepts for the x86-64 general registers (and xmm, below).
constexpr RegName kRegNames[] = {
    {"rax", Reg::rax, 8}, {"eax", Reg::rax, 4}, {"ax", Reg::rax, 2}, {"al", Reg::rax, 1}, {"ah", Reg::ah, 1},
    {"rbx", Reg::rbx, 8}, {"ebx", Reg::rbx, 4}, {"bx", Reg::rbx, 2}, {"bl", Reg::rbx, 1}, {"bh", Reg::bh, 1},
    {"rcx", Reg::rcx, 8}, {"ecx", Reg::rcx, 4}, {"cx", Reg::rcx, 2}, {"cl", Reg::rcx, 1}, {"ch", Reg::ch, 1},
    {"rdx", Reg::rdx, 8}, {"edx", Reg::rdx, 4}, {"dx", Reg::rdx, 2}, {"dl", Reg::rdx, 1}, {"dh", Reg::dh, 1},
    {"rsi", Reg::rsi, 8}, {"esi", Reg::rsi, 4}, {"si", Reg::rsi, 2}, {"sil", Reg::rsi, 1},
    {"rdi", Reg::rdi, 8}, {"edi", Reg::rdi, 4}, {"di", Reg::rdi, 2}, {"dil", Reg::rdi, 1},
    {"rbp", Reg::rbp, 8}, {"ebp", Reg::rbp, 4}, {"bp", Reg::rbp, 2}, {"bpl", Reg::rbp, 1},
    {"rsp", Reg::rsp, 8}, {"esp", Reg::rsp, 4}, {"sp", Reg::rsp, 2}, {"spl", Reg::rsp, 1},
    {"r8", Reg::r8, 8},   {"r8d", Reg::r8, 4},   {"r8w", Reg::r8, 2},   {"r8b", Reg::r8, 1},
    {"r9", Reg::r9, 8},   {"r9d", Reg::r9, 4},   {"r9w", Reg::r9, 2},   {"r9b", Reg::r9, 1},
    {"r10", Reg::r10, 8}, {"r10d", Reg::r10, 4}, {"r10w", Reg::r10, 2}, {"r10b", Reg::r10, 1},
    {"r11", Reg::r11, 8}, {"r11d", Reg::r11, 4}, {"r11w", Reg::r11, 2}, {"r11b", Reg::r11, 1},
    {"r12", Reg::r12, 8}, {"r12d", Reg::r12, 4}, {"r12w", Reg::r12, 2}, {"r12b", Reg::r12, 1},
    {"r13", Reg::r13, 8}, {"r13d", Reg::r13, 4}, {"r13w", Reg::r13, 2}, {"r13b", Reg::r13, 1},
    {"r14", Reg::r14, 8}, {"r14d", Reg::r14, 4}, {"r14w", Reg::r14, 2}, {"r14b", Reg::r14, 1},
    {"r15", Reg::r15, 8}, {"r15d", Reg::r15, 4}, {"r15w", Reg::r15, 2}, {"r15b", Reg::r15, 1},
    {"rip", Reg::rip, 8},
};

const char* reg_name(Reg r, unsigned width) {
  if (r == Reg::xmm) return "xmm";
  for (const RegName& n : kRegNames)
    if (n.reg == r && n.width == width) return n.name;
  for (const RegName& n : kRegNames)
    if (n.reg == r) return n.name;
  return "?";
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_sym_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.'; }
bool is_sym_char(char c) { return is_sym_start(c) || is_digit(c) || c == '$'; }
bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// A cursor over one token. Every read is bounds-checked.
struct Cur {
  std::string_view s;
  std::size_t i = 0;
  bool end() const { return i >= s.size(); }
  char peek() const { return i < s.size() ? s[i] : '\0'; }
  bool eat(char c) {
    if (peek() != c || end()) return false;
    ++i;
    return true;
  }
};

// [+-] (0x hex | 0 octal | decimal), magnitude <= 2^64-1, wrapped to 64 bits.
bool parse_int(Cur& c, std::int64_t& out, std::string& why) {
  bool neg = false;
  if (c.peek() == '-' || c.peek() == '+') {
    neg = c.peek() == '-';
    ++c.i;
  }
  if (!is_digit(c.peek())) {
    why = "expected a number";
    return false;
  }
  unsigned base = 10;
  if (c.peek() == '0' && c.i + 1 < c.s.size() && (c.s[c.i + 1] == 'x' || c.s[c.i + 1] == 'X')) {
    base = 16;
    c.i += 2;
  } else if (c.peek() == '0') {
    base = 8;
  }
  std::uint64_t v = 0;
  std::size_t digits = 0;
  for (; !c.end(); ++c.i, ++digits) {
    char ch = c.peek();
    unsigned d;
    if (ch >= '0' && ch <= '9') d = static_cast<unsigned>(ch - '0');
    else if (base == 16 && ch >= 'a' && ch <= 'f') d = static_cast<unsigned>(ch - 'a' + 10);
    else if (base == 16 && ch >= 'A' && ch <= 'F') d = static_cast<unsigned>(ch - 'A' + 10);
    else break;
    if (d >= base) {
      why = "digit `" + std::string(1, ch) + "' in an octal number";
      return false;
    }
    if (v > (UINT64_MAX - d) / base) {
      why = "number out of 64-bit range";
      return false;
    }
    v = v * base + d;
  }
  if (digits == 0) {
    why = "expected hex digits after 0x";
    return false;
  }
  out = static_cast<std::int64_t>(neg ? 0 - v : v);
  return true;
}

bool parse_symbol(Cur& c, std::string_view& name) {
  std::size_t b = c.i;
  if (!is_sym_start(c.peek())) return false;
  while (!c.end() && is_sym_char(c.peek())) ++c.i;
  name = c.s.substr(b, c.i - b);
  return true;
}

// After '%': a register name.
bool parse_reg(Cur& c, Reg& reg, std::uint8_t& width, std::int64_t& xmm_no, std::string& why) {
  std::size_t b = c.i;
  char buf[8];
  std::size_t n = 0;
  while (!c.end() && ((c.peek() >= 'a' && c.peek() <= 'z') || (c.peek() >= 'A' && c.peek() <= 'Z') || is_digit(c.peek()))) {
    char ch = c.peek();
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
    if (n < sizeof buf - 1) buf[n] = ch;
    ++n;
    ++c.i;
  }
  std::string_view shown = c.s.substr(b, c.i - b);
  if (n == 0) {
    why = "expected a register name after `%'";
    return false;
  }
  if (n < sizeof buf) {
    buf[n] = '\0';
    for (const RegName& r : kRegNames) {
      if (std::strcmp(r.name, buf) == 0) {
        reg = r.reg;
        width = r.width;
        return true;
      }
    }
    if (n >= 4 && std::strncmp(buf, "xmm", 3) == 0) {
      std::int64_t no = 0;
      bool ok = true;
      for (std::size_t k = 3; k < n; ++k) {
        if (!is_digit(buf[k]) || (k == 3 && buf[k] == '0' && n > 4)) ok = false;
        no = no * 10 + (buf[k] - '0');
      }
      if (ok && no < 16) {
        reg = Reg::xmm;
        width = 16;
        xmm_no = no;
        return true;
      }
    }
  }
  why = "unknown register `%" + std::string(shown.substr(0, 16)) + "'";
  return false;
}

bool is_gpr64(Reg r, unsigned width) { return width == 8 && r >= Reg::rax && r <= Reg::r15; }

// A displacement or constant: a sum of numbers and at most one symbol, as
// gcc prints them (`-20`, `0x10`, `sym`, `sym+8`, `8+sym`, `sym-4`). With a
// symbol the result is SYM+N - pc and `sym` is set (evaluated relative to the
// probe's runtime ip).
bool parse_expr(Cur& c, const ParseContext& ctx, std::int64_t& out, bool& sym, std::string& why) {
  std::uint64_t sum = 0;
  sym = false;
  for (bool first = true;; first = false) {
    bool neg = false;
    if (c.peek() == '+' || c.peek() == '-') {
      neg = c.peek() == '-';
      ++c.i;
    } else if (!first) {
      break;
    }
    if (is_digit(c.peek())) {
      std::int64_t v = 0;
      if (!parse_int(c, v, why)) return false;
      sum += neg ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
    } else if (is_sym_start(c.peek())) {
      std::string_view name;
      parse_symbol(c, name);
      if (sym) {
        why = "more than one symbol in an operand";
        return false;
      }
      if (neg) {
        why = "a negated symbol cannot be evaluated";
        return false;
      }
      if (c.peek() == '@') {
        why = "relocation operators (`@GOTPCREL', `@PLT', ...) are not supported";
        return false;
      }
      std::optional<std::uint64_t> addr;
      if (ctx.lookup) addr = ctx.lookup(name);
      if (!addr) {
        why = "symbol `" + std::string(name.substr(0, 64)) +
              "' is not in the file's symbol tables (or names several places)";
        return false;
      }
      sum += *addr;
      sym = true;
    } else {
      why = "expected a number or a symbol";
      if (!c.end()) why += " before `" + std::string(1, c.peek()) + "'";
      return false;
    }
  }
  out = static_cast<std::int64_t>(sym ? sum - ctx.pc : sum);
  return true;
}

bool parse_one(std::string_view tok, const ParseContext& ctx, Arg& a, std::string& why) {
  Cur c{tok, 0};
  bool sized = false;
  // SIZE[f]@ prefix.
  {
    std::size_t j = 0;
    bool neg = false;
    if (j < tok.size() && tok[j] == '-') {
      neg = true;
      ++j;
    }
    std::size_t ds = j;
    unsigned v = 0;
    while (j < tok.size() && is_digit(tok[j]) && j - ds < 4) v = v * 10 + static_cast<unsigned>(tok[j++] - '0');
    if (j > ds) {
      bool f = j < tok.size() && tok[j] == 'f';
      std::size_t at = j + (f ? 1 : 0);
      if (at < tok.size() && tok[at] == '@') {
        sized = true;
        if (f) {
          if (v != 4 && v != 8) {
            why = "floating-point size " + std::to_string(v) + " is not supported (4 or 8)";
            return false;
          }
          a.is_float = true;
        } else if (v != 1 && v != 2 && v != 4 && v != 8) {
          why = "size " + std::string(neg ? "-" : "") + std::to_string(v) + " is not 1, 2, 4 or 8";
          return false;
        }
        a.size = static_cast<std::int8_t>(neg && !f ? -static_cast<int>(v) : static_cast<int>(v));
        c.i = at + 1;
      } else if (j < tok.size() && is_digit(tok[j])) {
        // Five or more digits before '@' is an oversized size, not an operand.
        std::size_t k = j;
        while (k < tok.size() && is_digit(tok[k])) ++k;
        if (k < tok.size() && tok[k] == '@') {
          why = "size is not 1, 2, 4 or 8";
          return false;
        }
      }
    }
  }
  if (c.end()) {
    why = sized ? "missing operand after `@'" : "empty argument";
    return false;
  }
  if (!sized && tok[0] == '@') {
    why = "missing size before `@'";
    return false;
  }
  a.pc_relative = false;
  a.base = a.index = Reg::none;
  a.scale = 1;
  a.disp = 0;

  if (c.eat('$')) {  // constant
    a.kind = ArgKind::constant;
    if (c.end()) {
      why = "missing value after `$'";
      return false;
    }
    if (!parse_expr(c, ctx, a.disp, a.pc_relative, why)) return false;
    if (!sized) a.size = 8;
  } else if (c.eat('%')) {  // register
    a.kind = ArgKind::reg;
    std::int64_t xmm = 0;
    if (!parse_reg(c, a.base, a.width, xmm, why)) return false;
    if (a.base == Reg::xmm) a.disp = xmm;
    if (!sized) a.size = static_cast<std::int8_t>(a.width > 8 ? 8 : a.width);
  } else {  // memory
    a.kind = ArgKind::memory;
    bool sym = false;
    if (c.peek() == '-' || c.peek() == '+' || is_digit(c.peek()) || is_sym_start(c.peek())) {
      if (!parse_expr(c, ctx, a.disp, sym, why)) return false;
    } else if (c.peek() != '(') {
      why = "unexpected `" + std::string(1, c.peek()) + "' (expected $, %, a number, a symbol or `(')";
      return false;
    }
    if (c.eat('(')) {
      bool any = false;
      if (c.eat('%')) {
        std::uint8_t w = 0;
        std::int64_t xmm = 0;
        if (!parse_reg(c, a.base, w, xmm, why)) return false;
        if (!(is_gpr64(a.base, w) || a.base == Reg::rip)) {
          why = "base register `%" + std::string(reg_name(a.base, w)) + "' is not a 64-bit register";
          return false;
        }
        any = true;
      }
      if (c.eat(',')) {
        if (!c.eat('%')) {
          why = "expected an index register after `,'";
          return false;
        }
        std::uint8_t w = 0;
        std::int64_t xmm = 0;
        if (!parse_reg(c, a.index, w, xmm, why)) return false;
        if (!is_gpr64(a.index, w) || a.index == Reg::rsp) {
          why = "index register `%" + std::string(reg_name(a.index, w)) + "' is not a 64-bit index register";
          return false;
        }
        if (a.base == Reg::rip) {
          why = "%rip cannot be combined with an index register";
          return false;
        }
        any = true;
        if (c.eat(',')) {
          if (c.end() || !is_digit(c.peek())) {
            why = "expected a scale (1, 2, 4 or 8)";
            return false;
          }
          char s = c.peek();
          ++c.i;
          if (!c.end() && is_digit(c.peek())) s = 'x';
          if (s != '1' && s != '2' && s != '4' && s != '8') {
            why = "scale is not 1, 2, 4 or 8";
            return false;
          }
          a.scale = static_cast<std::uint8_t>(s - '0');
        }
      }
      if (!c.eat(')')) {
        why = c.end() ? "missing `)'" : "unexpected `" + std::string(1, c.peek()) + "' in a memory operand";
        return false;
      }
      if (!any) {
        why = "empty memory operand `()'";
        return false;
      }
    }
    if (sym) {
      a.pc_relative = true;
      if (a.base == Reg::rip) a.base = Reg::none;  // SYM(%rip) is SYM's address
    }
    if (!sized) a.size = 8;
  }
  if (!c.end()) {
    why = "unexpected `" + std::string(c.s.substr(c.i, 16)) + "' after the operand";
    return false;
  }
  return true;
}

std::uint64_t reg_value(const Regs& r, Reg g) noexcept {
  switch (g) {
    case Reg::rax: return r.rax;
    case Reg::rbx: return r.rbx;
    case Reg::rcx: return r.rcx;
    case Reg::rdx: return r.rdx;
    case Reg::rsi: return r.rsi;
    case Reg::rdi: return r.rdi;
    case Reg::rbp: return r.rbp;
    case Reg::rsp: return r.rsp;
    case Reg::r8: return r.r8;
    case Reg::r9: return r.r9;
    case Reg::r10: return r.r10;
    case Reg::r11: return r.r11;
    case Reg::r12: return r.r12;
    case Reg::r13: return r.r13;
    case Reg::r14: return r.r14;
    case Reg::r15: return r.r15;
    case Reg::rip: return r.rip;
    case Reg::ah: return (r.rax >> 8) & 0xff;
    case Reg::bh: return (r.rbx >> 8) & 0xff;
    case Reg::ch: return (r.rcx >> 8) & 0xff;
    case Reg::dh: return (r.rdx >> 8) & 0xff;
    default: return 0;
  }
}

bool read_memory(std::uint64_t addr, void* buf, std::size_t n, MemoryAccess access) noexcept {
  if (access == MemoryAccess::direct) {
    std::memcpy(buf, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(addr)), n);
    return true;
  }
  return uprobe::probe_read_user(buf, static_cast<std::uint32_t>(n), reinterpret_cast<const void*>(static_cast<std::uintptr_t>(addr))) == 0;
}

std::string truncated(std::string_view s) {
  if (s.size() <= 48) return std::string(s);
  return std::string(s.substr(0, 45)) + "...";
}

}  // namespace

bool ArgSpec::read(unsigned i, const Regs& regs, std::uint64_t& out, MemoryAccess access) const noexcept {
  if (i >= count_) return false;
  const Arg& a = args_[i];
  std::uint64_t v = 0;
  switch (a.kind) {
    case ArgKind::constant:
      v = static_cast<std::uint64_t>(a.disp) + (a.pc_relative ? regs.rip : 0);
      break;
    case ArgKind::reg:
      if (a.base == Reg::xmm || a.base == Reg::none) return false;
      v = reg_value(regs, a.base);
      break;
    case ArgKind::memory: {
      std::uint64_t addr = static_cast<std::uint64_t>(a.disp);
      if (a.pc_relative) addr += regs.rip;
      if (a.base != Reg::none) addr += reg_value(regs, a.base);
      if (a.index != Reg::none) addr += reg_value(regs, a.index) * a.scale;
      const unsigned n = a.bytes();
      if (n == 0 || n > 8) return false;
      std::uint64_t raw = 0;
      if (!read_memory(addr, &raw, n, access)) return false;
      v = raw;
      break;
    }
    default:
      return false;
  }
  const unsigned n = a.bytes();
  if (n < 8) {
    const unsigned sh = 64 - 8 * n;
    v = a.is_signed() ? static_cast<std::uint64_t>(static_cast<std::int64_t>(v << sh) >> sh) : (v << sh) >> sh;
  }
  out = v;
  return true;
}

ParseResult parse_args(std::string_view text, const ParseContext& ctx) {
  ParseResult res;
  std::size_t i = 0;
  unsigned n = 0;
  while (true) {
    while (i < text.size() && is_blank(text[i])) ++i;
    if (i >= text.size()) break;
    std::size_t b = i;
    while (i < text.size() && !is_blank(text[i])) ++i;
    std::string_view tok = text.substr(b, i - b);
    ++n;
    if (n > kMaxArgs) {
      res.error = "argument #" + std::to_string(n) + " `" + truncated(tok) + "': more than " +
                  std::to_string(kMaxArgs) + " arguments";
      res.error_arg = n;
      return res;
    }
    Arg a;
    std::string why;
    if (tok.find('\0') != std::string_view::npos) {
      why = "NUL byte in the argument";
    } else if (parse_one(tok, ctx, a, why)) {
      res.args.push(a);
      continue;
    }
    res.error = "argument #" + std::to_string(n) + " `" + truncated(tok) + "': " + why;
    res.error_arg = n;
    return res;
  }
  return res;
}

std::string format_arg(const Arg& a) {
  std::string s = std::to_string(static_cast<int>(a.size)) + (a.is_float ? "f" : "") + "@";
  char num[40];
  auto hexs = [&](std::int64_t v) {
    if (v < 0) std::snprintf(num, sizeof num, "-0x%llx", static_cast<unsigned long long>(0 - static_cast<std::uint64_t>(v)));
    else std::snprintf(num, sizeof num, "0x%llx", static_cast<unsigned long long>(v));
    return std::string(num);
  };
  switch (a.kind) {
    case ArgKind::constant:
      s += a.pc_relative ? "$(%rip" + std::string(a.disp < 0 ? "" : "+") + hexs(a.disp) + ")"
                         : "$" + std::to_string(a.disp);
      break;
    case ArgKind::reg:
      s += a.base == Reg::xmm ? "%xmm" + std::to_string(a.disp) : "%" + std::string(reg_name(a.base, a.width));
      break;
    case ArgKind::memory:
      if (a.pc_relative) s += "%rip" + std::string(a.disp < 0 ? "" : "+") + hexs(a.disp);
      else if (a.disp || (a.base == Reg::none && a.index == Reg::none)) s += std::to_string(a.disp);
      if (a.base != Reg::none || a.index != Reg::none) {
        s += "(";
        if (a.base != Reg::none) s += "%" + std::string(reg_name(a.base, 8));
        if (a.index != Reg::none) s += ",%" + std::string(reg_name(a.index, 8)) + "," + std::to_string(a.scale);
        s += ")";
      }
      break;
  }
  return s;
}

}  // namespace uprobe::usdt
