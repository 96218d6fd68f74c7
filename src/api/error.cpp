// SPDX-License-Identifier: MIT
#include <cstdio>

#include "uprobe/uprobe.hpp"

namespace uprobe {

namespace {
std::string format(const std::string& path, std::uint64_t offset, const std::string& why) {
  char off[32];
  std::snprintf(off, sizeof off, "0x%llx", static_cast<unsigned long long>(offset));
  return "libuprobe: cannot probe " + (path.empty() ? std::string("<unknown>") : path) + " at offset " + off + ": " +
         why;
}
}  // namespace

Error::Error(Errc code, std::string path, std::uint64_t offset, const std::string& why, int sys_errno)
    : std::runtime_error(format(path, offset, why)),
      code_(code),
      path_(std::move(path)),
      offset_(offset),
      sys_errno_(sys_errno) {}

}  // namespace uprobe
