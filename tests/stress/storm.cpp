// SPDX-License-Identifier: MIT
// uprobe-storm: N producer threads call probed fixtures of every probe kind
// (int3 sites run out of line and emulated, rip-relative, optimized nop5,
// function entries, uretprobes, sessions, filters, Action::remove, USDT with
// and without a semaphore, a function of a library the producers dlclose and
// dlopen again: a pending probe) and check every result, while M attacher threads
// attach and detach the kinds at random (and switch Config::optimize now and
// then). Exact accounting: every attach of a kind is a fresh consumer (a
// window) counting per producer, and the kind's generation counter walks
// through four phases per window w: 4w idle (nothing registered, nothing in
// progress), 4w+1 register_uprobe running, 4w+2 attached (register_uprobe
// returned, unregister_uprobe not started), 4w+3 unregister_uprobe running,
// then 4(w+1) idle again. A producer reads the generation before (g0) and
// after (g1) each call: a call with g0 == g1 == 4w+2 ran entirely while window
// w was attached and must be counted by it exactly once ("inside"); a call
// whose [g0, g1] meets [4w+1, 4w+3] otherwise may or may not be ("edge"); any
// other call must not be. So for every window and producer:
// inside <= hits <= inside + edge, and 0 for producers a filter refuses. Meanwhile a thread scans /proc/self/maps for writable and
// executable mappings; at the end every byte of every executable file mapping
// is compared with its file.
//
//   uprobe-storm [--seconds S] [--producers N] [--attachers M] [--seed X]
//                [--single-step] [--no-emulate] [--locked-lookup] [--defer-signals]
//                [--inject lost|extra]
//
// The runtime switches (uprobe/config.hpp) select the kernel-faithful or
// pre-seed designs: TF single-step after the XOL copy, every instruction run
// out of line, the locked lookup, SIGTRAP deferred in the handler.
// --inject is the checker's self-test: the consumers drop (lost) or double
// (extra) every 997th hit, and the run must fail.
// Prints one line per kind and a summary line; exit status 0 when every check
// passed, 1 otherwise, 2 on bad usage.

#include <dlfcn.h>
#include <getopt.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "proc_text.hpp"
#include "storm.hpp"
#include "uprobe/config.hpp"

