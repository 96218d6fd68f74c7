// SPDX-License-Identifier: MIT
// libFuzzer target: probe specs as uprobe-trace takes them (bpftrace style:
// `uprobe:/lib/x/libc.so.6:malloc`, `uretprobe:libc:str*`, `u:PATH:sym+0x10`,
// `usdt:PATH:provider:name`, `U:PATH:name`, `uprobe:PATH:0x1139`,
// `uprobe:PATH:+4096`) through uptrace::parse_spec(), then the accepted
// specs' targets through the library's resolvers: uprobe::resolve_location()
// (symbols, versions, globs, addresses, file offsets, library names) and
// uprobe::usdt::find().
//
// PATH from the input is used as written only when it is a library name (no
// `/`): it is then matched against the objects loaded in this process
// (LibrarySearch::loaded_only never opens a file by that name). A PATH with a
// `/` is replaced by this fuzzer's own executable, so that the fuzzer never
// opens arbitrary files; the executable carries code symbols and USDT notes
// (below) for the resolvers to find. uprobe::Error is the documented outcome
// of a bad spec; any other exception, a crash or a sanitizer report is a bug.
// Oracle: every resolved location is inside an executable segment of its file.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "spec.hpp"
#include "uprobe/symbols.hpp"
#include "uprobe/uprobe.hpp"
#include "uprobe/usdt.hpp"
#include "uprobe/usdt_probe.h"

// Things for the resolvers to find in this executable.
extern "C" {
__attribute__((noinline, used)) int fuzz_spec_target_one(int x) {
  UPROBE_USDT_PROBE(fuzzspec, entry, x);
  return x + 1;
}
__attribute__((noinline, used)) int fuzz_spec_target_two(int x) {
  UPROBE_USDT_PROBE(fuzzspec, two, x, x);
  UPROBE_USDT_PROBE(other, two, x);
  return x * 2;
}
}

namespace {

[[noreturn]] void fail(const char* what, std::string_view text) {
  std::fprintf(stderr, "probe_spec_fuzz: %s for input `%.*s'\n", what, static_cast<int>(text.size()), text.data());
  std::abort();
}

const std::string& self_path() {
  static const std::string p = uprobe::resolve_library("/proc/self/exe");
  return p;
}

void check_location(const uprobe::Location& l, std::string_view text) {
  // The same place through the inverse mapping.
  if (uprobe::offset_to_address(l.path, l.offset) != l.address) fail("offset and address disagree", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string error;
  const std::optional<uptrace::Spec> spec = uptrace::parse_spec(text, error);
  if (!spec) {
    if (error.empty()) fail("refused without a message", text);
    return 0;
  }
  if (spec->binary.empty() || spec->what.empty()) fail("accepted with an empty part", text);
  if (spec->text != text) fail("text not kept", text);
  // Keep the run cheap: a library name with a glob over libc's thousands of
  // symbols is valid but slow; resolve against this executable then.
  const bool by_name = spec->binary.find('/') == std::string::npos && spec->binary.size() < 64 &&
                       spec->binary.find('\0') == std::string::npos;
  const std::string binary = by_name ? spec->binary : self_path();
  try {
    if (spec->kind == uptrace::Kind::usdt) {
      for (const auto& p : uprobe::usdt::find(binary + ":" + spec->what)) {
        if (!p.error.empty()) fail("usdt::find() returned an unusable site", text);
        if (uprobe::offset_to_address(p.path, p.offset) != p.pc) fail("USDT site offset and pc disagree", text);
      }
    } else {
      std::string path = binary;
      if (by_name) path = uprobe::resolve_library(binary);
      if (path != self_path() && uptrace::has_glob(spec->what)) return 0;  // see above
      for (const auto& l : uprobe::resolve_location(path + ":" + spec->what)) check_location(l, text);
    }
  } catch (const uprobe::Error&) {
  }
  return 0;
}
