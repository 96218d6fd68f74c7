// SPDX-License-Identifier: MIT
// bpftrace's language for uprobe-trace, part 2 of 3 (continued): the
// compiler's statements and expressions (bt_compiler.hpp), each into the
// compact form's nodes (bt_form.hpp), with bpftrace 0.17's errors.

#include "bt_compiler.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace uptrace::bt::detail {

namespace {

/// A map's aggregation as a type: what bpftrace refuses in arithmetic,
/// comparisons, conditions, casts and printf() (it can only be printed,
/// assigned, or be a key).
bool is_agg_type(const std::string& t) {
  return t == "count" || t == "sum" || t == "avg" || t == "min" || t == "max" || t == "stats" || t == "hist" ||
         t == "lhist";
}

bool is_signed_int_type(const std::string& t) { return t.rfind("int", 0) == 0; }

}  // namespace

// ---- statements
std::int32_t Compiler::stmt(StmtA& s) {
  Stmt st{};
  switch (s.k) {
    case SK::if_: {
      st.op = StmtOp::if_;
      if (if_depth_ >= kMaxIfDepth)
        fail(Pos{s.pos.line, s.pos.col, s.pos.col + 2},
             "if statements nested too deeply (at most " + std::to_string(kMaxIfDepth) +
                 " levels, else if included: the probe runs on the traced thread's stack)");
      st.a = expr(*s.value);
      // (bpftrace 0.17 gives this error no location: line 1, column 1, nothing under it)
      if (nodes_[static_cast<std::size_t>(st.a)].is_str) fail(Pos{1, 1, 1}, "Invalid condition in if(): string");
      if (is_agg_type(type_of(st.a))) fail(Pos{1, 1, 1}, "Invalid condition in if(): " + type_of(st.a));
      std::vector<std::int32_t> t, e;
      ++if_depth_;
      for (auto& x : s.then_) t.push_back(stmt(*x));
      for (auto& x : s.else_) e.push_back(stmt(*x));
      --if_depth_;
      st.b = list(t), st.c = static_cast<std::int32_t>(t.size());
      st.d = list(e), st.e = static_cast<std::int32_t>(e.size());
      return push(st);
    }
    case SK::while_:
    case SK::unroll: {
      if (if_depth_ >= kMaxIfDepth)
        fail(s.pos, "loops and if statements nested too deeply (at most " + std::to_string(kMaxIfDepth) +
                        " levels: the probe runs on the traced thread's stack)");
      if (s.k == SK::unroll) {
        st.op = StmtOp::unroll;
        if (s.value->num > 100) fail(s.pos, "unroll maximum value is 100");
        if (s.value->num < 1) fail(s.pos, "unroll minimum value is 1");
        st.a = static_cast<std::int32_t>(s.value->num);
      } else {
        st.op = StmtOp::while_;
        st.a = expr(*s.value);
        // (bpftrace 0.17 compiles these, and the kernel refuses to load them)
        if (nodes_[static_cast<std::size_t>(st.a)].is_str)
          fail(s.value->pos, "Invalid condition in while(): string");
        if (is_agg_type(type_of(st.a))) fail(s.value->pos, "Invalid condition in while(): " + type_of(st.a));
      }
      std::vector<std::int32_t> body;
      ++if_depth_;
      if (s.k == SK::while_) ++loop_depth_;
      for (auto& x : s.then_) body.push_back(stmt(*x));
      if (s.k == SK::while_) --loop_depth_;
      --if_depth_;
      st.b = list(body), st.c = static_cast<std::int32_t>(body.size());
      return push(st);
    }
    case SK::jump: {
      st.op = StmtOp::jump;
      st.a = s.name == "break" ? kJumpBreak : s.name == "continue" ? kJumpContinue : kJumpReturn;
      if (st.a != kJumpReturn && loop_depth_ == 0) fail(s.pos, s.name + " used outside of a loop");
      return push(st);
    }
    case SK::var_assign: {
      st.op = StmtOp::set_var;
      st.b = expr(*s.value);
      const bool is_s = nodes_[static_cast<std::size_t>(st.b)].is_str != 0;
      const std::string& name = s.target->name;
      // (bpftrace 0.17's error: a string for an integer, or the reverse; an
      // aggregation's type for another, `$x = @c` having made $x a count)
      const bool other_kind = is_s ? vars_.count(name) != 0 : svars_.count(name) != 0;
      const bool other_agg = !is_s && vars_.count(name) && var_type_[name] != type_of(st.b) &&
                             (is_agg_type(var_type_[name]) || is_agg_type(type_of(st.b)));
      if (other_kind || other_agg)
        fail(s.assign_pos, "Type mismatch for " + name + ": trying to assign value of type '" + type_of(st.b) +
                               "' when variable already contains a value of type '" + var_type_[name] + "'");
      st.a = is_s ? svar_slot(name, s.target->pos) : var_slot(name, s.target->pos, true);
      var_type_[name] = type_of(st.b);  // (the last assigned, as bpftrace: a string takes the larger size)
      st.c = is_s ? 1 : 0;
      return push(st);
    }
    case SK::map_assign: {
      std::int32_t mi = -1;
      const MapInfo* m = find_map(s.target->name, mi);
      st.op = StmtOp::map_agg;
      st.a = mi;
      st.b = key_list(*s.target, *m);
      st.c = static_cast<std::int32_t>(s.target->kids.size());
      const Expr& v = *s.value;
      if (m->from_update) {  // a sum of the deltas
        st.d = expr(*s.delta);
        if (nodes_[static_cast<std::size_t>(st.d)].is_str)
          fail(s.delta->pos, "maps of strings are not supported by uprobe-trace yet");
      } else if (m->agg == Agg::assign) {
        st.d = expr(v);
        if ((nodes_[static_cast<std::size_t>(st.d)].is_str != 0) != m->value_is_str)  // (define_maps() checked)
          fail(v.pos, "Type mismatch for " + m->name + ": a string and an integer value");
      } else if (!v.kids.empty()) {
        st.d = expr(*v.kids[0]);
        if (nodes_[static_cast<std::size_t>(st.d)].is_str) fail(v.kids[0]->pos, v.name + "() expects an integer");
      }
      return push(st);
    }
    case SK::expr: {
      const Expr& e = *s.value;
      if (e.k == EK::call && e.name == "printf") return printf_stmt(e);
      if (e.k == EK::call && e.name == "print") {
        if (e.kids.size() != 1 || e.kids[0]->k != EK::map || !e.kids[0]->kids.empty())
          fail(e.call(), "print() of a whole map (print(@name)) is all uprobe-trace supports yet");
        std::int32_t mi = -1;
        if (!find_map(e.kids[0]->name, mi)) fail(e.kids[0]->pos, "Undefined map: " + e.kids[0]->name);
        st.op = StmtOp::print_map;
        st.a = mi;
        return push(st);
      }
      if (e.k == EK::call && (e.name == "delete" || e.name == "clear" || e.name == "zero")) return map_op_stmt(e);
      if (e.k == EK::call && e.name == "time") return time_stmt(e);
      if (e.k == EK::call && e.name == "exit") {
        if (!e.kids.empty()) fail(e.pos, "exit() takes no arguments");
        st.op = StmtOp::exit_;
        return push(st);
      }
      if (e.k == EK::call && is_agg_fn(e.name))
        fail(e.call(), e.name + "() should be directly assigned to a map");
      st.op = StmtOp::expr;
      st.a = expr(e);
      return push(st);
    }
  }
  return -1;
}

