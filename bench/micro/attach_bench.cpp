// SPDX-License-Identifier: MIT
// Attach and detach latency per probe through the public API
// (uprobe::register_uprobe / unregister_uprobe) on distinct fixture functions
// (fixtures.S), with a given number of probes already attached.

#include <benchmark/benchmark.h>

#include <vector>

#include "micro.hpp"
#include "uprobe/batch.hpp"
#include "uprobe/config.hpp"
#include "uprobe/uprobe.hpp"

namespace {

class Nop final : public uprobe::Consumer {
 public:
  uprobe::Action handler(uprobe::Regs&) override { return uprobe::Action::keep; }
};

Nop g_a, g_b;

// Probes on fixtures [from, to) with consumer c.
std::vector<uprobe::Uprobe*> attach(std::size_t from, std::size_t to, uprobe::Consumer& c) {
  std::vector<uprobe::Uprobe*> out;
  for (std::size_t i = from; i < to; ++i) out.push_back(uprobe::register_uprobe(micro::fixture(i), c));
  return out;
}
void detach(std::vector<uprobe::Uprobe*>& probes, uprobe::Consumer& c) {
  for (uprobe::Uprobe* p : probes) uprobe::unregister_uprobe(p, c);
  probes.clear();
}

// One new probe site per iteration (range(0) probes already attached).
void BM_Attach(benchmark::State& state) {
  const auto pre = static_cast<std::size_t>(state.range(0));
  std::vector<uprobe::Uprobe*> base = attach(0, pre, g_a), mine;
  std::size_t next = pre;
  for (auto _ : state) {
    if (next == micro::kMicroFixtures) {
      state.PauseTiming();
      detach(mine, g_a);
      next = pre;
      state.ResumeTiming();
    }
    mine.push_back(uprobe::register_uprobe(micro::fixture(next++), g_a));
  }
  detach(mine, g_a);
  detach(base, g_a);
}
BENCHMARK(BM_Attach)->ArgName("attached")->Arg(0)->Arg(10)->Arg(100)->Arg(500)->Unit(benchmark::kMicrosecond);

// Removing the last consumer of a probe site (original bytes restored, RCU grace period).
void BM_Detach(benchmark::State& state) {
  const auto pre = static_cast<std::size_t>(state.range(0));
  std::vector<uprobe::Uprobe*> base = attach(0, pre, g_a), mine;
  for (auto _ : state) {
    if (mine.empty()) {
      state.PauseTiming();
      mine = attach(pre, micro::kMicroFixtures, g_a);
      state.ResumeTiming();
    }
    uprobe::unregister_uprobe(mine.back(), g_a);
    mine.pop_back();
  }
  detach(mine, g_a);
  detach(base, g_a);
}
BENCHMARK(BM_Detach)->ArgName("attached")->Arg(0)->Arg(10)->Arg(100)->Arg(500)->Unit(benchmark::kMicrosecond);

// The same two with Config::optimize off: every site an int3, what an attach
// and a detach of these 2-byte fixtures (`nop; ret`) did before the
// trap-free work (issue 16) gave them a punned jump, its stub and the thread
// check; the before/after comparison of the attach path alone.
struct Int3Only {
  uprobe::Config saved = uprobe::configuration();
  Int3Only() {
    uprobe::Config c = saved;
    c.optimize = false;
    uprobe::configure(c);
  }
  ~Int3Only() { uprobe::configure(saved); }
};
void BM_AttachInt3(benchmark::State& state) {
  Int3Only int3;
  BM_Attach(state);
}
BENCHMARK(BM_AttachInt3)->ArgName("attached")->Arg(0)->Arg(10)->Arg(100)->Arg(500)->Unit(benchmark::kMicrosecond);
void BM_DetachInt3(benchmark::State& state) {
  Int3Only int3;
  BM_Detach(state);
}
BENCHMARK(BM_DetachInt3)->ArgName("attached")->Arg(0)->Arg(10)->Arg(100)->Arg(500)->Unit(benchmark::kMicrosecond);

// A second consumer on an already-probed site (no text patching), and its removal.
void BM_AddSecondConsumer(benchmark::State& state) {
  uprobe::Uprobe* p = uprobe::register_uprobe(micro::fixture(0), g_a);
  for (auto _ : state) {
    uprobe::register_uprobe(micro::fixture(0), g_b);
    uprobe::unregister_uprobe(p, g_b);
  }
  uprobe::unregister_uprobe(p, g_a);
}
BENCHMARK(BM_AddSecondConsumer)->Unit(benchmark::kMicrosecond);

// Attach + detach of one site, back to back.
void BM_AttachDetach(benchmark::State& state) {
  for (auto _ : state) {
    uprobe::Uprobe* p = uprobe::register_uprobe(micro::fixture(1), g_a);
    uprobe::unregister_uprobe(p, g_a);
  }
}
BENCHMARK(BM_AttachDetach)->Unit(benchmark::kMicrosecond);

// One hit of a probe (int3 -> SIGTRAP -> lookup -> consumer -> emulate -> sigreturn), for scale.
void BM_Hit(benchmark::State& state) {
  uprobe::Uprobe* p = uprobe::register_uprobe(micro::fixture(2), g_a);
  for (auto _ : state) micro_fixtures[2]();
  uprobe::unregister_uprobe(p, g_a);
}
BENCHMARK(BM_Hit)->Unit(benchmark::kMicrosecond);

}  // namespace

namespace {

// The batch API on the 1000 fixtures: one register_uprobes() of all of them,
// one unregister_uprobes() of all of them (per batch; divide by 1000 for the
// per-probe figure).
std::vector<uprobe::ProbeRequest> all_fixtures(uprobe::Consumer& c) {
  std::vector<uprobe::ProbeRequest> reqs;
  for (std::size_t i = 0; i < micro::kMicroFixtures; ++i) reqs.push_back(uprobe::ProbeRequest::at(micro::fixture(i), c));
  return reqs;
}

std::vector<uprobe::ProbeConsumer> registered(const std::vector<uprobe::RegisterResult>& res, uprobe::Consumer& c) {
  std::vector<uprobe::ProbeConsumer> out;
  for (const auto& r : res)
    if (r.probe) out.push_back({r.probe, &c});
  return out;
}

void BM_AttachBatch1000(benchmark::State& state) {
  const auto reqs = all_fixtures(g_a);
  for (auto _ : state) {
    auto res = uprobe::register_uprobes(reqs);
    state.PauseTiming();
    const auto pairs = registered(res, g_a);
    if (pairs.size() != reqs.size()) state.SkipWithError("a batch request was refused");
    uprobe::unregister_uprobes(pairs);
    state.ResumeTiming();
  }
}
BENCHMARK(BM_AttachBatch1000)->Unit(benchmark::kMillisecond);

void BM_DetachBatch1000(benchmark::State& state) {
  const auto reqs = all_fixtures(g_a);
  for (auto _ : state) {
    state.PauseTiming();
    const auto pairs = registered(uprobe::register_uprobes(reqs), g_a);
    if (pairs.size() != reqs.size()) state.SkipWithError("a batch request was refused");
    state.ResumeTiming();
    uprobe::unregister_uprobes(pairs);
  }
}
BENCHMARK(BM_DetachBatch1000)->Unit(benchmark::kMillisecond);

}  // namespace
