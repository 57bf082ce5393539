#include "kv/prefix_cache.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "kv/disk_cache.h"

namespace pg {

namespace {

// A final avalanche over FNV-1a, so keys of neighbouring blocks differ in every bit (the map buckets
// on the low bits).
uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

// 0 and 1 mark free and pending snapshot slots (snap_owner_), so keys never take those values.
uint64_t not_reserved(uint64_t h) { return h < 2 ? h + 2 : h; }

}  // namespace

uint64_t prefix_root_key(uint64_t model_id, DType k_type, DType v_type, int block_size) {
  const uint64_t v[5] = {0x5047505245464958ull /* "PGPREFIX" */, model_id, static_cast<uint64_t>(k_type),
                         static_cast<uint64_t>(v_type), static_cast<uint64_t>(block_size)};
  return not_reserved(mix(fnv1a64(reinterpret_cast<const uint8_t*>(v), sizeof v)));
}

uint64_t prefix_block_key(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = fnv1a64(reinterpret_cast<const uint8_t*>(&parent), sizeof parent);
  h = fnv1a64(reinterpret_cast<const uint8_t*>(tokens), static_cast<size_t>(n) * sizeof(int32_t), h);
  return not_reserved(mix(h));
}

PrefixPlan PrefixCache::plan(size_t ram_bytes, size_t block_bytes, size_t snapshot_bytes, int n_seq) {
  PrefixPlan p;
  if (ram_bytes == 0 || block_bytes == 0) return p;
  size_t left = ram_bytes;
  if (snapshot_bytes > 0) {
    // Hybrid: a cached prompt is useless without its snapshot, so up to half the budget goes to them;
    // every running slot may hold one pending snapshot, so fewer than n_seq + 1 cannot cache anything
    // reliably (then take n_seq + 1 when the budget affords it at all).
    size_t n = std::min<size_t>(ram_bytes / 2 / snapshot_bytes, 256);
    if (n < static_cast<size_t>(n_seq) + 1 && ram_bytes >= (static_cast<size_t>(n_seq) + 1) * snapshot_bytes)
      n = static_cast<size_t>(n_seq) + 1;
    p.snapshots = static_cast<int>(n);
    left -= std::min(left, n * snapshot_bytes);
  }
  p.blocks = static_cast<int>(std::min<size_t>(left / block_bytes, 1u << 24));
  return p;
}

PrefixCache::PrefixCache(PagedKvCache& kv, const PrefixCacheOptions& opt)
    : kv_(kv), rs_(kv.recurrent()), opt_(opt), bs_(kv.block_size()) {
  const KvCacheOptions& ko = kv.options();
  root_ = prefix_root_key(opt_.model_id, ko.k_type(), ko.v_type(), bs_);
  // What the pool holds beyond every slot at full context is the index's to keep (plan()).
  budget_blocks_ = std::max(0, kv.total_blocks() - kv.max_blocks() * kv.n_seq());
  pending_.assign(static_cast<size_t>(kv.n_seq()), Pending{});
  if (rs_) snap_owner_.assign(static_cast<size_t>(rs_->n_snapshot()), 0);
  if (!opt_.disk_dir.empty()) {
    DiskCacheOptions d;
    d.dir = opt_.disk_dir;
    d.budget = opt_.disk_bytes;
    d.root = root_;
    d.model_id = opt_.model_id;
    d.k_type = ko.k_type();
    d.v_type = ko.v_type();
    d.block_size = bs_;
    d.block_bytes = kv.block_bytes();
    d.snapshot_bytes = rs_ ? rs_->slot_bytes() : 0;
    disk_ = std::make_unique<DiskCache>(d);
  }
  PG_INFO("prefix cache: %d blocks of %d tokens (%.1f MiB)%s%s", budget_blocks_, bs_,
          static_cast<double>(static_cast<size_t>(budget_blocks_) * kv.block_bytes()) / (1024.0 * 1024.0),
          rs_ ? (", " + std::to_string(snap_owner_.size()) + " recurrent snapshots of " +
                 std::to_string(rs_->slot_bytes() / 1024) + " KiB").c_str()
              : "",
          disk_ && disk_->enabled() ? (", disk tier " + disk_->folder()).c_str() : "");
}

PrefixCache::~PrefixCache() = default;

bool PrefixCache::disk_enabled() const { return disk_ && disk_->enabled(); }

void PrefixCache::flush() const {
  if (disk_) disk_->flush();
}

std::vector<uint64_t> PrefixCache::chain(const std::vector<int32_t>& toks, int n_blocks) const {
  std::vector<uint64_t> keys(static_cast<size_t>(n_blocks));
  uint64_t h = root_;
  for (int i = 0; i < n_blocks; ++i) {
    h = prefix_block_key(h, toks.data() + static_cast<size_t>(i) * static_cast<size_t>(bs_), bs_);
    keys[static_cast<size_t>(i)] = h;
  }
  return keys;
}

PrefixCache::Entry* PrefixCache::find(uint64_t key, const int32_t* tokens) {
  auto it = index_.find(key);
  if (it == index_.end() || !it->second.full(bs_)) return nullptr;
  // The tokens decide: a 64-bit collision is a miss, never another prompt's KV.
  if (std::memcmp(it->second.tokens.data(), tokens, static_cast<size_t>(bs_) * sizeof(int32_t)) != 0) return nullptr;
  return &it->second;
}

PrefixCache::Entry& PrefixCache::insert(uint64_t key, uint64_t parent, int depth, int32_t block, const int32_t* tokens, int n_tokens) {
  Entry e;
  e.parent = parent;
  e.block = block;
  e.depth = depth;
  e.tick = tick_;
  e.tokens.assign(tokens, tokens + (n_tokens < 0 ? bs_ : n_tokens));
  if (depth > 0) {
    auto p = index_.find(parent);
    if (p != index_.end()) ++p->second.children;
  }
  kids_[parent].push_back(key);
  Entry& in = index_[key] = std::move(e);
  supersede(parent, key, in.tokens);  // removes other entries only: `in` stays valid (node-based map)
  n_index_ = index_.size();
  return in;
}

void PrefixCache::remove(uint64_t key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  Entry& e = it->second;
  if (e.depth > 0) {
    auto p = index_.find(e.parent);
    if (p != index_.end()) --p->second.children;
  }
  auto k = kids_.find(e.parent);
  if (k != kids_.end()) {
    k->second.erase(std::remove(k->second.begin(), k->second.end(), key), k->second.end());
    if (k->second.empty()) kids_.erase(k);
  }
  if (e.snap >= 0) snap_owner_[static_cast<size_t>(e.snap)] = 0;
  kv_.drop_block(e.block);
  index_.erase(it);
  n_index_ = index_.size();
}

void PrefixCache::supersede(uint64_t parent, uint64_t key, const std::vector<int32_t>& t) {
  if (rs_) return;
  auto it = kids_.find(parent);
  if (it == kids_.end()) return;
  std::vector<uint64_t> drop;
  for (uint64_t k : it->second) {
    if (k == key) continue;
    const Entry& e = index_.at(k);
    if (e.full(bs_) || e.tokens.size() >= t.size()) continue;
    if (std::equal(e.tokens.begin(), e.tokens.end(), t.begin())) drop.push_back(k);
  }
  for (uint64_t k : drop) remove(k);
}

PrefixCache::PartialMatch PrefixCache::find_partial(uint64_t parent, const std::vector<int32_t>& prompt, int from, int limit) const {
  PartialMatch best;
  auto it = kids_.find(parent);
  if (it == kids_.end() || limit <= 0) return best;
  for (uint64_t k : it->second) {
    const Entry& e = index_.at(k);
    const int m = static_cast<int>(e.tokens.size());
    const int most = std::min({m, limit, bs_ - 1});
    int c = 0;
    while (c < most && e.tokens[static_cast<size_t>(c)] == prompt[static_cast<size_t>(from + c)]) ++c;
    // Hybrid: the state is known only at the tail's end (its release snapshot).
    if (rs_ && (e.full(bs_) || e.snap < 0 || c != m)) continue;
    if (c > best.n) best = {k, c};
  }
  return best;
}

bool PrefixCache::room_for_copy(const std::vector<int32_t>& attach, const PartialMatch& m) {
  // The blocks about to be attached and the one to copy from are held, so the eviction cannot take them.
  const int32_t src = index_.at(m.key).block;
  for (int32_t b : attach) kv_.hold_block(b);
  kv_.hold_block(src);
  while (kv_.free_blocks() == 0 && evict_one()) {
  }
  kv_.drop_block(src);
  for (int32_t b : attach) kv_.drop_block(b);
  return kv_.free_blocks() > 0;
}

bool PrefixCache::attach_tail(int seq, const PartialMatch& m) {
  Entry& e = index_.at(m.key);
  e.tick = tick_;
  if (!kv_.attach_partial(seq, e.block, m.n)) return false;
  if (rs_) {
    rs_->copy_slot(rs_->snapshot_slot(e.snap), seq);
    rs_->invalidate(seq, 0);
  }
  return true;
}

PrefixHit PrefixCache::attach(int seq, const std::vector<int32_t>& prompt, int max_tokens) {
  if (max_tokens >= 0 && static_cast<size_t>(max_tokens) + 1 < prompt.size()) {
    // Capped: a lookup of the prompt's first max_tokens + 1 tokens (a hit always leaves the last one
    // to prefill, so it covers at most max_tokens), with the stats and the hybrid snapshot boundary
    // of the whole prompt, as an uncapped lookup would have them.
    const std::vector<int32_t> head(prompt.begin(), prompt.begin() + max_tokens + 1);
    const PrefixHit hit = attach(seq, head);
    prompt_tokens_ += prompt.size() - head.size();
    if (rs_) {
      const int point = ((static_cast<int>(prompt.size()) - 1) / bs_) * bs_;
      pending_[static_cast<size_t>(seq)].point = point > hit.n_tokens ? point : -1;
    }
    return hit;
  }
  PrefixHit hit;
  ++tick_;
  ++lookups_;
  prompt_tokens_ += prompt.size();
  pending_[static_cast<size_t>(seq)] = Pending{};
  const int n = static_cast<int>(prompt.size());
  // Whole blocks that leave at least one prompt token to prefill.
  const int max_blocks = n > 0 ? (n - 1) / bs_ : 0;
  const std::vector<uint64_t> keys = chain(prompt, max_blocks);
  std::vector<int32_t> blocks;
  int usable = 0;  // blocks of the match a hit may end at (hybrid: the deepest with a snapshot)
  int snap = -1;
  for (int i = 0; i < max_blocks; ++i) {
    Entry* e = find(keys[static_cast<size_t>(i)], prompt.data() + static_cast<size_t>(i) * static_cast<size_t>(bs_));
    if (!e) break;
    e->tick = tick_;
    blocks.push_back(e->block);
    if (!rs_ || e->snap >= 0) {
      usable = i + 1;
      snap = e->snap;
    }
  }
  const int matched = static_cast<int>(blocks.size());
  const auto key_of = [&](int n_blocks) { return n_blocks > 0 ? keys[static_cast<size_t>(n_blocks - 1)] : root_; };
  // A partly reused block after `base` full ones. Hybrid: a tail snapshotted at its end may sit after
  // the whole match, past the deepest block snapshot (the previous turn's prompt and answer).
  int base = usable;
  PartialMatch pm;
  if (opt_.partial) {
    if (rs_ && matched > usable) {
      pm = find_partial(key_of(matched), prompt, matched * bs_, n - 1 - matched * bs_);
      if (pm.key) base = matched;
    }
    if (!pm.key) pm = find_partial(key_of(base), prompt, base * bs_, n - 1 - base * bs_);
    if (pm.key && !room_for_copy(std::vector<int32_t>(blocks.begin(), blocks.begin() + base), pm)) {
      pm = {};
      base = usable;
    }
  }
  blocks.resize(static_cast<size_t>(base));
  int got = base;
  bool from_disk = false, state = true;
  const int ram_tokens = base * bs_ + (pm.key ? pm.n : 0);
  if (disk_ && disk_->enabled() && max_blocks > 0 && ram_tokens < n - 1) {
    // The disk serves the hit only where it reaches past what RAM serves (more blocks, or the same
    // blocks and more tail cells; RAM serving all but the last token needs no look). The RAM tail's
    // block is held meanwhile: an eviction for the disk's blocks must not take it.
    const int32_t tail_block = pm.key ? index_.at(pm.key).block : -1;
    if (tail_block >= 0) kv_.hold_block(tail_block);
    uint64_t disk_tail = 0;
    const int d = attach_disk(seq, prompt, keys, ram_tokens, disk_tail, state);
    if (tail_block >= 0) kv_.drop_block(tail_block);
    if (d > 0) {
      got = d;
      from_disk = true;
      pm = opt_.partial ? find_partial(key_of(d), prompt, d * bs_, n - 1 - d * bs_) : PartialMatch{};
      // attach_disk left a free block when it loaded a tail: the copy cannot fail then.
      if (pm.key && !room_for_copy({}, pm)) pm = {};
      PG_CHECK(state || pm.key, "prefix cache: a disk hit on a hybrid tail lost its snapshot");
      hit.n_disk = (d - usable) * bs_ + (pm.key && pm.key == disk_tail ? pm.n : 0);
    }
  }
  if (!from_disk && base > 0) {
    kv_.attach_blocks(seq, blocks);
    if (rs_ && !pm.key) {
      rs_->copy_slot(rs_->snapshot_slot(snap), seq);
      rs_->invalidate(seq, 0);
    }
  }
  // room_for_copy() left a free block, and nothing has taken it since: the copy cannot fail.
  if (pm.key) PG_CHECK(attach_tail(seq, pm), "prefix cache: no free block for a partial-block copy");
  hit.n_partial = pm.key ? pm.n : 0;
  hit.n_tokens = got * bs_ + hit.n_partial;
  n_idle_ = static_cast<uint64_t>(count_idle());
  ram_hits_ += static_cast<uint64_t>(hit.n_tokens - hit.n_disk);
  disk_hits_ += static_cast<uint64_t>(hit.n_disk);
  partial_hits_ += static_cast<uint64_t>(hit.n_partial);
  if (rs_) {
    // The state after the prompt's last full block before its final token is what a later prompt
    // sharing this one reuses; stop the prefill there once (unless this hit already reaches it).
    const int point = max_blocks * bs_;
    if (point > hit.n_tokens) pending_[static_cast<size_t>(seq)].point = point;
  }
  return hit;
}

int PrefixCache::attach_disk(int seq, const std::vector<int32_t>& prompt, const std::vector<uint64_t>& keys, int ram_tokens,
                             uint64_t& disk_tail, bool& state) {
  disk_tail = 0;
  state = true;
  const DiskCache::Found f = disk_->find(keys, prompt, opt_.partial);
  if (f.tokens <= ram_tokens || f.n_blocks == 0 || f.n_blocks > static_cast<int>(keys.size())) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  BlockFileHeader h;
  std::vector<uint8_t> payload;
  if (!disk_->load(f, keys, prompt, h, payload)) return 0;
  const auto t_read = std::chrono::steady_clock::now();
  const size_t bb = kv_.block_bytes();
  // The partly used block, when f uses one — the file's tail, or (attention) its block after the
  // attached ones, whose leading cells the prompt shares: a fresh index entry (new_tail), or the RAM
  // index's own entry of the same tokens; attach() copies the cells from it, as for a RAM hit. Its
  // key is recomputed from its tokens: the index files it under that.
  const uint64_t parent = keys[static_cast<size_t>(f.n_blocks - 1)];
  const int m = f.part_tail ? static_cast<int>(h.tail_cells) : bs_;  // the entry's cells
  const int32_t* part_tokens = f.part_tail ? h.tail_tokens.data() : h.tokens.data() + static_cast<size_t>(f.n_blocks) * static_cast<size_t>(bs_);
  bool use_tail = f.part_cells > 0, new_tail = false;
  uint64_t tail_key = 0;
  int32_t ram_tail_block = -1;
  if (use_tail) {
    tail_key = prefix_block_key(parent, part_tokens, m);
    auto it = index_.find(tail_key);
    if (tail_key != (f.part_tail ? h.tail_key : h.keys[static_cast<size_t>(f.n_blocks)])) {
      use_tail = false;  // (the header checksum held: a writer bug, not corruption) the blocks still serve
      PG_WARN("prefix cache: block file %s: a key does not match its tokens: only the blocks before it are used", f.name.c_str());
    } else if (it == index_.end()) {
      new_tail = true;
    } else if (static_cast<int>(it->second.tokens.size()) == m && std::equal(part_tokens, part_tokens + m, it->second.tokens.begin()) &&
               (!rs_ || it->second.snap >= 0)) {
      ram_tail_block = it->second.block;
    } else {
      use_tail = false;  // another entry under that key (a collision)
    }
    // Hybrid: without its tail the file has a state only at its snapshot depth.
    if (!use_tail && rs_ && static_cast<int>(h.snap_depth) != f.n_blocks) return 0;
  }
  // The blocks: RAM entries where the index has them (identical KV), fresh blocks loaded from the file
  // for the rest. The found blocks are held while fresh ones are allocated (an eviction to make room
  // must not take them); fresh blocks come from the free pool — the empty slot's share guarantees room
  // unless the index is over budget, so evict if needed.
  std::vector<int32_t> blocks(static_cast<size_t>(f.n_blocks), -1);
  std::vector<int32_t> held;
  int n_fresh = 0;
  for (int i = 0; i < f.n_blocks; ++i) {
    const uint64_t key = keys[static_cast<size_t>(i)];
    if (Entry* e = find(key, prompt.data() + static_cast<size_t>(i) * static_cast<size_t>(bs_))) {
      e->tick = tick_;
      kv_.hold_block(e->block);
      held.push_back(e->block);
      blocks[static_cast<size_t>(i)] = e->block;
    } else if (index_.count(key)) {
      for (int32_t b : held) kv_.drop_block(b);  // another block under the same key (a collision)
      return 0;
    } else {
      ++n_fresh;
    }
  }
  if (ram_tail_block >= 0) {
    kv_.hold_block(ram_tail_block);
    held.push_back(ram_tail_block);
  }
  // Beyond the chain's fresh blocks: the new tail entry's block, and one left free for the sequence's
  // copy of the tail (attach() copies it; nothing may take that block in between).
  const int n_alloc = n_fresh + (use_tail && new_tail ? 1 : 0) + (use_tail ? 1 : 0);
  std::vector<int32_t> fresh;
  while (static_cast<int>(fresh.size()) < n_alloc) {
    int32_t b = kv_.alloc_block();
    while (b < 0 && evict_one()) b = kv_.alloc_block();
    if (b < 0) break;
    fresh.push_back(b);
  }
  bool ok = static_cast<int>(fresh.size()) == n_alloc;
  // Hybrid: the new tail's state needs a snapshot slot (none: the block snapshot serves, if the file has
  // one at this depth).
  int tail_snap = -1;
  if (ok && rs_ && new_tail) {
    tail_snap = take_snapshot_slot();
    if (tail_snap < 0 && static_cast<int>(h.snap_depth) != f.n_blocks) {
      ok = false;
    } else if (tail_snap < 0) {
      for (int k = 0; k < 2; ++k) {
        kv_.drop_block(fresh.back());
        fresh.pop_back();
      }
      use_tail = new_tail = false;
    }
  }
  if (!ok) {
    for (int32_t b : fresh) kv_.drop_block(b);
    for (int32_t b : held) kv_.drop_block(b);
    return 0;
  }
  for (int i = 0, j = 0; i < f.n_blocks; ++i) {
    if (blocks[static_cast<size_t>(i)] >= 0) continue;
    const int32_t b = fresh[static_cast<size_t>(j++)];
    kv_.write_block(b, payload.data() + static_cast<size_t>(i) * bb);
    // The index takes the block's one reference; its parent is in the index (found or just inserted).
    insert(keys[static_cast<size_t>(i)], i == 0 ? root_ : keys[static_cast<size_t>(i - 1)], i, b,
           prompt.data() + static_cast<size_t>(i) * static_cast<size_t>(bs_));
    blocks[static_cast<size_t>(i)] = b;
  }
  kv_.attach_blocks(seq, blocks);
  for (int32_t b : held) kv_.drop_block(b);
  int32_t tail_block = use_tail ? ram_tail_block : -1;
  if (use_tail) {
    // The copy's block goes back to the pool, free for attach_partial.
    kv_.drop_block(fresh.back());
    fresh.pop_back();
    if (new_tail) {
      tail_block = fresh.back();
      if (f.part_tail)
        kv_.write_cells(tail_block, m, payload.data() + h.tail_at());
      else
        kv_.write_block(tail_block, payload.data() + static_cast<size_t>(f.n_blocks) * bb);
      insert(tail_key, parent, f.n_blocks, tail_block, part_tokens, m);
      if (rs_) {
        rs_->load_slot(rs_->snapshot_slot(tail_snap), payload.data() + h.tail_snapshot_at());
        index_.at(tail_key).snap = tail_snap;
        snap_owner_[static_cast<size_t>(tail_snap)] = tail_key;
      }
      disk_tail = tail_key;
    }
  }
  if (rs_ && !use_tail) {
    rs_->load_slot(seq, payload.data() + h.block_snapshot_at());
    rs_->invalidate(seq, 0);
    Entry& last = index_.at(keys[static_cast<size_t>(f.n_blocks - 1)]);
    if (last.snap < 0) {
      const int s = take_snapshot_slot();
      if (s >= 0) {
        rs_->copy_slot(seq, rs_->snapshot_slot(s));
        last.snap = s;
        snap_owner_[static_cast<size_t>(s)] = keys[static_cast<size_t>(f.n_blocks - 1)];
      }
    }
  }
  state = !rs_ || !use_tail;
  // The tail entry (index-only, the newest leaf) is held through the budget check: attach() copies from it.
  if (tail_block >= 0) kv_.hold_block(tail_block);
  enforce_budget();
  if (tail_block >= 0) kv_.drop_block(tail_block);
  PG_INFO("prefix cache: %d blocks and %d cells of a %s from disk (%s, %.1f MiB) in %.2f ms (read and verify %.2f ms)", f.n_blocks,
          use_tail ? f.part_cells : 0, f.part_tail ? "tail" : "block", f.name.c_str(), static_cast<double>(payload.size()) / (1024.0 * 1024.0),
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
          std::chrono::duration<double, std::milli>(t_read - t0).count());
  return f.n_blocks;
}

int PrefixCache::chunk_end(int seq, int from, int n_prompt) const {
  const int p = pending_[static_cast<size_t>(seq)].point;
  return p > from ? std::min(p, n_prompt) : n_prompt;
}

int PrefixCache::take_snapshot_slot() {
  for (size_t i = 0; i < snap_owner_.size(); ++i)
    if (snap_owner_[i] == 0) return static_cast<int>(i);
  // The least recently used cached snapshot gives way (its blocks stay, reusable once re-snapshotted).
  int best = -1;
  uint64_t best_tick = UINT64_MAX;
  for (size_t i = 0; i < snap_owner_.size(); ++i) {
    if (snap_owner_[i] < 2) continue;
    auto it = index_.find(snap_owner_[i]);
    if (it != index_.end() && it->second.tick < best_tick) {
      best_tick = it->second.tick;
      best = static_cast<int>(i);
    }
  }
  if (best < 0) return -1;
  const uint64_t owner = snap_owner_[static_cast<size_t>(best)];
  Entry& victim = index_.at(owner);
  victim.snap = -1;
  snap_owner_[static_cast<size_t>(best)] = 0;
  // A hybrid tail is reusable only with its snapshot: without it, it goes.
  if (!victim.full(bs_)) remove(owner);
  return best;
}

void PrefixCache::after_forward(int seq, int n_prefilled) {
  Pending& p = pending_[static_cast<size_t>(seq)];
  if (!rs_ || p.point < 0 || n_prefilled != p.point || kv_.seq_len(seq) != p.point) return;
  p.point = -1;
  const int s = take_snapshot_slot();
  if (s < 0) return;
  rs_->copy_slot(seq, rs_->snapshot_slot(s));
  snap_owner_[static_cast<size_t>(s)] = 1;
  p.snap = s;
  p.snap_at = n_prefilled;
}

void PrefixCache::abandon(int seq) {
  Pending& p = pending_[static_cast<size_t>(seq)];
  if (p.snap >= 0) snap_owner_[static_cast<size_t>(p.snap)] = 0;
  p = Pending{};
  kv_.clear(seq);
  n_idle_ = static_cast<uint64_t>(count_idle());
}

void PrefixCache::release(int seq, const std::vector<int32_t>& history, int n_valid) {
  ++tick_;
  Pending p = pending_[static_cast<size_t>(seq)];
  pending_[static_cast<size_t>(seq)] = Pending{};
  // A sequence that ended inside a verify step still has the rejected drafts' rows past n_valid.
  const int len = std::min({kv_.seq_len(seq), static_cast<int>(history.size()), n_valid >= 0 ? n_valid : INT32_MAX});
  const int n_full = len / bs_;
  const std::vector<uint64_t> keys = chain(history, n_full);
  int indexed = 0;  // depth of the chain now in the index, contiguous from the root
  for (int i = 0; i < n_full; ++i) {
    const uint64_t key = keys[static_cast<size_t>(i)];
    const int32_t* toks = history.data() + static_cast<size_t>(i) * static_cast<size_t>(bs_);
    if (Entry* e = find(key, toks)) {
      e->tick = tick_;
    } else if (index_.count(key)) {
      break;  // collision: the chain below it cannot be reached
    } else {
      const int32_t b = kv_.block_of(seq, i);
      kv_.hold_block(b);
      insert(key, i == 0 ? root_ : keys[static_cast<size_t>(i - 1)], i, b, toks);
    }
    indexed = i + 1;
  }
  // The recurrent state is the sequence's after all len tokens only when nothing past them was run (a
  // verify step's rejected rows, an uncommitted tree).
  const bool state_at_len = rs_ && kv_.seq_len(seq) == len && kv_.tree_size(seq) == 0;
  if (opt_.partial && indexed == n_full && len > n_full * bs_)
    release_tail(seq, history, len, n_full > 0 ? keys[static_cast<size_t>(n_full - 1)] : root_, n_full, state_at_len);
  // Hybrid: the boundary snapshot belongs to the entry of its block (unless that has one already).
  if (rs_ && p.snap >= 0) {
    const int d = p.snap_at / bs_;
    Entry* e = d >= 1 && d <= indexed ? &index_.at(keys[static_cast<size_t>(d - 1)]) : nullptr;
    if (e && e->snap < 0) {
      e->snap = p.snap;
      snap_owner_[static_cast<size_t>(p.snap)] = keys[static_cast<size_t>(d - 1)];
    } else {
      snap_owner_[static_cast<size_t>(p.snap)] = 0;
    }
  }
  // Hybrid, a prompt and answer ending on a block boundary: the end state serves the next turn there.
  if (opt_.partial && state_at_len && n_full > 0 && indexed == n_full && len == n_full * bs_) {
    Entry& last = index_.at(keys[static_cast<size_t>(n_full - 1)]);
    if (last.snap < 0) {
      const int s = take_snapshot_slot();
      if (s >= 0) {
        rs_->copy_slot(seq, rs_->snapshot_slot(s));
        last.snap = s;
        snap_owner_[static_cast<size_t>(s)] = keys[static_cast<size_t>(n_full - 1)];
      }
    }
  }
  // Disk: the chain as deep as a hit could use it, once: its indexed blocks and its tail (what a RAM hit
  // copies); hybrid: the deepest block snapshot and the tail with its release snapshot, the chain up to
  // the deeper of the two.
  if (disk_ && disk_->enabled()) {
    int snap_depth = 0;
    if (rs_)
      for (int i = indexed; i-- > 0;)
        if (index_.at(keys[static_cast<size_t>(i)]).snap >= 0) {
          snap_depth = i + 1;
          break;
        }
    int m = 0;  // tail cells to write
    uint64_t tail_key = 0;
    int tail_snap = -1;
    if (opt_.partial && n_full > 0 && indexed == n_full && len > n_full * bs_) {
      m = len - n_full * bs_;
      const int32_t* toks = history.data() + static_cast<size_t>(n_full) * static_cast<size_t>(bs_);
      tail_key = prefix_block_key(keys[static_cast<size_t>(n_full - 1)], toks, m);
      if (rs_) {
        // A hybrid tail is stored only with the state after it: its RAM entry's snapshot.
        auto it = index_.find(tail_key);
        if (it != index_.end() && it->second.snap >= 0 && static_cast<int>(it->second.tokens.size()) == m &&
            std::equal(toks, toks + m, it->second.tokens.begin()))
          tail_snap = it->second.snap;
        else
          m = 0;
      }
    }
    const int depth = m > 0 ? n_full : rs_ ? snap_depth : indexed;
    if (depth > 0 && !disk_->has(m > 0 ? tail_key : keys[static_cast<size_t>(depth - 1)])) {
      const size_t bb = kv_.block_bytes();
      DiskCache::Chain c;
      c.keys.assign(keys.begin(), keys.begin() + depth);
      c.tokens.assign(history.begin(), history.begin() + static_cast<std::ptrdiff_t>(depth) * bs_);
      c.snap_depth = static_cast<uint32_t>(snap_depth);
      // (depth·block + snapshot + m cells + snapshot) bytes, in file order.
      c.payload.resize(static_cast<size_t>(depth) * bb);
      for (int i = 0; i < depth; ++i) kv_.read_block(index_.at(keys[static_cast<size_t>(i)]).block, c.payload.data() + static_cast<size_t>(i) * bb);
      if (snap_depth > 0) rs_->save_slot(rs_->snapshot_slot(index_.at(keys[static_cast<size_t>(snap_depth - 1)]).snap), c.payload);
      if (m > 0) {
        // The tail's cells from the sequence's own last block (the RAM tail entry, when there is one,
        // is that block; without one — superseded by an entry starting with it — the cells are the same).
        c.tail_tokens.assign(history.begin() + static_cast<std::ptrdiff_t>(n_full) * bs_, history.begin() + len);
        c.tail_key = tail_key;
        const size_t at = c.payload.size();
        c.payload.resize(at + static_cast<size_t>(m) * kv_.bytes_per_token());
        kv_.read_cells(kv_.block_of(seq, n_full), m, c.payload.data() + at);
        if (rs_) rs_->save_slot(rs_->snapshot_slot(tail_snap), c.payload);
      }
      disk_->write(std::move(c));
    }
  }
  kv_.clear(seq);
  enforce_budget();
}

void PrefixCache::release_tail(int seq, const std::vector<int32_t>& history, int len, uint64_t parent, int depth, bool state_at_len) {
  const int m = len - depth * bs_;
  const int32_t* toks = history.data() + static_cast<size_t>(depth) * static_cast<size_t>(bs_);
  if (rs_ && !state_at_len) return;  // a hybrid tail without the state at its end serves no hit
  const uint64_t key = prefix_block_key(parent, toks, m);
  auto same = index_.find(key);
  if (same != index_.end()) {
    Entry& e = same->second;
    // The same tail again (or, improbably, a colliding key: then keep what is there).
    if (static_cast<int>(e.tokens.size()) != m || !std::equal(e.tokens.begin(), e.tokens.end(), toks)) return;
    e.tick = tick_;
    if (!rs_ || e.snap >= 0) return;
  } else {
    if (!rs_) {
      // Attention: an entry under the same parent that starts with these cells serves every hit this would.
      auto k = kids_.find(parent);
      if (k != kids_.end())
        for (uint64_t c : k->second) {
          Entry& e = index_.at(c);
          if (static_cast<int>(e.tokens.size()) >= m && std::equal(toks, toks + m, e.tokens.begin())) {
            e.tick = tick_;
            return;
          }
        }
    }
    const int32_t b = kv_.block_of(seq, depth);
    kv_.hold_block(b);
    insert(key, parent, depth, b, toks, m);
    if (!rs_) return;
  }
  const int s = take_snapshot_slot();
  Entry& e = index_.at(key);
  if (s < 0) {
    if (e.snap < 0) remove(key);
    return;
  }
  rs_->copy_slot(seq, rs_->snapshot_slot(s));
  e.snap = s;
  snap_owner_[static_cast<size_t>(s)] = key;
}

int PrefixCache::count_idle() const {
  int n = 0;
  for (const auto& [k, e] : index_) n += kv_.block_refcount(e.block) == 1;
  return n;
}

void PrefixCache::enforce_budget() {
  int over = count_idle() - budget_blocks_;
  while (over > 0 && evict_one()) --over;
  const int idle = count_idle();
  n_idle_ = static_cast<uint64_t>(idle);
  uint64_t used = static_cast<uint64_t>(idle) * kv_.block_bytes();
  if (rs_)
    for (uint64_t o : snap_owner_) used += o != 0 ? rs_->slot_bytes() : 0;
  used_bytes_ = used;
  n_index_ = index_.size();
}

bool PrefixCache::evict_one() {
  // The least recently used leaf that no sequence holds; on a tie the deeper one (a chain's blocks share
  // their last use, and its tail must go before its head).
  auto best = index_.end();
  for (auto it = index_.begin(); it != index_.end(); ++it) {
    const Entry& e = it->second;
    if (e.children > 0 || kv_.block_refcount(e.block) != 1) continue;
    if (best == index_.end() || e.tick < best->second.tick || (e.tick == best->second.tick && e.depth > best->second.depth)) best = it;
  }
  if (best == index_.end()) return false;
  remove(best->first);
  ++evicted_;
  return true;
}

PrefixStats PrefixCache::stats() const {
  PrefixStats s;
  s.lookups = lookups_;
  s.prompt_tokens = prompt_tokens_;
  s.ram_hit_tokens = ram_hits_;
  s.disk_hit_tokens = disk_hits_;
  s.partial_hit_tokens = partial_hits_;
  s.evicted_blocks = evicted_;
  s.ram_blocks = n_index_;
  s.ram_bytes = used_bytes_;
  if (disk_) {
    s.disk_files = disk_->files();
    s.disk_bytes = disk_->bytes();
    s.disk_writes = disk_->writes();
    s.disk_write_bytes = disk_->write_bytes();
  }
  return s;
}

}  // namespace pg
