// SPDX-License-Identifier: MIT
// uprobe-trace's CLI: a bpftrace program's run (bt_run.hpp).

#include "bt_run.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bt_lang.hpp"
#include "checks.hpp"
#include "counts.hpp"
#include "launch.hpp"
#include "ld_cache.hpp"
#include "report_read.hpp"
#include "spec.hpp"
#include "usym.hpp"

namespace uptrace {

namespace {

// What a bpftrace program's run sees of the counts file: its header and
// every block with a program area, mapped shared (the CLI consumes the
// rings: it writes their tail words).
class BtRun {
 public:
  BtRun(const bt::Program& p, std::FILE* out, int counts_fd, bool json)
      : p_(p), out_(out), fd_(counts_fd), json_(json) {
    void* m = mmap(nullptr, counts::kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) die(std::string("counts file: mmap: ") + std::strerror(errno));
    h_ = static_cast<counts::Header*>(m);
    // Zero pages mapped as they are touched (calloc of this size maps them):
    // the area is mostly the printf ring and map tables this process may
    // never use, and zeroing it took ~0.3 ms of the start.
    own_.reset(static_cast<std::uint64_t*>(std::calloc(p_.h->area_words ? p_.h->area_words : 1, 8)));
    if (!own_) die("cannot allocate the program's area");
  }

  counts::Header* header() { return h_; }

  /// Where the printf events and maps go from now on (-o's file, opened late).
  void set_out(std::FILE* out) { out_ = out; }

  // Runs the BEGIN, END or interval probe blocks of `kind` here, in the CLI.
  void run_here(bt::ProbeKind kind, const std::vector<bt::AttachPoint>& aps, std::uint32_t only = ~0u) {
    map_new_blocks();  // (a map read sees every thread's table)
    for (const auto& ap : aps) {
      if (ap.kind != kind || (only != ~0u && ap.probe != only)) continue;
      if (h_->bt_exit.load() && kind != bt::ProbeKind::end) return;
      bt::HitContext c;
      c.probe = ap.spec.c_str();
      c.start_ns = h_->bt_start_ns;
      c.area = own_.get();
      c.exit_flag = kind == bt::ProbeKind::end ? nullptr : reinterpret_cast<volatile std::uint64_t*>(&h_->bt_exit);
      c.read_map = &BtRun::read_map;
      c.read_map_ctx = this;
      c.map_op = &BtRun::map_op;
      c.map_op_ctx = this;
      bt::Vm vm(p_, c);
      vm.run_probe(ap.probe);
    }
    drain();
  }

  // A map read in BEGIN, END or interval: the map merged over the CLI's own
  // table and every thread's of every process, as bpftrace's one map.
  static bool read_map(void* self, std::uint32_t m, const std::uint64_t* key, std::int64_t& value) {
    auto* r = static_cast<BtRun*>(self);
    std::vector<std::uint64_t*> areas{r->own_.get()};
    for (auto& b : r->blocks_) areas.push_back(b.area);
    return bt::merged_read(r->p_, m, areas, key, value);
  }

  // delete, clear or zero in BEGIN, END or interval: in every table now.
  static void map_op(void* self, std::uint32_t op, std::uint32_t m, const std::uint64_t* key) {
    auto* r = static_cast<BtRun*>(self);
    r->map_new_blocks();
    r->apply(op, m, key, 0, nullptr);
  }

