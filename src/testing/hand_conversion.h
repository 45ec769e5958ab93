// Hand conversions between the model formats the name maps join
// (src/reshard/name_map.h): a Hugging Face model of distinct values and its
// Megatron-Core and vLLM forms, written from the families' documented
// layouts with explicit loops and names typed out here, so that they share
// nothing with the tables of name_map.cc. The name map tests and the mapped
// transfer plan tests check against them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "refit/layout.h"
#include "reshard/name_map.h"

namespace refit::testing {

// A full tensor of 32-bit values, and a model as tensors by name.
struct Dense {
  std::vector<std::int64_t> shape;
  std::vector<std::uint32_t> v;  // C order
};
using Store = std::map<std::string, Dense>;

inline std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const std::int64_t x : shape) n *= x;
  return n;
}

inline std::int64_t row_size(const Dense& t) { return numel(t.shape) / t.shape[0]; }

inline void append_row(Dense& out, const Dense& src, std::int64_t row) {
  const std::int64_t n = row_size(src);
  out.v.insert(out.v.end(), src.v.begin() + row * n, src.v.begin() + (row + 1) * n);
}

// [a; b; ...] along dim 0.
inline Dense concat_rows(const std::vector<const Dense*>& parts) {
  Dense out{parts[0]->shape, {}};
  out.shape[0] = 0;
  for (const Dense* p : parts) {
    for (std::int64_t r = 0; r < p->shape[0]; ++r) append_row(out, *p, r);
    out.shape[0] += p->shape[0];
  }
  return out;
}

// [E, ...]: item j at index j of a new leading dimension.
inline Dense stack(const std::vector<Dense>& items) {
  Dense out{items[0].shape, {}};
  out.shape.insert(out.shape.begin(), static_cast<std::int64_t>(items.size()));
  for (const Dense& t : items) out.v.insert(out.v.end(), t.v.begin(), t.v.end());
  return out;
}

// Megatron's linear_qkv from Hugging Face's q, k, v: for each query group g
// (one per kv head), the group's heads / kv_heads query heads, then k head
// g, then v head g, head_dim rows each ("q1 q2 k1 v1 | q3 q4 k2 v2").
inline Dense megatron_qkv(const Dense& q, const Dense& k, const Dense& v, const ModelDims& d) {
  const std::int64_t per_group = d.heads / d.kv_heads;
  Dense out{{(d.heads + 2 * d.kv_heads) * d.head_dim, d.hidden}, {}};
  for (std::int64_t g = 0; g < d.kv_heads; ++g) {
    for (std::int64_t h = 0; h < per_group; ++h) {
      const std::int64_t head = g * per_group + h;
      for (std::int64_t r = 0; r < d.head_dim; ++r) append_row(out, q, head * d.head_dim + r);
    }
    for (std::int64_t r = 0; r < d.head_dim; ++r) append_row(out, k, g * d.head_dim + r);
    for (std::int64_t r = 0; r < d.head_dim; ++r) append_row(out, v, g * d.head_dim + r);
  }
  return out;
}

// A Hugging Face model (transformers' names and shapes) whose every element
// in the whole model differs from every other and from 0.
inline Store hf_model(ModelFamily family, const ModelDims& d) {
  Store s;
  std::uint32_t next = 1;
  const auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
    Dense t{std::move(shape), {}};
    for (std::int64_t i = 0; i < numel(t.shape); ++i) t.v.push_back(next++);
    s[name] = std::move(t);
  };
  const std::int64_t q = d.heads * d.head_dim;
  const std::int64_t kv = d.kv_heads * d.head_dim;
  add("model.embed_tokens.weight", {d.vocab, d.hidden});
  for (std::int64_t l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {d.hidden});
    add(p + "self_attn.q_proj.weight", {q, d.hidden});
    add(p + "self_attn.k_proj.weight", {kv, d.hidden});
    add(p + "self_attn.v_proj.weight", {kv, d.hidden});
    add(p + "self_attn.o_proj.weight", {d.hidden, q});
    add(p + "post_attention_layernorm.weight", {d.hidden});
    if (family == ModelFamily::kLlama) {
      add(p + "mlp.gate_proj.weight", {d.intermediate, d.hidden});
      add(p + "mlp.up_proj.weight", {d.intermediate, d.hidden});
      add(p + "mlp.down_proj.weight", {d.hidden, d.intermediate});
      continue;
    }
    add(p + "self_attn.q_norm.weight", {d.head_dim});
    add(p + "self_attn.k_norm.weight", {d.head_dim});
    add(p + "mlp.gate.weight", {d.experts, d.hidden});
    for (std::int64_t j = 0; j < d.experts; ++j) {
      const std::string e = p + "mlp.experts." + std::to_string(j) + ".";
      add(e + "gate_proj.weight", {d.intermediate, d.hidden});
      add(e + "up_proj.weight", {d.intermediate, d.hidden});
      add(e + "down_proj.weight", {d.hidden, d.intermediate});
    }
  }
  add("model.norm.weight", {d.hidden});
  add("lm_head.weight", {d.vocab, d.hidden});
  return s;
}

