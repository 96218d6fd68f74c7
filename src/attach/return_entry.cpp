// SPDX-License-Identifier: MIT
// A return probe's entry checks (validate.hpp: check_function_entry()): the
// offset is a function's entry, and not one of the functions whose return
// a return probe cannot take over (vfork, the unwinder's entry points, code
// entered by a return or by the kernel, a compiler's cold fragments).

#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>

#include "elf_image.hpp"
#include "elf_info.hpp"
#include "format.hpp"
#include "uprobe/uprobe.hpp"
#include "validate.hpp"

namespace uprobe::detail {

namespace {

/// Functions whose return a return probe cannot take over, by name (a
/// symbol's base name: any version, "vfork@@GLIBC_2.2.5", and glibc's
/// internal "__GI_" prefix left out), and why. Any symbol at the offset
/// counts (aliases, a statically linked libc, LLVM's libunwind).
struct RefusedReturn {
  std::string_view names[4];
  const char* why;
};
constexpr RefusedReturn kRefusedReturns[] = {
    // It returns twice in one address space, first in the child, which runs
    // on the parent's stack with the parent's thread-local storage, and would
    // take the parent's pending return instance (the kernel gives the child
    // a copy of its own, uprobe_copy_process() with CLONE_VFORK; here they
    // share one): the parent's return then finds none (fatal) or an outer
    // function's (a return to the wrong caller).
    {{"vfork", "__vfork", "__libc_vfork", {}},
     "vfork returns twice in one address space, first in the child, on the parent's stack and thread-local "
     "storage, whose return would take the parent's return instance (the kernel gives the child a copy; here "
     "there is one); an entry probe there is fine"},
    // They start the unwind at their own frame, reading their own return
    // address, which a return probe has replaced by the trampoline: the
    // unwind stops there and every exception ends in std::terminate() (with
    // the kernel's uretprobe as well: its trampoline has no unwind info).
    // They return only when the unwind fails (no handler).
    {{"_Unwind_RaiseException", "_Unwind_Resume", "_Unwind_Resume_or_Rethrow", "_Unwind_ForcedUnwind"},
     "the exception unwinder starts at its own frame, whose return address a return probe replaces, so the "
     "unwind would stop there and every exception terminate the program (it returns only when no handler is "
     "found); an entry probe there is fine"},
    // Entered by a return or by the kernel, never by a call: at their entry
    // *rsp is no return address -- __restore_rt's is the signal frame the
    // kernel's sigreturn reads (a handler returns into it), __start_context's
    // the uc_link of makecontext()'s context (its function returns into
    // it), _start's argc -- and a return probe would overwrite it.
    {{"__restore_rt", "__start_context", "_start", {}},
     "it is entered by a return or by the kernel, never by a call: at its entry the stack holds no return "
     "address (a signal frame, a context's uc_link, argc) and a return probe would overwrite it; an entry "
     "probe there is fine"},
};

/// A GCC cold fragment (foo.cold, foo.cold.12, foo.part.0.cold): the
/// rarely run part of a function split out of it, jumped to from the
/// function's body, never called.
bool is_cold_fragment(std::string_view name) {
  for (std::size_t at = name.find(".cold"); at != std::string_view::npos; at = name.find(".cold", at + 1)) {
    const std::size_t end = at + 5;
    if (end == name.size() || name[end] == '.') return true;
  }
  return false;
}

/// Refuses a return probe on a function of kRefusedReturns at `offset`, or
/// on a cold fragment there.
void check_return_not_refused(const Target& t, const ElfImage& info, std::uint64_t offset) {
  auto it = std::lower_bound(info.funcs.begin(), info.funcs.end(), offset,
                             [](const FuncSym& f, std::uint64_t o) { return f.file_offset < o; });
  for (; it != info.funcs.end() && it->file_offset == offset; ++it) {
    std::string_view name = it->name;
    name = name.substr(0, name.find('@'));
    if (name.rfind("__GI_", 0) == 0) name.remove_prefix(5);
    if (is_cold_fragment(name))
      throw Error(Errc::refused_instruction, t.path, offset,
                  "a return probe on " + std::string(it->name) +
                      ": a compiler's cold fragment of a function, jumped to from its body, never called: at its start "
                      "*rsp is the function's own stack data, not a return address, and a return probe would "
                      "overwrite it; an entry probe there is fine");
    for (const RefusedReturn& r : kRefusedReturns)
      if (std::find(std::begin(r.names), std::end(r.names), name) != std::end(r.names) && !name.empty())
        throw Error(Errc::refused_instruction, t.path, offset,
                    "a return probe on " + std::string(it->name) + ": " + r.why);
  }
}

}  // namespace

void check_function_entry(const Target& t, std::uint64_t offset) {
  std::string why;
  auto info = elf_info(t.fd, t.path, t.st, why);
  if (!info) return;
  const FuncSym* fn = function_at(info, t.fd, t.path, t.st, offset);
  if (fn && fn->file_offset != offset)
    throw Error(Errc::refused_instruction, t.path, offset,
                "a return probe must be at a function's entry, and this offset is " + fn->display_name() + "+" +
                    hex(offset - fn->file_offset) + " (the return address is only at *rsp on entry)");
  check_return_not_refused(t, *info, offset);
}

}  // namespace uprobe::detail