  // Applies a map operation to every table but `except`'s (a delete's
  // sender, which did its own): delete removes the key (from a `@m[k] = x`
  // map only when its store is older than `ts`, the delete's time; 0: any),
  // clear every key, zero every key's value (compare-and-swap of each
  // slot's state: the threads keep running).
  void apply(std::uint32_t op, std::uint32_t mi, const std::uint64_t* key, std::uint64_t ts,
             const std::uint64_t* except) {
    const bt::MapDesc& m = p_.maps[mi];
    std::vector<std::uint64_t*> areas{own_.get()};
    for (auto& b : blocks_) areas.push_back(b.area);
    for (std::uint64_t* area : areas) {
      if (area == except) continue;
      if (op == bt::kEvDelete) {
        for (int tries = 0; tries < 8; ++tries) {
          std::uint64_t* s = bt::Vm::slot(m, area, key, false);
          if (!s) break;
          const std::uint64_t seen = __atomic_load_n(s, __ATOMIC_ACQUIRE);
          if (ts && m.agg == bt::Agg::assign && (seen & bt::kSlotStateMask) == bt::kSlotLive &&
              bt::load(s + m.key_words + m.value_words) >= ts)  // (the store's time: the last value word)
            break;  // stored again after the delete
          if (bt::Vm::cli_mark(s, seen, bt::kSlotDeleted)) break;
        }
        continue;
      }
      std::uint64_t* table = area + m.offset;
      for (std::uint32_t i = 0; i < m.nslots; ++i) {
        std::uint64_t* s = table + std::uint64_t{i} * m.slot_words();
        for (int tries = 0; tries < 8; ++tries)
          if (bt::Vm::cli_mark(s, __atomic_load_n(s, __ATOMIC_ACQUIRE),
                               op == bt::kEvClear ? bt::kSlotDeleted : bt::kSlotZeroed))
            break;
          else if (!(__atomic_load_n(s, __ATOMIC_ACQUIRE) & 1))  // (neither live nor zeroed)
            break;
      }
    }
  }

  // Prints the printf events written since the last drain, in time order
  // (each thread's in its own order), with the print(@map), delete, clear
  // and zero events in that order among them. The events are read where
  // they are, in the rings (a ring's tail moves only after they are
  // printed): a reference each, sorted by time only when several rings had
  // some (each ring's are in order already), formatted into one buffer,
  // written with one fwrite.
  void drain() {
    map_new_blocks();
    evs_.clear();
    std::size_t rings = 0;
    auto take = [&](std::uint64_t* area) {
      if (!p_.h->ring_bytes) return;
      const std::uint64_t ring = p_.h->ring_bytes;
      const auto* base = reinterpret_cast<const unsigned char*>(area + bt::kAreaHeaderWords);
      std::uint64_t tail = bt::load(area + bt::kRingTail);
      const std::uint64_t head = __atomic_load_n(area + bt::kRingHead, __ATOMIC_ACQUIRE);
      const std::size_t before = evs_.size();
      while (tail < head) {
        const auto* e = reinterpret_cast<const bt::EventHeader*>(base + (tail & (ring - 1)));
        if (e->bytes == 0 || e->bytes > ring) break;
        if (((e->kind == bt::kEvPrintf || e->kind == bt::kEvTime) && e->fmt < p_.h->nfmts) ||
            ((e->kind == bt::kEvPrint || e->kind == bt::kEvClear || e->kind == bt::kEvZero) && e->fmt < p_.h->nmaps) ||
            (e->kind == bt::kEvDelete && e->fmt < p_.h->nmaps &&
             sizeof *e + p_.maps[e->fmt].key_words * 8 <= e->bytes))
          evs_.push_back({e->ts, e, area});
        tail += e->bytes;
      }
      if (evs_.size() > before) ++rings;
      ends_.push_back({area, tail});
    };
    ends_.clear();
    take(own_.get());
    for (auto& b : blocks_) take(b.area);
    if (rings > 1)
      std::stable_sort(evs_.begin(), evs_.end(), [](const EvRef& a, const EvRef& b) { return a.ts < b.ts; });
    text_.clear();
    for (const EvRef& r : evs_) {
      const bt::EventHeader* e = r.e;
      const auto* args = reinterpret_cast<const unsigned char*>(e + 1);
      if (e->kind == bt::kEvPrintf) {
        if (!json_) {
          bt::format_event(text_, p_, e->fmt, args);
        } else {
          text_ += "{\"type\": \"printf\", \"data\": \"" + bt::json_escape(bt::format_event(p_, e->fmt, args)) + "\"}\n";
        }
      } else if (e->kind == bt::kEvTime) {
        std::string t;
        if (!bt::format_time(t, p_, e->fmt, e->ts)) {
          std::fwrite(text_.data(), 1, text_.size(), out_);  // (what came before it, first)
          text_.clear();
          std::fflush(out_);
          std::fputs("ERROR: strftime returned 0\n", stderr);
        } else if (json_) {
          text_ += "{\"type\": \"time\", \"data\": \"" + bt::json_escape(t) + "\"}\n";
        } else {
          text_ += t;
        }
      } else if (e->kind == bt::kEvPrint) {
        text_ += map_text(e->fmt);
      } else {
        const auto* k = reinterpret_cast<const std::uint64_t*>(args);
        const std::vector<std::uint64_t> key =
            e->kind == bt::kEvDelete ? std::vector<std::uint64_t>(k, k + p_.maps[e->fmt].key_words) : std::vector<std::uint64_t>{};
        // (the sender did its own table, but for the CLI's own events)
        apply(e->kind, e->fmt, key.data(), e->ts, r.from == own_.get() ? nullptr : r.from);
      }
    }
    const bool wrote = !text_.empty();
    if (wrote) std::fwrite(text_.data(), 1, text_.size(), out_);
    for (const auto& [area, tail] : ends_) __atomic_store_n(area + bt::kRingTail, tail, __ATOMIC_RELEASE);
    // Events a full ring dropped since the last drain: bpftrace's line, in
    // the output (its perf reader prints it when it learns of them).
    bool lost_line = false;
    if (const std::uint64_t lost = lost_events(); lost > lost_) {
      const unsigned long long d = lost - lost_;
      if (json_) std::fprintf(out_, "{\"type\": \"lost_events\", \"data\": {\"events\": %llu}}\n", d);
      else std::fprintf(out_, "Lost %llu events\n", d);
      lost_ = lost;
      lost_line = true;
    }
    if (wrote || lost_line) std::fflush(out_);
  }

