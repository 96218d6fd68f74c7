// SPDX-License-Identifier: MIT
#pragma once
/// @file usym.hpp
/// The CLI's symbolizer for ustack and usym() (bt_lang.hpp set_symbolizer()):
/// each traced image's mappings as its agent recorded them
/// (DIR/PID.LAYOUT.maps, /proc/self/maps at attach), reported to elfutils'
/// libdwfl (dwfl_linux_proc_maps_report(): it works after the process is
/// gone) for the module and its load bias; the symbol as bpftrace's bcc
/// finds it: from the module's symbol tables and those of its separate
/// debug file found by build-id under /usr/lib/debug/.build-id (libc6-dbg
/// for libc), the same name of several at one address. An address in none of the recorded modules
/// (a library dlopen()ed later) is looked up in /proc/PID/maps while the
/// process runs (bpftrace resolves only then, and only so). CLI only; not thread-safe, not
/// async-signal-safe.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "bt_lang.hpp"

typedef struct Dwfl Dwfl;  // (elfutils/libdwfl.h)

namespace uptrace {

struct ModuleSyms;

class UserSymbols {
 public:
  /// `dir`: the run's directory, where the agents write their .maps files.
  explicit UserSymbols(std::string dir);
  ~UserSymbols();
  UserSymbols(const UserSymbols&) = delete;
  UserSymbols& operator=(const UserSymbols&) = delete;

  /// The symbol covering `addr` in the image `image` (bt_vm.hpp
  /// image_word(): its layout id names the .maps file); false when the
  /// image has no .maps file or no symbol covers the address. C++ names are
  /// demangled (as bcc's demangle_name).
  bool resolve(std::uint64_t image, std::uint64_t addr, bt::UserSym& out);

 private:
  struct Image;
  Image* image(std::uint32_t layout);
  /// The mappings process `pid` of image `layout` has now (/proc/PID/maps:
  /// a library it dlopen()ed after its agent recorded the image's), while it
  /// runs that image; nullptr otherwise.
  ::Dwfl* live(Image& img, std::uint32_t layout, std::uint32_t pid);

  bool lookup(::Dwfl* d, std::uint64_t addr, bt::UserSym& out);

  std::string dir_;
  std::map<std::string, std::unique_ptr<struct ModuleSyms>> modules_;  // by path: symbols as bcc's
  std::map<std::uint32_t, std::unique_ptr<Image>> images_;  // by layout (nullptr: no .maps file yet)
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::optional<bt::UserSym>> cache_;
};

}  // namespace uptrace
