// SPDX-License-Identifier: MIT
// uprobe-trace's CLI, a bpftrace program's run: compiled (bt_lang.hpp), its
// BEGIN, END and interval probes run here, its user-space probes in the
// traced processes (the agent runs the compiled program at each hit), their
// printf events and maps read from the counts file while the program runs,
// the maps printed at the end as bpftrace prints them.

#pragma once

#include <string>
#include <vector>

namespace uptrace {

/// What the command line says about a bpftrace program's run.
struct BtOptions {
  std::string text, name;  ///< the program and its name in errors ("stdin" for -e)
  std::vector<std::string> cmd;  ///< the program to run (empty: none)
  std::vector<std::string> params;  ///< positional parameters ($1, $2, ...)
  std::string out_file;    ///< -o ("" : standard output)
  bool quiet = false, follow = true, json = false;  ///< -q, not --no-follow, -f json
};

/// Runs program `o.text` (with `o.cmd` traced when given) until the program
/// and its descendants are gone, exit() or Ctrl-C, as bpftrace 0.17 does.
/// Returns uprobe-trace's exit status: 1 for a program that does not
/// compile (the error on standard error, bpftrace's shape), 127 when the
/// command is not found, else the traced program's exit code (0 after
/// exit() or Ctrl-C); die() on a system error.
int run_bpftrace(const BtOptions& o);

}  // namespace uptrace
