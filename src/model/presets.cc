// Model presets: the real HF tensor names and C-order shapes ([out, in]) of
// llama-style dense and qwen3-moe-style (full-weight experts) decoders.
//
// Order: model.embed_tokens, then each decoder layer
//   input_layernorm, q_proj, k_proj, v_proj, (q_norm, k_norm), o_proj,
//   post_attention_layernorm, mlp tensors
// then model.norm and lm_head. Matrices are bfloat16; every norm weight is
// float32, so every preset carries two dtypes.
#include <cstdint>
#include <string>
#include <vector>

#include "model/preset_arch.h"
#include "refit/model.h"

namespace refit {
namespace {

using Arch = PresetArch;

constexpr Arch kArchs[] = {
    {.name = "tiny", .hidden = 512, .heads = 8, .kv_heads = 4, .head_dim = 64, .inter = 1408,
     .layers = 4, .vocab = 16000},
    {.name = "tiny-moe", .hidden = 256, .heads = 4, .kv_heads = 2, .head_dim = 64, .inter = 0,
     .layers = 2, .vocab = 4096, .experts = 64, .moe_inter = 128, .qk_norm = true},
    {.name = "llama3-8b", .hidden = 4096, .heads = 32, .kv_heads = 8, .head_dim = 128,
     .inter = 14336, .layers = 32, .vocab = 128256},
    {.name = "qwen3-30b-a3b", .hidden = 2048, .heads = 32, .kv_heads = 4, .head_dim = 128,
     .inter = 0, .layers = 48, .vocab = 151936, .experts = 128, .moe_inter = 768,
     .qk_norm = true},
};

class Builder {
 public:
  explicit Builder(std::vector<Weight>* out) : out_(out) {}

  void add(std::string name, DType dtype, std::vector<std::int64_t> shape, ShardRule rule) {
    out_->push_back(Weight{TensorSpec{std::move(name), dtype, std::move(shape)}, rule});
  }
  void matrix(std::string name, std::int64_t rows, std::int64_t cols, ShardRule rule) {
    add(std::move(name), DType::kBFloat16, {rows, cols}, rule);
  }
  void norm(std::string name, std::int64_t size) {
    add(std::move(name), DType::kFloat32, {size}, ShardRule::kReplicated);
  }

 private:
  std::vector<Weight>* out_;
};

void add_layer(const Arch& a, int i, Builder& b) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  const std::int64_t q_out = a.heads * a.head_dim;
  const std::int64_t kv_out = a.kv_heads * a.head_dim;
  b.norm(p + "input_layernorm.weight", a.hidden);
  b.matrix(p + "self_attn.q_proj.weight", q_out, a.hidden, ShardRule::kColumn);
  b.matrix(p + "self_attn.k_proj.weight", kv_out, a.hidden, ShardRule::kColumn);
  b.matrix(p + "self_attn.v_proj.weight", kv_out, a.hidden, ShardRule::kColumn);
  if (a.qk_norm) {
    b.norm(p + "self_attn.q_norm.weight", a.head_dim);
    b.norm(p + "self_attn.k_norm.weight", a.head_dim);
  }
  b.matrix(p + "self_attn.o_proj.weight", a.hidden, q_out, ShardRule::kRow);
  b.norm(p + "post_attention_layernorm.weight", a.hidden);
  if (a.experts == 0) {
    b.matrix(p + "mlp.gate_proj.weight", a.inter, a.hidden, ShardRule::kColumn);
    b.matrix(p + "mlp.up_proj.weight", a.inter, a.hidden, ShardRule::kColumn);
    b.matrix(p + "mlp.down_proj.weight", a.hidden, a.inter, ShardRule::kRow);
    return;
  }
  b.matrix(p + "mlp.gate.weight", a.experts, a.hidden, ShardRule::kReplicated);  // router
  for (std::int64_t j = 0; j < a.experts; ++j) {
    const std::string e = p + "mlp.experts." + std::to_string(j) + ".";
    b.matrix(e + "gate_proj.weight", a.moe_inter, a.hidden, ShardRule::kColumn);
    b.matrix(e + "up_proj.weight", a.moe_inter, a.hidden, ShardRule::kColumn);
    b.matrix(e + "down_proj.weight", a.hidden, a.moe_inter, ShardRule::kRow);
  }
}

std::string preset_list() {
  std::string out;
  for (const Arch& a : kArchs) {
    if (!out.empty()) out += ", ";
    out += a.name;
  }
  return out;
}

}  // namespace

std::uint64_t Model::total_bytes() const {
  std::uint64_t total = 0;
  for (const Weight& w : weights) total += w.spec.nbytes();
  return total;
}

std::vector<std::string> model_presets() {
  std::vector<std::string> out;
  for (const Arch& a : kArchs) out.emplace_back(a.name);
  return out;
}

const PresetArch* find_preset_arch(std::string_view preset) {
  for (const Arch& a : kArchs) {
    if (preset == a.name) return &a;
  }
  return nullptr;
}

StatusOr<Model> make_model(const std::string& preset, int layers) {
  const Arch* arch = find_preset_arch(preset);
  if (arch == nullptr) {
    return InvalidArgument("unknown model preset \"" + preset + "\"; known presets: " + preset_list());
  }
  if (layers > arch->layers) {
    return InvalidArgument("layers = " + std::to_string(layers) + " is out of range for model preset \"" +
                           preset + "\", which has " + std::to_string(arch->layers) +
                           " decoder layers (valid: 0.." + std::to_string(arch->layers) +
                           ", or negative for all)");
  }
  const int kept = layers < 0 ? arch->layers : layers;

  Model model;
  model.preset = preset;
  Builder b(&model.weights);
  b.matrix("model.embed_tokens.weight", arch->vocab, arch->hidden, ShardRule::kVocab);
  for (int i = 0; i < kept; ++i) add_layer(*arch, i, b);
  b.norm("model.norm.weight", arch->hidden);
  b.matrix("lm_head.weight", arch->vocab, arch->hidden, ShardRule::kVocab);
  return model;
}

}  // namespace refit
