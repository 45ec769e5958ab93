// Checkpoints (a file, or a directory with an index) and the shard-rules
// table: see refit/checkpoint.h.
#include "refit/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <unistd.h>

#include <cerrno>

#include "checkpoint/strict_json.h"
#include "core/regular_file.h"

namespace refit {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// A weight_map value must name a file inside the checkpoint's directory.
bool is_safe_relative(const std::string& name) {
  if (name.empty()) return false;
  const fs::path p(name);
  if (p.is_absolute()) return false;
  for (const fs::path& part : p) {
    if (part.string() == "..") return false;
  }
  return true;
}

// Reads a whole regular file of at most `limit` bytes (refusing a FIFO or a
// device before reading, without blocking: core/regular_file.h).
StatusOr<std::string> read_small_file(const std::string& path, std::uint64_t limit) {
  ASSIGN_OR_RETURN(RegularFile file, open_regular_file(path, "'" + path + "'"));
  if (static_cast<std::uint64_t>(file.st.st_size) > limit) {
    return InvalidArgument("'" + path + "' is " + std::to_string(file.st.st_size) + " bytes, over the limit of " +
                           std::to_string(limit));
  }
  std::string text(static_cast<std::size_t>(file.st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t k = ::read(file.fd.get(), text.data() + got, text.size() - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return ErrnoStatus("reading '" + path + "'", errno);
    if (k == 0) break;  // shrank meanwhile: what is there is parsed (and refused if cut)
    got += static_cast<std::size_t>(k);
  }
  text.resize(got);
  return text;
}

// A sharded checkpoint's index: which file holds each tensor.
struct ShardIndex {
  std::map<std::string, std::string> weight_map;           // tensor -> file
  std::map<std::string, std::vector<std::string>> by_file;  // file -> tensors (sorted by file name)
};

// Reads and checks the index at `index_path` (`at` names it in errors): a
// JSON object whose "weight_map" maps each tensor to a file inside the
// checkpoint's directory.
StatusOr<ShardIndex> read_shard_index(const std::string& index_path, const std::string& at) {
  StatusOr<std::string> text = read_small_file(index_path, kSafetensorsMaxHeaderBytes);
  if (!text.ok()) return text.status().WithContext("checkpoint index");
  StatusOr<Json> index = parse_json_strict(*text);
  if (!index.ok()) return index.status().WithContext(at);
  if (!index->is_object()) return InvalidArgument(at + ": must be a JSON object");
  if (!index->contains("weight_map") || !(*index)["weight_map"].is_object()) {
    return InvalidArgument(at + ": needs a \"weight_map\" object (tensor name -> file name)");
  }
  ShardIndex out;
  for (const auto& [name, file] : (*index)["weight_map"].items()) {
    if (!file.is_string()) {
      return InvalidArgument(at + ": weight_map maps tensor '" + name + "' to " + file.dump() +
                             ", not to a file name");
    }
    const std::string f = file.get<std::string>();
    if (!is_safe_relative(f)) {
      return InvalidArgument(at + ": weight_map maps tensor '" + name + "' to '" + f +
                             "', which is not a relative path inside the checkpoint directory");
    }
    out.weight_map.emplace(name, f);
    out.by_file[f].push_back(name);
  }
  return out;
}

// Every file the index names exists; then every file opens.
StatusOr<std::vector<SafetensorsFile>> open_shards(const fs::path& dir, const ShardIndex& index,
                                                   const std::string& at) {
  std::error_code ec;
  for (const auto& [f, names] : index.by_file) {
    if (!fs::exists(dir / f, ec)) {
      return NotFound(at + ": maps " + std::to_string(names.size()) + " tensors (e.g. '" + names.front() +
                      "') to '" + f + "', which does not exist (" + (dir / f).string() + ")");
    }
  }
  std::vector<SafetensorsFile> files;
  for (const auto& [f, names] : index.by_file) {
    StatusOr<SafetensorsFile> file = SafetensorsFile::Open((dir / f).string());
    if (!file.ok()) return file.status().WithContext(at);
    files.push_back(std::move(file).value());
  }
  return files;
}

// The index and the files agree: every tensor a file holds is where the
// index says, and each index entry's file holds its tensor.
Status check_index_agrees(const ShardIndex& index, const std::vector<SafetensorsFile>& files, const std::string& at) {
  std::size_t i = 0;
  for (const auto& [f, names] : index.by_file) {
    for (const SafetensorsTensor& t : files[i].tensors()) {
      auto it = index.weight_map.find(t.spec.name);
      if (it == index.weight_map.end()) {
        return InvalidArgument(at + ": tensor '" + t.spec.name + "' is in '" + f +
                               "', but the index does not list it");
      }
      if (it->second != f) {
        return InvalidArgument(at + ": tensor '" + t.spec.name + "' is in '" + f + "', but the index maps it to '" +
                               it->second + "'");
      }
    }
    ++i;
  }
  // Every tensor a file holds is where the index says; now each index entry's file holds its tensor.
  i = 0;
  for (const auto& [f, names] : index.by_file) {
    for (const std::string& name : names) {
      if (files[i].find(name) == nullptr) {
        return InvalidArgument(at + ": maps tensor '" + name + "' to '" + f + "', which does not hold it");
      }
    }
    ++i;
  }
  return Status::Ok();
}

}  // namespace

// ---- Checkpoint -------------------------------------------------------------

Status Checkpoint::add_file(SafetensorsFile file) {
  const std::size_t index = files_.size();
  for (const SafetensorsTensor& t : file.tensors()) {
    if (auto [it, fresh] = by_name_.emplace(t.spec.name, tensors_.size()); !fresh) {
      return InvalidArgument("checkpoint '" + path_ + "': tensor '" + t.spec.name + "' is in both '" +
                             files_[tensors_[it->second].file].path() + "' and '" + file.path() + "'");
    }
    tensors_.push_back(CheckpointTensor{t.spec, index, t.begin, t.end});
  }
  files_.push_back(std::move(file));
  return Status::Ok();
}

StatusOr<Checkpoint> Checkpoint::Open(const std::string& path) {
  Checkpoint ckpt;
  ckpt.path_ = path;
  std::error_code ec;
  fs::path dir;
  std::string index_path;
  if (fs::is_directory(path, ec)) {
    dir = path;
    if (fs::exists(dir / kSafetensorsIndexName, ec)) {
      index_path = (dir / kSafetensorsIndexName).string();
    } else if (fs::exists(dir / kSafetensorsSingleName, ec)) {
      ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open((dir / kSafetensorsSingleName).string()));
      RETURN_IF_ERROR(ckpt.add_file(std::move(file)));
      return ckpt;
    } else {
      return NotFound("checkpoint directory '" + path + "' holds neither " + std::string(kSafetensorsIndexName) +
                      " nor " + std::string(kSafetensorsSingleName));
    }
  } else if (fs::path(path).filename().string() == kSafetensorsIndexName) {
    index_path = path;
    dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
  } else {
    ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
    RETURN_IF_ERROR(ckpt.add_file(std::move(file)));
    return ckpt;
  }

  // Sharded: the index, then every file it names.
  const std::string at = "checkpoint index '" + index_path + "'";
  ASSIGN_OR_RETURN(const ShardIndex index, read_shard_index(index_path, at));
  ASSIGN_OR_RETURN(std::vector<SafetensorsFile> files, open_shards(dir, index, at));
  RETURN_IF_ERROR(check_index_agrees(index, files, at));
  for (SafetensorsFile& file : files) RETURN_IF_ERROR(ckpt.add_file(std::move(file)));
  return ckpt;
}

std::optional<std::size_t> Checkpoint::index_of(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::span<const std::byte> Checkpoint::data(std::size_t i) const {
  const CheckpointTensor& t = tensors_[i];
  const SafetensorsFile& file = files_[t.file];
  return file.bytes().subspan(static_cast<std::size_t>(file.header().data_offset + t.begin),
                              static_cast<std::size_t>(t.end - t.begin));
}

Status Checkpoint::check_unchanged() const {
  for (const SafetensorsFile& file : files_) RETURN_IF_ERROR(file.check_unchanged());
  return Status::Ok();
}

std::uint64_t Checkpoint::total_bytes() const {
  std::uint64_t total = 0;
  for (const CheckpointTensor& t : tensors_) total += t.end - t.begin;
  return total;
}

// ---- Shard rules ------------------------------------------------------------

std::string_view shard_rule_name(ShardRule rule) {
  switch (rule) {
    case ShardRule::kReplicated: return "replicated";
    case ShardRule::kColumn: return "column";
    case ShardRule::kRow: return "row";
    case ShardRule::kVocab: return "vocab";
    case ShardRule::kExpert: return "expert";
  }
  return "unknown";
}

StatusOr<ShardRule> parse_shard_rule(std::string_view name) {
  for (ShardRule r :
       {ShardRule::kReplicated, ShardRule::kColumn, ShardRule::kRow, ShardRule::kVocab, ShardRule::kExpert}) {
    if (shard_rule_name(r) == name) return r;
  }
  return InvalidArgument("unknown shard rule '" + std::string(name) +
                         "' (valid: replicated, column, row, vocab, expert)");
}

StatusOr<ShardRulePattern> parse_shard_rule_pattern(std::string_view text) {
  const std::size_t eq = text.rfind('=');
  if (eq == std::string_view::npos || eq == 0) {
    return InvalidArgument("shard rule '" + std::string(text) + "' is not GLOB=RULE (e.g. '*.qkv_proj.weight=column')");
  }
  ASSIGN_OR_RETURN(ShardRule rule, parse_shard_rule(text.substr(eq + 1)));
  if (rule == ShardRule::kExpert) {
    return InvalidArgument("shard rule '" + std::string(text) + "': 'expert' is not a GLOB=RULE row; "
                           "--engine-experts ep gives every expert tensor its owner");
  }
  return ShardRulePattern{std::string(text.substr(0, eq)), rule};
}

bool glob_match(std::string_view pattern, std::string_view name) {
  // Greedy with backtracking to the last '*': O(|pattern| * |name|) at worst.
  std::size_t p = 0, n = 0;
  std::size_t star = std::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_n = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

const std::vector<ShardRulePattern>& default_shard_rules() {
  static const std::vector<ShardRulePattern> rules = {
      // Vocabulary-parallel embedding and output projection.
      {"*embed_tokens.weight", ShardRule::kVocab},
      {"lm_head.weight", ShardRule::kVocab},
      {"*.lm_head.weight", ShardRule::kVocab},
      // Attention: q/k/v split by output features (heads), o by input features.
      {"*.q_proj.weight", ShardRule::kColumn},
      {"*.k_proj.weight", ShardRule::kColumn},
      {"*.v_proj.weight", ShardRule::kColumn},
      {"*.q_proj.bias", ShardRule::kColumn},
      {"*.k_proj.bias", ShardRule::kColumn},
      {"*.v_proj.bias", ShardRule::kColumn},
      {"*.o_proj.weight", ShardRule::kRow},
      {"*.q_b_proj.weight", ShardRule::kColumn},   // DeepSeek MLA
      {"*.kv_b_proj.weight", ShardRule::kColumn},  // DeepSeek MLA
      // MLP, dense or one MoE expert (mlp.experts.N.*, shared_expert.*).
      {"*.gate_proj.weight", ShardRule::kColumn},
      {"*.up_proj.weight", ShardRule::kColumn},
      {"*.down_proj.weight", ShardRule::kRow},
      {"*.experts.*.w1.weight", ShardRule::kColumn},  // Mixtral gate
      {"*.experts.*.w3.weight", ShardRule::kColumn},  // Mixtral up
      {"*.experts.*.w2.weight", ShardRule::kRow},     // Mixtral down
      // Replicated on purpose (also the default for names no row matches).
      {"*norm.weight", ShardRule::kReplicated},
      {"*.mlp.gate.weight", ShardRule::kReplicated},  // MoE router
  };
  return rules;
}

std::vector<ShardRulePattern> shard_rules_with_defaults(std::span<const ShardRulePattern> user) {
  std::vector<ShardRulePattern> out(user.begin(), user.end());
  const std::vector<ShardRulePattern>& d = default_shard_rules();
  out.insert(out.end(), d.begin(), d.end());
  return out;
}

ShardRuleMatch match_shard_rule(std::span<const ShardRulePattern> rules, std::string_view name) {
  for (const ShardRulePattern& row : rules) {
    if (glob_match(row.pattern, name)) return ShardRuleMatch{row.rule, &row};
  }
  return ShardRuleMatch{};
}

StatusOr<Model> model_from_checkpoint(const Checkpoint& checkpoint, std::span<const ShardRulePattern> rules) {
  Model model;
  model.preset = checkpoint.path();
  model.weights.reserve(checkpoint.tensors().size());
  for (const CheckpointTensor& t : checkpoint.tensors()) {
    const ShardRuleMatch m = match_shard_rule(rules, t.spec.name);
    const std::size_t needs = m.rule == ShardRule::kRow ? 2 : m.rule == ShardRule::kReplicated ? 0 : 1;
    if (t.spec.shape.size() < needs) {
      return InvalidArgument("checkpoint '" + checkpoint.path() + "': tensor '" + t.spec.name + "' has shape " +
                             shape_string(t.spec.shape) + ", but shard rule '" + m.row->pattern + "=" +
                             std::string(shard_rule_name(m.rule)) + "' needs at least " + std::to_string(needs) +
                             " dimension" + (needs > 1 ? "s" : "") + " to split");
    }
    model.weights.push_back(Weight{t.spec, m.rule});
  }
  return model;
}

// ---- WeightSource -----------------------------------------------------------

namespace {

class CheckpointSource : public WeightSource {
 public:
  CheckpointSource(Checkpoint checkpoint, Model model) : checkpoint_(std::move(checkpoint)), model_(std::move(model)) {}
  const Model& model() const override { return model_; }
  MemoryKind memory() const override { return MemoryKind::kHost; }
  int device() const override { return -1; }
  // The same bytes every version, as long as no file changed since it was opened.
  Status prepare(std::uint64_t, std::uint64_t) override { return checkpoint_.check_unchanged(); }
  const std::byte* data(std::size_t i) const override { return checkpoint_.data(i).data(); }
  Status check_unchanged() const override { return checkpoint_.check_unchanged(); }
  // The files' mappings: fixed while the checkpoint lives.
  std::vector<std::pair<const std::byte*, std::uint64_t>> stable_host_ranges() const override {
    std::vector<std::pair<const std::byte*, std::uint64_t>> ranges;
    for (const SafetensorsFile& f : checkpoint_.files()) ranges.emplace_back(f.bytes().data(), f.bytes().size());
    return ranges;
  }

 private:
  Checkpoint checkpoint_;
  Model model_;
};

}  // namespace

StatusOr<std::unique_ptr<WeightSource>> make_checkpoint_source(Checkpoint checkpoint,
                                                               std::span<const ShardRulePattern> rules) {
  ASSIGN_OR_RETURN(Model model, model_from_checkpoint(checkpoint, rules));
  return std::unique_ptr<WeightSource>(std::make_unique<CheckpointSource>(std::move(checkpoint), std::move(model)));
}

}  // namespace refit
