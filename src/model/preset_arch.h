// The dimensions of each model preset (presets.cc): what make_model builds
// its tensors from, in Hugging Face config words. Other parts that describe
// a preset's weights another way (the Megatron names of a sharded trainer,
// src/reshard/megatron_model.h) read them here.
//
// Thread safety: constants.
#pragma once

#include <cstdint>
#include <string_view>

namespace refit {

struct PresetArch {
  const char* name;
  std::int64_t hidden;
  std::int64_t heads;
  std::int64_t kv_heads;
  std::int64_t head_dim;
  std::int64_t inter;  // dense MLP width; unused when experts > 0
  int layers;
  std::int64_t vocab;
  std::int64_t experts = 0;  // 0: dense MLP
  std::int64_t moe_inter = 0;
  bool qk_norm = false;  // qwen3: per-head RMSNorm on q and k
};

// The preset named `preset`, or nullptr when none is.
const PresetArch* find_preset_arch(std::string_view preset);

}  // namespace refit
