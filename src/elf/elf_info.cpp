// SPDX-License-Identifier: MIT
#include "elf_info.hpp"

#include "uprobe/uprobe.hpp"

namespace uprobe::detail {

std::shared_ptr<const ElfInfo> elf_info(int fd, const std::string& path, const struct stat& st, std::string& why,
                                        ImageDepth depth) {
  try {
    return load_elf_image(fd, path, st, depth);
  } catch (const Error& e) {
    // The reason alone (the caller's own error names the file and offset).
    why = e.what();
    const std::string head = "at offset 0x0: ";
    if (const auto at = why.find(head); at != std::string::npos) why.erase(0, at + head.size());
    return nullptr;
  }
}

const FuncSym* function_at(std::shared_ptr<const ElfInfo>& info, int fd, const std::string& path,
                           const struct stat& st, std::uint64_t offset) {
  const FuncSym* fn = info->enclosing_function(offset);
  if (!info->debug_deferred ||
      (fn && fn->source != BoundsSource::eh_frame && !debug_file_refines(*info, *fn, offset)))
    return fn;
  std::string why;
  std::shared_ptr<const ElfInfo> deeper = elf_info(fd, path, st, why, ImageDepth::with_debug_file);
  if (!deeper) return fn;  // (unreadable now: what the file's own tables say)
  info = std::move(deeper);
  return info->enclosing_function(offset);
}

}  // namespace uprobe::detail