std::int32_t Compiler::map_op_stmt(const Expr& e) {
  if (e.kids.size() != 1)
    fail(e.call(), e.name + "() requires one argument (" + std::to_string(e.kids.size()) + " provided)");
  const Expr& m = *e.kids[0];
  if (m.k != EK::map) fail(e.call(), e.name + "() expects a map to be provided");
  if (e.name != "delete" && !m.kids.empty())
    fail(e.call(), "The map passed to " + e.name + "() should not be indexed by a key");
  std::int32_t mi = -1;
  const MapInfo* info = find_map(m.name, mi);
  if (!info) fail(e.call(), "Undefined map: " + m.name);
  Stmt st{};
  st.a = mi;
  if (e.name == "delete") {
    st.op = StmtOp::map_delete;
    st.b = key_list(m, *info);
    st.c = static_cast<std::int32_t>(m.kids.size());
    st.d = std::any_of(m.kids.begin(), m.kids.end(),
                       [](const ExprP& k) { return k->k == EK::builtin && k->name == "tid"; }) ? 1 : 0;
  } else {
    st.op = e.name == "clear" ? StmtOp::map_clear : StmtOp::map_zero;
  }
  return push(st);
}

// time([FORMAT]): bpftrace's time(), the format a string literal
// (default "%H:%M:%S\n"), printed by the CLI (strftime of the local time).
// bpftrace's limit on a string literal (printf()'s format excepted): 63
// bytes and its NUL.
void Compiler::check_string_size(const Expr& e) {
  if (e.k == EK::str && e.name.size() > kStrDefault - 1)
    fail(e.pos, "String is too long (over " + std::to_string(kStrDefault) + " bytes): " + e.name);
}

