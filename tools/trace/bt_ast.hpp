// SPDX-License-Identifier: MIT
// The syntax tree of bpftrace's language, as the parser (bt_parse.cpp) builds
// it and the compiler (bt_compile.cpp) reads it. Private to those two files:
// the rest of uprobe-trace sees compile() and the compact form (bt_lang.hpp,
// bt_vm.hpp). Not thread-safe (a tree belongs to one compile() call).
#pragma once

#include <cctype>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace uptrace::bt::ast {

struct Pos {
  int line = 1, col = 1, end = 2;  // end: one past the last column (on end_line)
  int end_line = 0;                // 0: `line` (bpftrace shows a span over lines as "stdin:L1-L2:", no source)
};

struct CompileError {
  Pos pos;
  std::string msg;
};

/// Ends parsing or compiling with an error at `p` (caught by compile()).
[[noreturn]] inline void fail(Pos p, const std::string& m) { throw CompileError{p, m}; }

/// Every error of the attach points (bpftrace checks them all in a pass of
/// their own, before the probes' bodies, and prints each).
struct CompileErrors {
  std::vector<CompileError> all;
};

// ---------------------------------------------------------------- AST

enum class EK { num, str, builtin, var, map, call, unary, binary, land, lor, ternary, cast };

struct Expr {
  EK k;
  Pos pos;
  std::string name;  // builtin / var / map / call name; str: the text; unary/binary: the operator
  std::int64_t num = 0;
  std::vector<std::unique_ptr<Expr>> kids;  // map keys, call args, operands
  int bits = 64;
  bool sgn = true;  // cast
  int call_end = 0;  // call: one past its ')'
  int call_end_line = 0;  // call: its ')' line when not pos.line
  int param = 0;             // num: a positional parameter $N (its value in num when numeric)
  bool param_not_numeric = false;  // ... given a value that is not a number (name: the value)
  Pos call() const { return Pos{pos.line, pos.col, call_end ? call_end : pos.end, call_end_line}; }
  /// The last line of this expression's place (`pos` or, for a call, its ')').
  int last_line() const { return call_end_line ? call_end_line : pos.end_line ? pos.end_line : pos.line; }
};
using ExprP = std::unique_ptr<Expr>;

/// while_: value the condition, then_ the body; unroll: value the count (a
/// number), then_ the body; jump: name "break", "continue" or "return".
enum class SK { var_assign, map_assign, expr, if_, while_, unroll, jump };

struct StmtA {
  SK k;
  Pos pos;
  Pos assign_pos;  // an assignment's `=` (where bpftrace places a variable's type mismatch)
  ExprP target;  // $var or @map
  ExprP value;   // or the expression / condition
  // An update (`@m[k]++`, `--$v`, `@m[k] += e`, ...): value is then
  // `target OP e`; upd the operator ("+", "-", "*", ...), delta what a
  // `+`/`-` update adds (e, -e, 1 or -1); incdec: ++ or --.
  std::string upd;
  ExprP delta;
  bool incdec = false;
  std::vector<std::unique_ptr<StmtA>> then_, else_;
  std::string name;  // jump: break, continue, return
};
using StmtP = std::unique_ptr<StmtA>;

struct ProbeA {
  struct Point {
    std::string text;
    Pos pos;
  };
  std::vector<Point> points;
  ExprP pred;
  std::vector<StmtP> body;
};

/// A character that may continue an identifier.
inline bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

/// bpftrace functions and builtins that uprobe-trace refuses by name (with
/// their own message, before the generic "unknown function").
extern const std::set<std::string> kUnsupportedFns;
extern const std::set<std::string> kUnsupportedBuiltins;

/// Parses a whole program (probes in source order). Throws CompileError
/// (syntax errors, with bpftrace 0.17's words and positions).
/// `params`: bpftrace's positional parameters ($1, $2, ...; $# their count).
std::vector<ProbeA> parse(const std::string& text, const std::vector<std::string>& params = {});

}  // namespace uptrace::bt::ast
