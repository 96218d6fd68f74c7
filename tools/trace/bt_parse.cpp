// SPDX-License-Identifier: MIT
// bpftrace's language for uprobe-trace, part 1 of 3: the lexer and the
// recursive-descent parser, building the tree of bt_ast.hpp with bpftrace
// 0.17's syntax errors (positions and words). The compiler is bt_compile.cpp,
// the CLI's printing bt_print.cpp.

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "bt_ast.hpp"

namespace uptrace::bt::ast {

namespace {

// ---------------------------------------------------------------- lexer + parser

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }

}  // namespace

const std::set<std::string> kUnsupportedFns = {
    "buf", "kstack", "ksym", "uaddr", "kaddr", "reg",
    "join", "system", "cat", "signal", "strncmp", "override", "sizeof", "ntop", "pton",
    "cgroupid", "macaddr", "path", "offsetof", "unwatch", "printf_", "skboutput", "bswap", "kptr", "uptr", "len"};
const std::set<std::string> kUnsupportedBuiltins = {"kstack", "username", "gid", "curtask", "rand",
                                                     "cgroup", "args", "ctx", "jiffies",
                                                     "numaid"};

namespace {

class Parser {
 public:
  Parser(const std::string& s, const std::vector<std::string>& params) : s_(s), params_(params) {}

  std::vector<ProbeA> program() {
    std::vector<ProbeA> out;
    skip_ws();
    if (at_end()) fail(here(0), "syntax error, unexpected end of file");
    while (!at_end()) {
      if (peek() == '#' && peek(1) == '!') fail(here(1), "invalid character '#'");  // (not at a line's start)
      if (peek() == '#') {  // bpftrace hands `#include`/`#define` lines to clang's preprocessor
        std::size_t len = 0;
        while (i_ + len < s_.size() && s_[i_ + len] != '\n') ++len;
        fail(here(len), "C preprocessor lines (#include, #define) are not supported by uprobe-trace yet");
      }
      out.push_back(probe());
      prev_end_ = here(0);
      skip_ws();
    }
    return out;
  }

 private:
  // ---- characters
  bool at_end() const { return i_ >= s_.size(); }
  char peek(std::size_t o = 0) const { return i_ + o < s_.size() ? s_[i_ + o] : '\0'; }
  Pos here(std::size_t len) const { return Pos{line_, col_, col_ + static_cast<int>(std::max<std::size_t>(len, 1))}; }
  void adv(std::size_t n = 1) {
    for (std::size_t k = 0; k < n && i_ < s_.size(); ++k, ++i_) {
      if (s_[i_] == '\n' || s_[i_] == '\r') ++line_, col_ = 1;  // (bpftrace's lexer: \r is a line break too)
      else ++col_;
    }
  }
  bool line_start() const { return i_ == 0 || s_[i_ - 1] == '\n'; }
  void skip_ws() {
    for (;;) {
      if (std::isspace(static_cast<unsigned char>(peek()))) adv();
      // An executable line (`#!/usr/bin/env bpftrace`): bpftrace's lexer
      // skips a line that starts with `#!`, wherever it is in the program.
      else if (peek() == '#' && peek(1) == '!' && line_start()) {
        while (!at_end() && peek() != '\n') adv();
      } else if (peek() == '/' && peek(1) == '/') {
        while (!at_end() && peek() != '\n') adv();
      } else if (peek() == '/' && peek(1) == '*') {
        adv(2);
        while (!at_end() && !(peek() == '*' && peek(1) == '/')) adv();
        adv(2);
      } else return;
    }
  }
  bool eat(const char* t) {
    skip_ws();
    const std::size_t n = std::strlen(t);
    if (s_.compare(i_, n, t) != 0) return false;
    if (ident_start(t[0]) && ident_char(peek(n))) return false;
    adv(n);
    return true;
  }
  // Where bpftrace's parser places a syntax error at the token here (`len`
  // bytes; 0 at the end of the text): from the token's start after the
  // last blank (its lexer steps its location only over blanks), to the
  // token's end.
  Pos token(std::size_t len) const {
    Pos p = here(len);
    p.end = col_ + static_cast<int>(len);
    for (std::size_t k = i_; k > 0 && !std::isspace(static_cast<unsigned char>(s_[k - 1])); --k) --p.col;
    return p;
  }
  [[noreturn]] void unexpected(const char* expecting = nullptr) {
    skip_ws();
    std::string m = "syntax error, unexpected ";
    std::size_t len = 1;
    if (at_end()) m += "end of file";
    else if (ident_start(peek())) {
      while (ident_char(peek(len))) ++len;
      m += s_.substr(i_, len);
    } else m += std::string(1, peek());
    if (expecting) m += std::string(", expecting ") + expecting;
    fail(token(at_end() ? 0 : len), m);
  }
  void expect(const char* t) {
    if (!eat(t)) unexpected(t);
  }

