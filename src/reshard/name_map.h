// Name maps: which sub-slices of which trainer tensors make each engine
// tensor, when the two sides name and fuse the same weights differently
// (issue 19, item 4). A trainer may hold Megatron-Core's fused tensors while
// the engine holds Hugging Face's separate ones, or vLLM's other fusions;
// the map lets the transfer plan move each sub-slice straight from the
// trainer tensor into the engine tensor, with no conversion pass.
//
// Every box below is in the FULL, unsharded tensor of its side (Megatron at
// TP 1, the Hugging Face checkpoint, vLLM at TP 1). Rows are dim 0 of the
// [out, in] weight; the columns are never cut. Layouts, with where each is
// documented:
//
//   Megatron linear_qkv [(heads + 2 kv_heads) head_dim, hidden]: per query
//     group g (one per kv head), the group's heads/kv_heads q heads, then
//     k head g, then v head g, head_dim rows each: "q1 q2 k1 v1 | q3 q4 k2
//     v2 | ...". NVIDIA/Megatron-LM megatron/core/transformer/attention.py
//     (SelfAttention.get_query_key_value_tensors, the [ng, (np/ng + 2) hn]
//     view); tools/checkpoint/loader_mixtral_hf.py (set_attn_state);
//     NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/models/conversion/
//     param_mapping.py (merge_qkv_weights: "[q1...qn, k1, v1, q1...qn, k2,
//     v2, ...]").
//   Megatron linear_fc1 [2 intermediate, hidden]: [gate; up] (the first half
//     goes through the activation). Megatron-LM megatron/core/transformer/
//     mlp.py (glu: torch.chunk(x, 2, dim=-1)); Megatron-Bridge
//     param_mapping.py (GatedMLPMapping: cat([gate, up]) at TP 1);
//     loader_mixtral_hf.py (cat([w1, w3], dim=0)).
//     TP CAUTION: at TP T, Megatron rank r holds [gate_r; up_r] (the r-th
//     T-th of each half), so the TP shards concatenated are NOT this full
//     tensor (mlp.py apply_swiglu_sharded_factory writes the checkpoint's
//     global tensor as [all gate; all up], as here). linear_qkv's TP shards
//     are whole query groups: a contiguous row range of the full tensor.
//   Megatron experts (Qwen3-MoE), two forms (MegatronExperts):
//     kStacked   decoder.layers.L.mlp.experts.linear_fc1.weight [E, 2I, H]
//                and .linear_fc2.weight [E, H, I]: the torch_dist
//                checkpoint's global tensors (Megatron-LM megatron/core/
//                extensions/transformer_engine.py _sharded_state_dict_grouped
//                keys every weight{i} as `weight` along a prepended expert
//                axis); the form layout.h's kExperts level splits.
//     kPerExpert decoder.layers.L.mlp.experts.linear_fc1.weightJ [2I, H]
//                (TEGroupedMLP's grouped-GEMM parameters, megatron/core/
//                transformer/moe/experts.py), J the GLOBAL expert index as
//                Megatron-Bridge names them (qwen/qwen3_moe_bridge.py).
//     Each expert's fc1 is [gate_J; up_J], with the TP caution above.
//   Megatron names (Transformer Engine spec: input_layernorm fused into
//     self_attention.linear_qkv.layer_norm_weight; Llama's pre-MLP norm into
//     mlp.linear_fc1.layer_norm_weight, Qwen3-MoE's stays pre_mlp_layernorm
//     since its experts are not TE layernorm-linears; q_layernorm,
//     k_layernorm; mlp.router.weight; embedding.word_embeddings.weight,
//     decoder.final_layernorm.weight, output_layer.weight): Megatron-Bridge
//     src/megatron/bridge/models/llama/llama_bridge.py and
//     qwen/qwen3_moe_bridge.py (mapping_registry); Megatron-LM
//     tools/checkpoint/schema_core.py.
//   vLLM qkv_proj [(heads + 2 kv_heads) head_dim, hidden]: [q; k; v], not
//     interleaved; gate_up_proj [2I, H]: [gate; up]. vllm-project/vllm
//     vllm/model_executor/layers/linear.py (QKVParallelLinear.weight_loader
//     shard offsets: q at 0, k at heads * head_size, v at (heads + kv_heads)
//     * head_size); vllm/model_executor/models/qwen3_moe.py
//     (stacked_params_mapping: gate_proj shard 0, up_proj shard 1).
//     vLLM experts: model.layers.L.mlp.experts.w13_weight [E, 2I, H] (per
//     expert [gate; up]) and w2_weight [E, H, I]: vllm/model_executor/layers/
//     fused_moe/layer.py (UnquantizedFusedMoEMethod.create_weights;
//     make_expert_params_mapping: gate_proj -> w1, up_proj -> w3; _load_w13:
//     w1 into the first half, w3 into the second). Unquantized only: some
//     quantized kernels load up first (load_up_proj_weight_first).
//     TP CAUTION: vLLM TP rank r holds [q_r; k_r; v_r] and [gate_r; up_r],
//     each component split on its own, so an engine rank's shard of a fused
//     tensor is not one row range of the full fused tensor (see component).
//   Hugging Face (the checkpoint names; also refit's presets, src/model/
//     presets.cc): model.layers.L.self_attn.{q,k,v,o}_proj.weight,
//     mlp.{gate,up,down}_proj.weight, mlp.experts.J.{gate,up,down}_proj.weight,
//     mlp.gate.weight (router [E, H]), input_layernorm, post_attention_
//     layernorm, self_attn.{q,k}_norm [head_dim] (Qwen3),
//     model.embed_tokens, model.norm, lm_head. huggingface/transformers
//     src/transformers/models/qwen3_moe/modeling_qwen3_moe.py.
//
// Not covered: tied embeddings (lm_head absent), biases, Megatron's
// non-TE ("local") norm names, SequentialMLP's local_experts names, kv
// heads replicated when an engine's TP exceeds kv_heads.
//
// Thread safety: values; the functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "refit/correspondence.h"
#include "refit/layout.h"
#include "refit/status.h"

