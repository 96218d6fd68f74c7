// SPDX-License-Identifier: MIT
// uprobe-trace: runs a program with libuprobe-agent.so preloaded, counting
// probe hits in the program (and, unless --no-follow, in every process it
// execs), and prints the counts and latency histograms at exit in bpftrace's
// format; or runs a bpftrace program (bt_run.hpp). `uprobe-trace -l PATH`
// lists what can be probed in PATH (checks.hpp). Its command line and the
// bare specs' run are here; what both runs share is launch.hpp's.

#include <dirent.h>
#include <getopt.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
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
#include <set>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include "bt_lang.hpp"
#include "bt_run.hpp"
#include "checks.hpp"
#include "counts.hpp"
#include "launch.hpp"
#include "record.hpp"
#include "report_read.hpp"
#include "spec.hpp"

namespace {

using namespace uptrace;

const char* const kUsage =
    "usage: uprobe-trace [-q] [-o FILE] [-f text|json] -e PROGRAM [PARAM...] [-c 'CMD' | -- PROG [ARGS...]]\n"
    "       uprobe-trace [-q] [-o FILE] [-f text|json] PROGRAM-FILE [PARAM...] [-c 'CMD' | -- PROG [ARGS...]]\n"
    "                     (PROGRAM-FILE `-': the program from standard input)\n"
    "       uprobe-trace [-e SPEC]... [-o FILE] [--format text|json] [--per-thread] [--no-follow] [--] PROG [ARGS...]\n"
    "       uprobe-trace -l PATH|SPEC [-v]\n"
    "\n"
    "Runs PROG with libuprobe's agent preloaded (no root, no ptrace, no eBPF). With a bpftrace program\n"
    "(bpftrace 0.17's language, user-space probes: tools/trace/README.md says what is supported), its\n"
    "actions run in PROG at each hit and the output is bpftrace's. With bare SPECs, it counts probe hits\n"
    "and, for functions with both an entry and a return probe, draws a log2 latency histogram; the\n"
    "report (bpftrace's format) goes to standard error at exit.\n"
    "\n"
    "SPEC (bpftrace's spelling; PATH is a path, a library name such as `libc', or the program's name):\n"
    "  uprobe:PATH:SYM[+OFF]      function entry or an offset into it; SYM may be a glob (`str*'),\n"
    "                             0xADDR (link-time address) or +OFF (file offset); short form u:\n"
    "  uretprobe:PATH:SYM         function return; SYM may be a glob; short form ur:\n"
    "  usdt:PATH:PROVIDER:NAME    a USDT probe at all its sites, semaphore set while attached; short form U:\n"
    "\n"
    "options:\n"
    "  -e PROGRAM|SPEC    a bpftrace program, or a probe spec (repeatable)\n"
    "  -c 'CMD'           the program to run, split into words at blanks ('...' and \"...\" quote)\n"
    "  -q                 no \"Attaching N probes...\" line\n"
    "  -o FILE            write the output (the report) to FILE (default: standard output for programs,\n"
    "                     standard error for the report of SPECs)\n"
    "  -f, --format F     text (default) or json (bpftrace's JSON lines for a program)\n"
    "  --per-thread       also report counts per process and thread (SPECs)\n"
    "  --no-follow        do not trace the programs PROG execs (forked children are always traced)\n"
    "  -l PATH|SPEC       list the probe-able functions and USDT probes of PATH (or those a SPEC matches)\n"
    "  -v                 with -l: USDT sites, semaphores and argument specs; when tracing: each\n"
    "                     process's probe sites by mode (int3, optimized-nop5, pending)\n"
    "  -p PID             refused: uprobe-trace runs inside the programs it starts (no ptrace)\n"
    "  -h, --help         this text\n"
    "\n"
    "environment: UPROBE_TRACE_AGENT overrides the agent's path.\n";

/// The bare specs' run (`-e uprobe:libc:malloc -- PROG`): PROG traced, the
/// hits counted per spec, a latency histogram per function with an entry and
/// a return probe, the report at exit (standard error, or -o FILE), text or
/// JSON. Returns uprobe-trace's exit status (pass_on_status()).
int run_specs(const std::vector<std::string>& spec_texts, const std::vector<std::string>& cmd,
              const std::string& out_file, const std::string& format, bool per_thread, bool follow, bool verbose) {
  if (format != "text" && format != "json") die("--format: text or json");
  if (cmd.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (spec_texts.empty()) die("no probes: give at least one -e SPEC");

  const std::string prog = cmd[0];
  int not_runnable = 0;
  const std::string prog_path = runnable_program(prog, not_runnable);
  if (prog_path.empty()) return not_runnable;
  std::vector<Spec> specs;
  for (const auto& t : spec_texts) {
    std::string err;
    auto s = parse_spec(t, err);
    if (!s) die(err);
    specs.push_back(*s);  // (checked while the program starts: StartGate)
  }
  const bool gated = loads_the_agent(prog_path);
  if (!gated)
    for (const Spec& s : specs) validate(s, prog_path);

  // The report file is opened (created, truncated) before the program runs,
  // as a shell's redirection: a missing directory stops it. With the start
  // gate, while the program starts (after start_traced(): truncating a file
  // can take milliseconds, e.g. ext4 mounted with discard).
  std::FILE* out = nullptr;
  auto open_out = [&] {
    if (out_file.empty()) return;
    out = std::fopen(out_file.c_str(), "we");
    if (!out) die(out_file + ": " + std::strerror(errno));
  };
  if (!gated) open_out();

  const Preload preload = find_preload();
  const std::string dir = make_trace_dir();

  std::string joined;
  for (const auto& t : spec_texts) joined += t + "\n";

  const int counts_fd = create_counts_file(dir);
  // The specs checked on a thread of their own from here (SpecChecks), while
  // the program starts: the agent waits for the ELF tables they write.
  // (After the counts file: on a small filesystem it comes first.)
  std::optional<SpecChecks> checks;
  if (gated) checks.emplace(specs, prog_path, dir + "/" + kElfTablesFile);

  prctl(PR_SET_CHILD_SUBREAPER, 1);  // orphaned descendants are reaped (and waited for) here
  // SIGINT (the terminal's ^C goes to the whole foreground group, the
  // program too) and SIGCHLD are taken through a signalfd: the first ^C
  // does not stop uprobe-trace, which reports once every descendant is gone
  // (as bpftrace prints its maps on ^C); a second one reports the counts so
  // far at once. SIGQUIT is ignored; SIGTERM and SIGHUP go to the program.
  TraceSignals sigs;
  const int sig_fd = sigs.fd;

  StartGate gate;
  int exec_errno = 0;
  const pid_t child = start_traced(cmd, preload, {joined, dir, "", follow, gated, kept_tables_env(checks ? &*checks : nullptr)}, sigs, gate, gated, exec_errno);
  if (gated) open_out();
  if (exec_errno == 0 && gated) checks->wait();
  if (gated) gate.tables_ready();
  g_dir_to_remove.clear();
  gate.open();
  g_child = child;
  int status = 0, main_status = 0;
  bool main_done = false, interrupted = false;
  std::vector<pid_t> left_running;
  unsigned interrupts = 0;
  for (;;) {
    bool all_gone = false;
    for (;;) {  // reap whatever has ended
      const pid_t p = waitpid(-1, &status, WNOHANG);
      if (p > 0) {
        if (p == child) {
          main_status = status, main_done = true;
          g_child = 0;
        }
        continue;
      }
      if (p < 0 && errno == EINTR) continue;
      all_gone = p < 0;  // ECHILD: every descendant is gone
      break;
    }
    if (all_gone) break;
    if (main_done && crashed(main_status)) {  // (what a crash left may never end: launch.hpp crashed())
      left_running = children_left();
      if (!left_running.empty()) break;
    }
    signalfd_siginfo si;
    const ssize_t n = read(sig_fd, &si, sizeof si);
    if (n == static_cast<ssize_t>(sizeof si) && si.ssi_signo == SIGINT && ++interrupts >= 2) {
      interrupted = true;
      break;
    }
  }
  close(sig_fd);

  Report rep = read_report(dir, counts_fd);
  close(counts_fd);
  remove_tree(dir);

  if (exec_errno != 0) {  // the child said why; nothing ran, nothing to report
    if (out) std::fclose(out);
    return WIFEXITED(main_status) ? WEXITSTATUS(main_status) : 127;
  }

  std::string text = format == "json" ? format_json(rep, per_thread) : format_text(rep, per_thread);
  if (!out) {
    std::fputs(("\n" + text).c_str(), stderr);
  } else {
    const bool wrote = std::fwrite(text.data(), 1, text.size(), out) == text.size();
    const bool flushed = std::fflush(out) == 0;
    const int err = errno;
    const bool closed = std::fclose(out) == 0;
    if (!wrote || !flushed || !closed) die(out_file + ": cannot write the report: " + std::strerror(err ? err : errno));
  }
  if (verbose && checks)
    std::fprintf(stderr, "uprobe-trace: ELF tables kept by an earlier run: %zu\n", checks->kept_taken());
  if (verbose)
    for (const auto& p : rep.processes) {
      std::string modes;
      for (const auto& [m, n] : p.modes) modes += (modes.empty() ? "" : ", ") + m + " " + std::to_string(n);
      std::fprintf(stderr, "uprobe-trace: pid %ld (%s, parent %ld): sites %s; ELF tables from uprobe-trace: %u\n",
                   p.pid, p.exe.c_str(), p.ppid, modes.empty() ? "none" : modes.c_str(), p.elf_tables);
    }
  if (rep.missed)
    std::fprintf(stderr, "uprobe-trace: WARNING: %llu probe hits were not run (a probe fired while its thread was "
                 "inside another hit: a signal handler that interrupted one)\n",
                 static_cast<unsigned long long>(rep.missed));
  if (rep.unrecorded)
    std::fprintf(stderr, "uprobe-trace: WARNING: %llu hits were not recorded (a thread could not make its counting "
                 "block: its process could not open or extend the counts file, or the trace made more than %zu)\n",
                 static_cast<unsigned long long>(rep.unrecorded), counts::kMaxSlots);
  if (interrupted)
    std::fprintf(stderr, "uprobe-trace: interrupted: the counts so far; %s\n",
                 main_done ? "processes it started are still running" : (prog + " is still running").c_str());
  if (rep.processes.empty())
    std::fprintf(stderr, "uprobe-trace: no process loaded the agent (a static or set-user-ID program?)\n");
  warn_unattached(rep);
  std::fputs(left_running_message(main_status, left_running).c_str(), stderr);
  if (interrupted && !main_done) return 128 + SIGINT;
  return pass_on_status(main_status);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> spec_texts, params;
  std::string out_file, format = "text", list_arg, program_file, cmd_text;
  bool per_thread = false, follow = true, verbose = false, do_list = false, quiet = false, have_cmd = false;
  enum { kFormat = 1000, kNoFollow, kPerThread };
  static const option longopts[] = {{"format", required_argument, nullptr, kFormat},
                                    {"per-thread", no_argument, nullptr, kPerThread},
                                    {"no-follow", no_argument, nullptr, kNoFollow},
                                    {"help", no_argument, nullptr, 'h'},
                                    {nullptr, 0, nullptr, 0}};
  int c;
again:
  while ((c = getopt_long(argc, argv, "+e:o:l:p:c:f:qvh", longopts, nullptr)) != -1) {
    switch (c) {
      case 'e': spec_texts.emplace_back(optarg); break;
      case 'o': out_file = optarg; break;
      case 'l': list_arg = optarg, do_list = true; break;
      case 'p':
        die("-p PID: uprobe-trace cannot attach to a running process (it runs inside the programs it starts, "
            "through LD_PRELOAD, without ptrace): start the program under it instead, with -c 'CMD' or -- PROG "
            "ARGS (per-thread counts: --per-thread)");
      case 'c': cmd_text = optarg, have_cmd = true; break;
      case 'q': quiet = true; break;
      case kPerThread: per_thread = true; break;
      case 'v': verbose = true; break;
      case 'f':
      case kFormat: format = optarg; break;
      case kNoFollow: follow = false; break;
      case 'h': std::fputs(kUsage, stdout); return 0;
      default: std::fputs(kUsage, stderr); return 2;
    }
  }
  if (do_list) return list(list_arg, verbose);
  // bpftrace's `uprobe-trace [options] FILE`: with no -e, the first operand
  // is the program file (options may follow it).
  if (spec_texts.empty() && program_file.empty() && optind < argc && std::string(argv[optind - 1]) != "--") {
    program_file = argv[optind++];
    goto again;
  }
  // A bpftrace program's operands are its positional parameters ($1, $2,
  // ...; options may follow them, as bpftrace's), up to a `--`: what follows
  // it is the program to run. (Bare specs' operands are that program.)
  const bool bt_program = !program_file.empty() ||
                          std::any_of(spec_texts.begin(), spec_texts.end(), [](const std::string& t) { return !bt::is_bare_spec(t); });
  if (bt_program && optind < argc && std::string(argv[optind - 1]) != "--" && std::string(argv[optind]) != "--") {
    params.emplace_back(argv[optind++]);
    goto again;
  }
  std::vector<std::string> cmd;
  if (have_cmd) {
    // Words split at blanks, with '...' and "..." quoting, as a shell would
    // (nothing is expanded: no globs, no variables), as bpftrace takes -c.
    std::string w;
    bool in_word = false;
    char quote = 0;
    for (char ch : cmd_text) {
      if (quote) {
        if (ch == quote) quote = 0;
        else w += ch;
      } else if (ch == '\'' || ch == '"') {
        quote = ch, in_word = true;
      } else if (ch == ' ' || ch == '\t' || ch == '\n') {
        if (in_word) cmd.push_back(w), w.clear(), in_word = false;
      } else {
        w += ch, in_word = true;
      }
    }
    if (quote) die("-c: unterminated quote in '" + cmd_text + "'");
    if (in_word) cmd.push_back(w);
    if (cmd.empty()) die("-c: no command in '" + cmd_text + "'");
    if (optind < argc) die("-c CMD and -- PROG ARGS: give the program once");
  } else {
    for (int i = optind; i < argc; ++i) cmd.emplace_back(argv[i]);
  }
  const bool bare = program_file.empty() && !spec_texts.empty() &&
                    std::all_of(spec_texts.begin(), spec_texts.end(), [](const std::string& t) { return bt::is_bare_spec(t); });
  if (!bare && (!program_file.empty() || !spec_texts.empty())) {
    BtOptions o;
    if (!program_file.empty()) {
      if (!spec_texts.empty()) die("-e PROGRAM and a program file: give one");
      std::stringstream ss;
      if (program_file == "-") {  // (bpftrace's `-`: the program from standard input, named "stdin")
        // (read(2), not std::cin: <iostream> would construct the standard
        // streams before main() in every run.)
        char buf[65536];
        for (ssize_t n; (n = ::read(STDIN_FILENO, buf, sizeof buf)) != 0;) {
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) die(std::string("-: cannot read the program from standard input: ") + std::strerror(errno));
          ss.write(buf, n);
        }
        o.name = "stdin";
      } else {
        struct stat pst;
        if (::stat(program_file.c_str(), &pst) == 0 && S_ISDIR(pst.st_mode))
          die(program_file + ": is a directory, not a bpftrace program file");
        std::ifstream f(program_file, std::ios::binary);
        if (!f) die(program_file + ": " + std::strerror(errno));
        ss << f.rdbuf();
        o.name = program_file;
      }
      o.text = ss.str();
    } else {
      if (spec_texts.size() > 1) die("-e: one bpftrace program (several probes go in it, as in bpftrace)");
      o.text = spec_texts[0], o.name = "stdin";
    }
    o.cmd = cmd;
    o.params = params;
    o.out_file = out_file;
    o.quiet = quiet;
    o.follow = follow;
    if (format != "text" && format != "json") die("-f: text or json");
    o.json = format == "json";
    return run_bpftrace(o);
  }
  return run_specs(spec_texts, cmd, out_file, format, per_thread, follow, verbose);
}
