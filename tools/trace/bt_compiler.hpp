// SPDX-License-Identifier: MIT
#pragma once
// bpftrace's language for uprobe-trace: the compiler from the tree
// (bt_ast.hpp) to the compact form (bt_form.hpp), shared by its two files:
// bt_compile.cpp (the program's layout, attach points, maps) and
// bt_compile_code.cpp (statements and expressions).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bt_ast.hpp"
#include "bt_lang.hpp"

namespace uptrace::bt::detail {

using namespace ast;

struct MapInfo {
  std::string name;
  Agg agg;
  std::vector<std::uint8_t> key_kinds;  // 0 unsigned, 1 string, 2 signed, 3 ustack, 4 usym (MapDesc::key_is_str)
  unsigned stack_limit = 0;  // the ustack component's type: ustack(perf?, limit)
  bool stack_perf = false;
  bool value_is_str = false;  // `@m[k] = STRING`
  std::string value_type;     // assign: the value's type as bpftrace names it (errors)
  std::string value_agg;      // assign of an aggregation's map (`@x = @c`): its type ("count", ...), which @x takes
  std::int64_t lmin = 0, lmax = 0, lstep = 1;
  bool value_signed = true;
  Pos pos;
  bool from_update = false;  // a sum made of `+`/`-` updates (@m++, @m -= e) only
};

bool is_agg_fn(const std::string& n);

/// An aggregation's map's type as bpftrace names it in errors ("count",
/// "sum", ..., "lhist"); "int64" for a plain assigned value.
inline const char* agg_type_name(Agg a) {
  static const char* const kNames[] = {"count", "sum", "avg", "min", "max", "stats", "hist", "lhist", "int64"};
  return kNames[static_cast<int>(a)];
}

// ustack's arguments, as bpftrace 0.17 takes them: ustack, ustack(N),
// ustack(MODE), ustack(MODE, N), MODE `bpftrace` or `perf`, N an integer
// literal; N is at most kMaxFrames here (bpftrace takes up to 1024, and its
// stack map then needs kernel.perf_event_max_stack at least N: 127 by default).
void stack_type(const Expr& e, unsigned& limit, bool& perf);

class Compiler {
 public:
  Compiler(TargetExists target_exists = nullptr, const void* ctx = nullptr)
      : target_exists_(target_exists), target_ctx_(ctx) {}
  Compiled run(std::vector<ProbeA>& probes);

 private:
  std::uint32_t str(const std::string& s) {
    const auto off = static_cast<std::uint32_t>(strtab_.size());
    strtab_.insert(strtab_.end(), s.begin(), s.end());
    strtab_.push_back('\0');
    return off;
  }
  std::int32_t list(const std::vector<std::int32_t>& v) {
    const auto at = static_cast<std::int32_t>(lists_.size());
    lists_.insert(lists_.end(), v.begin(), v.end());
    return at;
  }

  AttachPoint attach_point(const std::string& t, Pos pos, std::uint32_t pi, std::int64_t& interval_ns);

  // ---- maps
  void define_maps(StmtA& s);

  // bpftrace 0.17's name of a value's type in its errors.
  std::string type_name(const Expr& e);

  // A map's key kinds (and the type of its ustack component) from a use.
  void key_kinds(const Expr& m, MapInfo& mi);

  // Two uses of a map whose key has a ustack: the same ustack type.
  void same_stack_type(const MapInfo& o, const MapInfo& mi, const Expr& m);

  // The type of an expression before compiling it: 1 string, 2 signed int,
  // 0 unsigned int, 3 ustack, 4 usym.
  std::uint8_t static_kind(const Expr& e);

  const MapInfo* find_map(const std::string& n, std::int32_t& idx);

  std::int32_t key_list(const Expr& m, const MapInfo& mi, unsigned depth = 0);

  // ---- statements
  std::int32_t push(const Stmt& s) {
    stmts_.push_back(s);
    return static_cast<std::int32_t>(stmts_.size() - 1);
  }

  std::int32_t stmt(StmtA& s);

  // delete(@m[k]), clear(@m), zero(@m), with bpftrace 0.17's errors.
  std::int32_t map_op_stmt(const Expr& e);

  std::int32_t printf_stmt(const Expr& e);
  std::int32_t time_stmt(const Expr& e);
  void check_string_size(const Expr& e);
  std::int32_t strftime_node(const Expr& e, unsigned depth);

  std::int32_t svar_slot(const std::string& name, Pos pos);

  std::int32_t var_slot(const std::string& name, Pos pos, bool define);

  // ---- expressions
  std::int32_t node(Node n) {
    nodes_.push_back(n);
    return static_cast<std::int32_t>(nodes_.size() - 1);
  }
  bool signed_node(std::int32_t n) const { return node_signed_[static_cast<std::size_t>(n)]; }

  std::int32_t expr(const Expr& e, unsigned depth = 0);

  std::int32_t leaf(Op op, bool is_str, bool sgn, std::int64_t imm = 0);

  std::int32_t expr_inner(const Expr& e, unsigned depth);

  // ustack, ustack(...): a stack of the hit (uprobes, uretprobes, usdt).
  std::int32_t ustack_node(const Expr& e);

  std::int32_t builtin(const Expr& e);

  std::vector<MapInfo> maps_;
  std::vector<Node> nodes_;
  std::vector<bool> node_signed_;
  /// Each node's type as bpftrace 0.17 names it in its errors ("int64",
  /// "unsigned int8", "string[16]", "usym", "count", ...): set by expr().
  std::vector<std::string> node_type_;
  std::map<std::string, std::string> var_type_;  // this probe's $variables' types (node_type_ of their value)
  const std::string& type_of(std::int32_t n) const { return node_type_[static_cast<std::size_t>(n)]; }
  /// bpftrace's type name for the node `r` just made for `e`.
  std::string node_type(const Expr& e, std::int32_t r) const;
  std::vector<Stmt> stmts_;
  std::vector<std::int32_t> lists_;
  std::vector<ProbeDesc> probes_;
  TargetExists target_exists_ = nullptr;
  const void* target_ctx_ = nullptr;
  std::vector<FmtDesc> fmts_;
  std::vector<char> strtab_;
  std::map<std::string, std::int32_t> vars_, svars_;  // this probe's integer and string $variables
  std::map<std::string, std::uint8_t> var_kinds_;  // define_maps(): this probe's $variables' static_kind()
  unsigned if_depth_ = 0;
  unsigned loop_depth_ = 0;  ///< while loops around the statement being compiled (break, continue)
  bool allow_special_ = false;  // the next expr() may be a ustack or usym() (a key component, a printf argument)
  std::uint32_t key_words_ = 0;  // words of the keys being compiled (encode_key()'s stack)
  ProbeKind cur_kind_ = ProbeKind::uprobe;
  bool cur_ret_ = false, any_ret_ = false, has_mixed_ret_ = false;
};

}  // namespace uptrace::bt::detail
