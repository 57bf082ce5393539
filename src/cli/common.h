// Flags and loading shared by every command that runs a model.
#pragma once
#include <memory>
#include <string>

#include "backend/factory.h"
#include "cli/args.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace pg::cli {

struct ModelFlags {
  std::string model;  // empty = bundled default
  int threads = 0;
  std::string device = "auto";
  int ctx = 0;  // 0 = min(training context, 4096)
  std::string cache_type = "f16";
  bool exact = false;
  int batch = 512;

  void add_to(Args& a, bool with_ctx = true);
};

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<tok::Tokenizer> tokenizer;
  int n_ctx = 0;
  DType kv_type = DType::F16;
};

// The bundled demo model (models/ in the source tree) used when no -m is given.
constexpr const char* kBundledModel = "peregrine-demo-target-Q8_0.gguf";
// $PEREGRINE_MODEL, else the bundled model next to the install or the build tree.
std::string default_model_path();

// Loads the model named by the flags (or the bundled default when none is given).
LoadedModel load_model(const ModelFlags& f, bool need_tokenizer = true);

struct SamplingFlags {
  SamplingParams p;
  int64_t seed = -1;  // -1 = random
  void add_to(Args& a);
  SamplingParams resolve() const;
};

DType parse_cache_type(const std::string& s);
bool stderr_is_tty();

}  // namespace pg::cli