namespace refit {

enum class ModelFamily : unsigned char { kLlama, kQwen3Moe };

// Trainer format -> engine format.
enum class MapDirection : unsigned char { kMegatronToHf, kMegatronToVllm, kHfToVllm };

enum class MapSide : unsigned char { kTrainer, kEngine };

// How a Megatron trainer publishes its experts (see the header comment).
enum class MegatronExperts : unsigned char { kStacked, kPerExpert };

// "llama", "qwen3-moe"; "megatron->hf", "megatron->vllm", "hf->vllm";
// "trainer", "engine".
std::string_view model_family_name(ModelFamily family);
std::string_view map_direction_name(MapDirection direction);
std::string_view map_side_name(MapSide side);

// Model dimensions, in Hugging Face config words. Every field must be >= 1
// except `experts`; heads must be a multiple of kv_heads.
struct ModelDims {
  std::int64_t hidden = 0;        // hidden_size
  std::int64_t heads = 0;         // num_attention_heads
  std::int64_t kv_heads = 0;      // num_key_value_heads (Megatron num_query_groups)
  std::int64_t head_dim = 0;      // head_dim (Megatron kv_channels)
  std::int64_t intermediate = 0;  // Llama intermediate_size; Qwen3-MoE moe_intermediate_size (each expert's)
  std::int64_t experts = 0;       // Qwen3-MoE num_experts (>= 1); Llama: 0
  std::int64_t layers = 0;        // num_hidden_layers
  std::int64_t vocab = 0;         // vocab_size
  MegatronExperts megatron_experts = MegatronExperts::kStacked;  // Default: stacked
};

// One map: a family, a direction and its dimensions.
struct NameMap {
  ModelFamily family = ModelFamily::kLlama;
  MapDirection direction = MapDirection::kMegatronToHf;
  ModelDims dims;

  // "llama megatron->hf".
  std::string ToString() const;
};

// A tensor one side holds: its name and full shape.
struct MappedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  friend bool operator==(const MappedTensor&, const MappedTensor&) = default;
};

// Correspondence and box_text: refit/correspondence.h.

// OK when `map.dims` suit `map.family`; errors (kInvalidArgument) name the
// map, the field and its value.
Status validate_name_map(const NameMap& map);

// Every tensor `side` holds, in checkpoint order (the embedding, each layer,
// the final norm, the output layer; the Hugging Face order equals
// make_model's). Errors: validate_name_map's.
StatusOr<std::vector<MappedTensor>> mapped_tensors(const NameMap& map, MapSide side);

// The correspondences of one tensor, named as `side` names it: every piece
// of it and where the other side holds that piece. For an engine name they
// come in the engine tensor's row order (as model_correspondences lists
// them); for a trainer name, grouped by engine tensor in the order the
// trainer tensor's rows first meet them, then in engine row order. Errors: validate_name_map's; kNotFound for a name no
// tensor of that side has (naming the tensor, the map and the side);
// kInvalidArgument for a layer or expert index outside the model.
StatusOr<std::vector<Correspondence>> tensor_correspondences(const NameMap& map, MapSide side,
                                                             std::string_view name);

// Every correspondence of the model, in engine tensor order (mapped_tensors
// of the engine) and then row order. Errors: validate_name_map's.
StatusOr<std::vector<Correspondence>> model_correspondences(const NameMap& map);

// Checks that `correspondences` write every element of every `engine`
// tensor exactly once and read each element of each `trainer` tensor at
// most once; that each names a listed tensor, has boxes of that tensor's
// rank inside its shape, and boxes of equal extents (dims of extent 1
// dropped). Errors (kInvalidArgument) name the tensor, the boxes and what
// was expected. Cost: O(k log k) per tensor of k boxes, plus the overlaps
// of boxes that share rows of dim 0.
Status check_correspondences(const std::vector<Correspondence>& correspondences,
                             const std::vector<MappedTensor>& engine, const std::vector<MappedTensor>& trainer);

}  // namespace refit