std::int32_t Compiler::time_stmt(const Expr& e) {
  if (e.kids.size() > 1)
    fail(e.call(), "time() takes up to one argument (" + std::to_string(e.kids.size()) + " provided)");
  if (!e.kids.empty() && e.kids[0]->k != EK::str) {
    const std::int32_t n = expr(*e.kids[0]);
    const Node& nd = nodes_[static_cast<std::size_t>(n)];
    const std::string t = nd.is_str ? "string" : nd.vt == kVtStack ? "ustack" : nd.vt == kVtUsym ? "usym"
                          : is_agg_type(type_of(n)) ? type_of(n) : "integer";
    fail(e.call(), "time() expects a string literal (" + t + " provided)");
  }
  if (!e.kids.empty()) check_string_size(*e.kids[0]);
  FmtDesc fd{};
  fd.text = str(e.kids.empty() ? std::string("%H:%M:%S\n") : e.kids[0]->name);
  fmts_.push_back(fd);
  Stmt st{};
  st.op = StmtOp::time_;
  st.a = static_cast<std::int32_t>(fmts_.size() - 1);
  return push(st);
}

std::int32_t Compiler::printf_stmt(const Expr& e) {
  if (e.kids.empty() || e.kids[0]->k != EK::str) fail(e.call(), "printf() expects a string literal as first argument");
  std::vector<FmtPiece> pieces;
  std::string err;
  if (!parse_format(e.kids[0]->name, pieces, err)) fail(e.kids[0]->pos, "printf: " + err);
  FmtDesc fd{};
  fd.text = str(e.kids[0]->name);
  std::vector<std::int32_t> args;
  std::size_t k = 1;
  for (const FmtPiece& p : pieces) {
    if (!p.conv) continue;
    if (k >= e.kids.size()) {
      std::size_t want = 0;
      for (const FmtPiece& q : pieces) want += q.conv != 0;
      fail(e.call(), "printf: Not enough arguments for format string (" + std::to_string(e.kids.size() - 1) +
                         " supplied, " + std::to_string(want) + " expected)");
    }
    allow_special_ = true;
    std::int32_t n = expr(*e.kids[k]);
    const std::uint8_t vt = nodes_[static_cast<std::size_t>(n)].vt;
    const bool is_s = nodes_[static_cast<std::size_t>(n)].is_str != 0 || vt != kVtPlain;
    const bool agg = is_agg_type(type_of(n));
    if (agg || (p.conv == 's') != is_s)
      fail(e.call(), std::string("printf: %") + p.conv + " specifier expects a value of type " +
                         (p.conv == 's' ? "string" : "integer") + " (" +
                         (agg ? type_of(n) : is_s ? "string" : "integer") + " supplied)");
    if (fd.nargs >= kMaxPrintfArgs) fail(e.pos, "printf: too many arguments");
    if (vt == kVtStack) {
      unsigned limit;
      bool perf;
      stack_type(*e.kids[k], limit, perf);
      fd.arg_limit[fd.nargs] = static_cast<std::uint16_t>(limit);
    }
    if (vt == kVtTime) fd.arg_limit[fd.nargs] = static_cast<std::uint16_t>(nodes_[static_cast<std::size_t>(n)].imm);
    fd.arg_is_str[fd.nargs++] = vt == kVtStack ? 2 : vt == kVtUsym ? 3 : vt == kVtTime ? 4 : is_s ? 1 : 0;
    args.push_back(n);
    ++k;
  }
  if (k < e.kids.size()) fail(e.call(), "printf: Too many arguments for format string (" +
                                         std::to_string(e.kids.size() - 1) + " supplied, " +
                                         std::to_string(k - 1) + " expected)");
  fmts_.push_back(fd);
  Stmt st{};
  st.op = StmtOp::printf_;
  st.a = static_cast<std::int32_t>(fmts_.size() - 1);
  st.b = list(args);
  st.c = static_cast<std::int32_t>(args.size());
  return push(st);
}