  // print(@map): the map as it is now, merged.
  std::string map_text(std::uint32_t m) {
    bt::MapData data;
    bt::merge_table(p_, m, own_.get(), data);
    for (auto& b : blocks_) bt::merge_table(p_, m, b.area, data);
    return json_ ? bt::format_map_json(p_, m, data) : bt::format_map(p_, m, data);
  }

  // The maps merged over every thread of every process (and the CLI's own area).
  std::string maps() {
    map_new_blocks();
    std::vector<bt::MapData> data(p_.h->nmaps);
    for (std::uint32_t m = 0; m < p_.h->nmaps; ++m) {
      bt::merge_table(p_, m, own_.get(), data[m]);
      for (auto& b : blocks_) bt::merge_table(p_, m, b.area, data[m]);
    }
    return json_ ? bt::format_maps_json(p_, data) : bt::format_maps(p_, data);
  }

  std::uint64_t lost_events() {
    std::uint64_t n = 0;
    for (auto& b : blocks_) n += bt::load(b.area + bt::kLostEvents);
    return n;
  }
  std::uint64_t map_drops() { return area_sum(bt::kMapDrops); }
  std::uint64_t loop_stops() { return area_sum(bt::kLoopStops); }
  std::uint64_t area_sum(bt::AreaWord w) {
    std::uint64_t n = bt::load(own_.get() + w);
    for (auto& b : blocks_) n += bt::load(b.area + w);
    return n;
  }