namespace storm {
namespace {

struct Options {
  double seconds = 10;
  int producers = 2;
  int attachers = 2;
  std::uint64_t seed = 1;
  uprobe::Config config;  // the switches the run starts with (Config::optimize is toggled during the run)
  std::string kinds;      // comma-separated kind names to run (all when empty)
  bool toggle = true;     // switch Config::optimize now and then
};

[[noreturn]] void usage(const char* argv0, int status) {
  std::fprintf(status ? stderr : stdout,
               "usage: %s [--seconds S] [--producers N] [--attachers M] [--seed X] [--single-step]\n"
               "          [--no-emulate] [--locked-lookup] [--defer-signals] [--no-optimize-entries] [--no-toggle]\n"
               "          [--kinds NAME,...] [--inject lost|extra]\n"
               "  N producer threads (1..%d) call probed fixtures and check results; M attacher threads\n"
               "  attach and detach every probe kind at random for S seconds (default 10 s, 2 + 2, seed 1).\n"
               "  --single-step, --no-emulate, --locked-lookup, --defer-signals, --no-optimize-entries: runtime\n"
               "  switches (config.hpp); --no-toggle: leave Config::optimize alone; --kinds a,b: only those kinds.\n"
               "  --inject: checker self-test, the consumers drop or double every 997th hit (must fail).\n",
               argv0, kMaxProducers);
  std::exit(status);
}

Options parse(int argc, char** argv) {
  Options o;
  static const option longs[] = {{"seconds", required_argument, nullptr, 's'},
                                 {"producers", required_argument, nullptr, 'p'},
                                 {"attachers", required_argument, nullptr, 'a'},
                                 {"seed", required_argument, nullptr, 'S'},
                                 {"inject", required_argument, nullptr, 'i'},
                                 {"single-step", no_argument, nullptr, '1'},
                                 {"no-emulate", no_argument, nullptr, '2'},
                                 {"locked-lookup", no_argument, nullptr, '3'},
                                 {"defer-signals", no_argument, nullptr, '4'},
                                 {"no-optimize-entries", no_argument, nullptr, '5'},
                                 {"no-toggle", no_argument, nullptr, '6'},
                                 {"kinds", required_argument, nullptr, 'k'},
                                 {"help", no_argument, nullptr, 'h'},
                                 {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "", longs, nullptr)) != -1;) {
    char* end = nullptr;
    switch (c) {
      case 's': o.seconds = std::strtod(optarg, &end); break;
      case 'p': o.producers = static_cast<int>(std::strtol(optarg, &end, 10)); break;
      case 'a': o.attachers = static_cast<int>(std::strtol(optarg, &end, 10)); break;
      case 'S': o.seed = std::strtoull(optarg, &end, 0); break;
      case 'i':
        if (std::string(optarg) == "lost") g_inject = 1;
        else if (std::string(optarg) == "extra") g_inject = 2;
        else usage(argv[0], 2);
        break;
      case '1': o.config.xol = uprobe::XolMode::single_step; break;
      case '2': o.config.emulate = false; break;
      case '3': o.config.lookup = uprobe::LookupMode::locked; break;
      case '4': o.config.signal_mask = uprobe::SignalMask::defer; break;
      case '5': o.config.optimize_entries = false; break;
      case '6': o.toggle = false; break;
      case 'k': o.kinds = optarg; break;
      case 'h': usage(argv[0], 0);
      default: usage(argv[0], 2);
    }
    if (end && *end) usage(argv[0], 2);
  }
  if (optind != argc || !(o.seconds > 0) || o.producers < 1 || o.producers > kMaxProducers || o.attachers < 1)
    usage(argv[0], 2);
  return o;
}

/// A kind's state: its generation (phases 4w..4w+3 of window w, see the top
/// of this file), its windows, the current registration.
struct KindState {
  alignas(64) std::atomic<std::uint64_t> gen{0};
  std::mutex mu;  // one attacher at a time; never taken by producers
  std::deque<std::unique_ptr<Window>> windows;
  uprobe::Uprobe* probe = nullptr;
  std::uint64_t attaches = 0, detaches = 0;
  std::uint64_t as_expected = 0;  ///< attaches that took the kind's optimized_as mode
};

/// What one producer saw, per kind and window.
struct Tally {
  std::vector<std::uint64_t> must, edge;
  void add(std::vector<std::uint64_t>& v, std::uint64_t w) {
    if (v.size() <= w) v.resize(w + 64);
    ++v[w];
  }
  std::uint64_t get(const std::vector<std::uint64_t>& v, std::uint64_t w) const { return w < v.size() ? v[w] : 0; }
};

struct Failures {
  std::mutex mu;
  std::vector<std::string> first;
  std::atomic<std::uint64_t> n{0};
  void add(const std::string& s) {
    n.fetch_add(1);
    std::lock_guard<std::mutex> l(mu);
    if (first.size() < 20) first.push_back(s);
  }
};

pid_t gettid_now() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

std::string u64(std::uint64_t v) { return std::to_string(v); }

int run(const Options& o) {
  uprobe::configure(o.config);
  std::vector<Kind> kinds = make_kinds();
  if (!o.kinds.empty()) {
    std::vector<Kind> some;
    for (Kind& k : kinds)
      if (("," + o.kinds + ",").find("," + k.name + ",") != std::string::npos) some.push_back(std::move(k));
    kinds = std::move(some);
    if (kinds.empty()) usage("uprobe-storm", 2);
  }
  const std::size_t nk = kinds.size();
  std::vector<KindState> state(nk);
  std::vector<std::vector<std::size_t>> kinds_of_fn(kFns);
  for (std::size_t k = 0; k < nk; ++k) kinds_of_fn[static_cast<int>(kinds[k].fn)].push_back(k);

  Failures fail;
  const auto exec_before = uprobe_test::compare_text_with_files();
  if (exec_before.differing) fail.add("before the run, code differs from its file: " + exec_before.diffs[0]);

  std::atomic<bool> stop{false};
  std::atomic<int> producers_ready{0};
  std::vector<std::vector<Tally>> tallies(static_cast<std::size_t>(o.producers), std::vector<Tally>(nk));
  std::vector<std::uint64_t> calls(static_cast<std::size_t>(o.producers), 0);
  std::atomic<std::uint64_t> dlopens{0};

  auto producer = [&](int idx) {
    t_producer = idx;
    g_producer_tid[idx].store(gettid_now());
    producers_ready.fetch_add(1);
    std::mt19937_64 rng(o.seed * 1000003 + static_cast<std::uint64_t>(idx));
    std::vector<Tally>& tally = tallies[static_cast<std::size_t>(idx)];
    std::uint64_t g0[8], g1[8];
    std::uint64_t n = 0;
    for (std::uint64_t round = 0; !stop.load(std::memory_order_relaxed); ++round) {
      if (round % 32 == 0) t_dl.reopen();  // dlclose + dlopen: unmapped when no other producer holds it
      for (int f = 0; f < kFns; ++f) {
        const std::vector<std::size_t>& ks = kinds_of_fn[f];
        const std::uint64_t x = rng() >> 2;
        for (std::size_t i = 0; i < ks.size(); ++i) g0[i] = state[ks[i]].gen.load(std::memory_order_acquire);
        const std::uint64_t r = call(static_cast<Fn>(f), x);
        for (std::size_t i = 0; i < ks.size(); ++i) g1[i] = state[ks[i]].gen.load(std::memory_order_acquire);
        ++n;
        bool sema_on = false;
        if (!result_ok(static_cast<Fn>(f), x, r, sema_on))
          fail.add(std::string(fn_name(static_cast<Fn>(f))) + "(" + u64(x) + ") returned " + u64(r) +
                   " on producer " + std::to_string(idx));
        for (std::size_t i = 0; i < ks.size(); ++i) {
          Tally& t = tally[ks[i]];
          if (g0[i] == g1[i] && (g0[i] & 3) == 2) {
            t.add(t.must, g0[i] >> 2);
            if (kinds[ks[i]].ref_ctr && !sema_on)
              fail.add(kinds[ks[i]].name + ": the USDT semaphore was 0 during a call while attached (window " +
                       u64(g0[i] >> 2) + ")");
          } else if (g1[i] >= 1) {
            // Every window w whose registered life [4w+1, 4w+3] meets [g0, g1].
            for (std::uint64_t w = g0[i] / 4; w <= (g1[i] - 1) / 4; ++w) t.add(t.edge, w);
          }
        }
      }
    }
    calls[static_cast<std::size_t>(idx)] = n;
    dlopens.fetch_add(t_dl.opens);
    ::dlclose(t_dl.handle);
  };

  std::atomic<std::uint64_t> toggles{0};
  auto attacher = [&](int id) {
    std::mt19937_64 rng(o.seed * 7919 + 100 + static_cast<std::uint64_t>(id));
    while (!stop.load(std::memory_order_relaxed)) {
      const std::size_t k = rng() % nk;
      KindState& s = state[k];
      std::unique_lock<std::mutex> lock(s.mu, std::try_to_lock);
      if (!lock.owns_lock()) continue;
      const std::uint64_t g = s.gen.load(std::memory_order_relaxed);  // 4w (idle) or 4w+2 (attached)
      try {
        if (g & 2) {
          s.gen.store(g + 1, std::memory_order_release);
          uprobe::unregister_uprobe(s.probe, *s.windows[g >> 2]);
          s.probe = nullptr;
          ++s.detaches;
          s.gen.store(g + 2, std::memory_order_release);
        } else {
          s.windows.push_back(std::make_unique<Window>(kinds[k]));
          s.gen.store(g + 1, std::memory_order_release);
          try {
            s.probe = uprobe::register_uprobe(kinds[k].path, kinds[k].offset, kinds[k].ref_ctr, *s.windows.back());
          } catch (...) {
            s.gen.store(g + 3, std::memory_order_release);  // the window never attached: let it end empty
            s.gen.store(g + 4, std::memory_order_release);
            throw;
          }
          s.gen.store(g + 2, std::memory_order_release);
          ++s.attaches;
          if (kinds[k].optimized_as != uprobe::ProbeMode::pending &&
              uprobe::probe_info(s.probe, uprobe::ProbeDetail::state).mode == kinds[k].optimized_as)
            ++s.as_expected;
        }
      } catch (const std::exception& e) {
        fail.add(kinds[k].name + ((g & 2) ? ": unregister: " : ": register: ") + e.what());
      }
      lock.unlock();
      if (o.toggle && rng() % 64 == 0) {
        uprobe::Config c = uprobe::configuration();
        c.optimize = !c.optimize;
        uprobe::configure(c);
        toggles.fetch_add(1);
      }
    }
  };

  std::atomic<std::uint64_t> scans{0};
  auto scanner = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      for (const std::string& line : uprobe_test::rwx_mappings()) fail.add("writable and executable mapping: " + line);
      scans.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };

