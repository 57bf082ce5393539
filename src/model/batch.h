// A batch is n token rows, each (token, position, sequence slot, parent, wants logits).
// `parent` is the row's predecessor inside the batch for tree-shaped verification batches; -1 means
// "the sequence's committed history" (a plain chain needs no parents). See Model::forward for trees.
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
  // Sequences whose rows are a token tree although none has a parent ≥ 0: a tree of roots only (a
  // one-node tree looks like a chain row otherwise). A sequence with any parent ≥ 0 is a tree anyway.
  std::vector<int32_t> tree_seqs;

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
    tree_seqs.clear();
  }
  void add(int32_t token, int32_t pos, int32_t seq_id, bool want_logits) {
    tokens.push_back(token);
    positions.push_back(pos);
    seq.push_back(seq_id);
    parent.push_back(-1);
    logits.push_back(want_logits ? 1 : 0);
  }
  // A tree row: parent is an earlier row of the same sequence, or -1 for a root (at the sequence's length).
  void add_tree(int32_t token, int32_t pos, int32_t seq_id, int32_t parent_row, bool want_logits) {
    add(token, pos, seq_id, want_logits);
    parent.back() = parent_row;
    if (parent_row < 0) tree_seqs.push_back(seq_id);
  }
};

}  // namespace pg