 private:
  void map_new_blocks() {
    const std::uint64_t n = std::min<std::uint64_t>(h_->nslots.load(), counts::kMaxSlots);
    for (; next_slot_ < n; ++next_slot_) {
      const std::uint64_t w = h_->slots[next_slot_].load(std::memory_order_acquire);
      if (w == 0) {  // handed out, not published yet: look again next time
        if (pending_.insert(next_slot_).second) continue;
        continue;
      }
      add_block(w);
    }
    for (auto it = pending_.begin(); it != pending_.end();) {
      const std::uint64_t w = h_->slots[*it].load(std::memory_order_acquire);
      if (w == 0) {
        ++it;
        continue;
      }
      add_block(w);
      it = pending_.erase(it);
    }
  }
  void add_block(std::uint64_t w) {
    const std::size_t bytes = counts::slot_pages(w) * counts::kPage;
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                   static_cast<off_t>(counts::slot_first_page(w) * counts::kPage));
    if (m == MAP_FAILED) return;
    auto* b = static_cast<std::uint64_t*>(m);
    const std::uint64_t area = b[counts::kBlockBt];
    if (b[counts::kBlockMagicWord] != counts::kBlockMagic || area == 0 ||
        (area + p_.h->area_words) * 8 > bytes) {
      munmap(m, bytes);
      return;
    }
    blocks_.push_back({b + area});
  }

  struct Block {
    std::uint64_t* area;
  };
  const bt::Program& p_;
  std::FILE* out_;
  int fd_;
  bool json_;  // -f json: bpftrace's JSON lines
  counts::Header* h_ = nullptr;
  std::unique_ptr<std::uint64_t, decltype(&std::free)> own_{nullptr, &std::free};  // the CLI's area (BEGIN, END, interval)
  std::vector<Block> blocks_;
  std::uint64_t next_slot_ = 0;
  std::set<std::uint64_t> pending_;
  std::uint64_t lost_ = 0;  // lost events already reported
  /// drain()'s: the events of the rings (a reference into a ring each), the
  /// tail each ring gets once they are printed, the text made of them.
  struct EvRef {
    std::uint64_t ts;
    const bt::EventHeader* e;
    const std::uint64_t* from;
  };
  std::vector<EvRef> evs_;
  std::vector<std::pair<std::uint64_t*, std::uint64_t>> ends_;
  std::string text_;
};

}  // namespace

