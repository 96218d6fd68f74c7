// SPDX-License-Identifier: MIT
// libFuzzer target: hostile ELF files (truncated, lying sizes and offsets,
// bad string indices, notes that overrun their section) through every reader
// of ELF files: the USDT note reader (uprobe::usdt::probes(), which also
// reads the symbol tables for symbol operands and parses each note's
// argument string), the symbol layer (read_symbols, match_symbols,
// symbol_at, resolve_location) and the registry's ElfInfo (elf_info(): the
// executable segments and function symbols a registration is checked
// against).
//
// The input is the whole file. It is written to a scratch file whose mtime is
// set to a fresh value for every input: the ELF caches are keyed by
// (dev, ino, size, mtime), so no input is ever answered from the cache of an
// earlier one. uprobe::Error is the documented outcome for a bad file; any
// other exception, a crash or a sanitizer report is a bug. Oracles: every
// USDT probe either has an error or file offsets inside an executable
// segment (and a semaphore offset inside a non-executable one).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "elf_image.hpp"
#include "elf_info.hpp"
#include "uprobe/symbols.hpp"
#include "uprobe/uprobe.hpp"
#include "uprobe/usdt.hpp"

namespace {

std::string g_path;
std::int64_t g_stamp = 1'000'000'000;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "stapsdt_fuzz: %s\n", what);
  std::abort();
}

void setup() {
  // tmpfs when available: the file is rewritten for every input.
  std::string tmpl = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  tmpl += "/uprobe-fuzz-elf-XXXXXX";
  char* dir = tmpl.data();
  if (!::mkdtemp(dir)) fail("mkdtemp failed");
  g_path = std::string(dir) + "/input.elf";
  std::atexit([] {
    ::unlink(g_path.c_str());
    ::rmdir(g_path.substr(0, g_path.rfind('/')).c_str());
  });
}

/// Writes the input with a never-seen mtime; returns the open fd (or -1).
int write_input(const std::uint8_t* data, std::size_t size) {
  int fd = ::open(g_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) fail("cannot create the scratch file");
  std::size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) fail("cannot write the scratch file");
    done += static_cast<std::size_t>(n);
  }
  ++g_stamp;
  const struct timespec times[2] = {{g_stamp, 0}, {g_stamp, 0}};
  if (::futimens(fd, times) != 0) fail("futimens failed");
  return fd;
}

void check_probes(const std::vector<uprobe::usdt::Probe>& ps, const std::shared_ptr<const uprobe::detail::ElfImage>& img) {
  for (const auto& p : ps) {
    if (!p.error.empty()) {
      if (p.offset != 0 || p.semaphore_offset != 0) fail("probe with an error has offsets");
      continue;
    }
    const uprobe::detail::LoadSegment* seg = img->segment_of_vaddr(p.pc);
    if (!seg || !seg->executable() || p.offset != p.pc - seg->vaddr + seg->offset)
      fail("probe offset not inside an executable segment");
    if (p.semaphore) {
      const uprobe::detail::LoadSegment* s2 = img->segment_of_vaddr(p.semaphore);
      if (!s2 || s2->executable() || p.semaphore_offset != p.semaphore - s2->vaddr + s2->offset)
        fail("semaphore offset not inside a non-executable segment");
    }
    if (p.args_error.empty() && p.args.count() > uprobe::usdt::kMaxArgs) fail("too many arguments");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (g_path.empty()) setup();
  const int fd = write_input(data, size);

  // The registry's reader (validate.cpp): segments and function symbols.
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("fstat failed");
  std::string why;
  if (auto info = uprobe::detail::elf_info(fd, g_path, st, why)) {
    for (const auto& f : info->funcs) {
      if (info->enclosing_function(f.file_offset) == nullptr && f.size != 0) fail("function not found by its start");
      (void)info->exec_segment(f.file_offset);
    }
  } else if (why.empty()) {
    fail("elf_info() refused without a reason");
  }
  ::close(fd);

  try {
    auto img = uprobe::detail::load_elf_image(g_path);
    const auto probes = uprobe::usdt::probes(g_path);
    if (probes.size() != img->notes.size()) fail("not one probe per note");
    check_probes(probes, img);
    // The per-item look-ups are bounded: each is linear in the file's notes or symbols.
    std::size_t k = 0;
    for (const auto& p : probes) {
      if (++k > 16) break;
      try {
        (void)uprobe::usdt::find(g_path, p.provider, p.name);
      } catch (const uprobe::Error&) {
      }
      if (p.args_error.empty()) (void)uprobe::usdt::require_args(p);
    }
    (void)uprobe::read_symbols(g_path);
    k = 0;
    for (const auto& s : uprobe::match_symbols(g_path, "*")) {
      if (++k > 16) break;
      (void)uprobe::symbol_at(g_path, s.offset);
      try {
        (void)uprobe::resolve_location(g_path + ":" + s.full_name());
      } catch (const uprobe::Error&) {
      }
    }
    try {
      (void)uprobe::resolve_location(g_path + ":0x1000");
    } catch (const uprobe::Error&) {
    }
    try {
      (void)uprobe::offset_to_address(g_path, 0x40);
    } catch (const uprobe::Error&) {
    }
  } catch (const uprobe::Error&) {
  }
  return 0;
}