std::int32_t Compiler::svar_slot(const std::string& name, Pos pos) {
  auto it = svars_.find(name);
  if (it != svars_.end()) return it->second;
  if (svars_.size() >= kMaxStrVars) fail(pos, "too many string $variables (at most " + std::to_string(kMaxStrVars) + ")");
  const auto slot = static_cast<std::int32_t>(svars_.size());
  svars_[name] = slot;
  return slot;
}

std::int32_t Compiler::var_slot(const std::string& name, Pos pos, bool define) {
  auto it = vars_.find(name);
  if (it != vars_.end()) return it->second;
  if (!define) fail(pos, "Undefined or undeclared variable: " + name);
  if (vars_.size() >= kMaxVars) fail(pos, "too many $variables");
  const auto slot = static_cast<std::int32_t>(vars_.size());
  vars_[name] = slot;
  return slot;
}

// ---- expressions
std::int32_t Compiler::expr(const Expr& e, unsigned depth) {
  if (depth > kMaxDepth - 8) fail(e.pos, "expression nested too deeply");
  const bool special_ok = allow_special_;  // (for this expression, not its operands)
  allow_special_ = false;
  std::int32_t r = expr_inner(e, depth);
  node_type_.resize(nodes_.size());
  node_type_[static_cast<std::size_t>(r)] = node_type(e, r);
  if (!special_ok && nodes_[static_cast<std::size_t>(r)].vt != kVtPlain)
    fail(e.k == EK::call ? e.call() : e.pos,
         nodes_[static_cast<std::size_t>(r)].vt == kVtTime
             ? std::string("strftime() here is not supported by uprobe-trace yet: only as a printf() %s argument")
             : (nodes_[static_cast<std::size_t>(r)].vt == kVtStack ? std::string("ustack") : std::string("usym()")) +
                   " here is not supported by uprobe-trace yet: only as a map key or a printf() %s argument");
  return r;
}

std::string Compiler::node_type(const Expr& e, std::int32_t r) const {
  const Node& n = nodes_[static_cast<std::size_t>(r)];
  switch (e.k) {
    case EK::num: return "int64";
    case EK::str: return "string[" + std::to_string(e.name.size() + 1) + "]";
    case EK::builtin:
      if (e.name == "comm") return "string[16]";
      if (e.name == "func") return "usym";
      if (e.name == "probe") return "probe";
      if (e.name == "ustack") return "ustack";
      return "unsigned int64";
    case EK::var: {
      auto it = var_type_.find(e.name);
      if (svars_.count(e.name)) return it != var_type_.end() ? it->second : "string[64]";
      return it != var_type_.end() ? it->second : "int64";
    }
    case EK::map: {
      const MapInfo& m = maps_[static_cast<std::size_t>(n.a)];
      if (m.agg != Agg::assign)
        return m.from_update ? (m.value_signed ? "int64" : "unsigned int64") : agg_type_name(m.agg);
      if (!m.value_agg.empty()) return m.value_agg;
      return m.value_is_str ? m.value_type : m.value_signed ? "int64" : "unsigned int64";
    }
    case EK::call:
      if (e.name == "str") return "string[64]";
      if (e.name == "usym") return "usym";
      if (e.name == "strftime") return "timestamp";
      return "ustack";
    case EK::unary: return e.name == "!" ? "unsigned int64" : type_of(n.a);
    case EK::land:
    case EK::lor: return "int64";
    case EK::ternary: return type_of(n.b);
    case EK::cast: return (e.sgn ? "int" : "unsigned int") + std::to_string(e.bits);
    case EK::binary:
      return is_signed_int_type(type_of(n.a)) && is_signed_int_type(type_of(n.b)) ? "int64" : "unsigned int64";
  }
  return "int64";
}

