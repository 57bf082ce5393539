#include "cli/common.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/log.h"

namespace pg::cli {

void ModelFlags::add_to(Args& a, bool with_ctx) {
  a.opt("-m,--model", &model, "model file (GGUF); default: the bundled demo model", "FILE");
  a.opt("-t,--threads", &threads, "CPU threads (0 = all cores)");
  a.opt("--device", &device, "cpu, cuda, cuda:N or auto", "DEV");
  if (with_ctx) a.opt("-c,--ctx-size", &ctx, "context size in tokens (0 = model's training context, at most 4096)");
  a.opt("-ctk,--cache-type", &cache_type, "KV cache type: f16 or f32", "TYPE");
  a.opt("-b,--batch-size", &batch, "rows per forward micro-batch");
  a.flag("--exact", &exact, "CPU: multiply in F32 on dequantized weights (reference precision, slower)");
}

DType parse_cache_type(const std::string& s) {
  if (s == "f16" || s == "F16") return DType::F16;
  if (s == "f32" || s == "F32") return DType::F32;
  throw Error("unsupported cache type '" + s + "' (supported: f16, f32)");
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
  LoadedModel lm;
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
  lm.kv_type = parse_cache_type(f.cache_type);
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

}  // namespace pg::cli
