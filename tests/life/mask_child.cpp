// SPDX-License-Identifier: MIT
// The program life.Masks.PosixSpawnWithAFullSigmask spawns with every signal
// blocked (posix_spawnattr_setsigmask): with libuprobe loaded it reads its
// mask back as set, with SIGTRAP blocked in its view only, attaches an int3
// probe and takes 1000 hits. Exit status 0 when all holds, else the number
// of the first check that failed.

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "life_common.hpp"

int main() {
  using namespace lifetest;
  sigset_t m;
  pthread_sigmask(SIG_BLOCK, nullptr, &m);
  for (int s = 1; s <= 64; ++s) {
    // posix_spawn's child sets the mask with glibc's sigprocmask: every
    // signal but SIGKILL, SIGSTOP and glibc's SIGCANCEL (32), SIGSETXID (33).
    const bool want = s != SIGKILL && s != SIGSTOP && s != 32 && s != 33;
    if (sigismember(&m, s) != want) {
      std::fprintf(stderr, "mask_child: signal %d %s\n", s, want ? "not blocked" : "blocked");
      return 1;
    }
  }
  std::ifstream f("/proc/thread-self/status");
  std::string line;
  unsigned long long real = ~0ull;
  while (std::getline(f, line))
    if (line.rfind("SigBlk:", 0) == 0) real = std::stoull(line.substr(7), nullptr, 16);
  if (real & (1ull << (SIGTRAP - 1))) return 2;  // never blocked for real
  uprobe::Config c = uprobe::configuration();
  c.optimize = false;
  uprobe::configure(c);
  Counter hits;
  uprobe::Attachment a(vaddr(lf_add), hits);
  if (uprobe::probe_info(a.probe()).mode != uprobe::ProbeMode::int3) return 3;
  for (std::uint64_t i = 0; i < 1000; ++i)
    if (lf_add(i, 2) != i + 2) return 4;
  return hits.hits.load() == 1000 ? 0 : 5;
}