  const uprobe::Stats s0 = uprobe::stats();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < o.producers; ++i) threads.emplace_back(producer, i);
  while (producers_ready.load() < o.producers) std::this_thread::yield();
  for (int i = 0; i < o.attachers; ++i) threads.emplace_back(attacher, i);
  threads.emplace_back(scanner);
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  stop.store(true);
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Detach what is still attached (no producer runs any more).
  for (std::size_t k = 0; k < nk; ++k) {
    KindState& s = state[k];
    const std::uint64_t g = s.gen.load();
    if (!(g & 2)) continue;
    s.gen.store(g + 1);
    uprobe::unregister_uprobe(s.probe, *s.windows[g >> 2]);
    ++s.detaches;
    s.gen.store(g + 2);
  }
  const uprobe::Stats s1 = uprobe::stats();
  uprobe::Config c = uprobe::configuration();
  c.optimize = true;
  uprobe::configure(c);

  // Exact accounting, window by window.
  std::uint64_t checked = 0, lost = 0, extra = 0, bad = 0, must_total = 0, edge_total = 0, attaches = 0,
                detaches = 0;
  for (std::size_t k = 0; k < nk; ++k) {
    const Kind& kind = kinds[k];
    KindState& s = state[k];
    std::uint64_t k_hits = 0, k_must = 0, k_edge = 0, k_lost = 0, k_extra = 0;
    for (std::size_t w = 0; w < s.windows.size(); ++w) {
      const Window& win = *s.windows[w];
      bad += win.bad.load();
      if (win.bad.load()) fail.add(kind.name + ": window " + u64(w) + ": " + u64(win.bad.load()) + " bad callbacks");
      if (const std::uint64_t other = win.hits[kMaxProducers].load()) {
        extra += other;
        fail.add(kind.name + ": window " + u64(w) + ": " + u64(other) + " hits by threads that are not producers");
      }
      std::uint64_t w_hits = 0, w_must = 0;
      for (int p = 0; p < o.producers; ++p) {
        const Tally& t = tallies[static_cast<std::size_t>(p)][k];
        std::uint64_t must = t.get(t.must, w), edge = t.get(t.edge, w);
        const std::uint64_t hits = win.hits[p].load();
        if (kind.style == Style::filter && !filter_passes(p)) must = edge = 0;  // the filter refuses this producer
        w_hits += hits;
        w_must += must;
        k_must += must;
        k_edge += edge;
        if (kind.style == Style::once) {
          // At most one hit per producer (it said remove); at least one per window when a call was inside it.
          if (hits > 1 || hits > must + edge) {
            ++k_extra;
            fail.add(kind.name + ": window " + u64(w) + " producer " + std::to_string(p) + ": " + u64(hits) +
                     " hits after Action::remove (must " + u64(must) + ", edge " + u64(edge) + ")");
          }
          continue;
        }
        if (hits < must) {
          k_lost += must - hits;
          fail.add(kind.name + ": window " + u64(w) + " producer " + std::to_string(p) + ": " + u64(hits) +
                   " hits, but " + u64(must) + " calls ran entirely inside the window (edge " + u64(edge) + ")");
        } else if (hits > must + edge) {
          k_extra += hits - must - edge;
          fail.add(kind.name + ": window " + u64(w) + " producer " + std::to_string(p) + ": " + u64(hits) +
                   " hits, more than the " + u64(must) + " calls inside plus " + u64(edge) + " at the edges");
        }
      }
      if (kind.style == Style::once && w_must > 0 && w_hits == 0) {
        ++k_lost;
        fail.add(kind.name + ": window " + u64(w) + ": no hit although " + u64(w_must) + " calls ran inside it");
      }
      k_hits += w_hits;
    }
    std::printf("storm: %-18s %-16s windows %6zu  hits %10llu  inside %10llu  edge %8llu  lost %llu  extra %llu\n",
                kind.name.c_str(), fn_name(kind.fn), s.windows.size(), static_cast<unsigned long long>(k_hits),
                static_cast<unsigned long long>(k_must), static_cast<unsigned long long>(k_edge),
                static_cast<unsigned long long>(k_lost), static_cast<unsigned long long>(k_extra));
    if (kind.optimized_as != uprobe::ProbeMode::pending && s.attaches > 0 && s.as_expected == 0)
      fail.add(kind.name + ": none of its " + u64(s.attaches) + " attaches took the expected optimized mode");
    checked += k_hits;
    if (kind.style != Style::once) {  // a once window counts at most one hit per producer, whatever ran inside
      must_total += k_must;
      edge_total += k_edge;
    }
    lost += k_lost;
    extra += k_extra;
    attaches += s.attaches;
    detaches += s.detaches;
  }

  // Every code byte equals its file's byte again (the dlopen'ed library too);
  // nothing writable and executable.
  DlHandle last;
  last.reopen();
  const auto exec_after = uprobe_test::compare_text_with_files();
  for (const std::string& d : exec_after.diffs) fail.add("after the run, code differs from its file: " + d);
  for (const std::string& line : uprobe_test::rwx_mappings()) fail.add("writable and executable mapping: " + line);
  const std::string exe = uprobe::resolve_address(reinterpret_cast<const void*>(&storm_mid)).path;
  bool exe_compared = false, dl_compared = false, dl_used = false;
  for (const Kind& k : kinds) dl_used = dl_used || k.fn == Fn::dl;
  for (const std::string& p : exec_after.paths) {
    exe_compared = exe_compared || p == exe;
    dl_compared = dl_compared || (dl_used && p == kinds.back().path);
  }
  if (!exe_compared) fail.add("the fixture's text (" + exe + ") was not compared with its file");
  if (dl_used && !dl_compared) fail.add("the library's text (" + kinds.back().path + ") was not compared with its file");
  ::dlclose(last.handle);
  if (attaches == 0 || must_total == 0) fail.add("nothing was attached, or no call ran inside a window");

  std::uint64_t total_calls = 0;
  for (std::uint64_t n : calls) total_calls += n;
  std::printf("storm: runtime: %llu hits (%llu optimized, %llu emulated, %llu out of line), %llu return hits, "
              "%llu restarts, %llu optimize toggles, %llu dlopens; %llu rwx scans; %u code mappings, %llu bytes compared, "
              "%llu differ\n",
              static_cast<unsigned long long>(s1.hits - s0.hits),
              static_cast<unsigned long long>(s1.optimized - s0.optimized),
              static_cast<unsigned long long>(s1.emulated - s0.emulated),
              static_cast<unsigned long long>(s1.out_of_line - s0.out_of_line),
              static_cast<unsigned long long>(s1.return_hits - s0.return_hits),
              static_cast<unsigned long long>(s1.restarts - s0.restarts), static_cast<unsigned long long>(toggles.load()),
              static_cast<unsigned long long>(dlopens.load()), static_cast<unsigned long long>(scans.load()), exec_after.mappings,
              static_cast<unsigned long long>(exec_after.bytes), static_cast<unsigned long long>(exec_after.differing));
  for (const std::string& f : fail.first) std::printf("storm: FAIL %s\n", f.c_str());
  std::printf("storm: %s: %.1f s, %d producers, %d attachers, seed %llu: %llu calls, hits checked %llu "
              "(%llu inside windows, %llu at edges), %llu attaches, %llu detaches, lost=%llu extra=%llu bad=%llu, "
              "%llu failures\n",
              fail.n.load() ? "FAILED" : "passed", secs, o.producers, o.attachers,
              static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(total_calls),
              static_cast<unsigned long long>(checked), static_cast<unsigned long long>(must_total),
              static_cast<unsigned long long>(edge_total), static_cast<unsigned long long>(attaches),
              static_cast<unsigned long long>(detaches), static_cast<unsigned long long>(lost),
              static_cast<unsigned long long>(extra), static_cast<unsigned long long>(bad),
              static_cast<unsigned long long>(fail.n.load()));
  return fail.n.load() ? 1 : 0;
}

}  // namespace
}  // namespace storm

int main(int argc, char** argv) {
  const storm::Options o = storm::parse(argc, argv);
  try {
    return storm::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "storm: %s\n", e.what());
    return 1;
  }
}
