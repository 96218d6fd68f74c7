// SPDX-License-Identifier: MIT
// Tests of uprobe-bench (bench/): the pieces in uprobe_bench_core, and short
// runs of the binary checked for their output format (never for speed).

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "uprobe/uprobe.hpp"

namespace {

using bench::Options;

bool parse(std::vector<std::string> args, Options& o) {
  args.insert(args.begin(), "uprobe-bench");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  o = Options{};
  return bench::parse_options(static_cast<int>(args.size()), argv.data(), o);
}

int ncpu() { return static_cast<int>(bench::allowed_cpus().size()); }

std::vector<int> producers(const std::string& text) {
  std::vector<int> out;
  std::string error;
  EXPECT_TRUE(bench::parse_producers(text, out, error)) << text << ": " << error;
  return out;
}

TEST(Producers, ListsRangesAndCpuMultiples) {
  EXPECT_EQ(producers("4"), (std::vector<int>{4}));
  EXPECT_EQ(producers("1,2,4,8,16"), (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(producers("1-4"), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(producers("1-9:4"), (std::vector<int>{1, 5, 9}));
  EXPECT_EQ(producers("1,1,2"), (std::vector<int>{1, 2}));
  std::vector<int> all;
  for (int p = 1; p <= ncpu(); ++p) all.push_back(p);
  EXPECT_EQ(producers("1-N"), all);
  EXPECT_EQ(producers("2N"), (std::vector<int>{2 * ncpu()}));
  EXPECT_EQ(producers("256"), (std::vector<int>{256}));  // more producers than CPUs is fine
}

TEST(Producers, RejectsBadItems) {
  std::vector<int> out;
  std::string error;
  for (const char* bad : {"0", "257", "4-2", "x", "", "1-", "1-4:0", "-3"})
    EXPECT_FALSE(bench::parse_producers(bad, out, error)) << bad;
  // An empty item is refused as the empty list is, not skipped.
  for (const char* bad : {"1,,2", "1,", ",1", ",,"}) {
    EXPECT_FALSE(bench::parse_producers(bad, out, error)) << bad;
    EXPECT_NE(error.find("empty"), std::string::npos) << bad << ": " << error;
  }
  ASSERT_FALSE(bench::parse_producers("1,,2", out, error));
  EXPECT_EQ(error, "empty item in producer list '1,,2'");
}

TEST(Switches, EveryFlagMapsToConfig) {
  Options o;
  ASSERT_TRUE(parse({"--lookup=locked", "--signal-mask=defer", "--ri-pool=freelist", "--ri-lock=global",
                     "--no-optimize", "--xol=single-step", "--emulate=off", "uprobe-nop"},
                    o));
  const uprobe::Config c = bench::apply(o.switches, uprobe::Config{});
  EXPECT_EQ(c.lookup, uprobe::LookupMode::locked);
  EXPECT_EQ(c.signal_mask, uprobe::SignalMask::defer);
  EXPECT_EQ(c.ri_pool, uprobe::RiPool::freelist);
  EXPECT_EQ(c.ri_lock, uprobe::RiLock::global);
  EXPECT_FALSE(c.optimize);
  EXPECT_EQ(c.xol, uprobe::XolMode::single_step);
  EXPECT_FALSE(c.emulate);
  EXPECT_EQ(bench::describe(c),
            "lookup=locked xol=single-step signal_mask=defer emulate=off ri_pool=freelist ri_lock=global optimize=off");
}

TEST(Switches, ConfigAliasAndChildArgsRoundTrip) {
  bench::Switches s;
  std::string error;
  ASSERT_TRUE(bench::parse_config("lookup=locked,signal=defer,xol=single_step,ri_pool=freelist,optimize=off", s,
                                  error))
      << error;
  Options o;
  std::vector<std::string> args = bench::switch_args(s);
  args.push_back("uprobe-nop");
  ASSERT_TRUE(parse(args, o));
  const uprobe::Config a = bench::apply(s, {}), b = bench::apply(o.switches, {});
  EXPECT_EQ(bench::describe(a), bench::describe(b));
  EXPECT_FALSE(bench::parse_config("lookup", s, error));
  EXPECT_FALSE(bench::parse_config("lookup=fast", s, error));
  EXPECT_FALSE(bench::parse_config("nosuch=1", s, error));
}

TEST(Switches, IgnoredSwitchesAreNamed) {
  bench::Switches s;
  std::string error;
  ASSERT_TRUE(bench::set_switch(s, "ri-pool", "freelist", error));
  ASSERT_TRUE(bench::set_switch(s, "lookup", "locked", error));
  uprobe::Config effective;  // the runtime kept the default ri_pool but took lookup
  effective.lookup = uprobe::LookupMode::locked;
  EXPECT_EQ(bench::ignored_switches(s, effective), "ri-pool=freelist");
  EXPECT_EQ(bench::ignored_switches(s, bench::apply(s, {})), "");
}

TEST(Compare, EverySwitchHasADistinctBeforeAndAfter) {
  for (const bench::Comparison& c : bench::comparisons()) {
    const uprobe::Config before = bench::apply(c.before, {}), after = bench::apply(c.after, {});
    EXPECT_NE(bench::describe(before), bench::describe(after)) << c.name;
    EXPECT_EQ(bench::describe(after), bench::describe(uprobe::Config{})) << c.name;  // "after" is the default
    EXPECT_FALSE(c.default_variants.empty());
    for (const std::string& v : c.default_variants) EXPECT_NE(bench::find_variant(v), nullptr) << v;
  }
  for (const char* n : {"lookup", "signal-mask", "ri-pool", "ri-lock", "optimize", "xol", "emulate"})
    EXPECT_NE(bench::find_comparison(n), nullptr) << n;
}

TEST(Options, ModesAndDefaults) {
  Options o;
  ASSERT_TRUE(parse({"uprobe-nop"}, o));
  EXPECT_FALSE(o.lab());
  EXPECT_EQ(o.producers, (std::vector<int>{1}));

  ASSERT_TRUE(parse({"-p", "1,2,4", "uprobe-nop"}, o));
  EXPECT_TRUE(o.lab());

  ASSERT_TRUE(parse({"--compare", "lookup"}, o));
  EXPECT_TRUE(o.lab());
  EXPECT_EQ(o.variants, (std::vector<std::string>{"uprobe-nop"}));
  EXPECT_EQ(static_cast<int>(o.producers.size()), ncpu());
  EXPECT_FALSE(parse({"--compare", "lookup", "--lookup=locked"}, o));

  ASSERT_TRUE(parse({"--sweep"}, o));
  for (const std::string& v : o.variants) EXPECT_EQ(v.rfind("kernel-", 0), std::string::npos) << v;
  EXPECT_NE(std::find(o.variants.begin(), o.variants.end(), "uretprobe-nop5"), o.variants.end());

  ASSERT_TRUE(parse({"--kernel", "uprobe-nop", "uretprobe-ret", "-p", "1"}, o));
  EXPECT_EQ(o.variants, (std::vector<std::string>{"uprobe-nop", "uretprobe-ret", "kernel-uprobe-nop",
                                                  "kernel-uretprobe-ret"}));
  ASSERT_TRUE(parse({"--kernel"}, o));
  EXPECT_EQ(o.variants.size(), 10u);  // kernel-u(ret)probe-{nop,push,ret,nop5,entry}

  ASSERT_TRUE(parse({"uprobe-*"}, o));
  EXPECT_EQ(o.variants, (std::vector<std::string>{"uprobe-nop", "uprobe-push", "uprobe-ret", "uprobe-nop5",
                                                  "uprobe-entry", "uprobe-nop5-mid"}));

  ASSERT_TRUE(parse({"--sweep-producers", "1,2"}, o));  // the older spelling implies --sweep
  EXPECT_TRUE(o.sweep);
  EXPECT_EQ(o.producers, (std::vector<int>{1, 2}));

  ASSERT_TRUE(parse({"-o", "out.json", "uprobe-nop"}, o));  // the name implies the format
  EXPECT_EQ(o.format, bench::Format::json);
  EXPECT_FALSE(parse({"-o", "out.txt", "uprobe-nop"}, o));

  EXPECT_FALSE(parse({}, o));
  EXPECT_FALSE(parse({"nosuch"}, o));
  EXPECT_FALSE(parse({"--format", "xml", "uprobe-nop"}, o));
}

TEST(Report, ScalingLineIsTheSeedsFormat) {
  bench::Result r;
  r.mean = 13.100;
  r.stddev = 0.007;
  EXPECT_EQ(bench::scaling_line("uprobe-nop", 4, r),
            "uprobe-nop            ( 4 cpus):   13.100 \u00B1 0.007M/s  (  3.275M/s/cpu)");
  r.mean = 146.195;
  r.stddev = 0.230;
  EXPECT_EQ(bench::scaling_line("uprobe-nop", 80, r),
            "uprobe-nop            (80 cpus):  146.195 \u00B1 0.230M/s  (  1.827M/s/cpu)");
}

TEST(Report, Summarize) {
  const bench::Result r = bench::summarize({1e6, 2e6, 3e6, 10e6});
  EXPECT_DOUBLE_EQ(r.mean, 4.0);
  EXPECT_DOUBLE_EQ(r.median, 2.5);
  EXPECT_NEAR(r.stddev, 4.0825, 1e-4);
  EXPECT_DOUBLE_EQ(bench::summarize({}).mean, 0.0);
}

TEST(Protocol, OutcomeRoundTrips) {
  bench::RunOutcome r;
  r.ok = true;
  r.config = "lookup=locked xol=jump-back";
  r.rates = {1234567.25, 2e6};
  r.delta_ns = {1000000123, 999999877};
  bench::RunOutcome back;
  ASSERT_TRUE(bench::decode_outcome(bench::encode_outcome(r), back));
  EXPECT_TRUE(back.ok);
  EXPECT_EQ(back.config, r.config);
  EXPECT_EQ(back.rates, r.rates);
  EXPECT_EQ(back.delta_ns, r.delta_ns);

  r.ok = false;
  r.skipped = true;
  r.note = "not permitted: because";
  ASSERT_TRUE(bench::decode_outcome(bench::encode_outcome(r), back));
  EXPECT_TRUE(back.skipped);
  EXPECT_EQ(back.note, r.note);
  EXPECT_FALSE(bench::decode_outcome("sample 1 2\n", back));  // a child that died mid-way
}

TEST(Output, Escaping) {
  EXPECT_EQ(bench::csv_escape("plain"), "plain");
  EXPECT_EQ(bench::csv_escape("a,b"), "\"a,b\"");
  EXPECT_EQ(bench::csv_escape("say \"x\""), "\"say \"\"x\"\"\"");
  EXPECT_EQ(bench::json_escape("a\"b\\c\n\x01"), "a\\\"b\\\\c\\n\\u0001");
}

bench::Point sample_point() {
  bench::Point p;
  p.variant = "uprobe-nop";
  p.compare = "lookup";
  p.design = "before";
  p.producers = 2;
  p.config = "lookup=locked xol=jump-back signal_mask=nodefer emulate=on ri_pool=objpool ri_lock=none optimize=on";
  p.ok = true;
  p.samples = {{0, 0, true, 1e6}, {0, 1, false, 2e6}, {0, 2, false, 4e6}};
  p.measured = {2e6, 4e6};
  p.result = bench::summarize(p.measured);
  return p;
}

std::string record(bench::Format f) {
  Options o;
  o.format = f;
  o.compare = "lookup";
  char* buf = nullptr;
  std::size_t len = 0;
  FILE* mem = open_memstream(&buf, &len);
  {
    bench::Recorder rec(o, mem);
    rec.add(sample_point());
    rec.add(bench::Ratio{"lookup", "uprobe-nop", 2, 3.0, 4.5, 1.5});
    rec.skip("kernel-uprobe-nop", "not permitted, as a test");
    rec.finish();
  }
  std::fclose(mem);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

TEST(Output, CsvHasEverySampleAndSummary) {
  std::istringstream in(record(bench::Format::csv));
  std::string line, header;
  std::vector<std::string> rows;
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) == 0) continue;
    if (header.empty()) header = line;
    else rows.push_back(line);
  }
  EXPECT_EQ(header.rfind("kind,variant,compare,design,lookup,xol,signal_mask,emulate,ri_pool,ri_lock,optimize,"
                         "producers,",
                         0),
            0u);
  auto columns = [](const std::string& l) {
    std::size_t n = 1;
    bool quoted = false;
    for (char c : l) {
      if (c == '"') quoted = !quoted;
      else if (c == ',' && !quoted) ++n;
    }
    return n;
  };
  ASSERT_EQ(rows.size(), 6u);  // 3 samples, summary, ratio, skip
  for (const std::string& r : rows) EXPECT_EQ(columns(r), columns(header)) << r;
  EXPECT_EQ(rows[0].rfind("sample,uprobe-nop,lookup,before,locked,", 0), 0u) << rows[0];
  EXPECT_NE(rows[0].find(",1000000.0,"), std::string::npos) << rows[0];
  EXPECT_EQ(rows[3].rfind("summary,uprobe-nop,lookup,before,locked,", 0), 0u) << rows[3];
  EXPECT_NE(rows[3].find(",3.000000,"), std::string::npos) << rows[3];  // mean of the measured samples
  EXPECT_EQ(rows[4].rfind("ratio,uprobe-nop,lookup,", 0), 0u) << rows[4];
  EXPECT_NE(rows[4].find(",1.500000,"), std::string::npos) << rows[4];
  EXPECT_EQ(rows[5].rfind("skip,kernel-uprobe-nop,", 0), 0u) << rows[5];
  EXPECT_NE(rows[5].find("\"not permitted, as a test\""), std::string::npos) << rows[5];
}

TEST(Output, JsonHasEverySampleAndSummary) {
  const std::string j = record(bench::Format::json);
  EXPECT_EQ(j.front(), '{');
  for (const char* s : {"\"meta\": {", "\"samples\": [", "\"summaries\": [", "\"ratios\": [", "\"skipped\": [",
                        "\"hits_per_sec\": 1000000.0", "\"warmup\": true", "\"mean_mps\": 3.000000",
                        "\"ratio\": 1.500000", "\"lookup\": \"locked\"", "\"design\": \"before\""})
    EXPECT_NE(j.find(s), std::string::npos) << s;
  std::size_t braces = 0, brackets = 0;
  for (char c : j) {
    braces += c == '{';
    braces -= c == '}';
    brackets += c == '[';
    brackets -= c == ']';
  }
  EXPECT_EQ(braces, 0u);
  EXPECT_EQ(brackets, 0u);
}

TEST(Kernel, LocateAgreesWithTheLibrary) {
  bench::kernel::Location where;
  std::string error;
  const void* target = reinterpret_cast<const void*>(&uprobe_target_nop5);
  ASSERT_TRUE(bench::kernel::locate(target, where, error)) << error;
  const uprobe::FileOffset fo = uprobe::resolve_address(target);
  EXPECT_EQ(where.path, fo.path);
  EXPECT_EQ(where.offset, fo.offset);
  int on_stack = 0;
  EXPECT_FALSE(bench::kernel::locate(&on_stack, where, error));
}

TEST(Kernel, CountsHitsOrSaysWhyNot) {
  const std::string why = bench::kernel::preflight();
  if (!why.empty()) GTEST_SKIP() << why;
  bench::kernel::Location where;
  std::string error;
  ASSERT_TRUE(bench::kernel::locate(reinterpret_cast<const void*>(&uprobe_target_push), where, error));
  for (bool ret : {false, true}) {
    const int fd = bench::kernel::open_uprobe(where, ret, error);
    ASSERT_GE(fd, 0) << error;
    for (int i = 0; i < 1000; ++i) uprobe_target_push();
    EXPECT_EQ(bench::kernel::read_count(fd), 1000u) << (ret ? "uretprobe" : "uprobe");
    close(fd);
  }
}

// ---- The binary, end to end.

struct Exec {
  int status = -1;
  std::string out;
};

// `args`, stderr and stdout (or stdout to the file `stdout_to`) read back.
Exec run(const std::string& args, const std::string& stdout_to = "") {
  Exec r;
  const std::string cmd =
      std::string(UPROBE_BENCH_EXE) + " " + args + " 2>&1" + (stdout_to.empty() ? "" : " >" + stdout_to);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(Binary, SingleRunPrintsTheKernelBenchFormat) {
  const Exec r = run("uprobe-nop -w 0 -d 1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Iter   0 ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Summary: hits "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Config: lookup=speculative"), std::string::npos) << r.out;
}

TEST(Binary, CompareLookupPrintsBothTablesAndRatios) {
  const Exec r = run("--compare lookup -p 1 -w 0 -d 1 -q");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* s : {"BEFORE (lookup=locked)", "AFTER (lookup=speculative)", "Ratio after/before",
                        "uprobe-nop            ( 1 cpus): "})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(Options, CompareAllAndAttachLibc) {
  Options o;
  ASSERT_TRUE(parse({"--compare", "all", "-p", "2,16"}, o));
  EXPECT_EQ(o.compare, "all");
  EXPECT_FALSE(o.variants_given);
  EXPECT_EQ(o.producers, (std::vector<int>{2, 16}));
  for (const bench::Comparison& c : bench::comparisons())  // every switch's own variants are there
    for (const std::string& v : c.default_variants)
      EXPECT_NE(std::find(o.variants.begin(), o.variants.end(), v), o.variants.end()) << c.name << ": " << v;
  ASSERT_TRUE(parse({"--compare", "all", "uprobe-nop"}, o));
  EXPECT_TRUE(o.variants_given);
  EXPECT_EQ(o.variants, (std::vector<std::string>{"uprobe-nop"}));
  EXPECT_FALSE(parse({"--compare", "nothing"}, o));

  ASSERT_TRUE(parse({"--attach-libc", "1000", "--kernel", "--kernel-count", "100"}, o));
  EXPECT_EQ(o.attach_libc, 1000);
  EXPECT_TRUE(o.kernel);
  EXPECT_EQ(o.kernel_count, 100);
  ASSERT_TRUE(parse({"--attach-libc", "10", "--kernel-count", "100"}, o));
  EXPECT_EQ(o.kernel_count, 10) << "never more kernel probes than libuprobe ones";
  EXPECT_FALSE(parse({"--attach-libc", "10", "uprobe-nop"}, o));
  EXPECT_FALSE(parse({"--attach-libc", "0"}, o));
}

TEST(Binary, CompareAllPrintsEveryPair) {
  const Exec r = run("--compare all uprobe-nop -p 1 -w 0 -d 1 -q");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--compare all: before vs after of every switch"), std::string::npos) << r.out;
  for (const char* s : {"lookup       locked / speculative     uprobe-nop                    1",
                        "signal-mask  defer / nodefer          uprobe-nop                    1",
                        "ri-pool      freelist / objpool       uprobe-nop                    1",
                        "ri-lock      global / none            uprobe-nop                    1",
                        "optimize     off / on                 uprobe-nop                    1",
                        "xol          single-step / jump-back  uprobe-nop                    1",
                        "emulate      off / on                 uprobe-nop                    1"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(Binary, AttachLibcReportsBatchAttachAndDetach) {
  const Exec r = run("--attach-libc 50 --attach-no-single");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("attach-libc: /"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("libuprobe, one batch (50)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("one by one"), std::string::npos) << r.out;
}

TEST(Binary, AttachLibcWithoutOptimizationTimesTheConversionApart) {
  // --no-optimize reaches the attaching child: the batch writes int3s only,
  // then configure(optimize on) converts them, timed on its own line.
  const Exec r = run("--attach-libc 50 --attach-no-single --no-optimize");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("returned (the attach time includes the conversions): int3 50"), std::string::npos) << r.out;
  const auto at = r.out.find("then configure(optimize on) converted them: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimized-entry", at), std::string::npos) << r.out;
}

TEST(Binary, AttachLibcWritesEveryRoundAsCsvAndJson) {
  // --format csv|json is not ignored by --attach-libc: every round's figures,
  // on stdout (the text table goes to stderr) or to -o FILE.
  auto capture = [](const std::string& args) {
    const std::string cmd = std::string(UPROBE_BENCH_EXE) + " " + args + " 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    if (!p) return out;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << out;
    return out;
  };
  const std::string csv = capture("--attach-libc 30 -r 2 --no-optimize --format csv");
  std::istringstream in(csv);
  std::string line;
  int batch = 0, single = 0, convert = 0, header = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) == 0) continue;
    if (line == "round,measurement,probes,attach_wall_ms,attach_cpu_ms,detach_wall_ms,detach_cpu_ms") {
      ++header;
      continue;
    }
    std::vector<std::string> f;
    std::istringstream cells(line);
    for (std::string c; std::getline(cells, c, ',');) f.push_back(c);
    ASSERT_GE(f.size(), 5u) << line;
    EXPECT_EQ(f[2], "30") << line;
    EXPECT_GT(std::atof(f[3].c_str()), 0.0) << line;
    batch += f[1] == "batch";
    single += f[1] == "single";
    convert += f[1] == "convert";
  }
  EXPECT_EQ(header, 1) << csv;
  EXPECT_EQ(batch, 2) << csv;
  EXPECT_EQ(single, 2) << csv;
  EXPECT_EQ(convert, 2) << csv;
  const std::string json = capture("--attach-libc 30 -r 2 --attach-no-single --format json");
  EXPECT_EQ(json.rfind("{\n  \"meta\": {", 0), 0u) << json;
  std::size_t rounds = 0;
  for (std::size_t at = json.find("{\"round\": "); at != std::string::npos; at = json.find("{\"round\": ", at + 1)) ++rounds;
  EXPECT_EQ(rounds, 2u) << json;
  EXPECT_NE(json.find("\"attached\": 30"), std::string::npos) << json;
  EXPECT_EQ(json.find("single_attach_ms"), std::string::npos) << json;
  // The refused functions are in the data too (libc's abort is on the trap path).
  EXPECT_NE(json.find("\"refused\": [\"offset 0x"), std::string::npos) << json;
  EXPECT_NE(csv.find("# refused: offset 0x"), std::string::npos) << csv;
  // -o with a .csv name implies --format csv; any other name is refused.
  char dir[] = "/tmp/uprobe-bench-o-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string file = std::string(dir) + "/a.csv";
  const Exec r = run("--attach-libc 10 -r 1 --attach-no-single -o " + file);
  EXPECT_EQ(r.status, 0) << r.out;
  FILE* f = std::fopen(file.c_str(), "r");
  ASSERT_NE(f, nullptr) << r.out;
  char text[256] = {};
  bool has_header = false;
  while (std::fgets(text, sizeof text, f))
    has_header |= std::string(text).rfind("round,measurement,probes,", 0) == 0;
  std::fclose(f);
  EXPECT_TRUE(has_header);
  std::remove(file.c_str());
  ::rmdir(dir);
  const Exec bad = run("--attach-libc 10 -o /tmp/uprobe-bench-out.txt");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("-o FILE needs --format"), std::string::npos) << bad.out;
}

TEST(Binary, AttachLibcRefusesOptionsItWouldIgnore) {
  // Producers, warm-up, duration, pinning and --cycles mean nothing to an
  // attach/detach timing: refused with a line that says so, not ignored.
  for (const char* opt : {"-p 4", "-d 1", "-w 0", "-a", "--cycles"}) {
    const Exec r = run(std::string("--attach-libc 10 ") + opt);
    EXPECT_EQ(r.status, 2) << opt << ": " << r.out;
    EXPECT_NE(r.out.find("does not apply"), std::string::npos) << opt << ": " << r.out;
  }
  const Exec ok = run("--attach-libc 10 -r 1 --attach-no-single --no-optimize");
  EXPECT_EQ(ok.status, 0) << ok.out;
  // Counts print as counts.
  EXPECT_NE(ok.out.find("includes the conversions): int3 10\n"), std::string::npos) << ok.out;
}

TEST(Binary, CsvOnStdoutKeepsTheTextOnStderr) {
  const std::string cmd = std::string(UPROBE_BENCH_EXE) + " --sweep-variants usermode-count -p 1,2 -w 0 -d 1 -q "
                          "--format csv 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  std::istringstream in(out);
  std::string line;
  int summaries = 0;
  while (std::getline(in, line)) {
    EXPECT_TRUE(line.rfind("# ", 0) == 0 || line.rfind("kind,", 0) == 0 || line.rfind("sample,", 0) == 0 ||
                line.rfind("summary,", 0) == 0)
        << line;
    summaries += line.rfind("summary,usermode-count,", 0) == 0;
  }
  EXPECT_EQ(summaries, 2);
}

TEST(Binary, KernelRowsRunOrSayWhyInOneLine) {
  const Exec r = run("--kernel uprobe-nop -p 1 -w 0 -d 1 -q");
  ASSERT_EQ(r.status, 0) << r.out;
  const bool ran = r.out.find("kernel-uprobe-nop     ( 1 cpus): ") != std::string::npos;
  const bool said = r.out.find("kernel rows skipped: ") != std::string::npos;
  EXPECT_TRUE(ran != said) << r.out;
  EXPECT_NE(r.out.find("uprobe-nop            ( 1 cpus): "), std::string::npos) << r.out;
}


// ---- Options that would be ignored or contradict each other are refused.

TEST(Options, RefusesWhatItWouldIgnore) {
  Options o;
  EXPECT_FALSE(parse({"--kernel-count", "5", "uprobe-nop"}, o));
  EXPECT_FALSE(parse({"--attach-no-single", "uprobe-nop"}, o));
  EXPECT_FALSE(parse({"--sweep", "--compare", "lookup"}, o));
  EXPECT_FALSE(parse({"--sweep-variants", "uprobe-nop", "--compare", "lookup"}, o));
  EXPECT_FALSE(parse({"-p", "1,,2", "uprobe-nop"}, o));
  EXPECT_FALSE(parse({"--variants", "uprobe-nop,,uprobe-push"}, o));
  // A .csv/.json name and an explicit --format must agree.
  EXPECT_FALSE(parse({"-o", "x.csv", "--format", "json", "uprobe-nop"}, o));
  EXPECT_FALSE(parse({"--format", "csv", "-o", "x.json", "uprobe-nop"}, o));
  EXPECT_FALSE(parse({"--format", "text", "-o", "x.csv", "uprobe-nop"}, o));
  EXPECT_FALSE(parse({"--attach-libc", "10", "-o", "x.csv", "--format", "json"}, o));
  EXPECT_FALSE(parse({"--cycles", "-o", "x.csv", "uprobe-nop"}, o));
  ASSERT_TRUE(parse({"-o", "x.csv", "--format", "csv", "uprobe-nop"}, o));
  EXPECT_EQ(o.format, bench::Format::csv);
  ASSERT_TRUE(parse({"-o", "x.data", "--format", "json", "uprobe-nop"}, o));  // no extension to contradict
  EXPECT_EQ(o.format, bench::Format::json);
  ASSERT_TRUE(parse({"--attach-libc", "10", "--kernel-count", "5", "--attach-no-single"}, o));
  EXPECT_EQ(o.kernel_count, 5);
  EXPECT_TRUE(o.attach_no_single);
}

TEST(Binary, ContradictionsAreRefusedWithALine) {
  const struct {
    const char* args;
    const char* says;
  } cases[] = {
      {"--kernel-count 5 -w 0 -d 1 uprobe-nop", "uprobe-bench: --kernel-count applies to --attach-libc only\n"},
      {"--attach-no-single -w 0 -d 1 uprobe-nop", "uprobe-bench: --attach-no-single applies to --attach-libc only\n"},
      {"--sweep --compare lookup -w 0 -d 1 -q", "uprobe-bench: --sweep and --compare are two modes: pick one"},
      {"-o /tmp/uprobe-bench-never.csv --format json -w 0 -d 1 uprobe-nop",
       "uprobe-bench: -o /tmp/uprobe-bench-never.csv is a .csv name but --format is json"},
      {"-p 1,,2 -w 0 -d 1 -q uprobe-nop", "uprobe-bench: empty item in producer list '1,,2'\n"},
  };
  for (const auto& c : cases) {
    const Exec r = run(c.args);
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": " << r.out;
    EXPECT_EQ(r.out.find("Setting up benchmark"), std::string::npos) << c.args << ": " << r.out;
  }
  FILE* f = std::fopen("/tmp/uprobe-bench-never.csv", "r");
  EXPECT_EQ(f, nullptr) << "refused, but the file was written";
  if (f) std::fclose(f);
}

// ---- Output that cannot be written: said in one line, exit status 2.

// `args` with stdout sent to `stdout_to`; what the binary wrote to stderr.
Exec run_stdout_to(const std::string& args, const std::string& stdout_to) { return run(args, stdout_to); }

TEST(Binary, WriteErrorsAreNotIgnored) {
  const char* const stdout_full = "uprobe-bench: cannot write standard output: No space left on device\n";
  const char* const file_full = "uprobe-bench: cannot write /dev/full: No space left on device\n";
  const struct {
    const char* args;
    const char* says;
  } cases[] = {
      {"--list", stdout_full},
      {"--help", stdout_full},
      {"-w 0 -d 1 uprobe-nop", stdout_full},
      {"-w 0 -d 1 --format csv uprobe-nop", stdout_full},
      {"-w 0 -d 1 --format json uprobe-nop", stdout_full},
      {"-p 1,2 -w 0 -d 1 -q uprobe-nop", stdout_full},
      {"-p 1 -q -w 0 -d 1 -o /dev/full --format csv uprobe-nop", file_full},
      {"-p 1 -q -w 0 -d 1 -o /dev/full --format json uprobe-nop", file_full},
      {"-p 1,2 -q -w 0 -d 1 -o /dev/full --format json uprobe-nop", file_full},
      {"--attach-libc 10 --attach-no-single -o /dev/full --format csv", file_full},
  };
  for (const auto& c : cases) {
    const bool file = std::string(c.says) == file_full;
    const Exec r = run_stdout_to(c.args, file ? "/dev/null" : "/dev/full");
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": " << r.out;
    std::size_t lines = 0;
    for (std::size_t at = r.out.find("cannot write"); at != std::string::npos; at = r.out.find("cannot write", at + 1))
      ++lines;
    EXPECT_EQ(lines, 1u) << c.args << ": said once\n" << r.out;
  }
  const Exec ok = run_stdout_to("--list", "/dev/null");
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_EQ(ok.out, "");
}

TEST(Binary, OutputIsCheckedBeforeMeasuringInEveryMode) {
  // -d 30: were anything measured first, the refusal would take 30 s or more.
  char dir[] = "/tmp/uprobe-bench-o-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string missing = std::string(dir) + "/no/x";
  const struct {
    std::string args, file;
  } cases[] = {
      {"-w 0 -d 30 uprobe-nop", ".csv"},
      {"-p 1 -w 0 -d 30 uprobe-nop", ".csv"},
      {"-p 1,2 -w 0 -d 30 uprobe-nop", ".json"},
      {"--compare lookup -p 1 -w 0 -d 30", ".csv"},
      {"--compare all -p 1 -w 0 -d 30", ".csv"},
      {"--kernel -p 1 -w 0 -d 30 uprobe-nop", ".csv"},
      {"--attach-libc 10 -r 1000", ".json"},
  };
  for (const auto& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const Exec r = run(c.args + " -o " + missing + c.file);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.out;
    const std::string named = c.args.rfind("--compare all", 0) == 0 ? missing + "-lookup" + c.file : missing + c.file;
    EXPECT_NE(r.out.find("uprobe-bench: cannot write " + named + ": No such file or directory\n"), std::string::npos)
        << c.args << ": " << r.out;
    EXPECT_EQ(r.out.find("Setting up benchmark"), std::string::npos) << c.args << ": " << r.out;
    EXPECT_LT(s, 10.0) << c.args;
  }
  ::rmdir(dir);
}

// --cycles runs its variants in one process: each one's "Probe stats" are its
// own (hits == counted), not the process's running total.
TEST(Binary, CyclesProbeStatsArePerVariant) {
  const Exec r = run("--cycles -r 2 -d 1 uprobe-nop uprobe-push uprobe-ret");
  ASSERT_EQ(r.status, 0) << r.out;
  std::size_t lines = 0;
  for (std::size_t at = r.out.find("Probe stats: "); at != std::string::npos; at = r.out.find("Probe stats: ", at + 1)) {
    EXPECT_EQ(r.out.compare(at, 46, "Probe stats: hits 101000, counted 101000, opti"), 0)
        << r.out.substr(at, r.out.find('\n', at) - at);
    ++lines;
  }
  EXPECT_EQ(lines, 6u) << r.out;  // 3 variants, 2 rounds
}

TEST(Binary, AttachLibcSaysHowManyThereAre) {
  const Exec r = run("--attach-libc 100000 -r 1 --attach-no-single");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("the first 100000"), std::string::npos) << r.out;
  const std::size_t at = r.out.find(".so.6, all ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const int all = std::atoi(r.out.c_str() + at + 11);
  EXPECT_GT(all, 100) << r.out;
  EXPECT_LT(all, 100000) << r.out;
  EXPECT_NE(r.out.find(".so.6, all " + std::to_string(all) + " .dynsym function entries (asked 100000)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("libuprobe, one batch (" + std::to_string(all) + ")"), std::string::npos) << r.out;
}

}  // namespace

namespace {

TEST(Options, CyclesTakesVariantsAndKernelButNoProducers) {
  Options o;
  ASSERT_TRUE(parse({"--cycles", "--kernel", "uprobe-nop5"}, o));
  EXPECT_TRUE(o.cycles);
  EXPECT_EQ(o.variants, (std::vector<std::string>{"uprobe-nop5", "kernel-uprobe-nop5"}));
  EXPECT_FALSE(parse({"--cycles", "-p", "2", "uprobe-nop5"}, o));
  EXPECT_FALSE(parse({"--cycles", "--compare", "lookup"}, o));
  EXPECT_FALSE(parse({"--cycles"}, o));
}

// Every row is printed with its ratio to the floor (the floor's own is
// exactly 1.000) and the hit counts checked (exit status 0); a loop-only
// variant says why it has no row.
TEST(Binary, CyclesPrintsTicksAndRatios) {
  const Exec r = run("--cycles -d 1 trampoline-floor uprobe-nop5 uretprobe-nop5 usermode-count");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("variant                     ticks        ns   floor/this kernel/this"), std::string::npos)
      << r.out;
  std::istringstream in(r.out);
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::string name, ratio;
    double ticks = 0, ns = 0;
    if (!(w >> name >> ticks >> ns >> ratio)) continue;
    if (name == "trampoline-floor") {
      EXPECT_EQ(ratio, "1.000") << line;
      ++rows;
    } else if (name == "uprobe-nop5" || name == "uretprobe-nop5") {
      EXPECT_GT(ticks, 0.0) << line;
      EXPECT_NE(ratio, "-") << line;
      ++rows;
    }
  }
#if defined(UPROBE_HAS_URETPROBE)
  EXPECT_EQ(rows, 3) << r.out;
#else
  EXPECT_EQ(rows, 2) << r.out;
#endif
  EXPECT_NE(r.out.find("usermode-count         no single target to call"), std::string::npos) << r.out;
}

}  // namespace

namespace {

// --consumer: plain (the default) or gpr; anything else, or with
// --attach-libc (whose consumer is its own), refused.
TEST(Options, ConsumerIsPlainByDefaultOrGpr) {
  Options o;
  ASSERT_TRUE(parse({"uprobe-nop5"}, o));
  EXPECT_EQ(o.consumer, bench::ConsumerKind::plain);
  ASSERT_TRUE(parse({"--consumer=gpr", "--cycles", "uprobe-nop5"}, o));
  EXPECT_EQ(o.consumer, bench::ConsumerKind::gpr);
  ASSERT_TRUE(parse({"--consumer", "plain", "-p", "1,2", "uretprobe-entry"}, o));
  EXPECT_EQ(o.consumer, bench::ConsumerKind::plain);
  ASSERT_TRUE(parse({"--consumer=opaque", "uprobe-entry"}, o));
  EXPECT_EQ(o.consumer, bench::ConsumerKind::opaque);
  ASSERT_TRUE(parse({"--consumer=int", "uprobe-entry"}, o));
  EXPECT_EQ(o.consumer, bench::ConsumerKind::integer);
  EXPECT_FALSE(parse({"--consumer=fast", "uprobe-nop5"}, o));
  EXPECT_FALSE(parse({"--consumer=gpr", "--attach-libc", "10"}, o));
  EXPECT_STREQ(bench::consumer_name(bench::ConsumerKind::plain), "plain");
  EXPECT_STREQ(bench::consumer_name(bench::ConsumerKind::gpr), "gpr");
  EXPECT_STREQ(bench::consumer_name(bench::ConsumerKind::opaque), "opaque");
  EXPECT_STREQ(bench::consumer_name(bench::ConsumerKind::integer), "int");
}

// What libuprobe saves around each consumer, as every probe run prints it:
// the plain consumer's code reads as SSE only (its double in xmm0), the
// opaque one's calls through a pointer (what the site makes live: a
// function entry's, a return's, a nop5 inside a function's: everything),
// gpr declared it uses none, the int one's code touches no vector register.
TEST(Binary, RunsSayWhatIsSavedAroundTheConsumer) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizer build: the consumers' code calls the sanitizer runtime (not read)";
#endif
  const struct {
    const char* args;
    const char* saved;
  } cases[] = {
      {"uprobe-entry -w 0 -d 1", "Saved around the consumer: xmm0, MXCSR\n"},
      {"uprobe-nop5 -w 0 -d 1", "Saved around the consumer: xmm0, MXCSR\n"},
      {"uretprobe-entry -w 0 -d 1", "Saved around the consumer: xmm0, MXCSR\n"},
      {"uprobe-entry -w 0 -d 1 --consumer=opaque", "Saved around the consumer: entry\n"},
      {"uprobe-nop5 -w 0 -d 1 --consumer=opaque", "Saved around the consumer: entry\n"},  // (its function's first byte)
      {"uprobe-nop5-mid -w 0 -d 1", "Saved around the consumer: xmm0, MXCSR\n"},
      {"uprobe-nop5-mid -w 0 -d 1 --consumer=opaque", "Saved around the consumer: full\n"},
      {"uretprobe-entry -w 0 -d 1 --consumer=opaque", "Saved around the consumer: return\n"},
      {"uprobe-entry -w 0 -d 1 --consumer=gpr", "Saved around the consumer: none\n"},
      {"uprobe-entry -w 0 -d 1 --consumer=int", "Saved around the consumer: none (code read)\n"},
      {"uprobe-nop5-mid -w 0 -d 1 --consumer=int", "Saved around the consumer: none (code read)\n"},
      {"uretprobe-entry -w 0 -d 1 --consumer=int", "Saved around the consumer: none (code read)\n"},
  };
  for (const auto& c : cases) {
    const Exec e = run(c.args);
    ASSERT_EQ(e.status, 0) << c.args << "\n" << e.out;
    EXPECT_NE(e.out.find(c.saved), std::string::npos) << c.args << "\n" << e.out;
  }
}

// The consumer that ran is printed: by --cycles in its heading and its
// table's title, by every probe run ("Consumer: ..."), and by a sweep's
// heading, which passes it on to its children.
TEST(Binary, RunsSayWhichConsumerRan) {
  const Exec c = run("--cycles -d 1 --consumer=gpr uprobe-nop5");
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_NE(c.out.find("Consumer (uprobe-*/uretprobe-*): gpr (general registers only"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("Consumer: gpr (general registers only"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("; --consumer=gpr)"), std::string::npos) << c.out;
  const Exec s = run("uprobe-entry -w 0 -d 1");
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("Consumer: plain (normal flags, a double per hit"), std::string::npos) << s.out;
  const Exec l = run("-p 1 -w 0 -d 1 --consumer=gpr uprobe-nop uretprobe-nop");
  ASSERT_EQ(l.status, 0) << l.out;
  EXPECT_NE(l.out.find(", --consumer=gpr; 2 run(s)"), std::string::npos) << l.out;
  std::size_t children = 0;
  for (std::size_t at = l.out.find("Consumer: gpr"); at != std::string::npos; at = l.out.find("Consumer: gpr", at + 1))
    ++children;
  EXPECT_EQ(children, 2u) << l.out;
  EXPECT_EQ(l.out.find("Consumer: plain"), std::string::npos) << l.out;
}

}  // namespace
