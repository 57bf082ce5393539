// Architecture registry. Adding an architecture = one file in model/arch/ that reads its
// hyperparameters into ModelConfig and binds its tensor names to ModelWeights slots.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/config.h"
#include "model/weights.h"

namespace pg {

// Reads "<arch>.<key>" metadata with clear errors.
class ArchMeta {
 public:
  ArchMeta(const gguf::File& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  const gguf::File& file() const { return f_; }
  std::string key(const std::string& k) const { return arch_ + "." + k; }
  bool has(const std::string& k) const { return f_.has(key(k)); }
  int i(const std::string& k) const;
  int i(const std::string& k, int def) const;
  float f(const std::string& k) const;
  float f(const std::string& k, float def) const;
  bool b(const std::string& k, bool def) const;
  std::vector<int64_t> ints(const std::string& k) const;

 private:
  const gguf::File& f_;
  std::string arch_;
};

// Binds named GGUF tensors to weight slots, checking shapes; the caller turns them into backend tensors.
class Binder {
 public:
  explicit Binder(const gguf::File& f) : f_(f) {}
  // Required tensor with the given ggml shape ({in, out[, n_expert]}); throws when absent or mis-shaped.
  void req(Tensor& slot, const std::string& name, std::vector<int64_t> shape);
  // Optional: bound when present (shape still checked).
  bool opt(Tensor& slot, const std::string& name, std::vector<int64_t> shape);
  const std::set<std::string>& used() const { return used_; }
  const gguf::File& file() const { return f_; }

  struct Pending {
    Tensor* slot;
    const gguf::TensorInfo* info;
  };
  const std::vector<Pending>& pending() const { return pending_; }

 private:
  const gguf::File& f_;
  std::set<std::string> used_;
  std::vector<Pending> pending_;
};

// "blk.<il>.<name>.weight"
std::string blk(int il, const std::string& name, const char* suffix = "weight");

struct ArchDef {
  const char* name;
  void (*read_config)(const ArchMeta& m, ModelConfig& c);
  void (*bind)(Binder& b, const ModelConfig& c, ModelWeights& w);
};

const ArchDef* find_arch(const std::string& name);
std::vector<std::string> supported_archs();

// Shared pieces used by several architecture files.
void read_common_config(const ArchMeta& m, ModelConfig& c);
void bind_embeddings(Binder& b, const ModelConfig& c, ModelWeights& w);
void bind_attention(Binder& b, const ModelConfig& c, int il, LayerWeights& l);
void bind_dense_ffn(Binder& b, const ModelConfig& c, int il, LayerWeights& l);
void bind_moe_ffn(Binder& b, const ModelConfig& c, int il, LayerWeights& l);

}  // namespace pg