  // ---- positional parameters (bpftrace's get_param(): a missing one is
  // "" in a string, 0 as a number)
  std::string param(std::size_t n, bool in_str) const {
    return n <= params_.size() ? params_[n - 1] : in_str ? std::string() : std::string("0");
  }
  // bpftrace's is_numeric(): all of it read by strtoll, base 0.
  static bool numeric(const std::string& v, std::int64_t& out) {
    if (v.empty()) return false;
    errno = 0;
    char* end = nullptr;
    out = std::strtoll(v.c_str(), &end, 0);
    return errno == 0 && end && *end == '\0' && end != v.c_str();
  }
  // An attach point's `$N` (outside quotes, to the next `"` or `:`): the
  // parameter's text, as bpftrace's attach point parser puts it in.
  std::string with_params(const std::string& t, Pos pos) const {
    std::string out;
    bool quoted = false;
    for (std::size_t k = 0; k < t.size(); ++k) {
      if (t[k] == '"') quoted = !quoted;
      if (quoted || t[k] != '$') {
        out += t[k];
        continue;
      }
      std::size_t e = k + 1;
      while (e < t.size() && t[e] != '"' && t[e] != ':') ++e;
      const std::string idx = t.substr(k + 1, e - k - 1);
      std::int64_t n = 0;
      std::size_t digits = 0;
      while (digits < idx.size() && std::isdigit(static_cast<unsigned char>(idx[digits]))) ++digits;
      if (digits == 0 || !numeric(idx.substr(0, digits), n))
        fail(pos, "'" + t + "': a positional parameter ($N) must be a number here");
      if (digits != idx.size())
        fail(pos, "Found trailing text '" + idx.substr(digits) +
                      "' in positional parameter index. Try quoting the trailing text.");
      if (n > 0) out += param(static_cast<std::size_t>(n), true);
      k = e - 1;
    }
    return out;
  }

  // ---- probes
  ProbeA probe() {
    ProbeA p;
    for (;;) {
      // An attach point's place, as bpftrace's: from the end of the token
      // before it (the blanks, newlines and comments between are its), or
      // the start of the text, to its end.
      Pos pos = prev_end_;
      skip_ws();
      std::string t;
      while (!at_end() && !std::isspace(static_cast<unsigned char>(peek())) && peek() != ',' && peek() != '{')
        t += peek(), adv();
      if (t.empty()) unexpected();
      if (t.find('$') != std::string::npos) t = with_params(t, pos);
      pos.end = col_;
      if (line_ != pos.line) pos.end_line = line_;
      p.points.push_back({t, pos});
      skip_ws();
      if (peek() == ',') {
        adv();
        prev_end_ = here(0);
        continue;
      }
      break;
    }
    skip_ws();
    if (peek() == '/') {
      adv();
      p.pred = expr();
      skip_ws();
      if (peek() != '/') unexpected("/");
      adv();
    }
    p.body = block();
    return p;
  }