int run_bpftrace(const BtOptions& o) {
  std::string err;
  // PATHs as bpftrace checks them: a path names a regular file, a name a
  // library on the search path or a program in $PATH (or the program run).
  struct Names {
    std::string prog;
  } names{o.cmd.empty() ? std::string() : find_program(o.cmd[0])};
  // (bpftrace's check: an ELF executable or shared object, not only a file)
  const auto exists = [](const std::string& path, const void* ctx) {
    std::string file = path;
    if (path.find('/') == std::string::npos) file = resolve_here(path, static_cast<const Names*>(ctx)->prog);
    struct stat st;
    if (file.empty() || ::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return true;  // (unreadable: the checks say why)
    unsigned char h[18] = {};
    const bool read = ::pread(fd, h, sizeof h, 0) == static_cast<ssize_t>(sizeof h);
    ::close(fd);
    const unsigned type = h[16] | (h[17] << 8);
    return read && h[0] == 0x7f && h[1] == 'E' && h[2] == 'L' && h[3] == 'F' && (type == 2 || type == 3);
  };
  std::optional<bt::Compiled> c = bt::compile(o.text, o.name, err, exists, &names, o.params);
  if (!c) {
    std::fputs(err.c_str(), stderr);
    return 1;
  }
  const bt::Program& p = c->prog;
  std::string prog_path;
  if (!o.cmd.empty()) {
    int not_runnable = 0;
    prog_path = runnable_program(o.cmd[0], not_runnable);
    if (prog_path.empty()) return not_runnable;
  }
  std::string joined;  // "PROBE\tSPEC" lines for the agent
  std::size_t nprobes = 0;
  bool user_probes = false;
  std::vector<Spec> specs;  // checked while the program starts (StartGate)
  for (const auto& ap : c->attach) {
    if (ap.kind == bt::ProbeKind::begin || ap.kind == bt::ProbeKind::end || ap.kind == bt::ProbeKind::interval) {
      ++nprobes;
      continue;
    }
    std::string perr;
    auto s = parse_spec(ap.spec, perr);
    if (!s) die(perr);
    specs.push_back(*s);
    // (the `probe` strings name PATH as bpftrace does: as written, or a
    // `lib...` name by the dynamic linker cache's path)
    std::string shown;
    if (s->binary.find('/') != std::string::npos) shown = s->binary;
    else shown = ld_cache_path(s->binary);
    joined += std::to_string(ap.probe) + "\t" + ap.spec + (shown.empty() ? "" : "\t" + shown) + "\n";
    user_probes = true;
  }
  if (user_probes && o.cmd.empty())
    die("uprobe, uretprobe and usdt probes need a program to trace: -c 'CMD' or -- PROG ARGS (uprobe-trace "
        "runs in the programs it starts, not system-wide)");
  // -o FILE: opened (created, truncated) before the program runs, as a
  // shell's redirection; with the start gate while the program starts
  // (open_out() after start_traced(): truncating a file can take
  // milliseconds, e.g. ext4 mounted with discard), a failure then ends it
  // at the gate.
  const bool gated = !o.cmd.empty() && loads_the_agent(prog_path);
  std::FILE* out = stdout;
  auto open_out = [&] {
    if (o.out_file.empty()) return;
    out = std::fopen(o.out_file.c_str(), "we");
    if (!out) die(o.out_file + ": " + std::strerror(errno));
  };
  if (!gated) open_out();
  const Preload preload = o.cmd.empty() ? Preload{} : find_preload();
  const std::string dir = make_trace_dir();
  const int counts_fd = create_counts_file(dir);
  const std::string prog_file = dir + "/program";
  {
    std::ofstream f(prog_file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(c->blob.data()), static_cast<std::streamsize>(c->blob.size()));
    if (!f) {
      remove_tree(dir);
      die(prog_file + ": cannot write");
    }
  }
  // The specs checked on a thread of their own from here (SpecChecks): the
  // agent waits for the ELF tables they write when done. (After the counts
  // and program files: on a small filesystem those come first.)
  std::optional<SpecChecks> checks;
  if (gated) checks.emplace(specs, prog_path, dir + "/" + kElfTablesFile, true);
  // ustack and usym(): symbolized with each image's recorded mappings (usym.hpp)
  static UserSymbols* symbols = nullptr;
  symbols = new UserSymbols(dir);  // (lives until exit: the maps print at the end)
  bt::set_symbolizer([](std::uint64_t image, std::uint64_t addr, bt::UserSym& u) { return symbols->resolve(image, addr, u); });
  BtRun run(p, out, counts_fd, o.json);

  prctl(PR_SET_CHILD_SUBREAPER, 1);
  TraceSignals sigs;
  const int sig_fd = sigs.fd;

  // The specs checked, "Attaching N probes..." and BEGIN: while the program
  // starts when it waits at the gate, else before it starts. An uprobe or
  // uretprobe of a function its file does not have is skipped, as bpftrace
  // 0.17 skips it (with a warning here, where bpftrace says nothing); with
  // no probe left, bpftrace's "No probes to attach" (exit status 1).
  std::vector<std::pair<std::size_t, std::string>> skipped;
  bool no_probes = false;
  StartGate gate;
  auto check_and_begin = [&] {
    if (gated) {
      open_out();
      run.set_out(out);
    }
    if (checks) {
      nprobes += checks->wait();
      skipped = checks->skipped();
      gate.tables_ready();  // (the agent attaches while BEGIN runs here)
    } else {
      for (std::size_t k = 0; k < specs.size(); ++k) {
        std::string why;
        nprobes += validate(specs[k], prog_path, &why);
        if (!why.empty()) skipped.emplace_back(k, why);
      }
    }
    g_dir_to_remove.clear();
    for (const auto& [k, why] : skipped)
      std::fprintf(stderr, "uprobe-trace: WARNING: %s: not attached (bpftrace skips it too): %s\n",
                   specs[k].text.c_str(), why.c_str());
    if (nprobes == 0) {
      no_probes = true;
      return;
    }
    if (!o.quiet && o.json) std::fprintf(out, "{\"type\": \"attached_probes\", \"data\": {\"probes\": %zu}}\n", nprobes);
    else if (!o.quiet) std::fprintf(out, "Attaching %zu probe%s...\n", nprobes, nprobes == 1 ? "" : "s");
    std::fflush(out);
    run.run_here(bt::ProbeKind::begin, c->attach);
  };
  if (!gated) check_and_begin();
  pid_t child = -1;
  int exec_errno = 0;
  if (!o.cmd.empty() && !run.header()->bt_exit.load() && !no_probes) {
    std::fflush(out);
    child = start_traced(o.cmd, preload, {joined, dir, prog_file, o.follow, gated, kept_tables_env(checks ? &*checks : nullptr)}, sigs, gate, gated, exec_errno);
  }
  if (gated) check_and_begin();
  g_dir_to_remove.clear();
  if (no_probes) {  // (the program, started, ends at the gate)
    if (child > 0) {
      gate.shut();
      while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    close(counts_fd);
    remove_tree(dir);
    if (!o.quiet) std::fputs("No probes to attach\n", stdout);  // (bpftrace's: not into -o FILE, nothing with -q)
    if (out != stdout) std::fclose(out);
    return 1;
  }
  if (gated && child > 0 && run.header()->bt_exit.load()) {
    // exit() in BEGIN: the program never runs (its agent ends at the gate).
    gate.shut();
    while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
    child = -1;
  } else if (child > 0) {
    gate.open();
    g_child = child;
  }
  // Interval probes: the next time each fires.
  std::vector<std::pair<std::uint64_t, std::uint32_t>> timers;  // (due ns, probe)
  for (const auto& ap : c->attach)
    if (ap.kind == bt::ProbeKind::interval)
      timers.emplace_back(bt::now_ns() + static_cast<std::uint64_t>(p.probes[ap.probe].interval_ns), ap.probe);
  int status = 0, main_status = 0;
  bool terminated = false, main_done = false;
  std::vector<pid_t> left_running;
  unsigned interrupts = 0;
  for (;;) {
    bool all_gone = false;
    for (;;) {
      const pid_t w = waitpid(-1, &status, WNOHANG);
      if (w > 0) {
        if (w == child) {
          main_status = status;
          main_done = true;
          g_child = 0;
        }
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      all_gone = w < 0;
      break;
    }
    run.drain();
    if (run.header()->bt_exit.load() && !terminated) {  // exit(): the program is stopped, as bpftrace stops its child
      terminated = true;
      if (g_child > 0) kill(g_child, SIGTERM);
    }
    // With a program: until it and its descendants are gone. Without one
    // (BEGIN, END, interval only): until exit() or Ctrl-C, as bpftrace.
    if (all_gone && (child >= 0 || terminated)) break;
    if (main_done && crashed(main_status)) {  // (what a crash left may never end: launch.hpp crashed())
      left_running = children_left();
      if (!left_running.empty()) break;
    }
    std::uint64_t now = bt::now_ns();
    int timeout = 10;  // the rings are drained at least this often (ms)
    for (auto& [due, probe] : timers) {
      if (now >= due) {
        run.run_here(bt::ProbeKind::interval, c->attach, probe);
        due += static_cast<std::uint64_t>(p.probes[probe].interval_ns);
        now = bt::now_ns();
      }
      timeout = std::min<int>(timeout, static_cast<int>((due > now ? due - now : 0) / 1000000) + 1);
    }
    // SIGTERM or SIGHUP with no program to pass them to: bpftrace's end (END,
    // the maps, exit status 0), as it ends on them.
    if (g_stop_signal && g_child <= 0) break;
    pollfd pfd{sig_fd, POLLIN, 0};
    if (poll(&pfd, 1, timeout) > 0) {
      signalfd_siginfo si;
      const ssize_t n = read(sig_fd, &si, sizeof si);
      if (n == static_cast<ssize_t>(sizeof si) && si.ssi_signo == SIGINT) {
        if (child < 0 || ++interrupts >= 2) break;
        // bpftrace's Ctrl-C: END, the maps, and the program ended (SIGTERM,
        // as after exit(); one that survives SIGINT too): once it is gone,
        // with every event it made, here; a second Ctrl-C does not wait.
        if (!terminated) {
          terminated = true;
          if (g_child > 0) kill(g_child, SIGTERM);
        }
      }
    }
  }
  close(sig_fd);
  run.drain();
  run.run_here(bt::ProbeKind::end, c->attach);
  // bpftrace writes the two newlines before the maps to its standard output
  // whatever -o says (std::cout), the maps to the output.
  std::fwrite("\n\n", 1, 2, stdout);
  if (out != stdout) std::fflush(stdout);
  std::string text = run.maps();
  std::fwrite(text.data(), 1, text.size(), out);
  const bool flushed = std::fflush(out) == 0;
  if (out != stdout) std::fclose(out);
  if (!flushed) die(o.out_file.empty() ? "standard output: cannot write" : o.out_file + ": cannot write");
  if (const std::uint64_t lost = run.lost_events())
    std::fprintf(stderr, "uprobe-trace: WARNING: Lost %llu events (a thread's printf ring was full)\n",
                 static_cast<unsigned long long>(lost));
  if (const std::uint64_t drops = run.map_drops())
    std::fprintf(stderr, "uprobe-trace: WARNING: %llu map updates dropped (a thread's map table was full)\n",
                 static_cast<unsigned long long>(drops));
  if (const std::uint64_t stops = run.loop_stops())
    std::fprintf(stderr, "uprobe-trace: WARNING: %llu probe runs stopped: a loop ran %u iterations (bpftrace's kernel "
                 "would not load a loop it cannot bound)\n",
                 static_cast<unsigned long long>(stops), bt::kMaxLoopIterations);
  if (const std::uint64_t missed = run.header()->missed.load())
    std::fprintf(stderr, "uprobe-trace: WARNING: %llu probe hits were not run (a probe fired while its thread was "
                 "inside another hit: a signal handler that interrupted one)\n",
                 static_cast<unsigned long long>(missed));
  if (run.header()->unrecorded.load())
    std::fprintf(stderr, "uprobe-trace: WARNING: %llu hits were not run (no block of their own for them)\n",
                 static_cast<unsigned long long>(run.header()->unrecorded.load()));
  // Probes the traced processes refused (a return probe on vfork, ...) or
  // found nothing for: bpftrace says so before it runs; here they attach
  // in the program, so after it.
  if (child > 0 && exec_errno == 0) {
    Report rep = read_report(dir, counts_fd);
    for (const auto& [k, why] : skipped) {  // (said before the run)
      rep.spec_attached.erase(specs[k].text);
      rep.messages.erase(std::remove_if(rep.messages.begin(), rep.messages.end(),
                                        [&, &k = k](const auto& m) { return m.spec == specs[k].text; }),
                         rep.messages.end());
    }
    warn_unattached(rep);
  }
  close(counts_fd);
  remove_tree(dir);
  std::fputs(left_running_message(main_status, left_running).c_str(), stderr);
  if (exec_errno != 0) return WIFEXITED(main_status) ? WEXITSTATUS(main_status) : 127;
  if (terminated || child < 0) return 0;
  // The terminal's ^C reaches the program too: when it ended the program
  // before this loop read it from the signalfd, it is still bpftrace's
  // Ctrl-C (exit status 0), not a program that failed.
  if (WIFSIGNALED(main_status) && WTERMSIG(main_status) == SIGINT) return 0;
  if (WIFEXITED(main_status)) return WEXITSTATUS(main_status);
  if (WIFSIGNALED(main_status)) return 128 + WTERMSIG(main_status);
  return 1;
}

}  // namespace uptrace
