// SPDX-License-Identifier: MIT
#pragma once
/// @file agent.hpp
/// What libuprobe-agent.so's exec*() wrappers (agent_exec.cpp) need from the
/// agent's core (agent.cpp). Internal to the agent; not installed.

#include <string>

namespace uptrace::agent {

/// Marks the calling thread as running the agent's own code (nestable):
/// the probe handlers count nothing on it meanwhile. Not async-signal-safe
/// to pair across a signal; each call is a thread-local increment/decrement.
void enter() noexcept;
void leave() noexcept;

/// enter() for a scope.
struct Scope {
  Scope() noexcept { enter(); }
  ~Scope() { leave(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

/// Writes this process's record before an exec (not in a vfork() child, nor
/// after the final report): the record file's path, or "" when none was
/// written.
std::string write_before_exec() noexcept;

/// The exec failed: removes the record `file` and goes on counting.
void exec_failed(const std::string& file) noexcept;

}  // namespace uptrace::agent
