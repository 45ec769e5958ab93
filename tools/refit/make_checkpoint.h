// `refit make-checkpoint`: writes a preset's synthetic weights (content.h, the
// content of version 1 under --seed) as a sharded safetensors checkpoint:
// `files` files plus model.safetensors.index.json, the way Hugging Face
// stores large models. For benchmarks and tests of `refit push`.
#pragma once

#include <cstdint>
#include <string>

#include "refit/status.h"

namespace refit {

struct MakeCheckpointOptions {
  std::string model = "tiny";  // a preset
  int layers = -1;
  std::uint64_t seed = 0;
  int files = 2;
  std::string out;  // a directory (created)
};

Status make_checkpoint(const MakeCheckpointOptions& options);

}  // namespace refit
