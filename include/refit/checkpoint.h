// Checkpoints on disk, and the shard-rules table that turns one into a Model.
//
// A checkpoint is either
//   * one safetensors file (any name), or
//   * a directory holding model.safetensors.index.json (Hugging Face's sharded
//     layout: {"metadata": {...}, "weight_map": {"tensor name": "file name"}}),
//     or, without an index, model.safetensors.
// A path to the index file itself opens its directory's checkpoint.
//
// Index rules (errors name the index, the file and the tensor): the index is
// strict JSON (no duplicate keys) with a weight_map object of string ->
// string; every file it names is a relative path inside the directory (no
// "..") that exists and is a valid safetensors file (safetensors.h); each
// such file holds exactly the tensors the index maps to it: a tensor the
// index maps to a file that lacks it, and a tensor in a file that the index
// does not map to that file, are errors. "metadata" (total_size, ...) is
// not checked: real checkpoints disagree on what it counts. Files in the
// directory that the index does not name are ignored.
//
// Tensor order (tensors(), and so a Model's stream order): storage order:
// the index's files sorted by name (byte-wise), inside a file by data offset
// (empty tensors sharing an offset by name). A single file: its data order.
// This is a pure function of the files, so every process that opens the same
// checkpoint gets the same order, and reading tensors in this order reads
// each file front to back.
//
// Lifetime and thread safety: a Checkpoint owns its mapped files (see
// SafetensorsFile); data() spans stay valid while it (or the object it was
// moved into) lives. Immutable after Open: any number of threads may read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "refit/model.h"
#include "refit/safetensors.h"
#include "refit/status.h"
#include "refit/weight_source.h"

namespace refit {

inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kSafetensorsSingleName = "model.safetensors";

struct CheckpointTensor {
  TensorSpec spec;
  std::size_t file = 0;  // index into Checkpoint::files()
  std::uint64_t begin = 0;  // [begin, end) in that file's data section
  std::uint64_t end = 0;
};

class Checkpoint {
 public:
  // Opens a file, a directory or an index file (see above).
  static StatusOr<Checkpoint> Open(const std::string& path);

  // The path as given to Open.
  const std::string& path() const { return path_; }
  // The safetensors files, sorted by path.
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // Every tensor, in storage order.
  const std::vector<CheckpointTensor>& tensors() const { return tensors_; }
  // Index of the tensor named `name` in tensors(), if any.
  std::optional<std::size_t> index_of(std::string_view name) const;
  // Tensor i's bytes, zero-copy from its file's mapping.
  std::span<const std::byte> data(std::size_t i) const;
  // Sum of every tensor's bytes.
  std::uint64_t total_bytes() const;
  // OK while no file changed since Open (SafetensorsFile::check_unchanged):
  // call it after reading data() and before trusting what was read.
  Status check_unchanged() const;

 private:
  Checkpoint() = default;
  Status add_file(SafetensorsFile file);

  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::vector<CheckpointTensor> tensors_;
  std::unordered_map<std::string, std::size_t> by_name_;
};

// ---- Shard rules ----------------------------------------------------------
//
// A table of (pattern, rule) rows decides each tensor's TP rule by its name:
// the first row whose pattern matches the whole name wins; a name that no row
// matches is replicated (every engine rank gets the whole tensor: always
// correct bytes, never a wrong split, at the cost of memory).
//
// Patterns are globs: '*' matches any run of characters, dots included
// ("*.experts.*.w1.weight"); every other character matches itself.
//
// The default table gives the rules of the presets (model.h, presets.cc:
// q/k/v and gate/up column, o/down row, embed_tokens and lm_head vocab,
// norms and the MoE router replicated, MoE experts split like a dense MLP,
// each expert on its own) and a few common variants (q/k/v biases column,
// Mixtral's experts.*.w1/w3 column and w2 row, DeepSeek's q_b_proj and
// kv_b_proj column). Fused tensors (qkv_proj, gate_up_proj) are not in it:
// no ShardRule splits each part of a fused tensor, so they stay replicated
// unless a user row says otherwise.

struct ShardRulePattern {
  std::string pattern;  // glob over the whole tensor name
  ShardRule rule = ShardRule::kReplicated;
};

// "replicated", "column", "row", "vocab" (and back; other text is
// kInvalidArgument naming it and the valid names).
std::string_view shard_rule_name(ShardRule rule);
StatusOr<ShardRule> parse_shard_rule(std::string_view name);
// "GLOB=RULE", e.g. "*.qkv_proj.weight=column" (the last '=' separates them).
StatusOr<ShardRulePattern> parse_shard_rule_pattern(std::string_view text);

// Whole-name glob match ('*' only).
bool glob_match(std::string_view pattern, std::string_view name);

// The default table (see above).
const std::vector<ShardRulePattern>& default_shard_rules();
// The user's rows first (so they win), then the default table.
std::vector<ShardRulePattern> shard_rules_with_defaults(std::span<const ShardRulePattern> user);

// The rule for `name` and the row that gave it (nullptr: no row matched,
// kReplicated).
struct ShardRuleMatch {
  ShardRule rule = ShardRule::kReplicated;
  const ShardRulePattern* row = nullptr;
};
ShardRuleMatch match_shard_rule(std::span<const ShardRulePattern> rules, std::string_view name);

// The Model of a checkpoint under `rules` (e.g. default_shard_rules()):
// weights[i] is tensors()[i] with its rule; model.preset is the checkpoint's
// path. A rule that splits a dimension the tensor lacks (column or vocab on
// a 0-dim tensor, row on fewer than 2 dims) is kInvalidArgument naming the
// tensor, its shape, the rule and the pattern.
StatusOr<Model> model_from_checkpoint(const Checkpoint& checkpoint, std::span<const ShardRulePattern> rules);

// A trainer-side WeightSource over a checkpoint (weight_source.h): the model
// is model_from_checkpoint(checkpoint, rules); data(i) points into the mapped
// file (host memory); the bytes are the same for every version. prepare()
// and check_unchanged() fail naming the file when one changed since it was
// opened (truncated, rewritten or replaced).
StatusOr<std::unique_ptr<WeightSource>> make_checkpoint_source(Checkpoint checkpoint,
                                                               std::span<const ShardRulePattern> rules);

}  // namespace refit
