#include "engine/prefix.h"

#include <algorithm>

#include "core/error.h"
#include "kv/disk_cache.h"

namespace pg::engine {

uint64_t model_identity(const Model& m) {
  const gguf::File& f = m.file();
  uint64_t h = fnv1a64(nullptr, 0);
  auto mix = [&](const void* p, size_t n) { h = fnv1a64(static_cast<const uint8_t*>(p), n, h); };
  const uint64_t size = f.file_size();
  mix(&size, sizeof size);
  const std::string arch = f.architecture();
  mix(arch.data(), arch.size());
  for (const auto& t : f.tensors()) {
    mix(t.name.data(), t.name.size());
    mix(t.ne, sizeof t.ne);
    const auto ty = static_cast<uint32_t>(t.type);
    mix(&ty, sizeof ty);
    // 64 bytes from the start, middle and end of every tensor: a fine-tune or requantization changes
    // them, and reading them costs nothing next to loading.
    if (t.data && t.nbytes > 0) {
      const uint64_t n = std::min<uint64_t>(64, t.nbytes);
      for (uint64_t at : {uint64_t{0}, (t.nbytes - n) / 2, t.nbytes - n}) mix(t.data + at, static_cast<size_t>(n));
    }
  }
  return h;
}

size_t prefix_ram_bytes(const PrefixOptions& p, size_t slots_kv_bytes, size_t context_bytes) {
  if (p.ram_mib == 0) return 0;
  if (p.ram_mib > 0) return static_cast<size_t>(p.ram_mib) << 20;
  if (p.slots >= 0) return static_cast<size_t>(p.slots) * context_bytes;
  return std::min<size_t>(slots_kv_bytes, size_t{4} << 30);
}

std::unique_ptr<KvCache> make_cache_with_prefix(Model& m, KvCacheOptions ko, const PrefixOptions& p,
                                                std::unique_ptr<PrefixCache>& prefix) {
  prefix.reset();
  PG_CHECK(p.ram_mib >= -1, "--cache-ram must be ≥ 0 MiB (0 = prefix cache off), got " + std::to_string(p.ram_mib));
  PG_CHECK(p.slots >= -1, "--prefix-cache-slots must be ≥ 0, got " + std::to_string(p.slots));
  if (p.ram_mib == 0 || (p.ram_mib < 0 && p.slots == 0)) return m.make_cache(ko);
  // A one-block probe tells the bytes of a block and of a recurrent slot for these types and this model.
  size_t block_bytes = 0, snap_bytes = 0;
  {
    KvCacheOptions po = ko;
    po.n_seq = 1;
    po.n_ctx = ko.block_size;
    po.n_blocks = 1;
    po.n_capture = 0;
    auto probe = m.make_cache(po);
    auto* paged = dynamic_cast<PagedKvCache*>(probe.get());
    PG_CHECK(paged != nullptr, "the prefix cache needs the paged KV cache");
    block_bytes = paged->block_bytes();
    if (probe->recurrent()) snap_bytes = probe->recurrent()->slot_bytes();
  }
  const int max_blocks = (ko.n_ctx + ko.block_size - 1) / ko.block_size;
  const size_t context = static_cast<size_t>(max_blocks) * block_bytes + snap_bytes;
  const size_t ram = prefix_ram_bytes(p, context * static_cast<size_t>(ko.n_seq), context);
  const PrefixPlan plan = PrefixCache::plan(ram, block_bytes, snap_bytes, ko.n_seq);
  if (plan.blocks == 0) return m.make_cache(ko);
  ko.n_blocks = (ko.n_blocks > 0 ? ko.n_blocks : max_blocks * ko.n_seq) + plan.blocks;
  ko.n_snapshot = plan.snapshots;
  auto cache = m.make_cache(ko);
  PrefixCacheOptions po;
  po.ram_bytes = ram;
  po.model_id = model_identity(m);
  po.disk_dir = p.disk_dir;
  po.disk_bytes = p.disk_bytes;
  po.partial = p.partial;
  prefix = std::make_unique<PrefixCache>(dynamic_cast<PagedKvCache&>(*cache), po);
  return cache;
}

}  // namespace pg::engine
