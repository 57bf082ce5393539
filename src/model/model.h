// A loaded model: its canonical config, its weights on one backend, and the one forward pass that
// every architecture shares.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "kv/kv_cache.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/weights.h"

namespace pg {

struct ModelOptions {
  int max_batch = 512;  // rows per forward micro-batch (longer batches are split)
  bool progress = false;  // show a loading progress bar on stderr
};

// Bytes a forward step reads, for roofline accounting.
struct ModelBytes {
  size_t file = 0;            // all tensor data
  size_t per_token = 0;       // weights read to decode one token (all but the embedding table; MoE: active experts)
  size_t embedding_row = 0;   // one token_embd row
};

class Model {
 public:
  static std::unique_ptr<Model> load(const std::string& path, Backend& backend, const ModelOptions& opt = {});
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const gguf::File& file() const { return *file_; }
  Backend& backend() { return backend_; }
  const ModelWeights& weights() const { return w_; }
  ModelBytes bytes() const { return bytes_; }

  std::unique_ptr<KvCache> make_cache(const KvCacheOptions& opt);

  // Evaluates the batch: writes every row's K/V into the cache (reserving blocks as needed), and
  // returns the logits of rows with logits=1, in row order, as (n_outputs, n_vocab) row-major.
  // Sequence lengths in the cache advance to max(position)+1 of their rows.
  void forward(const Batch& batch, KvCache& cache, std::vector<float>& logits);

 private:
  Model(std::unique_ptr<gguf::File> file, Backend& backend, const ModelOptions& opt);
  struct Workspace;
  void ensure_workspace(KvCache& cache);
  void forward_ubatch(const Batch& batch, int b0, int b1, KvCache& cache, std::vector<float>& logits);
  void attention_block(int il, int n, KvCache& cache);
  void ffn_block(int il, int n);

  std::unique_ptr<gguf::File> file_;
  Backend& backend_;
  ModelOptions opt_;
  ModelConfig cfg_;
  ModelWeights w_;
  ModelBytes bytes_;
  std::unique_ptr<Workspace> ws_;
};

}  // namespace pg
