// `peregrine gguf synth --dflash`: a random-weight DFlash draft (llama.cpp's "dflash" layout, see
// model/dflash.h) shaped for a target preset — target-width layers, fc over the fused target
// features — for benchmarks of the draft pass at real sizes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/synth.h"

namespace pg::gguf {

struct DFlashSynthOptions {
  int n_layer = 5;                 // draft layers (the published drafts: 5)
  int block_size = 16;
  std::vector<int> target_layers;  // 0-based target layer outputs; empty: dflash_default_layers(target, 5)
  int64_t mask_token = -1;         // -1: the family's (Qwen3 151669, Qwen3.5 248070), else the last id
};

// The published rule for N features of an L-layer target: round(1 + i·(L−4)/(N−1)) (z-lab), made
// distinct for small L by taking 1..N when the rule repeats an id.
std::vector<int> dflash_default_layers(int target_layers, int n);

// Writes the draft; returns the file size. Throws pg::Error for unusable options.
uint64_t synth_dflash_write(const SynthConfig& target, const DFlashSynthOptions& d, const SynthFileType& ft, uint64_t seed,
                            const std::string& path);

}  // namespace pg::gguf
