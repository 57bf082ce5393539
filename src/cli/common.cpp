#include "cli/common.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/kv_quant.h"
#include "core/log.h"
#include "kv/disk_cache.h"
#include "model/dflash.h"
#include "spec/drafter.h"

namespace pg::cli {

void ModelFlags::add_to(Args& a, bool with_ctx) {
  a.opt("-m,--model", &model, "model file (GGUF); default: the bundled demo model", "FILE");
  a.opt("-t,--threads", &threads, "CPU threads (0 = all cores)");
  a.opt("--device", &device, "cpu, cuda, cuda:N or auto", "DEV");
  if (with_ctx) a.opt("-c,--ctx-size", &ctx, "context size in tokens (0 = model's training context, at most 4096)");
  a.opt("--cache-type", &cache_type, "KV cache type of K and V: " + kv_type_list(), "TYPE");
  a.opt("-ctk,--cache-type-k", &cache_type_k, "K cache type (default: --cache-type)", "TYPE");
  a.opt("-ctv,--cache-type-v", &cache_type_v, "V cache type (default: --cache-type)", "TYPE");
  a.opt("-b,--batch-size", &batch, "rows per forward micro-batch");
  a.flag("--exact", &exact, "CPU: multiply in F32 on dequantized weights (reference precision, slower)");
}

void ModelFlags::add_prefix_to(Args& a) {
  a.opt("--cache-ram", &cache_ram, "prefix cache RAM budget in MiB (-1 = the slots' KV size, at most 4096; 0 = off)");
  a.opt("--prefix-cache-slots", &prefix_cache_slots, "prefix cache sized for N whole contexts (used when --cache-ram is not given)");
  a.opt("--kv-cache-dir", &kv_cache_dir, "prefix cache on disk: block files in DIR survive restarts", "DIR");
  a.opt("--kv-block-size", &kv_block_size, "KV cache block size in tokens (default 64); the prefix cache shares whole blocks and copies the matching cells of a partly reused one");
  a.flag("--no-partial-blocks", &no_partial_blocks, "prefix cache: reuse whole blocks only (no copy of a partly matching block)");
  a.opt("--kv-cache-budget", &kv_cache_budget, "disk budget of --kv-cache-dir (e.g. 20G, 512M; a bare number is MiB)", "SIZE");
}

DType parse_cache_type(const std::string& s) { return parse_kv_type(s); }

KvCacheOptions LoadedModel::kv_options(int n_seq, int n_ctx_) const {
  KvCacheOptions o;
  o.n_seq = n_seq;
  o.n_ctx = n_ctx_;
  o.type = kv_type;
  o.type_v = kv_type_v;
  return o;
}

engine::SchedulerOptions LoadedModel::scheduler_options(int n_slots, int n_batch, const engine::SpecOptions& spec) const {
  engine::SchedulerOptions so;
  so.prefix = prefix;
  so.kv_block_size = kv_block_size;
  so.n_slots = n_slots;
  so.n_ctx = n_ctx;
  so.n_batch = n_batch;
  so.kv_type = kv_type;
  so.kv_type_v = kv_type_v;
  so.spec = spec;
  return so;
}

std::string ModelFlags::kv_types() const {
  const std::string k = cache_type_k.empty() ? cache_type : cache_type_k, v = cache_type_v.empty() ? cache_type : cache_type_v;
  return k == v ? k : k + "/" + v;
}

bool stderr_is_tty() { return isatty(2) != 0; }

std::string default_model_path() {
  if (const char* env = std::getenv("PEREGRINE_MODEL"); env && *env) return env;
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (!ec) {
    candidates.push_back(exe.parent_path() / "../share/peregrine/models" / kBundledModel);  // installed
    candidates.push_back(exe.parent_path() / "../../../models" / kBundledModel);            // build tree: build/src/cli
  }
  candidates.push_back(fs::path(PEREGRINE_SOURCE_DIR) / "models" / kBundledModel);
  for (const auto& c : candidates)
    if (fs::exists(c, ec)) return fs::weakly_canonical(c, ec).string();
  throw Error("no model given (use -m FILE) and the bundled model " + std::string(kBundledModel) + " was not found");
}

LoadedModel load_model(const ModelFlags& f_in, bool need_tokenizer) {
  ModelFlags f = f_in;
  if (f.model.empty()) {
    f.model = default_model_path();
    PG_INFO("no -m given: using the bundled demo model %s", f.model.c_str());
  }
  PG_CHECK(f.threads >= 0 && f.threads <= 1024, "invalid thread count " + std::to_string(f.threads));
  PG_CHECK(f.batch > 0 && f.batch <= 65536, "invalid batch size " + std::to_string(f.batch));
  PG_CHECK(f.ctx >= 0 && f.ctx <= (1 << 24), "invalid context size " + std::to_string(f.ctx));
  PG_CHECK(f.cache_ram >= -1, "--cache-ram must be a size in MiB ≥ 0 (0 = off), got " + std::to_string(f.cache_ram));
  PG_CHECK(f.prefix_cache_slots >= -1, "--prefix-cache-slots must be ≥ 0, got " + std::to_string(f.prefix_cache_slots));
  PG_CHECK(f.kv_block_size >= 1 && f.kv_block_size <= 4096, "--kv-block-size must be in [1, 4096], got " + std::to_string(f.kv_block_size));
  engine::PrefixOptions prefix;
  prefix.ram_mib = f.cache_ram;
  prefix.slots = f.prefix_cache_slots;
  prefix.disk_dir = f.kv_cache_dir;
  prefix.partial = !f.no_partial_blocks;
  try {
    prefix.disk_bytes = parse_byte_size(f.kv_cache_budget);
  } catch (const Error& e) {
    throw Error(std::string("--kv-cache-budget: ") + e.what());
  }
  LoadedModel lm;
  lm.prefix = prefix;
  lm.kv_block_size = f.kv_block_size;
  BackendOptions bo;
  bo.device = f.device;
  bo.cpu.n_threads = f.threads;
  bo.cpu.exact_f32 = f.exact;
  lm.backend = create_backend(bo);
  ModelOptions mo;
  mo.max_batch = f.batch;
  mo.progress = stderr_is_tty();
  lm.model = Model::load(f.model, *lm.backend, mo);
  if (need_tokenizer) lm.tokenizer = tok::Tokenizer::from_gguf(lm.model->file());
  const int train = lm.model->config().n_ctx_train > 0 ? lm.model->config().n_ctx_train : 4096;
  lm.n_ctx = f.ctx > 0 ? f.ctx : std::min(train, 4096);
  lm.kv_type = parse_cache_type(f.cache_type_k.empty() ? f.cache_type : f.cache_type_k);
  lm.kv_type_v = parse_cache_type(f.cache_type_v.empty() ? f.cache_type : f.cache_type_v);
  return lm;
}

void SamplingFlags::add_to(Args& a) {
  a.opt("--temp", &p.temperature, "temperature (0 = greedy)");
  a.opt("--top-k", &p.top_k, "top-k sampling (0 = off)");
  a.opt("--top-p", &p.top_p, "top-p (nucleus) sampling (1 = off)");
  a.opt("--min-p", &p.min_p, "min-p sampling (0 = off)");
  a.opt("--typical", &p.typical_p, "locally typical sampling (1 = off)");
  a.opt("--repeat-penalty", &p.repeat_penalty, "repetition penalty (1 = off)");
  a.opt("--repeat-last-n", &p.repeat_last_n, "tokens the penalties look back over (-1 = all)");
  a.opt("--presence-penalty", &p.presence_penalty, "presence penalty");
  a.opt("--frequency-penalty", &p.frequency_penalty, "frequency penalty");
  a.opt("-s,--seed", &seed, "random seed (-1 = random)");
}

SamplingParams SamplingFlags::resolve() const {
  SamplingParams r = p;
  r.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
  return r;
}

void SpecFlags::add_to(Args& a) {
  a.opt("-md,--spec-draft-model,--model-draft,--draft", &draft, "draft model for speculative decoding (same vocabulary as the target)", "FILE");
  a.opt("--spec-type", &type, "speculative decoding: none, draft or ngram (default: draft when a draft model is given or bundled)", "TYPE");
  a.opt("--spec-draft-n-max,--draft-max", &n_max, "tokens drafted per step at most (chain length, tree depth); 0 = 3 for chains, 8 for DDTree");
  a.opt("--spec-draft-n-min", &n_min, "drafts shorter than this are not verified");
  a.opt("--spec-draft-device,--draft-device", &device, "device of the draft model (default: the target's)", "DEV");
  a.flag("--ddtree", &ddtree, "verify a DDTree token tree built from the draft's top-k instead of a chain");
  a.opt("--ddtree-budget", &budget, "DDTree draft nodes per step (1..127)");
  a.opt("--spec-draft-p-min", &p_min, "stop drafting where the draft's top token is less likely than this (0 = off)");
  a.flag("--spec-fixed", &fixed, "verify whole drafts (default: the draft length / tree budget that pays, chosen per step)");
  a.opt("--spec-tree", &tree, "draft shape: ddtree or chain (default chain; --ddtree = ddtree)", "SHAPE");
  a.opt("--fa-window", &fa_window, "DFlash: context positions the draft attends to (0 = the whole context)");
  a.opt("--draft-residency", &residency, "draft weights: auto, persistent or request-scoped (the same on the CPU)", "MODE");
}

void SpecFlags::validate() const {
  if (!type.empty()) spec::parse_spec_type(type);
  PG_CHECK(tree.empty() || tree == "ddtree" || tree == "chain", "unknown --spec-tree '" + tree + "' (expected ddtree or chain)");
  PG_CHECK(budget >= 1 && budget <= spec::kMaxTreeNodes - 1,
           "--ddtree-budget must be in [1, " + std::to_string(spec::kMaxTreeNodes - 1) + "], got " + std::to_string(budget));
  PG_CHECK(n_max >= 0 && n_max <= spec::kMaxTreeNodes - 1,
           "--spec-draft-n-max must be in [1, " + std::to_string(spec::kMaxTreeNodes - 1) + "] (0 = auto), got " + std::to_string(n_max));
  PG_CHECK(p_min >= 0.0f && p_min <= 1.0f, "--spec-draft-p-min must be in [0, 1], got " + std::to_string(p_min));
  PG_CHECK(n_min >= 0 && (n_max == 0 || n_min <= n_max), "--spec-draft-n-min must be in [0, --spec-draft-n-max], got " + std::to_string(n_min));
  PG_CHECK(fa_window >= 0, "--fa-window must be ≥ 0 (0 = the whole context), got " + std::to_string(fa_window));
  PG_CHECK(residency == "auto" || residency == "persistent" || residency == "request-scoped",
           "unknown --draft-residency '" + residency + "' (expected auto, persistent or request-scoped)");
}

LoadedDraft load_spec(const SpecFlags& f, const ModelFlags& mf, const LoadedModel& target, const std::string& target_path, bool bundled) {
  namespace fs = std::filesystem;
  f.validate();
  LoadedDraft d;
  std::string draft = f.draft;
  if (draft.empty() && bundled && fs::path(target_path).filename() == kBundledModel) {
    std::error_code ec;
    const bool want_dflash = !f.type.empty() && spec::parse_spec_type(f.type) == spec::SpecType::kDFlash;
    const fs::path p = fs::path(target_path).parent_path() / (want_dflash ? kBundledDFlashDraft : kBundledDraft);
    if (fs::exists(p, ec)) draft = p.string();
  }
  spec::SpecType t = f.type.empty() ? (draft.empty() ? spec::SpecType::kNone : spec::SpecType::kDraft) : spec::parse_spec_type(f.type);
  PG_CHECK(t != spec::SpecType::kDraft || !draft.empty(), "--spec-type draft needs a draft model (-md FILE)");
  PG_CHECK(t != spec::SpecType::kDFlash || !draft.empty(), "--spec-type dflash needs a DFlash draft model (--draft FILE)");
  // A DFlash draft is recognised by its architecture (dflash, dflash-draft, ...), whatever --spec-type says.
  bool dflash_file = false;
  if (t == spec::SpecType::kDraft || t == spec::SpecType::kDFlash) {
    try {
      dflash_file = is_dflash_arch(gguf::File::open(draft)->architecture());
    } catch (const Error& e) {
      // An unreadable file: the draft loader below reports it as usual.
      if (t == spec::SpecType::kDFlash) throw Error("cannot load the DFlash draft '" + draft + "': " + e.what());
    }
  }
  PG_CHECK(t != spec::SpecType::kDFlash || dflash_file, "--spec-type dflash: '" + draft + "' is not a DFlash draft (architecture dflash, dflash-draft, qwen35-dflash-draft)");
  if (dflash_file) t = spec::SpecType::kDFlash;
  d.opt.type = t;
  d.opt.tree = f.ddtree || f.tree == "ddtree";
  // Auto depth: every drafted token costs a verify row, and on a compute-bound device (the 2-core CPU
  // with the demo pair) rows cost nearly an AR step each, so chains stay short; a tree spends its
  // budget across depth 8 (docs/benchmarks.md).
  d.opt.n_max = f.n_max > 0 ? f.n_max : (d.opt.tree ? 8 : 3);
  d.opt.n_min = std::min(f.n_min, d.opt.n_max);
  d.opt.budget = f.budget;
  d.opt.p_min = f.p_min;
  d.opt.adaptive = !f.fixed;
  d.opt.fa_window = f.fa_window;
  if (t == spec::SpecType::kDFlash) {
    // The draft shares the target's embedding and head, so it lives on the target's backend; its
    // weights stay resident (--draft-residency changes nothing on the CPU).
    d.path = draft;
    try {
      d.dflash = DFlashModel::load(draft, *target.model);
    } catch (const Error& e) {
      throw Error("cannot load the DFlash draft '" + draft + "': " + e.what());
    }
    d.opt.dflash = d.dflash.get();
    return d;
  }
  if (t != spec::SpecType::kDraft) return d;
  d.path = draft;
  // On the target's device the draft shares its backend: two CPU thread pools on the same cores
  // would spin against each other.
  Backend* be = target.backend.get();
  if (!f.device.empty() && f.device != mf.device) {
    BackendOptions bo;
    bo.device = f.device;
    bo.cpu.n_threads = mf.threads;
    bo.cpu.exact_f32 = mf.exact;
    d.backend = create_backend(bo);
    be = d.backend.get();
  }
  ModelOptions mo;
  mo.max_batch = mf.batch;
  try {
    d.model = Model::load(draft, *be, mo);
  } catch (const Error& e) {
    throw Error("cannot load the draft model '" + draft + "': " + e.what());
  }
  spec::check_same_vocab(*target.model, *d.model, draft);
  d.opt.draft = d.model.get();
  return d;
}

std::string spec_line(int drafted, int accepted, int steps) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "spec: drafted %d accepted %d steps %d mean_accept_len %.2f", drafted, accepted, steps,
                steps > 0 ? static_cast<double>(accepted + steps) / steps : 0.0);
  return buf;
}

}  // namespace pg::cli
