// SPDX-License-Identifier: MIT
#include "pool_common.hpp"

#include <algorithm>
#include <cstdio>

namespace pooltest {

std::string check_objects(const RiPool& pool, std::vector<void*> objs, bool owners_clear) {
  char buf[160];
  for (void* obj : objs) {
    if (obj == nullptr) return "null object";
    if (reinterpret_cast<std::uintptr_t>(obj) % 64 != 0) {
      std::snprintf(buf, sizeof buf, "object %p not 64-byte aligned", obj);
      return buf;
    }
    if (!pool.contains(obj)) {
      std::snprintf(buf, sizeof buf, "object %p not in the pool", obj);
      return buf;
    }
    if (owners_clear && words(obj)[1] != 0) {
      std::snprintf(buf, sizeof buf, "object %p still owned by %#llx", obj,
                    static_cast<unsigned long long>(words(obj)[1]));
      return buf;
    }
  }
  std::sort(objs.begin(), objs.end());
  for (std::size_t i = 1; i < objs.size(); ++i) {
    const auto gap = static_cast<std::size_t>(static_cast<char*>(objs[i]) - static_cast<char*>(objs[i - 1]));
    if (gap < pool.object_size()) {
      std::snprintf(buf, sizeof buf, "objects %p and %p overlap or repeat (gap %zu)", objs[i - 1], objs[i], gap);
      return buf;
    }
  }
  return "";
}

std::size_t drain_check_refill(RiPool& pool, std::string* why) {
  std::vector<void*> all = drain(pool);
  *why = check_objects(pool, all);
  for (void* obj : all) pool.put(obj);
  return why->empty() ? all.size() : ~std::size_t{0};
}

}  // namespace pooltest
