// SPDX-License-Identifier: MIT
// uprobe-trace's CLI, before the program runs: a spec's PATH as this process
// sees it, the specs checked as bpftrace checks them (definite errors stop
// the run), and `-l`'s listing.

#pragma once

#include <pthread.h>

#include <cstddef>
#include <string>
#include <vector>

#include "spec.hpp"

namespace uptrace {

/// PATH of a spec or of -l, as this process can see it: a path (canonical;
/// die() when it is missing, a directory or not a regular file), the
/// program (by its name, `prog_path`), a library on the search path or a
/// program found in $PATH; "" when none.
std::string resolve_here(const std::string& name, const std::string& prog_path);

/// PATH as bpftrace 0.17 shows it: as written when it has a '/', the
/// dynamic linker cache's path for a `lib...` name, else `resolved`.
std::string bpftrace_path(const std::string& name, const std::string& resolved);

/// `uprobe-trace -l ARG [-v]`: the probe-able functions and USDT probes of
/// PATH, or those a spec (uprobe:PATH[:GLOB], usdt:PATH[:PROVIDER[:NAME]])
/// matches, on standard output as bpftrace lists them; with `verbose`, USDT
/// sites, semaphores and argument specs. Returns the exit status; die() on
/// a bad argument or an unreadable file.
int list(const std::string& arg, bool verbose);

/// Checks spec `s` for the program at `prog_path` before it runs: a definite
/// error (no such file, symbol or USDT probe; an offset that is not an
/// instruction start) is die()'s; what this process cannot resolve (a
/// library the program loads from its own RUNPATH, a script's interpreter)
/// is left to the agent. Returns the number of probes bpftrace would attach
/// for it (its wildcard expansions; 1 without a wildcard or where this
/// process cannot tell). With `skipped` (a bpftrace program's attach
/// point): an uprobe or uretprobe whose function the file does not have (no
/// symbol of that name, or none its wildcard matches) is not an error, as
/// bpftrace 0.17 skips it: 0 probes, `*skipped` says why.
std::size_t validate(const Spec& s, const std::string& prog_path, std::string* skipped = nullptr);

/// validate() of every spec, on a thread of its own started here, before
/// the program is: the program's start and its agent's attach (~3 ms) run
/// beside it on the other CPU, and the start gate opens as soon as both are
/// done. (Run after posix_spawn() returned, the checks started late
/// whenever the kernel woke this process on the CPU the new program ran on,
/// and the agent waited at the gate for them: ~1 ms in a third of the runs
/// on a 2-vCPU VM.) The thread blocks every signal (the CLI takes its own
/// through its signalfd). Its result: wait(), once.
class SpecChecks {
 public:
  /// With `tables_path` not empty, the checks first take the ELF tables an
  /// earlier run of the same specs kept (kept_path(): the agent takes them
  /// too, at once), keeping them again when they read anything
  /// (tables_cache.hpp); when there were none to take, the tables they read
  /// are written to `tables_path` once they are done
  /// (uprobe::export_elf_tables(), of the files the specs name): the agent
  /// waits for those (StartGate::tables_ready()) and its attach takes them
  /// instead of reading the files (a failure to write only means that it
  /// reads them).
  /// `skip_missing`: validate()'s `skipped` (a bpftrace program's specs).
  SpecChecks(const std::vector<Spec>& specs, const std::string& prog_path, const std::string& tables_path = {},
             bool skip_missing = false);
  ~SpecChecks();  ///< joins the thread (its result unused: the program never ran)
  SpecChecks(const SpecChecks&) = delete;
  SpecChecks& operator=(const SpecChecks&) = delete;
  /// Waits for the checks; die()s with the first definite error, as
  /// validate() in this thread would have; else the sum of the specs'
  /// probe counts.
  std::size_t wait();
  /// After wait(): how many files' tables the checks took from those an
  /// earlier run kept (tables_cache.hpp) instead of reading the files.
  std::size_t kept_taken() const { return kept_taken_; }
  /// The file of the tables an earlier run of these specs kept
  /// (tables_cache_file(); "" when none may be kept or there is no
  /// `tables_path`): the agent imports it before it attaches (kEnvTables).
  /// Named by the constructor, in its thread.
  const std::string& kept_path() const { return kept_; }
  /// How many files the specs name (resolved here): the tables the agent
  /// takes from kept_path() when none changed since (kEnvTables).
  std::size_t spec_files() const { return files_.size(); }
  /// After wait(), with `skip_missing`: the specs skipped (index, why).
  const std::vector<std::pair<std::size_t, std::string>>& skipped() const { return skipped_; }

 private:
  void join();
  pthread_t thread_{};
  bool running_ = false;
  const std::vector<Spec>* specs_;
  std::string prog_path_, tables_path_, error_, kept_;
  std::vector<std::string> files_;  ///< the files the specs name, as resolved here (spec_keys())
  std::size_t probes_ = 0, kept_taken_ = 0;
  bool skip_missing_ = false;
  std::vector<std::pair<std::size_t, std::string>> skipped_;
  void validate_all();  ///< every spec, probes_ and skipped_
};

/// kEnvTables' "N:FILE" for the agent: "N:FILE" (SpecChecks::spec_files(),
/// SpecChecks::kept_path()); "" without checks or a kept file.
std::string kept_tables_env(const SpecChecks* checks);

}  // namespace uptrace