std::int32_t Compiler::leaf(Op op, bool is_str, bool sgn, std::int64_t imm) {
  Node n{};
  n.op = op;
  n.is_str = is_str;
  n.imm = imm;
  std::int32_t r = node(n);
  node_signed_.resize(nodes_.size());
  node_signed_[static_cast<std::size_t>(r)] = sgn;
  return r;
}

std::int32_t Compiler::expr_inner(const Expr& e, unsigned depth) {
  switch (e.k) {
    case EK::num:
      if (e.param_not_numeric)
        fail(e.pos, "$" + std::to_string(e.param) + " used numerically but given \"" + e.name + "\". Try using str($" +
                        std::to_string(e.param) + ").");
      return leaf(Op::num, false, true, e.num);
    case EK::str: {
      check_string_size(e);
      std::int32_t r = leaf(Op::str, true, false);
      nodes_[static_cast<std::size_t>(r)].a = static_cast<std::int32_t>(str(e.name));
      return r;
    }
    case EK::builtin: return builtin(e);
    case EK::var: {
      if (auto sv = svars_.find(e.name); sv != svars_.end()) {
        std::int32_t r = leaf(Op::var, true, false);
        nodes_[static_cast<std::size_t>(r)].a = sv->second;
        return r;
      }
      std::int32_t slot = var_slot(e.name, e.pos, false);
      std::int32_t r = leaf(Op::var, false, true);
      nodes_[static_cast<std::size_t>(r)].a = slot;
      return r;
    }
    case EK::map: {
      std::int32_t mi = -1;
      const MapInfo* m = find_map(e.name, mi);
      if (!m) fail(e.pos, "Undefined map: " + e.name);
      // (A map of strings is read from the hit's thread's table, as every
      // map in a probe of a program: the CLI has no string merge for
      // BEGIN, END and interval.)
      if (m->value_is_str && cur_kind_ != ProbeKind::uprobe && cur_kind_ != ProbeKind::uretprobe &&
          cur_kind_ != ProbeKind::usdt)
        fail(e.pos, "reading a map of strings in BEGIN, END and interval probes is not supported by uprobe-trace yet");
      if (m->agg == Agg::hist || m->agg == Agg::lhist || m->agg == Agg::stats)
        fail(e.pos, "reading a " + std::string(m->agg == Agg::stats ? "stats()" : "histogram") +
                        " map in an expression is not supported");
      const std::int32_t keys = key_list(e, *m, depth);
      const bool is_str = m->value_is_str != 0;
      std::int32_t r = leaf(Op::map_read, is_str, !is_str);
      Node& n = nodes_[static_cast<std::size_t>(r)];
      n.a = mi, n.b = keys, n.c = static_cast<std::int32_t>(e.kids.size());
      return r;
    }
    case EK::call: {
      if (e.name == "printf" || e.name == "exit" || is_agg_fn(e.name))
        fail(e.pos, e.name + "() cannot be used in an expression");
      if (e.name == "delete" || e.name == "clear" || e.name == "zero" || e.name == "time")
        fail(e.call(), e.name + "() should not be used in an assignment or as a map key");
      if (e.name == "str") {
        if (e.kids.empty() || e.kids.size() > 2)
          fail(e.call(), (e.kids.empty() ? "str() requires at least one argument (" : "str() takes up to 2 arguments (") +
                             std::to_string(e.kids.size()) + " provided)");
        std::int32_t a = expr(*e.kids[0], depth + 1);
        if (nodes_[static_cast<std::size_t>(a)].is_str) fail(e.kids[0]->pos, "str() expects an integer or a pointer");
        if (is_agg_type(type_of(a)))
          fail(e.call(), "str() expects an integer or a pointer type as first argument (" + type_of(a) + " provided)");
        std::int32_t b = e.kids.size() > 1 ? expr(*e.kids[1], depth + 1) : -1;
        if (b >= 0 && nodes_[static_cast<std::size_t>(b)].is_str) fail(e.kids[1]->pos, "str() expects an integer length");
        std::int32_t r = leaf(Op::str_read, true, false);
        nodes_[static_cast<std::size_t>(r)].a = a;
        nodes_[static_cast<std::size_t>(r)].b = b;
        return r;
      }
      if (e.name == "ustack") return ustack_node(e);
      if (e.name == "strftime") return strftime_node(e, depth);
      if (e.name == "usym") {
        if (e.kids.size() != 1)
          fail(e.call(), "usym() requires one argument (" + std::to_string(e.kids.size()) + " provided)");
        std::int32_t a = expr(*e.kids[0], depth + 1);
        if (nodes_[static_cast<std::size_t>(a)].is_str) fail(e.call(), "usym() expects an integer or pointer argument");
        std::int32_t r = leaf(Op::usym, false, false);
        nodes_[static_cast<std::size_t>(r)].a = a;
        nodes_[static_cast<std::size_t>(r)].vt = kVtUsym;
        return r;
      }
      if (kUnsupportedFns.count(e.name))
        fail(e.pos, e.name + "() is not supported by uprobe-trace yet");
      fail(e.pos, "Unknown function: " + e.name);
    }
    case EK::unary: {
      std::int32_t a = expr(*e.kids[0], depth + 1);
      if (nodes_[static_cast<std::size_t>(a)].is_str || is_agg_type(type_of(a)))  // (at the operator, as bpftrace's)
        fail(Pos{e.pos.line, e.pos.col, e.pos.col + 1},
             "The " + e.name + " operator can not be used on expressions of type '" + type_of(a) + "'");
      // (- and ~ keep the operand's type, as in bpftrace: -arg0 is unsigned)
      std::int32_t r = leaf(Op::unary, false, e.name == "!" ? false : signed_node(a));
      Node& n = nodes_[static_cast<std::size_t>(r)];
      n.sub = static_cast<std::uint8_t>(e.name[0]);
      n.a = a;
      return r;
    }
    case EK::land:
    case EK::lor: {
      std::int32_t a = expr(*e.kids[0], depth + 1), b = expr(*e.kids[1], depth + 1);
      if (is_agg_type(type_of(a)) || is_agg_type(type_of(b)) || nodes_[static_cast<std::size_t>(a)].is_str ||
          nodes_[static_cast<std::size_t>(b)].is_str)  // (bpftrace's: both integers)
        fail(e.pos, "Type mismatch for '" + std::string(e.k == EK::land ? "&&" : "||") + "': comparing '" + type_of(a) +
                        "' with '" + type_of(b) + "'");
      std::int32_t r = leaf(e.k == EK::land ? Op::land : Op::lor, false, true);
      nodes_[static_cast<std::size_t>(r)].a = a;
      nodes_[static_cast<std::size_t>(r)].b = b;
      return r;
    }
    case EK::ternary: {
      std::int32_t c = expr(*e.kids[0], depth + 1), a = expr(*e.kids[1], depth + 1),
                   b = expr(*e.kids[2], depth + 1);
      const bool sa = nodes_[static_cast<std::size_t>(a)].is_str, sb = nodes_[static_cast<std::size_t>(b)].is_str;
      if (nodes_[static_cast<std::size_t>(c)].is_str) fail(e.pos, "Invalid condition in ternary: string");
      if (is_agg_type(type_of(c))) fail(e.pos, "Invalid condition in ternary: " + type_of(c));
      if (sa != sb) fail(e.pos, "Ternary operator must return the same type: have '" +
                                    std::string(sa ? "string" : "integer") + "' and '" +
                                    (sb ? "string" : "integer") + "'");
      std::int32_t r = leaf(Op::ternary, sa, signed_node(a) && signed_node(b));
      Node& n = nodes_[static_cast<std::size_t>(r)];
      n.a = c, n.b = a, n.c = b;
      return r;
    }
    case EK::cast: {
      std::int32_t a = expr(*e.kids[0], depth + 1);
      if (nodes_[static_cast<std::size_t>(a)].is_str || is_agg_type(type_of(a)))
        fail(e.pos, "Casts are not supported for type: \"" + type_of(a) + "\"");
      std::int32_t r = leaf(Op::cast, false, e.sgn, e.bits);
      Node& n = nodes_[static_cast<std::size_t>(r)];
      n.a = a;
      n.sub = e.sgn ? 1 : 0;
      return r;
    }
    case EK::binary: {
      std::int32_t a = expr(*e.kids[0], depth + 1), b = expr(*e.kids[1], depth + 1);
      const bool sa = nodes_[static_cast<std::size_t>(a)].is_str, sb = nodes_[static_cast<std::size_t>(b)].is_str;
      static const std::map<std::string, BinOp> kOps = {
          {"+", kAdd}, {"-", kSub}, {"*", kMul}, {"/", kDiv}, {"%", kMod}, {"&", kAnd}, {"|", kOr}, {"^", kXor},
          {"<<", kShl}, {">>", kShr}, {"==", kEq}, {"!=", kNe}, {"<", kLt}, {"<=", kLe}, {">", kGt}, {">=", kGe}};
      const BinOp op = kOps.at(e.name);
      if (is_agg_type(type_of(a)) || is_agg_type(type_of(b)) || sa != sb)
        fail(e.pos, "Type mismatch for '" + e.name + "': comparing '" + type_of(a) + "' with '" + type_of(b) + "'");
      if (sa || sb) {
        if (op != kEq && op != kNe) fail(e.pos, "The " + e.name + " operator can not be used on strings");
      }
      const bool sgn = signed_node(a) && signed_node(b);
      const bool cmp = op >= kEq;
      std::int32_t r = leaf(Op::binary, false, cmp ? false : sgn, sgn ? 1 : 0);
      Node& n = nodes_[static_cast<std::size_t>(r)];
      n.sub = op;
      n.a = a, n.b = b;
      return r;
    }
  }
  return -1;
}

