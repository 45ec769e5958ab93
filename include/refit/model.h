// Model presets: synthetic weights with the real tensor names and shapes of
// real architectures, and the engine's tensor-parallel sharding rules.
//
// A preset lists the full (unsharded) weights in checkpoint order, each with
// a ShardRule that says how an engine with N TP ranks splits it:
//   kReplicated  every rank gets the whole tensor (norms, router)
//   kColumn      split along dim 0 (q/k/v, gate/up: output features)
//   kRow         split along dim 1 (o_proj, down_proj: input features)
//   kVocab       split along dim 0 (embed_tokens, lm_head: vocabulary)
//   kExpert      expert parallel (`--engine-experts ep`, expert_parallel.h):
//                a per-expert tensor (Weight::expert >= 0) is held whole by
//                the rank that owns its expert and by no other (their shard
//                is empty: 0 rows of dim 0); a stacked [experts, ...] tensor
//                (Weight::expert == -1) is split along dim 0 into whole
//                experts. Experts go to ranks as contiguous ranges, the first
//                experts % N ranks holding one more (expert_owner)
// Splits may be uneven: a dimension D over N ranks gives rank i
// D / N + (i < D % N ? 1 : 0) entries, starting after ranks 0..i-1's.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

enum class ShardRule : unsigned char { kReplicated, kColumn, kRow, kVocab, kExpert };

struct Weight {
  TensorSpec spec;  // full, unsharded
  ShardRule rule = ShardRule::kReplicated;
  // kExpert only: the expert this tensor belongs to (-1: a stacked tensor
  // of all `experts`) and how many experts its layer has.
  int expert = -1;
  int experts = 0;
};

// The rank among `ranks` that owns expert `expert` of `experts`: contiguous
// ranges, the first experts % ranks ranks holding one more (vLLM's expert
// map). REQUIRES: 0 <= expert < experts, ranks >= 1.
int expert_owner(int expert, int experts, int ranks);

struct Model {
  std::string preset;
  std::vector<Weight> weights;
  std::uint64_t total_bytes() const;
};

// "tiny", "tiny-moe", "llama3-8b", "qwen3-30b-a3b".
std::vector<std::string> model_presets();

// Builds a preset. layers < 0 keeps all layers; layers >= 0 keeps the first
// `layers` decoder layers (the embedding, final norm and lm_head stay).
// Unknown preset or layers beyond the preset's count: kInvalidArgument.
StatusOr<Model> make_model(const std::string& preset, int layers);

// [begin, end) along `dim` of a shard; dim == -1 means the whole tensor.
struct ShardSlice {
  int dim = -1;
  std::int64_t begin = 0;
  std::int64_t end = 0;
};
ShardSlice shard_slice(const Weight& weight, int rank, int ranks);
// The spec of rank `rank`'s shard (same name and dtype, sliced shape).
TensorSpec shard_spec(const Weight& weight, int rank, int ranks);
// Rank `rank`'s stream: the shard specs of every weight, in model order.
std::vector<TensorSpec> engine_stream(const Model& model, int rank, int ranks);

// A shard as runs inside the full tensor's C-order bytes: run i
// (0 <= i < count) is full bytes [base + i * stride, + run) and shard bytes
// [i * run, (i + 1) * run). Replicated and dim-0 shards are one run; a dim-1
// shard is one run per index of dim 0. An empty shard has count == 0.
struct ShardRunLayout {
  std::uint64_t base = 0;
  std::uint64_t stride = 0;
  std::uint64_t run = 0;
  std::uint64_t count = 0;
};
ShardRunLayout shard_run_layout(const Weight& weight, int rank, int ranks);

// Calls fn(full_offset, shard_offset, bytes) for each contiguous run of the
// shard inside the full tensor's C-order bytes, in shard order.
void for_each_shard_run(const Weight& weight, int rank, int ranks,
                        const std::function<void(std::uint64_t full_offset, std::uint64_t shard_offset,
                                                 std::uint64_t bytes)>& fn);

// Copies rank `rank`'s shard out of the full tensor's bytes, copying only
// shard bytes [shard_begin, shard_begin + out.size()).
void copy_shard_range(const Weight& weight, int rank, int ranks, const std::byte* full,
                      std::uint64_t shard_begin, std::span<std::byte> out);

}  // namespace refit
