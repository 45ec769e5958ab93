// `--quantize` and the engine's model under it: see refit/quantize.h.
#include <set>

#include "quant/fp8_block.h"
#include "refit/checkpoint.h"  // glob_match
#include "refit/quantize.h"

namespace refit {
namespace {

constexpr std::string_view kFp8Block128 = "fp8-block128";

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// Left whole by the default selection: the embeddings, lm_head, norms and
// the MoE router (Qwen3-MoE's mlp.gate, or a weight named router).
bool kept_by_default(std::string_view name) {
  for (std::string_view pattern : {"*embed*", "lm_head.weight", "*norm*", "*.mlp.gate.weight", "*router*"}) {
    if (glob_match(pattern, name)) return true;
  }
  return false;
}

bool matrix_weight(const Weight& w) {
  return (w.spec.shape.size() == 2 || w.spec.shape.size() == 3) && ends_with(w.spec.name, ".weight");
}

std::string ordinal_dim(std::size_t dim, std::size_t rank) {
  return dim + 2 == rank ? "row" : "column";
}

// A split of `weight` (the trainer's, named as it is) along a matrix
// dimension (rows or columns) must put every shard
// boundary on a multiple of 128, so that each rank's blocks are whole
// blocks of the full tensor; and the scales' split must give each rank the
// blocks of its rows or columns.
Status check_block_split(const Weight& weight, const Weight& scale, int ranks) {
  const std::size_t nd = weight.spec.shape.size();
  for (int r = 0; r < ranks; ++r) {
    const ShardSlice s = shard_slice(weight, r, ranks);
    if (s.dim < 0 || static_cast<std::size_t>(s.dim) + 2 < nd) continue;  // whole, or whole experts
    const std::int64_t size = weight.spec.shape[static_cast<std::size_t>(s.dim)];
    const std::string what = "--quantize fp8-block128: tensor '" + weight.spec.name + "' " +
                             weight.spec.ToString().substr(weight.spec.name.size() + 1) + ", rule " +
                             std::string(shard_rule_name(weight.rule)) + " over " + std::to_string(ranks) +
                             " engine ranks";
    if (r + 1 < ranks && s.end < size && s.end % kFp8BlockSize != 0) {
      return InvalidArgument(what + ": the boundary between ranks " + std::to_string(r) + " and " +
                             std::to_string(r + 1) + " at " + ordinal_dim(static_cast<std::size_t>(s.dim), nd) +
                             " " + std::to_string(s.end) + " cuts 128-" + ordinal_dim(static_cast<std::size_t>(s.dim), nd) +
                             " block " + std::to_string(s.end / kFp8BlockSize) +
                             " (each engine rank must hold whole blocks, as vLLM requires)");
    }
    const ShardSlice b = shard_slice(scale, r, ranks);
    const std::int64_t want_begin = s.begin / kFp8BlockSize, want_end = fp8_blocks(s.end);
    if (s.begin == s.end ? b.begin != b.end : (b.begin != want_begin || b.end != want_end)) {
      return InvalidArgument(what + ": rank " + std::to_string(r) + " holds blocks [" + std::to_string(want_begin) +
                             ", " + std::to_string(want_end) + ") of the weight but scales [" +
                             std::to_string(b.begin) + ", " + std::to_string(b.end) + ") by the rule");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string QuantizeSpec::ToString() const {
  if (format == QuantFormat::kNone) return "none";
  std::string out(kFp8Block128);
  for (std::size_t i = 0; i < globs.size(); ++i) out += (i == 0 ? ":" : ",") + globs[i];
  return out;
}

StatusOr<QuantizeSpec> parse_quantize(std::string_view text) {
  QuantizeSpec spec;
  if (text == "none") return spec;
  const std::size_t colon = text.find(':');
  if (text.substr(0, colon) != kFp8Block128) {
    return InvalidArgument("--quantize \"" + std::string(text) +
                           "\": expected none, fp8-block128 (the default selection) or fp8-block128:GLOB[,GLOB...]");
  }
  spec.format = QuantFormat::kFp8Block128;
  if (colon == std::string_view::npos) return spec;
  std::string_view rest = text.substr(colon + 1);
  for (;;) {
    const std::size_t comma = rest.find(',');
    const std::string_view glob = rest.substr(0, comma);
    if (glob.empty()) {
      return InvalidArgument("--quantize \"" + std::string(text) + "\": an empty glob (give GLOB[,GLOB...] after ':')");
    }
    spec.globs.emplace_back(glob);
    if (comma == std::string_view::npos) return spec;
    rest = rest.substr(comma + 1);
  }
}

bool quantizes(const QuantizeSpec& spec, const Weight& weight) {
  if (spec.format == QuantFormat::kNone || !matrix_weight(weight)) return false;
  if (spec.globs.empty()) {
    const DType d = weight.spec.dtype;
    return (d == DType::kBFloat16 || d == DType::kFloat32) && !kept_by_default(weight.spec.name);
  }
  for (const std::string& g : spec.globs) {
    if (glob_match(g, weight.spec.name)) return true;
  }
  return false;
}

StatusOr<QuantizedModel> quantize_model(const Model& model, const QuantizeSpec& spec, int engine_ranks) {
  QuantizedModel out;
  out.engine.preset = model.preset;
  std::set<std::string> names;
  for (const Weight& w : model.weights) names.insert(w.spec.name);
  for (const std::string& g : spec.globs) {
    bool any = false;
    for (const Weight& w : model.weights) any = any || (matrix_weight(w) && glob_match(g, w.spec.name));
    if (!any) return InvalidArgument("--quantize " + spec.ToString() + ": glob '" + g + "' selects no 2-D or 3-D weight");
  }
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    const Weight& w = model.weights[i];
    if (!quantizes(spec, w)) {
      out.engine.weights.push_back(w);
      out.sources.push_back(QuantSource{i, QuantPart::kCopy});
      continue;
    }
    ASSIGN_OR_RETURN(Fp8BlockSpecs specs, fp8_block_specs(w.spec));
    if (names.count(specs.scale.name) != 0) {
      return InvalidArgument("--quantize " + spec.ToString() + ": tensor '" + w.spec.name + "' would get scales '" +
                             specs.scale.name + "', which the model already holds");
    }
    Weight codes = w, scales = w;
    codes.spec = std::move(specs.weight);
    scales.spec = std::move(specs.scale);
    RETURN_IF_ERROR(check_block_split(w, scales, engine_ranks));
    out.engine.weights.push_back(std::move(codes));
    out.sources.push_back(QuantSource{i, QuantPart::kCodes});
    out.engine.weights.push_back(std::move(scales));
    out.sources.push_back(QuantSource{i, QuantPart::kScales});
    ++out.quantized_tensors;
  }
  return out;
}

}  // namespace refit
