// SPDX-License-Identifier: MIT
// uprobe-coverage on libc.so.6: every exported function entry attached in one
// process; the share that ends optimized (the target: >= 90%; the
// kernel optimizes none), every int3 with a reason, only the documented
// refusals, and every byte of libc back after the detach (exit status 0).

#include <gtest/gtest.h>

#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <string>

namespace {

std::string run(const std::string& cmd, int& status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  status = pclose(p);
  return out;
}

/// The count on the line "  ROW   N ..." of the report, or -1.
int field(const std::string& out, const std::string& row) {
  const std::size_t p = out.find("\n  " + row + " ");
  if (p == std::string::npos) return -1;
  std::size_t i = p + 3 + row.size();
  while (i < out.size() && out[i] == ' ') ++i;
  return std::isdigit(static_cast<unsigned char>(out[i])) ? std::atoi(out.c_str() + i) : -1;
}

TEST(Coverage, LibcEntriesAreOptimized) {
  int status = -1;
  const std::string out = run(UPROBE_COVERAGE_BIN " libc.so.6", status);
  ASSERT_EQ(status, 0) << out;
  const std::size_t fe = out.find(" function entries");
  ASSERT_NE(fe, std::string::npos) << out;
  std::size_t b = fe;
  while (b > 0 && std::isdigit(static_cast<unsigned char>(out[b - 1]))) --b;
  const int total = std::atoi(out.c_str() + b);
  // (An entry a neighbour branches into takes a punned jump: counted with the entries.)
  const int entry = field(out, "optimized-entry") + field(out, "optimized-punned") +
                    field(out, "optimized-punned-padded"),
            nop5 = field(out, "optimized-nop5"),
            int3 = field(out, "int3"), pending = field(out, "pending"), refused = field(out, "refused");
  ASSERT_GT(total, 1000) << out;
  EXPECT_EQ(field(out, "optimized-window"), 0) << out;
  EXPECT_EQ(entry + nop5 + int3 + pending + refused, total) << out;
  EXPECT_EQ(pending, 0) << out;
  EXPECT_GE(100.0 * (entry + nop5) / total, 90.0) << out;
  // Refusals are only the libc functions libuprobe's own trap path runs or
  // that run with SIGTRAP blocked (src/attach/validate.cpp lists 30 names).
  EXPECT_LE(refused, 30) << out;
  if (refused > 0) {
    const std::string why = out.substr(out.find("why refused:"));
    int reasons = 0;
    for (std::size_t at = why.find("\n      "); at != std::string::npos; at = why.find("\n      ", at + 1)) {
      const std::string line = why.substr(at + 1, why.find('\n', at + 1) - at - 1);
      if (line.find("  the function") == std::string::npos) continue;  // the example names
      ++reasons;
      EXPECT_TRUE(line.find("runs on libuprobe's trap path") != std::string::npos ||
                  line.find("runs with SIGTRAP blocked") != std::string::npos)
          << line;
    }
    EXPECT_GT(reasons, 0) << out;
  }
  EXPECT_NE(out.find("bytes differing from the file after detach: 0"), std::string::npos) << out;
  std::printf("%s", out.substr(0, out.find("why int3")).c_str());
}

}  // namespace

// --every-instruction --attach on a program this process does not run
// (/bin/true: its segments are mapped, not executed): a probe at every
// instruction start, attached in rounds and detached; every text byte is the
// file's again (exit status 0) and the last line is the trap-free count.
TEST(Coverage, EveryInstructionAttachedOnAMappedProgram) {
  int status = -1;
  const std::string out = run(UPROBE_COVERAGE_BIN " --every-instruction --attach /bin/true", status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("text bytes differing from the file after detach: 0 of "), std::string::npos) << out;
  EXPECT_EQ(out.find("text bytes differing from the file after detach: 0 of 0\n"), std::string::npos) << out;
  const std::size_t last = out.rfind("trap-free: ");
  ASSERT_NE(last, std::string::npos) << out;
  long n = -1, m = -1;
  double pct = -1;
  char tail[64] = {};
  ASSERT_EQ(std::sscanf(out.c_str() + last, "trap-free: %ld of %ld instruction sites (%lf%%)%63s", &n, &m, &pct, tail),
            3)
      << out.substr(last);
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n', last), out.size() - 1) << "not the last line";
  EXPECT_GT(m, 1000);
  EXPECT_GE(n * 100, 90 * m) << out;
}
