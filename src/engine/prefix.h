// Engine glue of the prefix cache (kv/prefix_cache.h): what a model and a RAM budget mean for the KV
// pool, and the model identity that keys cached blocks.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "kv/prefix_cache.h"
#include "model/model.h"

namespace pg::engine {

struct PrefixOptions {
  // RAM budget in MiB for blocks (and hybrid recurrent snapshots) only the prefix index holds;
  // -1 = the default (the slots' own KV size, at most 4 GiB), 0 = prefix cache off.
  int64_t ram_mib = -1;
  // The reference's --prefix-cache-slots N: room for N whole contexts (N·n_ctx tokens of KV and, for
  // hybrid models, N snapshots); used when ram_mib is -1. -1 = unset, 0 = off.
  int slots = -1;
  std::string disk_dir;       // --kv-cache-dir: "" = no disk tier
  uint64_t disk_bytes = 10ull << 30;  // --kv-cache-budget
  bool partial = true;        // reuse partly matching blocks (false: --no-partial-blocks)
};

// A hash of the model file's metadata and tensor directory, its size, and a sample of every tensor's
// bytes: two files share it only when they are (for all practical purposes) the same weights.
uint64_t model_identity(const Model& m);

// The RAM budget in bytes PrefixOptions resolve to, given the KV bytes of every slot at full context
// and of one context.
size_t prefix_ram_bytes(const PrefixOptions& p, size_t slots_kv_bytes, size_t context_bytes);

// Makes the model's cache with room for the prefix cache (KvCacheOptions::n_blocks grows by the
// budget's blocks, n_snapshot for hybrid models) and the PrefixCache over it; `prefix` stays null when
// the budget is 0.
std::unique_ptr<KvCache> make_cache_with_prefix(Model& m, KvCacheOptions ko, const PrefixOptions& p,
                                                std::unique_ptr<PrefixCache>& prefix);

}  // namespace pg::engine
