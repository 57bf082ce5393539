// Flags and loading shared by every command that runs a model.
#pragma once
#include <memory>
#include <string>

#include "backend/factory.h"
#include "cli/args.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/dflash.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace pg::cli {

struct ModelFlags {
  std::string model;  // empty = bundled default
  int threads = 0;
  std::string device = "auto";
  int ctx = 0;  // 0 = min(training context, 4096)
  std::string cache_type = "f16";             // K and V (--cache-type)
  std::string cache_type_k, cache_type_v;     // -ctk / -ctv; empty = cache_type
  bool exact = false;
  int batch = 512;
  // Prefix cache (commands that run the scheduler: run, chat, serve); docs/prefix-cache.md.
  int64_t cache_ram = -1;        // --cache-ram MiB (-1 = default, 0 = off)
  int prefix_cache_slots = -1;   // --prefix-cache-slots N (the reference's; N contexts' worth of RAM)
  std::string kv_cache_dir;      // --kv-cache-dir DIR
  std::string kv_cache_budget = "10G";
  int kv_block_size = 64;        // --kv-block-size: cells per KV block (the prefix cache's reuse granularity)
  bool no_partial_blocks = false;  // --no-partial-blocks: the prefix cache reuses whole blocks only

  void add_to(Args& a, bool with_ctx = true);
  void add_prefix_to(Args& a);
  std::string kv_types() const;  // "q8_0", or "q8_0/f16" when K and V differ (for messages)
};

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<tok::Tokenizer> tokenizer;
  int n_ctx = 0;
  DType kv_type = DType::F16;    // K cache type
  DType kv_type_v = DType::F16;  // V cache type
  engine::PrefixOptions prefix;  // from the prefix-cache flags (checked at load)
  int kv_block_size = 64;
  KvCacheOptions kv_options(int n_seq, int n_ctx) const;  // the cache the flags ask for
  // The step loop's options for this model: its context and KV types, n_slots sequences, n_batch rows per step.
  engine::SchedulerOptions scheduler_options(int n_slots, int n_batch, const engine::SpecOptions& spec) const;
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

// Speculative decoding flags (run, chat, bench, serve).
struct SpecFlags {
  std::string draft;             // -md FILE
  std::string type;              // --spec-type; empty: draft when a draft model is given or bundled, else none
  int n_max = 0, n_min = 0;      // --spec-draft-n-max (0 = auto: 3 for chains, 8 for DDTree) / --spec-draft-n-min
  std::string device;            // --spec-draft-device; empty = the target's device
  bool ddtree = false;           // --ddtree
  std::string tree;              // --spec-tree ddtree|chain
  int budget = 22;               // --ddtree-budget
  float p_min = 0.75f;           // --spec-draft-p-min
  bool fixed = false;            // --spec-fixed: verify whole drafts (no adaptive length/budget)
  int fa_window = 0;             // --fa-window (DFlash: context positions the draft sees; 0 = all)
  std::string residency = "auto";  // --draft-residency auto|persistent|request-scoped

  void add_to(Args& a);
  // Checks the values that need no model (one clear error before anything loads).
  void validate() const;
};

// The bundled draft (models/), used with the bundled target when no -m is given.
constexpr const char* kBundledDraft = "peregrine-demo-draft-Q8_0.gguf";
// The bundled DFlash draft (--spec-type dflash with the bundled target and no --draft).
constexpr const char* kBundledDFlashDraft = "peregrine-demo-dflash-Q8_0.gguf";

struct LoadedDraft {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<DFlashModel> dflash;  // a DFlash draft (auto-detected from the file's architecture)
  std::string path;
  engine::SpecOptions opt;  // opt.draft points at model
};

// Resolves the flags against the loaded target (`target_path` is the file it came from,
// `bundled` true when no -m was given): loads the draft on its device, checks its vocabulary.
LoadedDraft load_spec(const SpecFlags& f, const ModelFlags& mf, const LoadedModel& target, const std::string& target_path, bool bundled);
// "spec: drafted N accepted M steps S mean_accept_len X" (the stable form of `peregrine run`'s line).
std::string spec_line(int drafted, int accepted, int steps);

DType parse_cache_type(const std::string& s);
bool stderr_is_tty();

}  // namespace pg::cli