  std::vector<StmtP> block() {
    Nest nest(*this);
    expect("{");
    std::vector<StmtP> out;
    for (;;) {
      skip_ws();
      if (eat("}")) return out;
      if (eat(";")) continue;
      if (at_end()) fail(token(0), "syntax error, unexpected end of file, expecting }");
      bool is_if = false;
      out.push_back(stmt(is_if));
      if (eat("}")) return out;
      skip_ws();
      if (at_end()) fail(token(0), "syntax error, unexpected end of file, expecting }");
      if (!is_if && !eat(";")) unexpected("}");
    }
  }

  StmtP stmt(bool& is_if) {
    skip_ws();
    auto st = std::make_unique<StmtA>();
    st->pos = here(0);
    if (eat("if")) {
      is_if = true;
      st->k = SK::if_;
      expect("(");
      st->value = expr();
      expect(")");
      st->then_ = block();
      if (eat("else")) {
        skip_ws();
        if (s_.compare(i_, 2, "if") == 0 && !ident_char(peek(2))) {
          bool dummy = false;
          st->else_.push_back(stmt(dummy));
        } else {
          st->else_ = block();
        }
      }
      return st;
    }
    auto keyword = [&](const char* kw) {
      return s_.compare(i_, std::strlen(kw), kw) == 0 && !ident_char(peek(std::strlen(kw)));
    };
    if (keyword("for")) unexpected("}");  // (not bpftrace 0.17's)
    for (const char* kw : {"break", "continue", "return"}) {
      if (!keyword(kw)) continue;
      st->k = SK::jump;
      st->name = kw;
      st->pos = token(std::strlen(kw));
      adv(std::strlen(kw));
      return st;
    }
    if (keyword("while")) {
      is_if = true;  // (a block: no `;` after it)
      st->k = SK::while_;
      st->pos = token(5);
      adv(5);
      expect("(");
      st->value = expr();
      expect(")");
      st->then_ = block();
      return st;
    }
    if (keyword("unroll")) {  // unroll(N) { ... }: N a number or a positional parameter
      is_if = true;
      st->k = SK::unroll;
      Pos p = token(6);
      adv(6);
      expect("(");
      skip_ws();
      const bool number = std::isdigit(static_cast<unsigned char>(peek())) || (peek() == '$' && (peek(1) == '#' ||
                          std::isdigit(static_cast<unsigned char>(peek(1)))));
      if (!number) {
        std::size_t len = 1;
        while (ident_char(peek(len))) ++len;
        // (bison names a builtin by its token's name)
        static const std::set<std::string> kBuiltins = {
            "pid", "tid", "uid", "gid", "nsecs", "elapsed", "cpu", "comm", "kstack", "ustack", "retval", "func",
            "probe", "username", "args", "curtask", "rand", "ctx", "cgroup", "numaid", "jiffies"};
        const std::string w = s_.substr(i_, len);
        const bool numbered = (w.rfind("arg", 0) == 0 && w.size() == 4) || (w.rfind("sarg", 0) == 0 && w.size() == 5);
        const bool builtin = ident_start(peek()) && (kBuiltins.count(w) || (numbered && std::isdigit(static_cast<unsigned char>(w.back()))));
        if (builtin)
          fail(token(len), "syntax error, unexpected builtin, expecting $# or - or positional parameter or integer");
        unexpected("$# or - or positional parameter or integer");
      }
      st->value = primary();
      if (st->value->param_not_numeric)
        fail(st->value->pos, "$" + std::to_string(st->value->param) + " used numerically but given \"" +
                                 st->value->name + "\". Try using str($" + std::to_string(st->value->param) + ").");
      expect(")");
      p.end = col_;
      st->pos = p;
      st->then_ = block();
      return st;
    }
    // ++@m[k], --$v
    std::string prefix;
    if ((peek() == '+' || peek() == '-') && peek(1) == peek()) {
      prefix = s_.substr(i_, 2);
      adv(2);
    }
    ExprP e = expr();
    skip_ws();
    if (!prefix.empty() && e->k != EK::var && e->k != EK::map)
      fail(e->pos, "The " + prefix + " operator must be applied to a map or variable");
    if (!prefix.empty()) return update(std::move(st), std::move(e), prefix);
    if ((e->k == EK::var || e->k == EK::map) && peek() == '=' && peek(1) != '=') {
      st->assign_pos = token(1);
      adv();
      st->k = e->k == EK::var ? SK::var_assign : SK::map_assign;
      st->target = std::move(e);
      st->value = expr();
      no_incdec_here();
      return st;
    }
    for (const char* op : {"++", "--", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="}) {
      const std::size_t n = std::strlen(op);
      if (s_.compare(i_, n, op) != 0) continue;
      if (e->k != EK::var && e->k != EK::map)
        fail(here(n), std::string("The ") + op + " operator must be applied to a map or variable");
      adv(n);
      return update(std::move(st), std::move(e), op);
    }
    st->k = SK::expr;
    st->value = std::move(e);
    return st;
  }

  // `x++` `x--` `++x` `--x` `x OP= e` as the statement `x = x OP e` (with
  // the delta of a + or - update kept apart: a map only ever updated so is
  // a sum, merged over threads).
  StmtP update(StmtP st, ExprP target, const std::string& op) {
    st->k = target->k == EK::var ? SK::var_assign : SK::map_assign;
    st->incdec = op == "++" || op == "--";
    st->upd = op.substr(0, op.size() - 1);  // "+" "-" "*" ... "<<"
    ExprP rhs;
    if (st->incdec) {
      st->upd = op.substr(0, 1);
      rhs = make(EK::num, target->pos);
      rhs->num = 1;
    } else {
      rhs = expr();
      no_incdec_here();
    }
    if (st->upd == "+" || st->upd == "-") {
      ExprP d = clone(*rhs);
      if (st->upd == "-") {
        ExprP neg = make(EK::unary, d->pos);
        neg->name = "-";
        neg->kids.push_back(std::move(d));
        d = std::move(neg);
      }
      st->delta = std::move(d);
    }
    st->value = bin(EK::binary, st->upd, clone(*target), std::move(rhs));
    st->target = std::move(target);
    return st;
  }

  void no_incdec_here() {
    skip_ws();
    if ((peek() == '+' || peek() == '-') && peek(1) == peek())
      fail(here(2), std::string("the ") + s_.substr(i_, 2) +
                        " operator in an expression is not supported by uprobe-trace yet (only as a statement)");
  }

  static ExprP clone(const Expr& e) {
    auto c = std::make_unique<Expr>();
    c->k = e.k, c->pos = e.pos, c->name = e.name, c->num = e.num, c->bits = e.bits, c->sgn = e.sgn;
    c->call_end = e.call_end, c->call_end_line = e.call_end_line;
    c->param = e.param, c->param_not_numeric = e.param_not_numeric;
    for (const auto& k : e.kids) c->kids.push_back(clone(*k));
    return c;
  }

  // ---- expressions (C precedence)
  ExprP make(EK k, Pos p) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->pos = p;
    return e;
  }
  ExprP bin(EK k, const std::string& op, ExprP a, ExprP b) {
    Pos p = a->pos;
    if (a->call_end) p.end = a->call_end, p.end_line = a->call_end_line;
    const int b_end = b->call_end ? b->call_end : b->pos.end;  // (a call: to its ')')
    if (b->last_line() != p.line) p.end_line = std::max(b->last_line(), p.end_line), p.end = b_end;
    else p.end = std::max(b_end, p.end);
    ExprP e = make(k, p);
    e->name = op;
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  ExprP expr() {
    Nest n(*this);
    return ternary();
  }
  ExprP ternary() {
    ExprP c = lor();
    skip_ws();
    if (peek() == '?') {
      adv();
      ExprP a = expr();
      expect(":");
      ExprP b = ternary();
      ExprP e = make(EK::ternary, c->pos);
      const Pos bp = b->call();
      if (bp.line == e->pos.line) e->pos.end = std::max(e->pos.end, bp.end);  // (the whole ?:, as bpftrace)
      e->kids.push_back(std::move(c));
      e->kids.push_back(std::move(a));
      e->kids.push_back(std::move(b));
      return e;
    }
    return c;
  }
  ExprP lor() {
    ExprP a = land();
    while (eat("||")) a = bin(EK::lor, "||", std::move(a), land());
    return a;
  }
  ExprP land() {
    ExprP a = bor();
    while (eat("&&")) a = bin(EK::land, "&&", std::move(a), bor());
    return a;
  }
  bool eat_op(const char* op, const char* not_followed) {
    skip_ws();
    const std::size_t n = std::strlen(op);
    if (s_.compare(i_, n, op) != 0) return false;
    if (not_followed && std::strchr(not_followed, peek(n))) return false;
    adv(n);
    return true;
  }
  ExprP bor() {
    ExprP a = bxor();
    while (eat_op("|", "|=")) a = bin(EK::binary, "|", std::move(a), bxor());
    return a;
  }
  ExprP bxor() {
    ExprP a = band();
    while (eat_op("^", "=")) a = bin(EK::binary, "^", std::move(a), band());
    return a;
  }
  ExprP band() {
    ExprP a = equality();
    while (eat_op("&", "&=")) a = bin(EK::binary, "&", std::move(a), equality());
    return a;
  }
  ExprP equality() {
    ExprP a = relational();
    for (;;) {
      if (eat_op("==", nullptr)) a = bin(EK::binary, "==", std::move(a), relational());
      else if (eat_op("!=", nullptr)) a = bin(EK::binary, "!=", std::move(a), relational());
      else return a;
    }
  }
  ExprP relational() {
    ExprP a = shift();
    for (;;) {
      if (eat_op("<=", nullptr)) a = bin(EK::binary, "<=", std::move(a), shift());
      else if (eat_op(">=", nullptr)) a = bin(EK::binary, ">=", std::move(a), shift());
      else if (eat_op("<", "<")) a = bin(EK::binary, "<", std::move(a), shift());
      else if (eat_op(">", ">")) a = bin(EK::binary, ">", std::move(a), shift());
      else return a;
    }
  }
  ExprP shift() {
    ExprP a = additive();
    for (;;) {
      if (eat_op("<<", "=")) a = bin(EK::binary, "<<", std::move(a), additive());
      else if (eat_op(">>", "=")) a = bin(EK::binary, ">>", std::move(a), additive());
      else return a;
    }
  }
  ExprP additive() {
    ExprP a = mult();
    for (;;) {
      if (eat_op("+", "+=")) a = bin(EK::binary, "+", std::move(a), mult());
      else if (eat_op("-", "-=>")) a = bin(EK::binary, "-", std::move(a), mult());
      else return a;
    }
  }
  ExprP mult() {
    ExprP a = unary();
    for (;;) {
      if (eat_op("*", "=")) a = bin(EK::binary, "*", std::move(a), unary());
      else if (!predicate_end() && eat_op("/", "=")) a = bin(EK::binary, "/", std::move(a), unary());
      else if (eat_op("%", "=")) a = bin(EK::binary, "%", std::move(a), unary());
      else return a;
    }
  }
  // A '/' followed by '{': the end of a predicate, not a division.
  bool predicate_end() {
    skip_ws();
    if (peek() != '/') return false;
    std::size_t k = 1;
    while (std::isspace(static_cast<unsigned char>(peek(k)))) ++k;
    return peek(k) == '{';
  }
  ExprP unary() {
    skip_ws();
    // (Every token's place starts after the last blank, as bpftrace's lexer
    // steps its location only over blanks: `$x=-1`'s `-` at the `$`.)
    Pos p = token(1);
    for (char op : {'!', '~', '-'}) {
      if (peek() == op && !(op == '-' && peek(1) == '-')) {
        Nest nest(*this);
        adv();
        const bool digit_next = std::isdigit(static_cast<unsigned char>(peek())) != 0;
        ExprP e = make(EK::unary, p);
        e->name = std::string(1, op);
        e->kids.push_back(unary());
        // (-N is one token to bpftrace's lexer: a negative literal spans both)
        if (op == '-' && digit_next && e->kids[0]->k == EK::num) e->pos.end = e->kids[0]->pos.end;
        return e;
      }
    }
    if (peek() == '*' || peek() == '&') fail(p, std::string("the unary ") + peek() +
                                                    " operator (pointer dereference/address) is not supported by "
                                                    "uprobe-trace yet");
    if (peek() == '(') {  // a cast?
      std::size_t save = i_;
      int sl = line_, sc = col_;
      adv();
      skip_ws();
      std::size_t n = 0;
      while (ident_char(peek(n))) ++n;
      const std::string t = s_.substr(i_, n);
      static const std::map<std::string, std::pair<int, bool>> kTypes = {
          {"int8", {8, true}},   {"int16", {16, true}},   {"int32", {32, true}},   {"int64", {64, true}},
          {"uint8", {8, false}}, {"uint16", {16, false}}, {"uint32", {32, false}}, {"uint64", {64, false}}};
      if (t == "struct" || t == "union" || t == "enum")
        fail(here(n), "casts to " + t + " types are not supported by uprobe-trace yet");
      auto ty = kTypes.find(t);
      if (ty != kTypes.end()) {
        adv(n);
        skip_ws();
        if (peek() == '*') fail(here(1), "pointer casts are not supported by uprobe-trace yet");
        if (peek() == ')') {
          Nest nest(*this);
          adv();
          ExprP e = make(EK::cast, p);
          e->pos.end = col_;  // (bpftrace's place of a cast: `(type)`, its operand not included)
          e->bits = ty->second.first;
          e->sgn = ty->second.second;
          e->kids.push_back(unary());
          return e;
        }
      }
      i_ = save, line_ = sl, col_ = sc;
    }
    return postfix();
  }
  ExprP postfix() {
    ExprP e = primary();
    skip_ws();
    if (peek() == '.' || (peek() == '-' && peek(1) == '>'))
      fail(here(peek() == '.' ? 1 : 2), std::string("struct member access (") + (peek() == '.' ? "." : "->") +
                                            ") is not supported by uprobe-trace yet");
    if (peek() == '[' && e->k != EK::map) fail(here(1), "array indexing is not supported by uprobe-trace yet");
    return e;
  }
  ExprP primary() {
    skip_ws();
    Pos p = here(1);
    char c = peek();
    if (c == '(') {
      adv();
      ExprP e = expr();
      expect(")");
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t n = 0;
      while (ident_char(peek(n))) ++n;
      const std::string t = s_.substr(i_, n);
      ExprP e = make(EK::num, token(n));
      // bpftrace 0.17's decimal literals: digits with '_' between them
      // (1_000), and N e M (1e6: N 0-9, M at most 16).
      auto decimal = [](const std::string& d) {
        return !d.empty() && std::isdigit(static_cast<unsigned char>(d.front())) &&
               std::isdigit(static_cast<unsigned char>(d.back())) &&
               d.find_first_not_of("0123456789_") == std::string::npos;
      };
      std::string u = t;
      u.erase(std::remove(u.begin(), u.end(), '_'), u.end());
      const std::size_t ex = t.find('e');
      if (t.compare(0, 2, "0x") != 0 && t.compare(0, 2, "0X") != 0 && ex != std::string::npos &&
          decimal(t.substr(0, ex)) && decimal(t.substr(ex + 1))) {
        auto strip = [](std::string d) {  // (digits without leading zeros; "0" for none)
          d.erase(0, std::min(d.find_first_not_of('0'), d.size()));
          return d.empty() ? std::string("0") : d;
        };
        const std::string cs = strip(u.substr(0, u.find('e'))), xs = strip(u.substr(u.find('e') + 1));
        if (cs.size() > 1) fail(here(n), "Coefficient part of scientific literal must be in range (0,9), got: " + cs);
        if (xs.size() > 2 || std::stoi(xs) > 16) fail(here(n), "Exponent will overflow integer range: " + xs);
        std::int64_t v = cs[0] - '0';
        for (int k = std::stoi(xs); k > 0; --k) v *= 10;
        e->num = v;
        adv(n);
        return e;
      }
      if (t != u && !decimal(t)) fail(here(n), "Invalid integer: " + t);
      char* endp = nullptr;
      errno = 0;
      unsigned long long v = std::strtoull(u.c_str(), &endp, 0);
      if (*endp || errno) fail(here(n), "Invalid integer: " + t);
      e->num = static_cast<std::int64_t>(v);
      adv(n);
      return e;
    }
    if (c == '"') {
      // bpftrace's lexer places an error in a string from where its token
      // began, after the last blank (flex's loc.step()), to where the
      // scanner is (after the escape; the line's end for an unterminated
      // string); the string's own place starts there too.
      int from = col_;
      for (std::size_t k = i_; k > 0 && !std::isspace(static_cast<unsigned char>(s_[k - 1])); --k) --from;
      ExprP e = make(EK::str, Pos{p.line, from, p.end});
      auto err = [&](const std::string& m) { fail(Pos{line_, from, col_}, m); };
      adv();
      std::string v;
      auto is_oct = [](char d) { return d >= '0' && d <= '7'; };
      while (!at_end() && peek() != '"') {
        const char ch = peek();
        if (ch == '\n') err("unterminated string");
        if (ch != '\\') {
          v += ch;
          adv();
          continue;
        }
        const char esc = peek(1);
        const char* simple = std::strchr("ntr\\\"", esc);
        if (esc && simple) {
          v += esc == 'n' ? '\n' : esc == 't' ? '\t' : esc == 'r' ? '\r' : esc;
          adv(2);
          continue;
        }
        std::size_t n = 0;
        int base = 8;
        if (is_oct(esc)) {  // \NNN: up to 3 octal digits
          n = 2;
          while (n < 4 && is_oct(peek(n))) ++n;
        } else if (esc == 'x' && std::isxdigit(static_cast<unsigned char>(peek(2)))) {  // \xHH
          n = std::isxdigit(static_cast<unsigned char>(peek(3))) ? 4 : 3;
          base = 16;
        }
        if (n == 0) {
          adv(esc ? 2 : 1);
          err(esc ? std::string("invalid escape character '\\") + esc + "'" : "invalid character");
        }
        const std::string text = s_.substr(i_, n);
        const long value = std::strtol(text.c_str() + (base == 16 ? 2 : 1), nullptr, base);
        adv(n);
        if (value > 255) err("octal escape sequence out of range '" + text + "'");
        if (value == 0) err("a NUL byte in a string ('" + text + "') is not supported by uprobe-trace");
        v += static_cast<char>(value);
      }
      if (at_end()) err("unterminated string");
      adv();
      e->pos.end = col_;
      e->name = v;
      return e;
    }
    if (c == '$' && peek(1) == '#') {  // the number of positional parameters
      ExprP e = make(EK::num, token(2));
      e->num = static_cast<std::int64_t>(params_.size());
      e->param = -1;
      adv(2);
      return e;
    }
    if (c == '$' && std::isdigit(static_cast<unsigned char>(peek(1)))) {  // $N: a positional parameter
      std::size_t n = 1;
      while (std::isdigit(static_cast<unsigned char>(peek(n)))) ++n;
      ExprP e = make(EK::num, token(n));
      const std::string digits = s_.substr(i_ + 1, n - 1);
      std::int64_t idx = 0;
      if (!numeric(digits, idx) || idx <= 0)
        fail(e->pos, "param $" + digits + " is out of integer range [1, 9223372036854775807]");
      e->param = static_cast<int>(std::min<std::int64_t>(idx, 1 << 20));
      e->name = param(static_cast<std::size_t>(e->param), false);
      e->param_not_numeric = !numeric(e->name, e->num);
      adv(n);
      return e;
    }
    if (c == '$') {
      std::size_t n = 1;
      while (ident_char(peek(n))) ++n;
      ExprP e = make(EK::var, token(n));
      e->name = s_.substr(i_, n);
      adv(n);
      return e;
    }
    if (c == '@') {
      std::size_t n = 1;
      while (ident_char(peek(n))) ++n;
      ExprP e = make(EK::map, token(n));
      e->name = s_.substr(i_, n);
      adv(n);
      if (peek() == '[') {
        adv();
        if (!eat("]")) {
          do e->kids.push_back(expr());
          while (eat(","));
          expect("]");
        }
      }
      return e;
    }
    if (ident_start(c)) {
      std::size_t n = 0;
      while (ident_char(peek(n))) ++n;
      const std::string id = s_.substr(i_, n);
      Pos ip = token(n);
      adv(n);
      skip_ws();
      if (peek() == '(') {
        adv();
        ExprP e = make(EK::call, ip);
        e->name = id;
        if (!eat(")")) {
          do e->kids.push_back(expr());
          while (eat(","));
          if (!eat(")")) unexpected(") or \",\"");
        }
        e->call_end = col_;
        if (line_ != ip.line) e->call_end_line = line_;
        if (id == "str" && !e->kids.empty() && e->kids[0]->param != 0) return param_str(std::move(e));
        return e;
      }
      ExprP e = make(EK::builtin, ip);
      e->name = id;
      return e;
    }
    unexpected();
  }

  // str($N) and str($N, LEN): the parameter's text (its first LEN bytes), as
  // bpftrace makes it a string; str($#) is bpftrace's error.
  ExprP param_str(ExprP call) {
    const Expr& p = *call->kids[0];
    if (p.param < 0) fail(p.pos, "use $#, not str($#)");
    std::string v = param(static_cast<std::size_t>(p.param), true);
    if (call->kids.size() > 2)
      fail(call->call(), "str() takes up to 2 arguments (" + std::to_string(call->kids.size()) + " provided)");
    if (call->kids.size() == 2) {
      const Expr& len = *call->kids[1];
      if (len.k != EK::num || len.param_not_numeric)
        fail(len.pos, "str($N, LEN): LEN must be an integer literal with a positional parameter (uprobe-trace)");
      if (len.num >= 0 && static_cast<std::uint64_t>(len.num) < v.size()) v.resize(static_cast<std::size_t>(len.num));
    }
    if (v.size() > 63) v.resize(63);  // (bpftrace's str(): 64 bytes, NUL included)
    ExprP s = make(EK::str, call->pos);
    s->name = v;
    s->call_end = call->call_end, s->call_end_line = call->call_end_line;
    return s;
  }

  // Nesting of parentheses, unary operators, casts, expressions and blocks:
  // the parser recurses for each, on the CLI's stack.
  struct Nest {
    Parser& p;
    explicit Nest(Parser& q) : p(q) {
      if (++p.depth_ > kMaxParseDepth) {
        p.skip_ws();
        fail(p.here(1), "program nested too deeply (more than " + std::to_string(kMaxParseDepth) + " levels)");
      }
    }
    ~Nest() { --p.depth_; }
  };
  static constexpr unsigned kMaxParseDepth = 1000;

  const std::string& s_;
  const std::vector<std::string>& params_;
  std::size_t i_ = 0;
  int line_ = 1, col_ = 1;
  Pos prev_end_{1, 1, 2};  ///< just after the last token of the previous probe or attach point (the start: 1:1)
  unsigned depth_ = 0;
};

// ---------------------------------------------------------------- compiler

}  // namespace

std::vector<ProbeA> parse(const std::string& text, const std::vector<std::string>& params) {
  Parser p(text, params);
  return p.program();
}

}  // namespace uptrace::bt::ast