// The Megatron-Core (Transformer Engine spec) checkpoint of `hf`.
inline Store megatron_from_hf(ModelFamily family, const ModelDims& d, const Store& hf) {
  Store m;
  m["embedding.word_embeddings.weight"] = hf.at("model.embed_tokens.weight");
  for (std::int64_t l = 0; l < d.layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    m[p + "self_attention.linear_qkv.layer_norm_weight"] = hf.at(h + "input_layernorm.weight");
    m[p + "self_attention.linear_qkv.weight"] =
        megatron_qkv(hf.at(h + "self_attn.q_proj.weight"), hf.at(h + "self_attn.k_proj.weight"),
                     hf.at(h + "self_attn.v_proj.weight"), d);
    m[p + "self_attention.linear_proj.weight"] = hf.at(h + "self_attn.o_proj.weight");
    if (family == ModelFamily::kLlama) {
      m[p + "mlp.linear_fc1.layer_norm_weight"] = hf.at(h + "post_attention_layernorm.weight");
      m[p + "mlp.linear_fc1.weight"] =
          concat_rows({&hf.at(h + "mlp.gate_proj.weight"), &hf.at(h + "mlp.up_proj.weight")});
      m[p + "mlp.linear_fc2.weight"] = hf.at(h + "mlp.down_proj.weight");
      continue;
    }
    m[p + "self_attention.q_layernorm.weight"] = hf.at(h + "self_attn.q_norm.weight");
    m[p + "self_attention.k_layernorm.weight"] = hf.at(h + "self_attn.k_norm.weight");
    m[p + "pre_mlp_layernorm.weight"] = hf.at(h + "post_attention_layernorm.weight");
    m[p + "mlp.router.weight"] = hf.at(h + "mlp.gate.weight");
    std::vector<Dense> fc1;
    std::vector<Dense> fc2;
    for (std::int64_t j = 0; j < d.experts; ++j) {
      const std::string e = h + "mlp.experts." + std::to_string(j) + ".";
      fc1.push_back(concat_rows({&hf.at(e + "gate_proj.weight"), &hf.at(e + "up_proj.weight")}));
      fc2.push_back(hf.at(e + "down_proj.weight"));
      if (d.megatron_experts == MegatronExperts::kPerExpert) {
        m[p + "mlp.experts.linear_fc1.weight" + std::to_string(j)] = fc1.back();
        m[p + "mlp.experts.linear_fc2.weight" + std::to_string(j)] = fc2.back();
      }
    }
    if (d.megatron_experts == MegatronExperts::kStacked) {
      m[p + "mlp.experts.linear_fc1.weight"] = stack(fc1);
      m[p + "mlp.experts.linear_fc2.weight"] = stack(fc2);
    }
  }
  m["decoder.final_layernorm.weight"] = hf.at("model.norm.weight");
  m["output_layer.weight"] = hf.at("lm_head.weight");
  return m;
}

// vLLM's parameters of `hf`: qkv_proj = [q; k; v], gate_up_proj = [gate;
// up], w13_weight[j] = [gate_j; up_j], w2_weight[j] = down_j.
inline Store vllm_from_hf(ModelFamily family, const ModelDims& d, const Store& hf) {
  Store s;
  for (const char* name : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}) s[name] = hf.at(name);
  for (std::int64_t l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* same : {"input_layernorm.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight"}) {
      s[p + same] = hf.at(p + same);
    }
    s[p + "self_attn.qkv_proj.weight"] =
        concat_rows({&hf.at(p + "self_attn.q_proj.weight"), &hf.at(p + "self_attn.k_proj.weight"),
                     &hf.at(p + "self_attn.v_proj.weight")});
    if (family == ModelFamily::kLlama) {
      s[p + "mlp.gate_up_proj.weight"] =
          concat_rows({&hf.at(p + "mlp.gate_proj.weight"), &hf.at(p + "mlp.up_proj.weight")});
      s[p + "mlp.down_proj.weight"] = hf.at(p + "mlp.down_proj.weight");
      continue;
    }
    for (const char* same : {"self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate.weight"}) {
      s[p + same] = hf.at(p + same);
    }
    std::vector<Dense> w13;
    std::vector<Dense> w2;
    for (std::int64_t j = 0; j < d.experts; ++j) {
      const std::string e = p + "mlp.experts." + std::to_string(j) + ".";
      w13.push_back(concat_rows({&hf.at(e + "gate_proj.weight"), &hf.at(e + "up_proj.weight")}));
      w2.push_back(hf.at(e + "down_proj.weight"));
    }
    s[p + "mlp.experts.w13_weight"] = stack(w13);
    s[p + "mlp.experts.w2_weight"] = stack(w2);
  }
  return s;
}

// Flat C-order offsets of the elements of `box` inside a tensor of `shape`,
// in the box's C order.
inline std::vector<std::int64_t> box_offsets(const std::vector<std::int64_t>& shape, const Box& box) {
  std::vector<std::int64_t> out;
  if (box.numel() == 0) return out;
  std::vector<std::int64_t> at = box.begin;
  while (true) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) off = off * shape[d] + at[d];
    out.push_back(off);
    std::size_t d = shape.size();
    while (d > 0 && ++at[d - 1] == box.end[d - 1]) {
      at[d - 1] = box.begin[d - 1];
      --d;
    }
    if (d == 0) return out;
  }
}

}  // namespace refit::testing
