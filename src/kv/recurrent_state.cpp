#include "kv/recurrent_state.h"

#include <algorithm>

#include "core/error.h"

namespace pg {

RecurrentState::RecurrentState(Backend& backend, const std::vector<RecurrentLayerShape>& layers, int n_seq, int n_capture,
                               int n_snapshot)
    : backend_(backend), n_seq_(n_seq), n_capture_(n_capture), n_snapshot_(n_snapshot), n_backup_(n_capture > 0 ? n_seq : 0), shapes_(layers) {
  PG_CHECK(n_seq > 0 && n_capture >= 0 && n_snapshot >= 0, "invalid recurrent state size");
  layers_.resize(layers.size());
  for (size_t il = 0; il < layers.size(); ++il) {
    if (!layers[il].any()) continue;
    PG_CHECK(layers[il].conv_width > 0 && layers[il].ssm_width > 0, "recurrent layer needs both a conv and a delta state");
    layers_[il].conv = backend_.alloc(DType::F32, layers[il].conv_width, n_slots());
    layers_[il].ssm = backend_.alloc(DType::F32, layers[il].ssm_width, n_slots());
    bytes_ += layers_[il].conv.nbytes() + layers_[il].ssm.nbytes();
    slot_bytes_ += layers_[il].conv.row_bytes() + layers_[il].ssm.row_bytes();
  }
  tags_.assign(static_cast<size_t>(n_backup_ + n_capture), CaptureTag{});
}

RecurrentState::~RecurrentState() {
  for (auto& l : layers_) {
    if (l.conv.valid()) backend_.free(l.conv);
    if (l.ssm.valid()) backend_.free(l.ssm);
  }
}

void RecurrentState::check_slot(int slot) const {
  PG_CHECK(slot >= 0 && slot < n_slots(), "recurrent state slot " + std::to_string(slot) + " out of range");
}

void RecurrentState::zero_slot(int slot) {
  check_slot(slot);
  std::vector<uint8_t> zeros;
  for (auto& l : layers_) {
    if (!l.conv.valid()) continue;
    for (Tensor* t : {&l.conv, &l.ssm}) {
      zeros.assign(t->row_bytes(), 0);
      backend_.upload(*t, zeros.data(), zeros.size(), static_cast<size_t>(slot) * t->row_bytes());
    }
  }
}

void RecurrentState::copy_slot(int src, int dst) {
  check_slot(src);
  check_slot(dst);
  if (src == dst) return;
  for (auto& l : layers_) {
    if (!l.conv.valid()) continue;
    for (Tensor* t : {&l.conv, &l.ssm}) {
      Tensor d = t->rows_view(dst, 1);
      backend_.copy(t->rows_view(src, 1), d);
    }
  }
}

void RecurrentState::save_slot(int slot, std::vector<uint8_t>& out) const {
  check_slot(slot);
  for (const auto& l : layers_) {
    if (!l.conv.valid()) continue;
    for (const Tensor* t : {&l.conv, &l.ssm}) {
      const size_t at = out.size();
      out.resize(at + t->row_bytes());
      backend_.download(*t, out.data() + at, t->row_bytes(), static_cast<size_t>(slot) * t->row_bytes());
    }
  }
}

void RecurrentState::load_slot(int slot, const uint8_t* data) {
  check_slot(slot);
  for (auto& l : layers_) {
    if (!l.conv.valid()) continue;
    for (Tensor* t : {&l.conv, &l.ssm}) {
      backend_.upload(*t, data, t->row_bytes(), static_cast<size_t>(slot) * t->row_bytes());
      data += t->row_bytes();
    }
  }
}

void RecurrentState::backup(int seq, int pos) {
  PG_CHECK(seq >= 0 && seq < n_seq_, "sequence slot out of range");
  PG_CHECK(n_backup_ > 0, "recurrent state backups need capture slots (KvCacheOptions::n_capture)");
  tags_[static_cast<size_t>(seq)] = CaptureTag{};
  if (pos < 0) return;
  copy_slot(seq, backup_slot(seq));
  tags_[static_cast<size_t>(seq)] = {seq, pos, true};
}

int RecurrentState::find_snapshot(int seq, int pos) const {
  for (size_t j = 0; j < tags_.size(); ++j) {
    const CaptureTag& t = tags_[j];
    if (t.chain && t.seq == seq && t.pos == pos) return n_seq_ + static_cast<int>(j);
  }
  return -1;
}

void RecurrentState::invalidate(int seq, int from_pos) {
  for (auto& t : tags_)
    if (t.seq == seq && (!t.chain || t.pos >= from_pos)) t = CaptureTag{};
}

void RecurrentState::commit(int seq, int i) {
  PG_CHECK(seq >= 0 && seq < n_seq_, "sequence slot out of range");
  PG_CHECK(i >= 0 && i < n_capture_, "capture index " + std::to_string(i) + " out of range");
  PG_CHECK(tag(i).seq == seq, "capture " + std::to_string(i) + " does not hold a state of sequence " + std::to_string(seq));
  copy_slot(capture_slot(i), seq);
}

}  // namespace pg
