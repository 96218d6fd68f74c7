// SPDX-License-Identifier: MIT
// bpftrace's language for uprobe-trace, part 2 of 3: the checks and the
// compiler from the tree (bt_ast.hpp, built by bt_parse.cpp) to the compact
// form the agent runs (bt_vm.hpp), with bpftrace 0.17's errors; printf
// formats. The compiler's statements and expressions are in
// bt_compile_code.cpp; the CLI's printing is bt_print.cpp.

#include "bt_lang.hpp"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "bt_ast.hpp"
#include "bt_compiler.hpp"

namespace uptrace::bt {

namespace detail {

bool is_agg_fn(const std::string& n) {
  return n == "count" || n == "sum" || n == "avg" || n == "min" || n == "max" || n == "stats" || n == "hist" ||
         n == "lhist";
}

namespace {

// The words of a key component of kind `kind` (MapDesc::key_is_str).
std::uint32_t key_component_words(std::uint8_t kind, unsigned stack_limit) {
  return kind == 1 ? kStrLen / 8 : kind == 3 ? 1 + stack_limit : kind == 4 ? 2 : 1;
}

bool is_ustack(const Expr& e) { return (e.k == EK::builtin || e.k == EK::call) && e.name == "ustack"; }

}  // namespace

void stack_type(const Expr& e, unsigned& limit, bool& perf) {
  limit = kMaxFrames;
  perf = false;
  if (e.k != EK::call) return;
  if (e.kids.size() > 2) fail(e.call(), "ustack() takes up to 2 arguments (" + std::to_string(e.kids.size()) + " provided)");
  std::size_t k = 0;
  if (!e.kids.empty() && e.kids[0]->k == EK::builtin && (e.kids[0]->name == "perf" || e.kids[0]->name == "bpftrace")) {
    perf = e.kids[0]->name == "perf";
    ++k;
  }
  if (k < e.kids.size()) {
    const Expr& n = *e.kids[k];
    if (n.k == EK::builtin && n.name != "perf" && n.name != "bpftrace" && n.name.rfind("arg", 0) != 0 &&
        n.name != "retval" && n.name != "pid" && n.name != "tid")
      fail(n.pos, "Unknown identifier: '" + n.name + "'");
    if (n.k != EK::num)  // (bpftrace 0.17's words)
      fail(e.call(), std::string("ustack() expects a integer literal (") +
                         (n.k == EK::builtin && (n.name == "perf" || n.name == "bpftrace") ? "stack mode"
                          : n.k == EK::str                                                ? "string"
                                                                                           : "integer") +
                         " provided)");
    if (n.num > 1024) fail(e.call(), "ustack([int limit]): limit shouldn't exceed 1024, " + std::to_string(n.num) + " given");
    if (n.num < 1 || n.num > static_cast<std::int64_t>(kMaxFrames))
      fail(e.call(), "ustack([int limit]): a limit of " + std::to_string(n.num) + " is not supported by uprobe-trace: 1 to " +
                         std::to_string(kMaxFrames) + " (bpftrace's stack map needs kernel.perf_event_max_stack, 127 by default, at least that)");
    limit = static_cast<unsigned>(n.num);
  }
}

Compiled Compiler::run(std::vector<ProbeA>& probes) {
  Compiled out;
  strtab_.push_back('\0');
  // The attach points first, every one (bpftrace's attach point pass: its
  // errors, all of them, come before any of the bodies'); each with its
  // interval (interval probes).
  std::vector<std::vector<std::pair<AttachPoint, std::int64_t>>> points(probes.size());
  {
    CompileErrors errs;
    for (std::size_t pi = 0; pi < probes.size(); ++pi)
      for (auto& pt : probes[pi].points) {
        std::int64_t interval_ns = 0;
        try {
          points[pi].emplace_back(attach_point(pt.text, pt.pos, static_cast<std::uint32_t>(pi), interval_ns),
                                  interval_ns);
        } catch (const CompileError& e) {
          errs.all.push_back(e);
        }
      }
    if (!errs.all.empty()) throw errs;
  }
  // Maps: first definition wins (in source order), uses must agree.
  for (auto& p : probes) {
    var_kinds_.clear();
    for (auto& s : p.body) define_maps(*s);
  }
  for (std::size_t pi = 0; pi < probes.size(); ++pi) {
    ProbeA& pa = probes[pi];
    ProbeDesc pd{};
    bool first_kind = true;
    for (const auto& [ap, interval_ns] : points[pi]) {
      if (ap.kind == ProbeKind::interval) pd.interval_ns = interval_ns;
      if (first_kind) pd.kind = ap.kind, first_kind = false;
      else if ((ap.kind == ProbeKind::uretprobe) != (pd.kind == ProbeKind::uretprobe) &&
               (ap.kind == ProbeKind::uretprobe || pd.kind == ProbeKind::uretprobe))
        has_mixed_ret_ = true;
      if (ap.kind == ProbeKind::uretprobe) any_ret_ = true;
      out.attach.push_back(ap);
    }
    cur_kind_ = pd.kind;
    cur_ret_ = any_ret_;
    any_ret_ = false;
    vars_.clear();
    svars_.clear();
    var_type_.clear();
    if (pa.pred) {
      pd.pred = expr(*pa.pred);
      if (nodes_[static_cast<std::size_t>(pd.pred)].is_str) fail(pa.pred->pos, "Invalid type for predicate: string");
    }
    std::vector<std::int32_t> body;
    for (auto& s : pa.body) body.push_back(stmt(*s));
    pd.body = list(body);
    pd.nbody = static_cast<std::int32_t>(body.size());
    pd.nvars = static_cast<std::int32_t>(vars_.size());
    pd.nsvars = static_cast<std::int32_t>(svars_.size());
    probes_.push_back(pd);
  }
  // Layout of a thread's area.
  BlobHeader h{};
  const bool events = !fmts_.empty() || std::any_of(stmts_.begin(), stmts_.end(), [](const Stmt& st) {
    return st.op == StmtOp::print_map || st.op == StmtOp::map_clear || st.op == StmtOp::map_zero ||
           (st.op == StmtOp::map_delete && !st.d);
  });
  h.ring_bytes = events ? (std::uint64_t{1} << 20) : 0;  // 1 MiB per thread that hits
  std::uint64_t off = kAreaHeaderWords + h.ring_bytes / 8;
  std::vector<MapDesc> mds;
  for (const MapInfo& mi : maps_) {
    MapDesc md{};
    md.agg = mi.agg;
    md.nkeys = static_cast<std::uint8_t>(mi.key_kinds.size());
    std::uint32_t kw = 0;
    for (std::size_t k = 0; k < mi.key_kinds.size(); ++k) {
      md.key_is_str[k] = mi.key_kinds[k];
      kw += key_component_words(mi.key_kinds[k], mi.stack_limit);
    }
    md.stack_limit = static_cast<std::uint16_t>(mi.stack_limit);
    md.stack_perf = mi.stack_perf ? 1 : 0;
    md.value_is_str = mi.value_is_str ? 1 : 0;
    md.key_words = std::max<std::uint32_t>(kw, 1);
    md.name = str(mi.name);
    md.lmin = mi.lmin, md.lmax = mi.lmax, md.lstep = mi.lstep;
    md.value_signed = mi.value_signed ? 1 : 0;
    switch (mi.agg) {
      case Agg::count: case Agg::sum: md.value_words = 1; break;
      case Agg::hist: md.value_words = kHistBuckets; break;
      case Agg::lhist: md.value_words = static_cast<std::uint32_t>((mi.lmax - mi.lmin) / mi.lstep + 2); break;
      case Agg::assign: md.value_words = mi.value_is_str ? kStrLen / 8 + 1 : 2; break;
      default: md.value_words = 2; break;
    }
    if (mi.key_kinds.empty()) {
      md.nslots = 1;
    } else {
      // (256 KiB a table; 2 MiB for a stack key, ~1 KiB a slot: 1024 stacks a thread)
      const std::uint64_t budget = mi.stack_limit > 8 ? std::uint64_t{1} << 21 : std::uint64_t{1} << 18;
      md.nslots = 64;
      while (md.nslots < 4096 && std::uint64_t{md.nslots} * 2 * md.slot_words() * 8 <= budget)
        md.nslots *= 2;
    }
    md.offset = off;
    off += std::uint64_t{md.nslots} * md.slot_words();
    mds.push_back(md);
  }
  h.area_words = off;
  h.nnodes = static_cast<std::uint32_t>(nodes_.size());
  h.nstmts = static_cast<std::uint32_t>(stmts_.size());
  h.nlists = static_cast<std::uint32_t>(lists_.size());
  h.nprobes = static_cast<std::uint32_t>(probes_.size());
  h.nmaps = static_cast<std::uint32_t>(mds.size());
  h.nfmts = static_cast<std::uint32_t>(fmts_.size());
  h.strtab = static_cast<std::uint32_t>(strtab_.size());
  auto& b = out.blob;
  auto put = [&](const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    b.insert(b.end(), c, c + n);
    b.resize((b.size() + 7) & ~std::size_t{7}, 0);
  };
  put(&h, sizeof h);
  put(nodes_.data(), nodes_.size() * sizeof(Node));
  put(stmts_.data(), stmts_.size() * sizeof(Stmt));
  put(lists_.data(), lists_.size() * sizeof(std::int32_t));
  put(probes_.data(), probes_.size() * sizeof(ProbeDesc));
  put(mds.data(), mds.size() * sizeof(MapDesc));
  put(fmts_.data(), fmts_.size() * sizeof(FmtDesc));
  put(strtab_.data(), strtab_.size());
  out.prog.load(out.blob.data(), out.blob.size());
  return out;
}

AttachPoint Compiler::attach_point(const std::string& t, Pos pos, std::uint32_t pi, std::int64_t& interval_ns) {
  AttachPoint ap{ProbeKind::uprobe, "", pi};
  // (spec: what `probe` gives in these blocks, run by the CLI)
  if (t == "BEGIN") return ap.kind = ProbeKind::begin, ap.spec = t, ap;
  if (t == "END") return ap.kind = ProbeKind::end, ap.spec = t, ap;
  const auto colon = t.find(':');
  const std::string type = t.substr(0, colon);
  if (type == "interval" || type == "i") {
    // interval:s:N, interval:ms:N (also us, hz)
    const auto c2 = colon == std::string::npos ? std::string::npos : t.find(':', colon + 1);
    const std::string unit = c2 == std::string::npos ? "" : t.substr(colon + 1, c2 - colon - 1);
    const std::string num = c2 == std::string::npos ? "" : t.substr(c2 + 1);
    char* e = nullptr;
    const long long n = num.empty() ? 0 : std::strtoll(num.c_str(), &e, 10);
    if (num.empty() || *e || n <= 0) fail(pos, "interval probe must have unit of time: interval:s:N, interval:ms:N");
    std::int64_t mult = unit == "s" ? 1000000000ll : unit == "ms" ? 1000000ll : unit == "us" ? 1000ll : 0;
    if (unit == "hz") mult = -1;
    if (mult == 0) fail(pos, unit + " is not an accepted unit of time");
    interval_ns = mult < 0 ? 1000000000ll / n : n * mult;
    ap.kind = ProbeKind::interval;
    ap.spec = "interval:" + unit + ":" + num;
    return ap;
  }
  std::string canon;
  if (type == "uprobe" || type == "u") ap.kind = ProbeKind::uprobe, canon = "uprobe";
  else if (type == "uretprobe" || type == "ur") ap.kind = ProbeKind::uretprobe, canon = "uretprobe";
  else if (type == "usdt" || type == "U") ap.kind = ProbeKind::usdt, canon = "usdt";
  else if (colon == std::string::npos && std::all_of(t.begin(), t.end(), ident_char))
    fail(pos, "Invalid probe type: " + t);
  else {
    static const std::set<std::string> kKernel = {"kprobe", "k", "kretprobe", "kr", "kfunc", "f", "kretfunc",
                                                  "fr", "tracepoint", "t", "rawtracepoint", "rt", "software",
                                                  "s", "hardware", "h", "profile", "p", "watchpoint", "w",
                                                  "asyncwatchpoint", "aw", "iter", "it"};
    if (kKernel.count(type))
      fail(pos, type + " probes are not supported by uprobe-trace: it runs in the traced program, in user "
                       "space (uprobe, uretprobe, usdt, BEGIN, END, interval)");
    fail(pos, "Invalid probe type: " + type);
  }
  const std::string rest = colon == std::string::npos ? "" : t.substr(colon + 1);
  if (rest.empty() || rest.find(':') == std::string::npos)
    fail(pos, canon + " probe type requires 2 arguments");
  // (PATH:FUNC, PATH:[PROVIDER:]NAME: one colon more is bpftrace's error, a
  // C++ name's `::` too unless quoted)
  const std::size_t colons = static_cast<std::size_t>(std::count(rest.begin(), rest.end(), ':'));
  if (rest.find('"') == std::string::npos && colons > (ap.kind == ProbeKind::usdt ? 2u : 1u))
    fail(pos, canon + (ap.kind == ProbeKind::usdt ? " probe type requires 2 or 3 arguments" : " probe type requires 2 arguments"));
  ap.spec = canon + ":" + rest;
  const std::string path = rest.substr(0, rest.find(':'));
  if (target_exists_ && path.find_first_of("*?[") == std::string::npos && !target_exists_(path, target_ctx_))
    fail(pos, (ap.kind == ProbeKind::usdt ? "usdt" : "uprobe") + std::string(" target file '") + path +
                  "' does not exist or is not executable");
  return ap;
}

void Compiler::define_maps(StmtA& s) {
  if (s.k == SK::if_ || s.k == SK::while_ || s.k == SK::unroll) {
    for (auto& t : s.then_) define_maps(*t);
    for (auto& t : s.else_) define_maps(*t);
    return;
  }
  if (s.k == SK::jump) return;
  if (s.k == SK::var_assign) {
    if (!var_kinds_.count(s.target->name)) var_kinds_[s.target->name] = static_kind(*s.value) == 1 ? 1 : 2;
    return;
  }
  if (s.k != SK::map_assign) return;
  Expr& m = *s.target;
  Expr& v = *s.value;
  MapInfo mi;
  mi.name = m.name;
  mi.pos = m.pos;
  if (!s.upd.empty()) {
    // (bpftrace 0.17: a map made by ++/-- prints signed, one made by OP= unsigned)
    mi.from_update = s.upd == "+" || s.upd == "-";
    mi.agg = mi.from_update ? Agg::sum : Agg::assign;
    mi.value_signed = s.incdec;
    key_kinds(m, mi);
    if (mi.key_kinds.size() > kMaxArgs) fail(m.pos, "too many map key components");
    for (MapInfo& o : maps_) {
      if (o.name != mi.name) continue;
      if (o.key_kinds.size() != mi.key_kinds.size())
        fail(m.pos, "Argument mismatch for " + mi.name + ": trying to access with arguments: [" +
                        std::to_string(mi.key_kinds.size()) + "] when map expects arguments: [" +
                        std::to_string(o.key_kinds.size()) + "]");
      if (o.agg != Agg::assign && !o.from_update) {
        static const char* const kNames[] = {"count", "sum", "avg", "min", "max", "stats", "hist", "lhist", "integer"};
        fail(Pos{m.pos.line, m.pos.col, m.pos.end + 2}, "The " + (s.incdec ? s.upd + s.upd : s.upd + "=") +
                                                        " operator can not be used on expressions of type '" +
                                                        kNames[static_cast<int>(o.agg)] + "'");
      }
      if (!(o.from_update && mi.from_update)) o.agg = Agg::assign, o.from_update = false;  // (read-modify-write)
      return;
    }
    maps_.push_back(mi);
    return;
  }
  if (v.k == EK::call && is_agg_fn(v.name)) {
    static const std::map<std::string, Agg> kAgg = {{"count", Agg::count}, {"sum", Agg::sum},
                                                    {"avg", Agg::avg},     {"min", Agg::min},
                                                    {"max", Agg::max},     {"stats", Agg::stats},
                                                    {"hist", Agg::hist},   {"lhist", Agg::lhist}};
    mi.agg = kAgg.at(v.name);
    const std::size_t want = v.name == "count" ? 0 : v.name == "lhist" ? 4 : 1;
    if (v.kids.size() != want)
      fail(v.call(), v.name + "() requires " + (want == 0 ? "no arguments" : want == 1 ? "one argument" :
                                             "four arguments") +
                      " (" + std::to_string(v.kids.size()) + " provided)");
    if (mi.agg == Agg::lhist) {
      std::int64_t vals[3];
      const char* names[3] = {"min", "max", "step"};
      for (int k = 0; k < 3; ++k) {
        const Expr& a = *v.kids[static_cast<std::size_t>(k) + 1];
        bool neg = a.k == EK::unary && a.name == "-" && a.kids[0]->k == EK::num;
        if (a.k != EK::num && !neg) fail(v.call(), std::string("lhist() ") + names[k] + " must be an integer literal");
        vals[k] = neg ? -a.kids[0]->num : a.num;
      }
      if (vals[0] < 0) fail(v.call(), "lhist() min must be non-negative (provided min " + std::to_string(vals[0]) + ")");
      if (vals[0] > vals[1]) fail(v.call(), "lhist() min must be less than max (provided min " +
                                             std::to_string(vals[0]) + " and max " + std::to_string(vals[1]) + ")");
      if (vals[2] <= 0) fail(v.call(), "lhist() step must be >= 1 (" + std::to_string(vals[2]) + " provided)");
      if ((vals[1] - vals[0]) / vals[2] > 1000)
        fail(v.call(), "lhist() too many buckets, must be <= 1000 (would need " +
                        std::to_string((vals[1] - vals[0]) / vals[2]) + ")");
      mi.lmin = vals[0], mi.lmax = vals[1], mi.lstep = vals[2];
    }
  } else {
    mi.agg = Agg::assign;
  }
  if (mi.agg == Agg::assign) {
    mi.value_signed = static_kind(v) == 2;
    mi.value_is_str = static_kind(v) == 1;
    mi.value_type = type_name(v);
    // `@x = @c` of an aggregation's map: @x is of its type (bpftrace's).
    if (v.k == EK::map)
      for (const MapInfo& o : maps_)
        if (o.name == v.name && o.agg != Agg::assign && !o.from_update) mi.value_agg = mi.value_type = agg_type_name(o.agg);
  } else if (mi.agg == Agg::sum)
    mi.value_signed = !v.kids.empty() && static_kind(*v.kids[0]) == 2;
  else if (mi.agg == Agg::min || mi.agg == Agg::max)
    mi.value_signed = true;  // (bpftrace 0.17 prints them signed, whatever the argument)
  key_kinds(m, mi);
  if (mi.key_kinds.size() > kMaxArgs) fail(m.pos, "too many map key components");
  for (MapInfo& o : maps_) {
    if (o.name != mi.name) continue;
    if (o.from_update && mi.agg == Agg::assign) o.agg = Agg::assign, o.from_update = false;
    if (o.from_update && mi.agg != Agg::assign) {
      static const char* const kNames[] = {"count", "sum", "avg", "min", "max", "stats", "hist", "lhist", "integer"};
      fail(m.pos, "Type mismatch for " + mi.name + ": trying to assign value of type '" +
                      kNames[static_cast<int>(mi.agg)] + "' when map already contains a value of type '" +
                      (o.value_signed ? "int64" : "unsigned int64"));
    }
    if (o.key_kinds.size() != mi.key_kinds.size())
      fail(m.pos, "Argument mismatch for " + mi.name + ": trying to access with arguments: [" +
                      std::to_string(mi.key_kinds.size()) + "] when map expects arguments: [" +
                      std::to_string(o.key_kinds.size()) + "]");
    same_stack_type(o, mi, m);
    if (o.agg == Agg::assign && mi.agg == Agg::assign && o.value_agg != mi.value_agg)  // (`@x = @c` made @x a count)
      fail(m.pos, "Type mismatch for " + mi.name + ": trying to assign value of type '" + mi.value_type +
                      "' when map already contains a value of type '" + o.value_type);
    if (o.agg == Agg::assign && mi.agg == Agg::assign && o.value_is_str != mi.value_is_str)  // (bpftrace 0.17's)
      fail(m.pos, "Type mismatch for " + mi.name + ": trying to assign value of type '" + type_name(v) +
                      "' when map already contains a value of type '" + o.value_type);
    if (o.agg == Agg::lhist && mi.agg == Agg::lhist && (o.lmin != mi.lmin || o.lmax != mi.lmax || o.lstep != mi.lstep))
      fail(v.call(), "Different lhist bounds in a single map unsupported");
    if (o.agg != mi.agg) {
      static const char* const kNames[] = {"count", "sum", "avg", "min", "max", "stats", "hist", "lhist", "integer"};
      // (bpftrace 0.17's message, its missing quote included; at the map)
      fail(m.pos, "Type mismatch for " + mi.name + ": trying to assign value of type '" +
                      (mi.agg == Agg::assign ? type_name(v) : kNames[static_cast<int>(mi.agg)]) +
                      "' when map already contains a value of type '" +
                      (o.agg == Agg::assign ? o.value_type : kNames[static_cast<int>(o.agg)]));
    }
    return;
  }
  maps_.push_back(mi);
}

std::string Compiler::type_name(const Expr& e) {
  if (static_kind(e) != 1) return "int64";
  if (e.k == EK::builtin && e.name == "comm") return "string[16]";
  if (e.k == EK::str) return "string[" + std::to_string(e.name.size() + 1) + "]";
  return "string[64]";
}

void Compiler::key_kinds(const Expr& m, MapInfo& mi) {
  for (auto& k : m.kids) {
    if (k->k == EK::call && k->name == "strftime")
      fail(k->call(), "strftime() as a map key is not supported by uprobe-trace yet: only as a printf() %s argument");
    mi.key_kinds.push_back(static_kind(*k));
    if (mi.key_kinds.back() == 3) {
      unsigned limit;
      bool perf;
      stack_type(*k, limit, perf);
      if (mi.stack_limit && (limit != mi.stack_limit || perf != mi.stack_perf))
        fail(k->pos, "a map key with two ustack components of different types is not supported by uprobe-trace");
      mi.stack_limit = limit, mi.stack_perf = perf;
    }
  }
  if (mi.key_kinds.size() > kMaxArgs) fail(m.pos, "too many map key components");
}

void Compiler::same_stack_type(const MapInfo& o, const MapInfo& mi, const Expr& m) {
  Pos pos = m.pos;  // (the use's ustack, where it has one)
  for (const auto& k : m.kids)
    if (is_ustack(*k)) pos = k->k == EK::call ? k->call() : k->pos;
  if (o.stack_limit == mi.stack_limit && o.stack_perf == mi.stack_perf) return;
  auto name = [](const MapInfo& x) {
    return x.stack_limit == 0 ? std::string("no ustack")
                              : "ustack(" + std::string(x.stack_perf ? "perf" : "bpftrace") + ", " +
                                    std::to_string(x.stack_limit) + ")";
  };
  fail(pos, "Argument mismatch for " + mi.name + ": trying to access with arguments: [" + name(mi) +
                  "] when map expects arguments: [" + name(o) + "]");
}

std::uint8_t Compiler::static_kind(const Expr& e) {
  if (is_ustack(e)) return 3;
  if (e.k == EK::call && e.name == "usym") return 4;
  switch (e.k) {
    case EK::str: return 1;
    case EK::var: {
      auto it = var_kinds_.find(e.name);
      return it != var_kinds_.end() && it->second == 1 ? 1 : 2;
    }
    case EK::builtin:
      if (e.name == "comm" || e.name == "func" || e.name == "probe") return 1;
      if (e.name.rfind("arg", 0) == 0 || e.name == "retval" || e.name == "nsecs" || e.name == "elapsed") return 0;
      return 0;
    case EK::ternary: return static_kind(*e.kids[1]);
    case EK::cast: return e.sgn ? 2 : 0;
    case EK::num: return 2;
    case EK::binary:
      if (e.name == "==" || e.name == "!=" || e.name == "<" || e.name == ">" || e.name == "<=" || e.name == ">=")
        return 0;
      return static_kind(*e.kids[0]) == 2 && static_kind(*e.kids[1]) == 2 ? 2 : 0;
    case EK::unary: return e.name == "!" ? 0 : static_kind(*e.kids[0]) == 2 ? 2 : 0;
    case EK::call: return e.name == "str" ? 1 : 2;
    case EK::map: {  // (a map of strings read: a string)
      std::int32_t mi = -1;
      const MapInfo* m = find_map(e.name, mi);
      return m && m->value_is_str ? 1 : 2;
    }
    default: return 2;
  }
}

const MapInfo* Compiler::find_map(const std::string& n, std::int32_t& idx) {
  for (std::size_t i = 0; i < maps_.size(); ++i)
    if (maps_[i].name == n) return idx = static_cast<std::int32_t>(i), &maps_[i];
  return nullptr;
}

std::int32_t Compiler::key_list(const Expr& m, const MapInfo& mi, unsigned depth) {
  if (m.kids.size() != mi.key_kinds.size())
    fail(m.pos, "Argument mismatch for " + mi.name + ": trying to access with arguments: [" +
                    std::to_string(m.kids.size()) + "] when map expects arguments: [" +
                    std::to_string(mi.key_kinds.size()) + "]");
  std::uint32_t words = 0;
  for (std::uint8_t kind : mi.key_kinds) words += key_component_words(kind, mi.stack_limit);
  words = std::max<std::uint32_t>(words, 1);
  if (key_words_ + words > kKeyStackWords)
    fail(m.pos, "map keys nested too deeply (a map read in the key of a map read ...)");
  key_words_ += words;
  std::vector<std::int32_t> ks;
  for (std::size_t k = 0; k < m.kids.size(); ++k) {
    allow_special_ = true;
    std::int32_t n = expr(*m.kids[k], depth + 1);
    const std::uint8_t vt = nodes_[static_cast<std::size_t>(n)].vt;
    const std::uint8_t want_vt = mi.key_kinds[k] == 3 ? kVtStack : mi.key_kinds[k] == 4 ? kVtUsym : kVtPlain;
    if (vt != want_vt)
      fail(m.kids[k]->pos, "Argument mismatch for " + mi.name + ": key " + std::to_string(k) + " is " +
                               (want_vt == kVtStack ? "a ustack" : want_vt == kVtUsym ? "a usym" : "not a ustack or usym") +
                               " elsewhere");
    if (vt == kVtStack) {
      unsigned limit;
      bool perf;
      stack_type(*m.kids[k], limit, perf);
      if (limit != mi.stack_limit || perf != mi.stack_perf) {
        MapInfo use = mi;
        use.stack_limit = limit, use.stack_perf = perf;
        same_stack_type(mi, use, m);
      }
    }
    if ((nodes_[static_cast<std::size_t>(n)].is_str != 0) != (mi.key_kinds[k] == 1))
      fail(m.kids[k]->pos, "Argument mismatch for " + mi.name + ": key " + std::to_string(k) +
                               " is a " + (mi.key_kinds[k] == 1 ? "string" : "integer") + " elsewhere");
    ks.push_back(n);
  }
  key_words_ -= words;
  return list(ks);
}

}  // namespace detail

namespace {

using namespace ast;

std::string error_text(const std::string& text, const std::string& name, const CompileError& e) {
  // Over lines: bpftrace names them, nothing more.
  if (e.pos.end_line && e.pos.end_line != e.pos.line)
    return name + ":" + std::to_string(e.pos.line) + "-" + std::to_string(e.pos.end_line) + ": ERROR: " + e.msg + "\n";
  // The line, and ~ under the construct (bpftrace's shape).
  std::size_t start = 0;
  for (int l = 1; l < e.pos.line && start != std::string::npos; ++l) {
    start = text.find('\n', start);
    if (start != std::string::npos) ++start;
  }
  std::string line;
  if (start != std::string::npos && start <= text.size()) {
    const std::size_t end = text.find('\n', start);
    line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
  }
  const int end = std::max(e.pos.end, e.pos.col);  // (zero width at the end of the text)
  std::string out = name + ":" + std::to_string(e.pos.line) + ":" + std::to_string(e.pos.col) + "-" +
                    std::to_string(end) + ": ERROR: " + e.msg + "\n";
  // bpftrace's: an empty line is not printed; a tab is 4 spaces, in the
  // line and under it; the ~ stop at the line's end.
  if (line.empty()) return out;
  for (char c : line) out += c == '\t' ? std::string(4, ' ') : std::string(1, c);
  out += "\n";
  for (std::size_t x = 0; x < line.size() && x < static_cast<std::size_t>(end - 1); ++x) {
    const char marker = x < static_cast<std::size_t>(e.pos.col - 1) ? ' ' : '~';
    out += line[x] == '\t' ? std::string(4, marker) : std::string(1, marker);
  }
  return out + "\n";
}

}  // namespace

bool is_bare_spec(const std::string& text) {
  if (text.find_first_of("{}/ \t\n") != std::string::npos) return text.find('{') == std::string::npos &&
                                                                     text.find_first_of(" \t\n") == std::string::npos;
  return true;
}

std::optional<Compiled> compile(const std::string& text, const std::string& name, std::string& error,
                                TargetExists target_exists, const void* ctx, const std::vector<std::string>& params) {
  try {
    std::vector<ast::ProbeA> probes = ast::parse(text, params);
    detail::Compiler c(target_exists, ctx);
    return c.run(probes);
  } catch (const CompileError& e) {
    error = error_text(text, name, e);
    return std::nullopt;
  } catch (const CompileErrors& es) {
    error.clear();
    for (const CompileError& e : es.all) error += error_text(text, name, e);
    return std::nullopt;
  }
}

// ---------------------------------------------------------------- printf

bool parse_format(const std::string& fmt, std::vector<FmtPiece>& out, std::string& /*error*/) {
  auto digit = [&](std::size_t j) { return j < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[j])); };
  std::size_t from = 0;  // the text not yet in a piece
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') continue;
    // bpftrace's regex, tried at i (a search: no match here, try i + 1)
    std::size_t j = i + 1;
    if (j < fmt.size() && fmt[j] == '-') ++j;
    while (digit(j)) ++j;
    if (j < fmt.size() && fmt[j] == '.' && digit(j + 1)) {
      ++j;
      while (digit(j)) ++j;
    }
    const std::size_t spec_end = j;
    char conv = 0, len = 0;
    std::size_t after = 0;
    if (j < fmt.size() && (fmt[j] == 'c' || fmt[j] == 's')) {
      conv = fmt[j], after = j + 1;
    } else {
      static const char* const kLens[] = {"hh", "h", "ll", "l", "z", "j", "t", ""};
      for (const char* l : kLens) {
        const std::size_t n = std::strlen(l);
        if (fmt.compare(j, n, l) != 0 || j + n >= fmt.size() || !std::strchr("duoxXp", fmt[j + n])) continue;
        conv = fmt[j + n], after = j + n + 1;
        len = n == 0 ? 0 : l[0] == 'h' ? (n == 2 ? 'H' : 'h') : 'l';
        break;
      }
    }
    if (!conv) continue;
    out.push_back({fmt.substr(from, i - from), fmt.substr(i, spec_end - i) + conv, conv, len, fmt.substr(i, after - i)});
    from = after;
    i = after - 1;
  }
  out.push_back({fmt.substr(from), "", 0, 0, ""});
  return true;
}


}  // namespace uptrace::bt
