// SPDX-License-Identifier: MIT
// bpftrace's language for uprobe-trace, part 2 of 3: the checks and the
// compiler from the tree (bt_ast.hpp, built by bt_parse.cpp) to the compact
// form the agent runs (bt_vm.hpp), with bpftrace 0.17's errors; printf
// formats. The CLI's printing is bt_print.cpp.

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

namespace uptrace::bt {

namespace {

using namespace ast;

struct MapInfo {
  std::string name;
  Agg agg;
  std::vector<std::uint8_t> key_kinds;  // 0 unsigned, 1 string, 2 signed, 3 ustack, 4 usym (MapDesc::key_is_str)
  unsigned stack_limit = 0;  // the ustack component's type: ustack(perf?, limit)
  bool stack_perf = false;
  bool value_is_str = false;  // `@m[k] = STRING`
  std::string value_type;     // assign: the value's type as bpftrace names it (errors)
  std::int64_t lmin = 0, lmax = 0, lstep = 1;
  bool value_signed = true;
  Pos pos;
  bool from_update = false;  // a sum made of `+`/`-` updates (@m++, @m -= e) only
};

bool is_agg_fn(const std::string& n) {
  return n == "count" || n == "sum" || n == "avg" || n == "min" || n == "max" || n == "stats" || n == "hist" ||
         n == "lhist";
}

// The words of a key component of kind `kind` (MapDesc::key_is_str).
std::uint32_t key_component_words(std::uint8_t kind, unsigned stack_limit) {
  return kind == 1 ? kStrLen / 8 : kind == 3 ? 1 + stack_limit : kind == 4 ? 2 : 1;
}

// ustack's arguments, as bpftrace 0.17 takes them: ustack, ustack(N),
// ustack(MODE), ustack(MODE, N), MODE `bpftrace` or `perf`, N an integer
// literal; N is at most kMaxFrames here (bpftrace takes up to 1024, and its
// stack map then needs kernel.perf_event_max_stack at least N: 127 by default).
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

bool is_ustack(const Expr& e) { return (e.k == EK::builtin || e.k == EK::call) && e.name == "ustack"; }

class Compiler {
 public:
  Compiled run(std::vector<ProbeA>& probes) {
    Compiled out;
    strtab_.push_back('\0');
    // Maps: first definition wins (in source order), uses must agree.
    for (auto& p : probes) {
      var_kinds_.clear();
      for (auto& s : p.body) define_maps(*s);
    }
    for (std::size_t pi = 0; pi < probes.size(); ++pi) {
      ProbeA& pa = probes[pi];
      ProbeDesc pd{};
      bool first_kind = true;
      for (auto& pt : pa.points) {
        AttachPoint ap = attach_point(pt.text, pt.pos, static_cast<std::uint32_t>(pi), pd.interval_ns);
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

  AttachPoint attach_point(const std::string& t, Pos pos, std::uint32_t pi, std::int64_t& interval_ns) {
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
    ap.spec = canon + ":" + rest;
    return ap;
  }

  // ---- maps
  void define_maps(StmtA& s) {
    if (s.k == SK::if_) {
      for (auto& t : s.then_) define_maps(*t);
      for (auto& t : s.else_) define_maps(*t);
      return;
    }
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
        fail(s.value->pos, "Type mismatch for " + mi.name + ": trying to assign value of type '" +
                               kNames[static_cast<int>(mi.agg)] + "' when map already contains a value of type 'integer");
      }
      if (o.key_kinds.size() != mi.key_kinds.size())
        fail(m.pos, "Argument mismatch for " + mi.name + ": trying to access with arguments: [" +
                        std::to_string(mi.key_kinds.size()) + "] when map expects arguments: [" +
                        std::to_string(o.key_kinds.size()) + "]");
      same_stack_type(o, mi, m);
      if (o.agg == Agg::assign && mi.agg == Agg::assign && o.value_is_str != mi.value_is_str)  // (bpftrace 0.17's)
        fail(m.pos, "Type mismatch for " + mi.name + ": trying to assign value of type '" + type_name(v) +
                        "' when map already contains a value of type '" + o.value_type);
      if (o.agg != mi.agg || o.lmin != mi.lmin || o.lmax != mi.lmax || o.lstep != mi.lstep) {
        static const char* const kNames[] = {"count", "sum", "avg", "min", "max", "stats", "hist", "lhist", "integer"};
        // (bpftrace 0.17's message, its missing quote included)
        fail(s.value->pos, "Type mismatch for " + mi.name + ": trying to assign value of type '" +
                               kNames[static_cast<int>(mi.agg)] + "' when map already contains a value of type '" +
                               kNames[static_cast<int>(o.agg)]);
      }
      return;
    }
    maps_.push_back(mi);
  }

  // bpftrace 0.17's name of a value's type in its errors.
  std::string type_name(const Expr& e) {
    if (static_kind(e) != 1) return "int64";
    if (e.k == EK::builtin && e.name == "comm") return "string[16]";
    if (e.k == EK::str) return "string[" + std::to_string(e.name.size() + 1) + "]";
    return "string[64]";
  }

  // A map's key kinds (and the type of its ustack component) from a use.
  void key_kinds(const Expr& m, MapInfo& mi) {
    for (auto& k : m.kids) {
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

  // Two uses of a map whose key has a ustack: the same ustack type.
  void same_stack_type(const MapInfo& o, const MapInfo& mi, const Expr& m) {
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

  // The type of an expression before compiling it: 1 string, 2 signed int,
  // 0 unsigned int, 3 ustack, 4 usym.
  std::uint8_t static_kind(const Expr& e) {
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
      default: return 2;
    }
  }

  const MapInfo* find_map(const std::string& n, std::int32_t& idx) {
    for (std::size_t i = 0; i < maps_.size(); ++i)
      if (maps_[i].name == n) return idx = static_cast<std::int32_t>(i), &maps_[i];
    return nullptr;
  }

  std::int32_t key_list(const Expr& m, const MapInfo& mi, unsigned depth = 0) {
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

  // ---- statements
  std::int32_t push(const Stmt& s) {
    stmts_.push_back(s);
    return static_cast<std::int32_t>(stmts_.size() - 1);
  }

  std::int32_t stmt(StmtA& s) {
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
        std::vector<std::int32_t> t, e;
        ++if_depth_;
        for (auto& x : s.then_) t.push_back(stmt(*x));
        for (auto& x : s.else_) e.push_back(stmt(*x));
        --if_depth_;
        st.b = list(t), st.c = static_cast<std::int32_t>(t.size());
        st.d = list(e), st.e = static_cast<std::int32_t>(e.size());
        return push(st);
      }
      case SK::var_assign: {
        st.op = StmtOp::set_var;
        st.b = expr(*s.value);
        const bool is_s = nodes_[static_cast<std::size_t>(st.b)].is_str != 0;
        const std::string& name = s.target->name;
        if (is_s ? vars_.count(name) != 0 : svars_.count(name) != 0)  // (bpftrace 0.17's error)
          fail(s.value->pos, "Type mismatch for " + name + ": trying to assign value of type '" +
                                 (is_s ? "string[64]" : "int64") + "' when variable already contains a value of type '" +
                                 (is_s ? "int64" : "string[64]") + "'");
        st.a = is_s ? svar_slot(name, s.target->pos) : var_slot(name, s.target->pos, true);
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

  // delete(@m[k]), clear(@m), zero(@m), with bpftrace 0.17's errors.
  std::int32_t map_op_stmt(const Expr& e) {
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

  std::int32_t printf_stmt(const Expr& e) {
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
      if ((p.conv == 's') != is_s)
        fail(e.call(), std::string("printf: %") + (p.conv == 's' ? 's' : p.conv) + " specifier expects a value of type " +
                                 (p.conv == 's' ? "string" : "integer") + " (" + (is_s ? "string" : "integer") +
                                 " supplied)");
      if (fd.nargs >= kMaxPrintfArgs) fail(e.pos, "printf: too many arguments");
      if (vt == kVtStack) {
        unsigned limit;
        bool perf;
        stack_type(*e.kids[k], limit, perf);
        fd.arg_limit[fd.nargs] = static_cast<std::uint16_t>(limit);
      }
      fd.arg_is_str[fd.nargs++] = vt == kVtStack ? 2 : vt == kVtUsym ? 3 : is_s ? 1 : 0;
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

  std::int32_t svar_slot(const std::string& name, Pos pos) {
    auto it = svars_.find(name);
    if (it != svars_.end()) return it->second;
    if (svars_.size() >= kMaxStrVars) fail(pos, "too many string $variables (at most " + std::to_string(kMaxStrVars) + ")");
    const auto slot = static_cast<std::int32_t>(svars_.size());
    svars_[name] = slot;
    return slot;
  }

  std::int32_t var_slot(const std::string& name, Pos pos, bool define) {
    auto it = vars_.find(name);
    if (it != vars_.end()) return it->second;
    if (!define) fail(pos, "Undefined or undeclared variable: " + name);
    if (vars_.size() >= kMaxVars) fail(pos, "too many $variables");
    const auto slot = static_cast<std::int32_t>(vars_.size());
    vars_[name] = slot;
    return slot;
  }

  // ---- expressions
  std::int32_t node(Node n) {
    nodes_.push_back(n);
    return static_cast<std::int32_t>(nodes_.size() - 1);
  }
  bool signed_node(std::int32_t n) const { return node_signed_[static_cast<std::size_t>(n)]; }

  std::int32_t expr(const Expr& e, unsigned depth = 0) {
    if (depth > kMaxDepth - 8) fail(e.pos, "expression nested too deeply");
    const bool special_ok = allow_special_;  // (for this expression, not its operands)
    allow_special_ = false;
    std::int32_t r = expr_inner(e, depth);
    if (!special_ok && nodes_[static_cast<std::size_t>(r)].vt != kVtPlain)
      fail(e.k == EK::call ? e.call() : e.pos,
           (nodes_[static_cast<std::size_t>(r)].vt == kVtStack ? std::string("ustack") : std::string("usym()")) +
               " here is not supported by uprobe-trace yet: only as a map key or a printf() %s argument");
    return r;
  }

  std::int32_t leaf(Op op, bool is_str, bool sgn, std::int64_t imm = 0) {
    Node n{};
    n.op = op;
    n.is_str = is_str;
    n.imm = imm;
    std::int32_t r = node(n);
    node_signed_.resize(nodes_.size());
    node_signed_[static_cast<std::size_t>(r)] = sgn;
    return r;
  }

  std::int32_t expr_inner(const Expr& e, unsigned depth) {
    switch (e.k) {
      case EK::num: return leaf(Op::num, false, true, e.num);
      case EK::str: {
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
        if (m->value_is_str)
          fail(e.pos, "reading a map of strings in an expression is not supported by uprobe-trace yet");
        if (m->agg == Agg::hist || m->agg == Agg::lhist || m->agg == Agg::stats)
          fail(e.pos, "reading a " + std::string(m->agg == Agg::stats ? "stats()" : "histogram") +
                          " map in an expression is not supported");
        const std::int32_t keys = key_list(e, *m, depth);
        std::int32_t r = leaf(Op::map_read, false, true);
        Node& n = nodes_[static_cast<std::size_t>(r)];
        n.a = mi, n.b = keys, n.c = static_cast<std::int32_t>(e.kids.size());
        return r;
      }
      case EK::call: {
        if (e.name == "printf" || e.name == "exit" || is_agg_fn(e.name))
          fail(e.pos, e.name + "() cannot be used in an expression");
        if (e.name == "delete" || e.name == "clear" || e.name == "zero")
          fail(e.call(), e.name + "() should not be used in an assignment or as a map key");
        if (e.name == "str") {
          if (e.kids.empty() || e.kids.size() > 2)
            fail(e.call(), "str() requires one or two arguments (" + std::to_string(e.kids.size()) + " provided)");
          std::int32_t a = expr(*e.kids[0], depth + 1);
          if (nodes_[static_cast<std::size_t>(a)].is_str) fail(e.kids[0]->pos, "str() expects an integer or a pointer");
          std::int32_t b = e.kids.size() > 1 ? expr(*e.kids[1], depth + 1) : -1;
          if (b >= 0 && nodes_[static_cast<std::size_t>(b)].is_str) fail(e.kids[1]->pos, "str() expects an integer length");
          std::int32_t r = leaf(Op::str_read, true, false);
          nodes_[static_cast<std::size_t>(r)].a = a;
          nodes_[static_cast<std::size_t>(r)].b = b;
          return r;
        }
        if (e.name == "ustack") return ustack_node(e);
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
        if (nodes_[static_cast<std::size_t>(a)].is_str) fail(e.pos, "Invalid type for unary " + e.name + ": string");
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
        if (nodes_[static_cast<std::size_t>(a)].is_str) fail(e.pos, "Cannot cast from string to integer");
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
        if (sa || sb) {
          if (sa != sb) fail(e.pos, "Type mismatch for '" + e.name + "': comparing '" +
                                        std::string(sa ? "string" : "integer") + "' with '" +
                                        (sb ? "string" : "integer") + "'");
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

  // ustack, ustack(...): a stack of the hit (uprobes, uretprobes, usdt).
  std::int32_t ustack_node(const Expr& e) {
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

  std::int32_t builtin(const Expr& e) {
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

  std::vector<MapInfo> maps_;
  std::vector<Node> nodes_;
  std::vector<bool> node_signed_;
  std::vector<Stmt> stmts_;
  std::vector<std::int32_t> lists_;
  std::vector<ProbeDesc> probes_;
  std::vector<FmtDesc> fmts_;
  std::vector<char> strtab_;
  std::map<std::string, std::int32_t> vars_, svars_;  // this probe's integer and string $variables
  std::map<std::string, std::uint8_t> var_kinds_;  // define_maps(): this probe's $variables' static_kind()
  unsigned if_depth_ = 0;
  bool allow_special_ = false;  // the next expr() may be a ustack or usym() (a key component, a printf argument)
  std::uint32_t key_words_ = 0;  // words of the keys being compiled (encode_key()'s stack)
  ProbeKind cur_kind_ = ProbeKind::uprobe;
  bool cur_ret_ = false, any_ret_ = false, has_mixed_ret_ = false;
};

std::string error_text(const std::string& text, const std::string& name, const CompileError& e) {
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
                    std::to_string(end) + ": ERROR: " + e.msg + "\n" + line + "\n";
  out += std::string(static_cast<std::size_t>(e.pos.col - 1), ' ') +
         std::string(static_cast<std::size_t>(end - e.pos.col), '~') + "\n";
  return out;
}

}  // namespace

bool is_bare_spec(const std::string& text) {
  if (text.find_first_of("{}/ \t\n") != std::string::npos) return text.find('{') == std::string::npos &&
                                                                     text.find_first_of(" \t\n") == std::string::npos;
  return true;
}

std::optional<Compiled> compile(const std::string& text, const std::string& name, std::string& error) {
  try {
    std::vector<ast::ProbeA> probes = ast::parse(text);
    Compiler c;
    return c.run(probes);
  } catch (const CompileError& e) {
    error = error_text(text, name, e);
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