// strftime(FORMAT, NS): bpftrace's, its errors; a printf() %s argument here
// (printed by the CLI: the local time at NS, %f its microseconds).
std::int32_t Compiler::strftime_node(const Expr& e, unsigned depth) {
  if (e.kids.size() < 2)
    fail(e.call(), "strftime() requires at least 2 arguments (" + std::to_string(e.kids.size()) + " provided)");
  if (e.kids.size() > 2)
    fail(e.call(), "strftime() takes up to 2 arguments (" + std::to_string(e.kids.size()) + " provided)");
  if (e.kids[0]->k != EK::str) {
    const std::int32_t f = expr(*e.kids[0], depth + 1);
    fail(e.call(), std::string("strftime() expects a string literal (") +
                       (nodes_[static_cast<std::size_t>(f)].is_str ? "string" : "integer") + " provided)");
  }
  check_string_size(*e.kids[0]);
  const std::int32_t a = expr(*e.kids[1], depth + 1);
  if (nodes_[static_cast<std::size_t>(a)].is_str || nodes_[static_cast<std::size_t>(a)].vt != kVtPlain ||
      is_agg_type(type_of(a)))
    fail(e.call(), "strftime() only supports integer arguments (" +
                       std::string(nodes_[static_cast<std::size_t>(a)].is_str ? "string" : type_of(a)) + " provided)");
  if (fmts_.size() >= 0xffff) fail(e.call(), "too many formats");
  FmtDesc fd{};
  fd.text = str(e.kids[0]->name);
  fmts_.push_back(fd);
  std::int32_t r = leaf(Op::strftime_, false, false, static_cast<std::int64_t>(fmts_.size() - 1));
  nodes_[static_cast<std::size_t>(r)].a = a;
  nodes_[static_cast<std::size_t>(r)].vt = kVtTime;
  return r;
}

