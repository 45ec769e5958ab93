// The name maps' tables: see name_map_tables.h; the layouts and where each
// is documented: name_map.h.
#include "reshard/name_map_tables.h"

#include <iterator>

namespace refit::name_map_detail {
namespace {

using C = Component;
using S = Scope;

// ---- Hugging Face (presets.cc's order) ----

constexpr Rule kHfHead[] = {whole("model.embed_tokens.weight", S::kModel, C::kEmbed)};
constexpr Rule kHfTail[] = {whole("model.norm.weight", S::kModel, C::kFinalNorm),
                            whole("lm_head.weight", S::kModel, C::kLmHead)};

constexpr Rule kHfLlamaLayer[] = {
    whole("model.layers.{L}.input_layernorm.weight", S::kLayer, C::kInputNorm),
    whole("model.layers.{L}.self_attn.q_proj.weight", S::kLayer, C::kQ),
    whole("model.layers.{L}.self_attn.k_proj.weight", S::kLayer, C::kK),
    whole("model.layers.{L}.self_attn.v_proj.weight", S::kLayer, C::kV),
    whole("model.layers.{L}.self_attn.o_proj.weight", S::kLayer, C::kO),
    whole("model.layers.{L}.post_attention_layernorm.weight", S::kLayer, C::kPostAttnNorm),
    whole("model.layers.{L}.mlp.gate_proj.weight", S::kLayer, C::kGate),
    whole("model.layers.{L}.mlp.up_proj.weight", S::kLayer, C::kUp),
    whole("model.layers.{L}.mlp.down_proj.weight", S::kLayer, C::kDown),
};

constexpr Rule kHfQwen3MoeLayer[] = {
    whole("model.layers.{L}.input_layernorm.weight", S::kLayer, C::kInputNorm),
    whole("model.layers.{L}.self_attn.q_proj.weight", S::kLayer, C::kQ),
    whole("model.layers.{L}.self_attn.k_proj.weight", S::kLayer, C::kK),
    whole("model.layers.{L}.self_attn.v_proj.weight", S::kLayer, C::kV),
    whole("model.layers.{L}.self_attn.q_norm.weight", S::kLayer, C::kQNorm),
    whole("model.layers.{L}.self_attn.k_norm.weight", S::kLayer, C::kKNorm),
    whole("model.layers.{L}.self_attn.o_proj.weight", S::kLayer, C::kO),
    whole("model.layers.{L}.post_attention_layernorm.weight", S::kLayer, C::kPostAttnNorm),
    whole("model.layers.{L}.mlp.gate.weight", S::kLayer, C::kRouter),
    whole("model.layers.{L}.mlp.experts.{E}.gate_proj.weight", S::kExpert, C::kGate),
    whole("model.layers.{L}.mlp.experts.{E}.up_proj.weight", S::kExpert, C::kUp),
    whole("model.layers.{L}.mlp.experts.{E}.down_proj.weight", S::kExpert, C::kDown),
};

// ---- Megatron-Core, Transformer Engine spec ----

constexpr Rule kMegatronHead[] = {whole("embedding.word_embeddings.weight", S::kModel, C::kEmbed)};
constexpr Rule kMegatronTail[] = {whole("decoder.final_layernorm.weight", S::kModel, C::kFinalNorm),
                                  whole("output_layer.weight", S::kModel, C::kLmHead)};

constexpr Rule kMegatronLlamaLayer[] = {
    whole("decoder.layers.{L}.self_attention.linear_qkv.layer_norm_weight", S::kLayer, C::kInputNorm),
    fused("decoder.layers.{L}.self_attention.linear_qkv.weight", S::kLayer, Rows::kPerQueryGroup, C::kQ, C::kK,
          C::kV),
    whole("decoder.layers.{L}.self_attention.linear_proj.weight", S::kLayer, C::kO),
    whole("decoder.layers.{L}.mlp.linear_fc1.layer_norm_weight", S::kLayer, C::kPostAttnNorm),
    fused("decoder.layers.{L}.mlp.linear_fc1.weight", S::kLayer, Rows::kConcat, C::kGate, C::kUp),
    whole("decoder.layers.{L}.mlp.linear_fc2.weight", S::kLayer, C::kDown),
};

// Qwen3-MoE's layer up to its experts; one of the two expert tables follows.
constexpr Rule kMegatronQwen3MoeAttention[] = {
    whole("decoder.layers.{L}.self_attention.linear_qkv.layer_norm_weight", S::kLayer, C::kInputNorm),
    fused("decoder.layers.{L}.self_attention.linear_qkv.weight", S::kLayer, Rows::kPerQueryGroup, C::kQ, C::kK,
          C::kV),
    whole("decoder.layers.{L}.self_attention.q_layernorm.weight", S::kLayer, C::kQNorm),
    whole("decoder.layers.{L}.self_attention.k_layernorm.weight", S::kLayer, C::kKNorm),
    whole("decoder.layers.{L}.self_attention.linear_proj.weight", S::kLayer, C::kO),
    whole("decoder.layers.{L}.pre_mlp_layernorm.weight", S::kLayer, C::kPostAttnNorm),
    whole("decoder.layers.{L}.mlp.router.weight", S::kLayer, C::kRouter),
};
constexpr Rule kMegatronStackedExperts[] = {
    fused("decoder.layers.{L}.mlp.experts.linear_fc1.weight", S::kStackedExperts, Rows::kConcat, C::kGate, C::kUp),
    whole("decoder.layers.{L}.mlp.experts.linear_fc2.weight", S::kStackedExperts, C::kDown),
};
constexpr Rule kMegatronPerExpert[] = {
    fused("decoder.layers.{L}.mlp.experts.linear_fc1.weight{E}", S::kExpert, Rows::kConcat, C::kGate, C::kUp),
    whole("decoder.layers.{L}.mlp.experts.linear_fc2.weight{E}", S::kExpert, C::kDown),
};

// ---- vLLM (the Hugging Face names, fused where vLLM fuses) ----

constexpr Rule kVllmLlamaLayer[] = {
    whole("model.layers.{L}.input_layernorm.weight", S::kLayer, C::kInputNorm),
    fused("model.layers.{L}.self_attn.qkv_proj.weight", S::kLayer, Rows::kConcat, C::kQ, C::kK, C::kV),
    whole("model.layers.{L}.self_attn.o_proj.weight", S::kLayer, C::kO),
    whole("model.layers.{L}.post_attention_layernorm.weight", S::kLayer, C::kPostAttnNorm),
    fused("model.layers.{L}.mlp.gate_up_proj.weight", S::kLayer, Rows::kConcat, C::kGate, C::kUp),
    whole("model.layers.{L}.mlp.down_proj.weight", S::kLayer, C::kDown),
};

constexpr Rule kVllmQwen3MoeLayer[] = {
    whole("model.layers.{L}.input_layernorm.weight", S::kLayer, C::kInputNorm),
    fused("model.layers.{L}.self_attn.qkv_proj.weight", S::kLayer, Rows::kConcat, C::kQ, C::kK, C::kV),
    whole("model.layers.{L}.self_attn.q_norm.weight", S::kLayer, C::kQNorm),
    whole("model.layers.{L}.self_attn.k_norm.weight", S::kLayer, C::kKNorm),
    whole("model.layers.{L}.self_attn.o_proj.weight", S::kLayer, C::kO),
    whole("model.layers.{L}.post_attention_layernorm.weight", S::kLayer, C::kPostAttnNorm),
    whole("model.layers.{L}.mlp.gate.weight", S::kLayer, C::kRouter),
    fused("model.layers.{L}.mlp.experts.w13_weight", S::kStackedExperts, Rows::kConcat, C::kGate, C::kUp),
    whole("model.layers.{L}.mlp.experts.w2_weight", S::kStackedExperts, C::kDown),
};

}  // namespace

// The rules of one format, in checkpoint order: model tensors before the
// layers, the layer's tensors, model tensors after.
std::vector<Rule> rules_of(ModelFamily family, Format format, MegatronExperts experts) {
  std::vector<Rule> out;
  const auto add = [&out](const auto& table) { out.insert(out.end(), std::begin(table), std::end(table)); };
  const bool llama = family == ModelFamily::kLlama;
  switch (format) {
    case Format::kHf:
      add(kHfHead);
      llama ? add(kHfLlamaLayer) : add(kHfQwen3MoeLayer);
      add(kHfTail);
      break;
    case Format::kVllm:
      add(kHfHead);
      llama ? add(kVllmLlamaLayer) : add(kVllmQwen3MoeLayer);
      add(kHfTail);
      break;
    case Format::kMegatron:
      add(kMegatronHead);
      if (llama) {
        add(kMegatronLlamaLayer);
      } else {
        add(kMegatronQwen3MoeAttention);
        experts == MegatronExperts::kStacked ? add(kMegatronStackedExperts) : add(kMegatronPerExpert);
      }
      add(kMegatronTail);
      break;
  }
  return out;
}

}  // namespace refit::name_map_detail
