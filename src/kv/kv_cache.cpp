#include "kv/kv_cache.h"

#include <atomic>

namespace pg {

static uint64_t next_cache_id() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

KvCache::KvCache() : id_(next_cache_id()) {}

}  // namespace pg
