// A batch is n token rows, each (token, position, sequence slot, parent, wants logits).
// `parent` is the row's predecessor inside the batch for tree-shaped verification batches; -1 means
// "the sequence's committed history" (a plain chain needs no parents).
#pragma once
#include <cstdint>
#include <vector>

namespace pg {

struct Batch {
  std::vector<int32_t> tokens;     // (n)
  std::vector<int32_t> positions;  // (n)
  std::vector<int32_t> seq;        // (n)
  std::vector<int32_t> parent;     // (n)
  std::vector<uint8_t> logits;     // (n) 1 = return this row's logits

  int size() const { return static_cast<int>(tokens.size()); }
  int n_outputs() const {
    int n = 0;
    for (auto l : logits) n += l;
    return n;
  }
  void clear() {
    tokens.clear();
    positions.clear();
    seq.clear();
    parent.clear();
    logits.clear();
  }
  void add(int32_t token, int32_t pos, int32_t seq_id, bool want_logits) {
    tokens.push_back(token);
    positions.push_back(pos);
    seq.push_back(seq_id);
    parent.push_back(-1);
    logits.push_back(want_logits ? 1 : 0);
  }
};

}  // namespace pg