std::int32_t Compiler::ustack_node(const Expr& e) {
  unsigned limit;
  bool perf;
  stack_type(e, limit, perf);
  if (cur_kind_ != ProbeKind::uprobe && cur_kind_ != ProbeKind::uretprobe && cur_kind_ != ProbeKind::usdt)
    fail(e.k == EK::call ? e.call() : e.pos,
         "ustack in BEGIN, END and interval probes is not supported by uprobe-trace (they run in the CLI)");
  std::int32_t r = leaf(Op::ustack, false, false, limit);
  nodes_[static_cast<std::size_t>(r)].sub = perf ? 1 : 0;
  nodes_[static_cast<std::size_t>(r)].vt = kVtStack;
  return r;
}

std::int32_t Compiler::builtin(const Expr& e) {
  const std::string& n = e.name;
  if (n == "ustack") return ustack_node(e);
  static const std::map<std::string, Op> kOps = {
      {"retval", Op::retval}, {"pid", Op::pid},     {"tid", Op::tid},     {"uid", Op::uid},
      {"comm", Op::comm},     {"func", Op::func},   {"probe", Op::probe}, {"nsecs", Op::nsecs},
      {"elapsed", Op::elapsed}, {"cpu", Op::cpu}};
  if (n.size() == 4 && n.rfind("arg", 0) == 0 && std::isdigit(static_cast<unsigned char>(n[3]))) {
    const int k = n[3] - '0';
    if (cur_kind_ != ProbeKind::uprobe && cur_kind_ != ProbeKind::usdt)
      fail(e.pos, "The " + n + " builtin can only be used with 'kprobes', 'uprobes' and 'usdt' probes");
    // A USDT argument is the note's spec (uprobe::usdt::ArgSpec: a register,
    // a memory operand, a constant), evaluated at the site by the agent.
    if (k > 5 && cur_kind_ != ProbeKind::usdt)
      fail(e.pos, "x86_64 doesn't support " + n);  // (bpftrace 0.17's: sarg0... are the stack's)
    return leaf(Op::arg, false, false, k);
  }
  if (n.size() == 5 && n.rfind("sarg", 0) == 0 && std::isdigit(static_cast<unsigned char>(n[4]))) {
    if (cur_kind_ != ProbeKind::uprobe)
      fail(e.pos, "The " + n + " builtin can only be used with 'kprobes' and 'uprobes' probes");
    return leaf(Op::sarg, false, false, n[4] - '0');
  }
  auto it = kOps.find(n);
  if (it == kOps.end()) {
    if (kUnsupportedBuiltins.count(n)) fail(e.pos, n + " is not supported by uprobe-trace yet");
    fail(e.pos, "Unknown identifier: '" + n + "'");
  }
  if (it->second == Op::func &&
      (cur_kind_ == ProbeKind::begin || cur_kind_ == ProbeKind::end || cur_kind_ == ProbeKind::interval))
    fail(e.pos, "The func builtin can not be used with '" +
                    std::string(cur_kind_ == ProbeKind::begin ? "BEGIN" : cur_kind_ == ProbeKind::end ? "END" : "interval") +
                    "' probes");
  if (it->second == Op::retval && cur_kind_ != ProbeKind::uretprobe)
    fail(e.pos, "The retval builtin can only be used with 'kretprobe' and 'uretprobe' probes");
  const bool is_str = it->second == Op::comm || it->second == Op::func || it->second == Op::probe;
  return leaf(it->second, is_str, false);
}

}  // namespace uptrace::bt::detail
