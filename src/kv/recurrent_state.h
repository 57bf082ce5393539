// Recurrent state of the linear-attention (Gated DeltaNet) layers of hybrid models, on the backend.
//
// Unlike K/V rows, a recurrent state summarises the whole history: it cannot be truncated, only
// replaced by a snapshot. So every layer keeps a pool of state "slots" (F32):
//   - slots 0 .. n_seq-1: the committed state of each sequence slot (the state after its last token);
//   - with n_capture > 0, slots n_seq .. 2·n_seq-1: backups. A capturing forward first copies the
//     committed state of each sequence it extends here, so rejecting every drafted token is a rollback
//     like any other;
//   - then n_capture capture slots;
//   - then n_snapshot prefix slots (kv/prefix_cache.h): the state after a cached prompt block, which a
//     prefix-cache hit copies into the sequence instead of recomputing the prefix. The prefix cache
//     owns their bookkeeping; nothing here tags or invalidates them.
// The capture slots: A forward with capture on writes, for batch
//     row i, the state after that row into capture slot i (conv window and delta state of every
//     layer), so that a later step resumes from any verified position (speculative decoding keeps the
//     state of the last accepted token) or any verified tree node, without recomputing.
// Backups and captures ("snapshots") carry a tag saying which sequence and position (or tree row) they
// hold; tags are dropped as soon as the history they summarise is truncated or replaced, so a tag that
// is present is valid.
//
// Owned by KvCache (kv_cache.h), which routes clear/truncate/save/restore of a hybrid sequence here.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace pg {

// Floats per slot of one layer: the conv window ((kernel-1)·channels) and the delta-rule state
// (value heads·d_k·d_v). Both 0 for layers without recurrent state (attention layers).
struct RecurrentLayerShape {
  int64_t conv_width = 0, ssm_width = 0;
  bool any() const { return conv_width > 0 || ssm_width > 0; }
};

class RecurrentState {
 public:
  RecurrentState(Backend& backend, const std::vector<RecurrentLayerShape>& layers, int n_seq, int n_capture, int n_snapshot = 0);
  ~RecurrentState();
  RecurrentState(const RecurrentState&) = delete;
  RecurrentState& operator=(const RecurrentState&) = delete;

  struct Layer {
    Tensor conv;  // (n_slots, conv_width) F32, slot layout [kernel-1][channels], oldest input first
    Tensor ssm;   // (n_slots, ssm_width) F32, slot layout [value head][d_k][d_v]
  };

  int n_seq() const { return n_seq_; }
  int n_capture() const { return n_capture_; }
  int n_snapshot() const { return n_snapshot_; }
  int n_slots() const { return n_seq_ + n_backup_ + n_capture_ + n_snapshot_; }
  int snapshot_slot(int i) const { return n_seq_ + n_backup_ + n_capture_ + i; }
  int backup_slot(int seq) const { return n_seq_ + seq; }  // only when n_capture() > 0
  int capture_slot(int i) const { return n_seq_ + n_backup_ + i; }
  int n_layer() const { return static_cast<int>(layers_.size()); }
  bool has_layer(int il) const { return layers_[static_cast<size_t>(il)].conv.valid(); }
  Layer& layer(int il) { return layers_[static_cast<size_t>(il)]; }
  const RecurrentLayerShape& shape(int il) const { return shapes_[static_cast<size_t>(il)]; }
  size_t bytes() const { return bytes_; }
  size_t slot_bytes() const { return slot_bytes_; }  // one slot over all layers

  // Whole-slot operations over every layer.
  void zero_slot(int slot);
  void copy_slot(int src, int dst);
  void save_slot(int slot, std::vector<uint8_t>& out) const;  // appends slot_bytes()
  void load_slot(int slot, const uint8_t* data);              // reads slot_bytes()

  // ---- capture bookkeeping ----
  struct CaptureTag {
    int seq = -1;        // sequence slot the row belonged to (-1 = empty)
    int pos = -1;        // the row's position: the slot holds the state after tokens 0..pos
    bool chain = false;  // true: the row continued the committed history (chain batch), so the state
                         // is "sequence seq after position pos"; false: a tree node (find by row)
  };
  void set_tag(int i, const CaptureTag& t) { tags_[static_cast<size_t>(n_backup_ + i)] = t; }
  const CaptureTag& tag(int i) const { return tags_[static_cast<size_t>(n_backup_ + i)]; }
  // Copies seq's committed state to its backup slot, tagged as the state after position pos (-1: empty).
  void backup(int seq, int pos);
  // Slot (backup or capture) holding sequence seq's chain state after position pos, or -1.
  int find_snapshot(int seq, int pos) const;
  // Drops the snapshot tags of seq at positions ≥ from_pos, and all its tree tags (its history there is
  // being replaced).
  void invalidate(int seq, int from_pos = 0);
  // Makes capture i the committed state of seq (accepting a tree node or a chain position).
  void commit(int seq, int i);

 private:
  void check_slot(int slot) const;

  Backend& backend_;
  int n_seq_, n_capture_, n_snapshot_;
  int n_backup_;  // n_seq when captures are enabled, else 0
  std::vector<RecurrentLayerShape> shapes_;
  std::vector<Layer> layers_;     // (n_layer); invalid tensors for attention layers
  std::vector<CaptureTag> tags_;  // (n_backup + n_capture): backups, then captures
  size_t bytes_ = 0, slot_bytes_ = 0;
};

}  // namespace pg
