// SPDX-License-Identifier: MIT
// uprobe-trace's CLI, what both of its runs share (the bare specs' in
// main.cpp, a bpftrace program's in bt_run.cpp): the trace directory and its
// counts file, the traced program started with libuprobe and the agent
// preloaded (start_traced()), its start gate, the CLI's signals while it
// runs, and its exit status passed on.

#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace uptrace {

/// The trace directory die() removes: set while the program is being started
/// (its checks may still refuse a spec).
extern std::string g_dir_to_remove;

/// "uprobe-trace: M" on standard error, g_dir_to_remove removed, exit status 2.
/// On a thread that set t_die_throws (SpecChecks' thread): throws Died{M}
/// instead, for the thread that owns the run to die() with.
[[noreturn]] void die(const std::string& m);

/// What die() throws on a thread that set t_die_throws.
struct Died {
  std::string message;
};
extern constinit thread_local bool t_die_throws;  // (constinit: accessed directly, no TLS wrapper)
/// Called by die() first on a thread that does not throw (SpecChecks: its
/// thread joined before exit() runs the process's destructors).
extern void (*g_before_die)();

/// The traced program's start (exec, loading, the agent's attach) runs while
/// this process checks the specs (validate(): each reads ELF files; ~10 ms
/// of page faults on a VM): the child's agent waits at this gate once it has
/// attached, before any code of the program runs (agent.cpp,
/// pass_start_gate()), until open(). If this process dies first (die(): a
/// refused spec), the agent reads end-of-file and the child exits (125)
/// without running the program. A socket pair: a child gone before the gate
/// opens costs no SIGPIPE here (MSG_NOSIGNAL).
struct StartGate {
  int fd[2] = {-1, -1};  ///< [0] ours (close-on-exec), [1] the child's (its number in kEnvGate)
  /// Makes the socket pair (die() on failure).
  void make();
  /// In the parent once the child is started: the child's end closed.
  void in_parent();
  /// Tells the child's agent that the checks wrote the ELF tables
  /// (kEnvTables, kElfTablesFile): the byte 't', which it waits for before
  /// it attaches (agent.cpp, wait_for_elf_tables()). Before open().
  void tables_ready();
  /// Lets the program run (once every spec was checked): the byte '1'.
  void open();
  /// Ends the program at the gate (end-of-file: its agent exits, 125).
  void shut();
};

/// The traced program's pid while it runs (0 when none): where forwarded
/// signals go.
extern volatile sig_atomic_t g_child;
/// SIGTERM or SIGHUP taken while no program ran (g_child 0: none started, or
/// it is gone): what ends a run without one (BEGIN/interval only), as
/// bpftrace ends on them; 0 when none came.
extern volatile sig_atomic_t g_stop_signal;

/// The CLI's signals while a traced program runs: SIGINT (which the terminal
/// sends to the program too) and SIGCHLD are taken through `fd` (a
/// signalfd); SIGQUIT is ignored; SIGTERM and SIGHUP go to the program
/// (g_child). restore_in_child() gives a forked child the dispositions and
/// mask the CLI started with.
struct TraceSignals {
  struct sigaction old_int{}, old_quit{};
  sigset_t old_mask{};
  int fd = -1;
  TraceSignals();
  void restore_in_child() const;
};

// ---------------------------------------------------------------- files

/// The directory part of `p` ("." when none). (self_exe(), base_name(): spec.hpp.)
std::string dir_name(const std::string& p);
/// Whether `p` is a regular file (stat, links followed).
bool is_file(const std::string& p);
/// realpath(3) of `p`, `p` itself when that fails.
std::string real_path(const std::string& p);
/// The file execvp(3) would run for `name` (PATH searched for a name without
/// '/', its empty elements as the current directory, glibc's default when
/// it is unset), canonical; "" when there is none.
std::string find_program(const std::string& name);
/// The program's file as execvp(3) would find it (find_program()), or ""
/// after saying on standard error why it cannot run, as a shell would, with
/// the shell's status in `status`: 127 (no such file, not found on PATH),
/// 126 (a directory, not a regular file, not executable).
std::string runnable_program(const std::string& name, int& status);
/// Whether `p` starts with the ELF magic.
bool is_elf(const std::string& p);
/// Whether running `path` loads the agent, which then waits at the start
/// gate (StartGate): a dynamically linked ELF program (PT_INTERP), or a
/// `#!` script whose interpreter is one, run without secure-execution mode
/// (no set-user-ID or set-group-ID bit, no file capabilities: the dynamic
/// linker would ignore LD_PRELOAD). Otherwise PROG would run before the
/// specs are checked: they are checked first, as the program must not run
/// if one is refused.
bool loads_the_agent(const std::string& path, int depth = 0);

