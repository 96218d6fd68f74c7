// SPDX-License-Identifier: MIT
#include "elf_info.hpp"

#include "uprobe/uprobe.hpp"

namespace uprobe::detail {

std::shared_ptr<const ElfInfo> elf_info(int fd, const std::string& path, const struct stat& st, std::string& why) {
  try {
    return load_elf_image(fd, path, st);
  } catch (const Error& e) {
    // The reason alone (the caller's own error names the file and offset).
    why = e.what();
    const std::string head = "at offset 0x0: ";
    if (const auto at = why.find(head); at != std::string::npos) why.erase(0, at + head.size());
    return nullptr;
  }
}

}  // namespace uprobe::detail