/// Removes directory `dir` and the files in it (no subdirectories).
void remove_tree(const std::string& dir);
/// The trace's private directory (counts file, records, program): under
/// $TMPDIR when it is set, else in /dev/shm when that is a writable tmpfs
/// directory, else under /tmp (die() when it cannot be made).
std::string make_trace_dir();
/// DIR/counts (counts.hpp), its header written: made before the program
/// runs; every traced process maps it and counts there. Returns its
/// descriptor (close-on-exec); die() on failure, `dir` removed.
int create_counts_file(const std::string& dir);

// ---------------------------------------------------------------- the traced program

/// What the traced program preloads: libuprobe.so (as this process loaded
/// it when it did; else the one the agent was built with, next to it or in
/// the directory above: die() when there is none) and the agent.
struct Preload {
  std::string agent, libuprobe;
};
/// The agent (next to this executable, or $UPROBE_TRACE_AGENT) and
/// libuprobe; die() when the agent is missing or a path cannot go in
/// LD_PRELOAD (':' or a blank).
Preload find_preload();

/// What the agent is told through the traced program's environment
/// (spec.hpp's kEnv* variables; agent.cpp reads them).
struct AgentEnv {
  std::string specs;         ///< kEnvSpecs: the specs, one per line
  std::string dir;           ///< kEnvOut: the trace directory
  std::string program_file;  ///< kEnvProgram: the compiled bpftrace program, "" for bare specs
  bool follow = true;        ///< kEnvFollow: what the program execs is traced too
  bool tables = false;       ///< kEnvTables: the checks write kElfTablesFile in `dir` (SpecChecks)
  std::string kept_tables;   ///< kEnvTables' "N:FILE": kept_tables_env() ("": none)
};

/// Forks and execs `cmd` (execvp) with `preload` ahead of the LD_PRELOAD
/// there was and `env` set, the child's signals as this process found them
/// (`sigs`); with `gated`, the gate is made first and the child waits at it
/// once its agent attached (the caller opens or shuts it). g_dir_to_remove
/// is set to env.dir (die() from here on removes it). Returns the child's
/// pid; exec_errno is 0, or why the exec failed (the child said so on
/// standard error and exited 127 for ENOENT, else 126). die() when it cannot
/// fork.
pid_t start_traced(const std::vector<std::string>& cmd, const Preload& preload, const AgentEnv& env,
                   const TraceSignals& sigs, StartGate& gate, bool gated, int& exec_errno);

/// The program's status as uprobe-trace's own: its exit code; or, when a
/// signal ended it, the same signal raised here once the report is out (core
/// dumps off: the program dumped its own), as timeout(1) and strace do, so
/// that a caller sees a death by signal, not an exit (128 + N if the signal
/// does not end this process).
int pass_on_status(int status);

/// Whether waitpid's `status` is a crash: a death by a signal whose default
/// action dumps core (SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE, SIGTRAP,
/// SIGSYS, SIGQUIT, SIGXCPU, SIGXFSZ). uprobe-trace waits for every process
/// the program started, but not after the program crashed: what it left
/// (a worker blocked on a pipe to it) may never end.
bool crashed(int status);

/// The processes this one (a child subreaper) still has as children, its
/// own threads' included (/proc/self/task/TID/children).
std::vector<pid_t> children_left();

/// "uprobe-trace: the program died by SIGABRT; 2 processes it started still
/// run, not waited for (pids 12, 34): their counts so far are in the report\n",
/// or "" when `left` is empty.
std::string left_running_message(int status, const std::vector<pid_t>& left);

}  // namespace uptrace
