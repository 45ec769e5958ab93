// Checkpoints (file, directory, sharded index), the shard-rules table against
// the presets, and the safetensors fixtures (reference-written and
// refit-written files, tests/fixtures/safetensors/).
#include "refit/checkpoint.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_test_util.h"

namespace refit {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::Bytes;
using testing::content_of;
using testing::TempDir;
using testing::write_sharded;
using testing::write_text;
using testing::xxh64_hex;

Model must_make(const std::string& preset, int layers = -1) {
  StatusOr<Model> m = make_model(preset, layers);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : Model{};
}

std::vector<TensorSpec> specs_of(const Model& m) {
  std::vector<TensorSpec> out;
  for (const Weight& w : m.weights) out.push_back(w.spec);
  return out;
}

Status write_single(const std::string& path, const std::vector<TensorSpec>& specs) {
  std::vector<Bytes> data;
  std::vector<SafetensorsWriteTensor> tensors;
  for (const TensorSpec& s : specs) data.push_back(content_of(s));
  for (std::size_t i = 0; i < specs.size(); ++i) tensors.push_back({specs[i], data[i]});
  return write_safetensors(path, tensors);
}

// Every tensor of the checkpoint holds content_of(its spec).
void expect_content(const Checkpoint& c) {
  for (std::size_t i = 0; i < c.tensors().size(); ++i) {
    const Bytes want = content_of(c.tensors()[i].spec);
    std::span<const std::byte> got = c.data(i);
    ASSERT_EQ(got.size(), want.size()) << c.tensors()[i].spec.name;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0) << c.tensors()[i].spec.name;
  }
}

const std::vector<TensorSpec> kSmall = {{"model.embed_tokens.weight", DType::kBFloat16, {16, 4}},
                                        {"model.layers.0.input_layernorm.weight", DType::kFloat32, {4}},
                                        {"model.layers.0.self_attn.q_proj.weight", DType::kBFloat16, {4, 4}},
                                        {"model.layers.0.self_attn.o_proj.weight", DType::kBFloat16, {4, 4}},
                                        {"model.norm.weight", DType::kFloat32, {4}},
                                        {"lm_head.weight", DType::kBFloat16, {16, 4}}};

// ---- opening ----------------------------------------------------------------

// Catches: a file checkpoint listed in another order than its data order, a
// data() span into the wrong tensor, total_bytes off.
TEST(CheckpointOpen, SingleFileInStorageOrder) {
  TempDir dir;
  ASSERT_TRUE(write_single(dir.file("x.safetensors"), kSmall).ok());
  StatusOr<Checkpoint> c = Checkpoint::Open(dir.file("x.safetensors"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->files().size(), 1u);
  std::vector<std::string> names;
  std::uint64_t total = 0;
  for (const CheckpointTensor& t : c->tensors()) {
    names.push_back(t.spec.name);
    total += t.spec.nbytes();
  }
  // The writer put the 4-byte norms first, then the bf16 matrices, each in the given order.
  EXPECT_EQ(names, (std::vector<std::string>{"model.layers.0.input_layernorm.weight", "model.norm.weight",
                                             "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                                             "model.layers.0.self_attn.o_proj.weight", "lm_head.weight"}));
  EXPECT_EQ(c->total_bytes(), total);
  EXPECT_EQ(c->index_of("lm_head.weight"), 5u);
  EXPECT_FALSE(c->index_of("nope").has_value());
  expect_content(*c);
}

// Catches: a directory without an index not falling back to
// model.safetensors, or an unhelpful error for an empty directory.
TEST(CheckpointOpen, DirectoryWithModelSafetensors) {
  TempDir dir;
  StatusOr<Checkpoint> empty = Checkpoint::Open(dir.path());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_NE(empty.status().message().find("holds neither model.safetensors.index.json nor model.safetensors"),
            std::string::npos)
      << empty.status().ToString();
  ASSERT_TRUE(write_single(dir.file("model.safetensors"), kSmall).ok());
  StatusOr<Checkpoint> c = Checkpoint::Open(dir.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tensors().size(), kSmall.size());
  expect_content(*c);
}

// Catches: shards taken in directory-listing order (not sorted), tensors of
// one shard mixed with another's, the index path form not supported.
TEST(CheckpointOpen, ShardedDirectoryWithIndex) {
  TempDir dir;
  const Model moe = must_make("tiny-moe", 1);
  ASSERT_TRUE(write_sharded(dir.path(), specs_of(moe), 3).ok());
  for (const std::string& path : {dir.path(), dir.file("model.safetensors.index.json")}) {
    StatusOr<Checkpoint> c = Checkpoint::Open(path);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_EQ(c->files().size(), 3u);
    ASSERT_EQ(c->tensors().size(), moe.weights.size());
    std::size_t prev_file = 0;
    std::uint64_t prev_end = 0;
    for (const CheckpointTensor& t : c->tensors()) {
      ASSERT_GE(t.file, prev_file);
      if (t.file == prev_file) {
        EXPECT_GE(t.begin, prev_end) << t.spec.name;
      }
      prev_file = t.file;
      prev_end = t.end;
    }
    for (std::size_t f = 0; f < 3; ++f) {
      EXPECT_NE(c->files()[f].path().find("model-0000" + std::to_string(f + 1) + "-of-00003"), std::string::npos);
    }
    expect_content(*c);
  }
}

class CheckpointIndex : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(write_sharded(dir_.path(), kSmall, 2).ok()); }
  Json index() const {
    std::ifstream in(dir_.file("model.safetensors.index.json"));
    return Json::parse(in);
  }
  void set_index(const std::string& text) const { write_text(dir_.file("model.safetensors.index.json"), text); }
  // Opens the directory; expects failure with `code` and every needle.
  void expect_refused(StatusCode code, const std::vector<std::string>& needles) const {
    StatusOr<Checkpoint> c = Checkpoint::Open(dir_.path());
    ASSERT_FALSE(c.ok()) << "accepted";
    EXPECT_EQ(c.status().code(), code) << c.status().ToString();
    for (const std::string& n : needles) {
      EXPECT_NE(c.status().message().find(n), std::string::npos) << "missing '" << n << "' in " << c.status().ToString();
    }
  }
  TempDir dir_;
  const std::string first_ = "model-00001-of-00002.safetensors";
  const std::string second_ = "model-00002-of-00002.safetensors";
};

// Catches: not checking that each index entry's file exists.
TEST_F(CheckpointIndex, NamesAMissingFile) {
  Json j = index();
  j["weight_map"]["lm_head.weight"] = "model-00003-of-00002.safetensors";
  set_index(j.dump());
  expect_refused(StatusCode::kNotFound, {"model.safetensors.index.json", "maps 1 tensors (e.g. 'lm_head.weight')",
                                         "'model-00003-of-00002.safetensors', which does not exist"});
}

// Catches: not checking that a file holds every tensor the index maps to it.
TEST_F(CheckpointIndex, MapsATensorToAFileThatLacksIt) {
  Json j = index();
  j["weight_map"]["model.layers.0.extra.weight"] = first_;
  set_index(j.dump());
  expect_refused(StatusCode::kInvalidArgument,
                 {"maps tensor 'model.layers.0.extra.weight' to '" + first_ + "', which does not hold it"});
}

// Catches: ignoring a tensor that a file holds but the index does not list.
TEST_F(CheckpointIndex, FileHoldsATensorTheIndexDoesNotList) {
  Json j = index();
  j["weight_map"].erase("model.norm.weight");
  set_index(j.dump());
  expect_refused(StatusCode::kInvalidArgument, {"tensor 'model.norm.weight' is in '", "but the index does not list it"});
}

// Catches: trusting the file over the index when they disagree on a tensor's file.
TEST_F(CheckpointIndex, IndexMapsATensorToAnotherFile) {
  Json j = index();
  const std::string name = "lm_head.weight";  // in the second shard
  ASSERT_EQ(j["weight_map"][name], second_);
  j["weight_map"][name] = first_;
  set_index(j.dump());
  expect_refused(StatusCode::kInvalidArgument, {"tensor 'lm_head.weight' is in '" + second_ +
                                                "', but the index maps it to '" + first_ + "'"});
}

// Catches: the index parsed with a JSON parser that keeps one of two equal
// keys, or a malformed weight_map accepted.
TEST_F(CheckpointIndex, MalformedIndex) {
  set_index(R"({"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}})");
  expect_refused(StatusCode::kInvalidArgument, {"model.safetensors.index.json", "duplicate key \"a\" inside \"weight_map\""});
  set_index(R"({"metadata": {}})");
  expect_refused(StatusCode::kInvalidArgument, {"needs a \"weight_map\" object"});
  set_index(R"({"weight_map": {"a": 3}})");
  expect_refused(StatusCode::kInvalidArgument, {"maps tensor 'a' to 3, not to a file name"});
  set_index(R"({"weight_map": {"a": "../outside.safetensors"}})");
  expect_refused(StatusCode::kInvalidArgument, {"'../outside.safetensors', which is not a relative path inside"});
  set_index(R"({"weight_map": {"a": "/etc/passwd"}})");
  expect_refused(StatusCode::kInvalidArgument, {"'/etc/passwd', which is not a relative path inside"});
  set_index("{\"weight_map\": ");
  expect_refused(StatusCode::kInvalidArgument, {"not valid JSON"});
}

// Catches: a broken shard's error losing the index context or the file name.
TEST_F(CheckpointIndex, BrokenShardNamesTheIndexAndTheFile) {
  std::ofstream(dir_.file(second_), std::ios::binary | std::ios::trunc) << "short";
  expect_refused(StatusCode::kDataLoss, {"model.safetensors.index.json", second_, "too short"});
}

// ---- shard rules --------------------------------------------------------------

// Catches: a glob that matches prefixes only, does not backtrack, or treats
// '.' or other characters specially.
TEST(ShardRules, GlobMatch) {
  EXPECT_TRUE(glob_match("*.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(glob_match("*.q_proj.weight", "model.layers.0.self_attn.q_proj.weight.extra"));
  EXPECT_FALSE(glob_match("*.q_proj.weight", "q_proj.weight"));
  EXPECT_TRUE(glob_match("*.experts.*.w1.weight", "model.layers.3.block_sparse_moe.experts.7.w1.weight"));
  EXPECT_FALSE(glob_match("*.experts.*.w1.weight", "model.layers.3.block_sparse_moe.experts.7.w2.weight"));
  EXPECT_TRUE(glob_match("a*b*c", "aXbYbZc"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("lm_head.weight", "lm_head.weight"));
  EXPECT_FALSE(glob_match("lm_head.weight", "lm_headXweight"));
  EXPECT_FALSE(glob_match("", "x"));
}

// Catches: a misspelt rule name accepted, the split at the wrong '=', or a
// rule (expert included) whose name does not parse back to it.
TEST(ShardRules, ParseUserRows) {
  StatusOr<ShardRulePattern> p = parse_shard_rule_pattern("*.qkv_proj.weight=column");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->pattern, "*.qkv_proj.weight");
  EXPECT_EQ(p->rule, ShardRule::kColumn);
  StatusOr<ShardRulePattern> bad = parse_shard_rule_pattern("*.x=columns");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(
      bad.status().message().find("unknown shard rule 'columns' (valid: replicated, column, row, vocab, expert)"),
      std::string::npos);
  EXPECT_FALSE(parse_shard_rule_pattern("no-equals").ok());
  EXPECT_FALSE(parse_shard_rule_pattern("=row").ok());
  for (ShardRule r :
       {ShardRule::kReplicated, ShardRule::kColumn, ShardRule::kRow, ShardRule::kVocab, ShardRule::kExpert}) {
    EXPECT_EQ(*parse_shard_rule(shard_rule_name(r)), r);
  }
}

// The default table gives every preset's rule for every weight, by name
// alone. Catches: any row of the table that disagrees with presets.cc (e.g.
// o_proj column, lm_head replicated, the router split, experts' down_proj
// column), or a row order where a broader pattern shadows a narrower one.
TEST(ShardRules, DefaultTableMatchesEveryPreset) {
  for (const std::string& preset : model_presets()) {
    const Model m = must_make(preset, 2);
    for (const Weight& w : m.weights) {
      EXPECT_EQ(match_shard_rule(default_shard_rules(), w.spec.name).rule, w.rule)
          << preset << ": " << w.spec.name << " should be " << shard_rule_name(w.rule);
    }
  }
}

// A checkpoint written from a preset (with content.h bytes) gives back the
// preset's Model: same specs, same rules, bytes intact; sharded too.
// Catches: a rule table that differs from the presets on a real file, a spec
// changed by the round trip, or weights[i] not matching tensors()[i].
TEST(ShardRules, CheckpointOfAPresetYieldsThePresetsModel) {
  for (const std::string preset : {"tiny", "tiny-moe"}) {
    const Model m = must_make(preset);
    for (int shards : {1, 4}) {
      TempDir dir;
      Status written = shards == 1 ? write_single(dir.file("model.safetensors"), specs_of(m))
                                   : write_sharded(dir.path(), specs_of(m), shards);
      ASSERT_TRUE(written.ok()) << written.ToString();
      StatusOr<Checkpoint> c = Checkpoint::Open(dir.path());
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      StatusOr<Model> got = model_from_checkpoint(*c, default_shard_rules());
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(got->preset, dir.path());
      ASSERT_EQ(got->weights.size(), m.weights.size());
      EXPECT_EQ(got->total_bytes(), m.total_bytes());
      std::map<std::string, const Weight*> want;
      for (const Weight& w : m.weights) want[w.spec.name] = &w;
      for (std::size_t i = 0; i < got->weights.size(); ++i) {
        const Weight& w = got->weights[i];
        ASSERT_EQ(w.spec, c->tensors()[i].spec);
        ASSERT_TRUE(want.count(w.spec.name)) << w.spec.name;
        EXPECT_EQ(w.spec, want[w.spec.name]->spec);
        EXPECT_EQ(w.rule, want[w.spec.name]->rule) << preset << ": " << w.spec.name;
      }
      expect_content(*c);
    }
  }
}

// Catches: user rows placed after the defaults (they could not override),
// unknown names not replicated, a split rule applied to a tensor without the
// dimension (sharding.cc would assert or silently replicate).
TEST(ShardRules, UserRowsOverrideDefaultsAndBadSplitsAreRefused) {
  TempDir dir;
  const std::vector<TensorSpec> specs = {{"model.layers.0.self_attn.qkv_proj.weight", DType::kBFloat16, {12, 4}},
                                         {"model.layers.0.self_attn.o_proj.weight", DType::kBFloat16, {4, 4}},
                                         {"model.layers.0.self_attn.o_proj.bias", DType::kBFloat16, {4}},
                                         {"custom.thing", DType::kFloat32, {3}}};
  ASSERT_TRUE(write_single(dir.file("m.safetensors"), specs).ok());
  Checkpoint c = Checkpoint::Open(dir.file("m.safetensors")).value();
  const std::vector<ShardRulePattern> user = {{"*.qkv_proj.weight", ShardRule::kColumn},
                                              {"*.o_proj.weight", ShardRule::kReplicated}};
  StatusOr<Model> m = model_from_checkpoint(c, shard_rules_with_defaults(user));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::map<std::string, ShardRule> rules;
  for (const Weight& w : m->weights) rules[w.spec.name] = w.rule;
  EXPECT_EQ(rules["model.layers.0.self_attn.qkv_proj.weight"], ShardRule::kColumn);
  EXPECT_EQ(rules["model.layers.0.self_attn.o_proj.weight"], ShardRule::kReplicated);
  EXPECT_EQ(rules["model.layers.0.self_attn.o_proj.bias"], ShardRule::kReplicated);  // no row matches
  EXPECT_EQ(rules["custom.thing"], ShardRule::kReplicated);
  EXPECT_EQ(match_shard_rule(default_shard_rules(), "custom.thing").row, nullptr);

  const std::vector<ShardRulePattern> bad = {{"*.o_proj.bias", ShardRule::kRow}};
  StatusOr<Model> refused = model_from_checkpoint(c, shard_rules_with_defaults(bad));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("tensor 'model.layers.0.self_attn.o_proj.bias' has shape [4], but shard "
                                            "rule '*.o_proj.bias=row' needs at least 2 dimensions"),
            std::string::npos)
      << refused.status().ToString();
}

// Catches: a checkpoint source whose data(i) is not tensors()[i]'s bytes, or
// whose mapping dies with the moved-from Checkpoint.
TEST(CheckpointSource, DataPointsIntoTheMappedFiles) {
  TempDir dir;
  ASSERT_TRUE(write_sharded(dir.path(), kSmall, 2).ok());
  auto source = make_checkpoint_source(Checkpoint::Open(dir.path()).value(), default_shard_rules());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const WeightSource& s = **source;
  EXPECT_EQ(s.memory(), MemoryKind::kHost);
  ASSERT_TRUE((*source)->prepare(1, 0).ok());
  ASSERT_EQ(s.model().weights.size(), kSmall.size());
  for (std::size_t i = 0; i < s.model().weights.size(); ++i) {
    const Bytes want = content_of(s.model().weights[i].spec);
    EXPECT_EQ(std::memcmp(s.data(i), want.data(), want.size()), 0) << s.model().weights[i].spec.name;
  }
}

// ---- fixtures -----------------------------------------------------------------
//
// tests/fixtures/safetensors/<set>/NAME.json describes checkpoint NAME (a
// file or a directory beside it): {"checkpoint": relative path, "tensors":
// [{"name", "dtype" (safetensors name), "shape", "nbytes", "xxh64"}],
// "metadata": {...} (optional, single files), "expect_error": "text"
// (optional: the checkpoint must be refused with this in the message)}.
//   reference/     written by the Python `safetensors` package
//                  (scripts/make_safetensors_fixtures.py, run on a machine with torch)
//   refit_written/ written by refit (golden: regenerated and compared below;
//                  scripts/check_safetensors_load.py loads them with the Python package)

std::string fixtures_dir(const std::string& set) {
  if (const char* root = std::getenv("REFIT_SOURCE_DIR"); root != nullptr && *root) {
    return std::string(root) + "/tests/fixtures/safetensors/" + set;
  }
  std::string here = __FILE__;  // <root>/src/checkpoint/checkpoint_test.cc
  return here.substr(0, here.rfind("/src/checkpoint/")) + "/tests/fixtures/safetensors/" + set;
}

std::vector<std::string> sidecars(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".json" && e.is_regular_file()) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// "" when the checkpoint matches its sidecar, else what differs.
std::string verify_sidecar(const std::string& sidecar_path) {
  Json side;
  try {
    std::ifstream in(sidecar_path);
    side = Json::parse(in);
  } catch (const std::exception& e) {
    return sidecar_path + ": " + e.what();
  }
  const std::string path = (fs::path(sidecar_path).parent_path() / side.at("checkpoint").get<std::string>()).string();
  StatusOr<Checkpoint> c = Checkpoint::Open(path);
  if (side.contains("expect_error")) {
    const std::string want = side["expect_error"].get<std::string>();
    if (c.ok()) return path + ": accepted, expected an error containing '" + want + "'";
    if (c.status().message().find(want) == std::string::npos) {
      return path + ": error '" + c.status().message() + "' does not contain '" + want + "'";
    }
    return "";
  }
  if (!c.ok()) return path + ": " + c.status().ToString();
  std::string diff;
  const Json& tensors = side.at("tensors");
  if (tensors.size() != c->tensors().size()) {
    diff += "; " + std::to_string(c->tensors().size()) + " tensors, sidecar lists " + std::to_string(tensors.size());
  }
  for (const Json& t : tensors) {
    const std::string name = t.at("name").get<std::string>();
    std::optional<std::size_t> i = c->index_of(name);
    if (!i) {
      diff += "; missing tensor '" + name + "'";
      continue;
    }
    const TensorSpec& spec = c->tensors()[*i].spec;
    if (safetensors_dtype_name(spec.dtype) != t.at("dtype").get<std::string>()) diff += "; dtype of '" + name + "'";
    if (spec.shape != t.at("shape").get<std::vector<std::int64_t>>()) diff += "; shape of '" + name + "'";
    if (c->data(*i).size() != t.at("nbytes").get<std::uint64_t>()) diff += "; nbytes of '" + name + "'";
    if (xxh64_hex(c->data(*i)) != t.at("xxh64").get<std::string>()) diff += "; bytes (xxh64) of '" + name + "'";
  }
  if (side.contains("metadata") && !side["metadata"].is_null() && c->files().size() == 1) {
    if (Json(c->files()[0].metadata()) != side["metadata"]) diff += "; metadata";
  }
  return diff.empty() ? "" : path + diff;
}

// Files written by the reference implementation load here with the names,
// dtypes, shapes and bytes it wrote. Catches: any disagreement with the
// reference writer's layout or dtype names that refit's own round trips
// cannot see (both sides would share the mistake).
TEST(SafetensorsFixtures, ReferenceWrittenFilesLoad) {
  const std::string dir = fixtures_dir("reference");
  const std::vector<std::string> files = sidecars(dir);
  if (files.empty()) {
    GTEST_SKIP() << "no reference fixtures in " << dir
                 << " yet: run scripts/make_safetensors_fixtures.py there on a machine with torch and safetensors";
  }
  for (const std::string& s : files) EXPECT_EQ(verify_sidecar(s), "") << s;
}

// The sidecar checker itself fails on a wrong byte, dtype or shape, so the
// fixture tests cannot pass vacuously. Catches: a verify_sidecar that
// compares nothing.
TEST(SafetensorsFixtures, SidecarCheckerSeesDifferences) {
  TempDir dir;
  const TensorSpec spec{"w", DType::kBFloat16, {2, 2}};
  ASSERT_TRUE(write_single(dir.file("w.safetensors"), {spec}).ok());
  const Json good = {{"checkpoint", "w.safetensors"},
                     {"tensors", Json::array({{{"name", "w"}, {"dtype", "BF16"}, {"shape", {2, 2}}, {"nbytes", 8},
                                               {"xxh64", xxh64_hex(content_of(spec))}}})}};
  write_text(dir.file("w.json"), good.dump());
  EXPECT_EQ(verify_sidecar(dir.file("w.json")), "");
  for (const auto& [field, value] : std::vector<std::pair<std::string, Json>>{
           {"dtype", "F16"}, {"shape", {4}}, {"nbytes", 6}, {"xxh64", "0000000000000000"}, {"name", "v"}}) {
    Json bad = good;
    bad["tensors"][0][field] = value;
    write_text(dir.file("w.json"), bad.dump());
    EXPECT_NE(verify_sidecar(dir.file("w.json")), "") << field;
  }
  Json err = {{"checkpoint", "w.safetensors"}, {"expect_error", "U16"}};
  write_text(dir.file("w.json"), err.dump());
  EXPECT_NE(verify_sidecar(dir.file("w.json")), "");
}

// The refit-written set: what scripts/check_safetensors_load.py loads with
// the reference implementation. Built by golden_set() below.
struct GoldenFile {
  std::string name;  // relative to the set's directory
  std::vector<TensorSpec> specs;
  std::map<std::string, std::string> metadata;
};

std::vector<GoldenFile> golden_files() {
  std::vector<TensorSpec> dtypes;
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto d = static_cast<DType>(i);
    dtypes.push_back(TensorSpec{"dtype." + std::string(dtype_name(d)), d, {2, 3 + i % 3}});
  }
  dtypes.push_back(TensorSpec{"dtype.bfloat16.3d", DType::kBFloat16, {2, 3, 5}});
  return {
      {"dtypes.safetensors", dtypes, {{"format", "pt"}, {"writer", "refit"}}},
      {"edge.safetensors",
       {{"scalar.float32", DType::kFloat32, {}},
        {"scalar.int64", DType::kInt64, {}},
        {"scalar.bool", DType::kBool, {}},
        {"empty.bfloat16", DType::kBFloat16, {0}},
        {"empty.float32.3d", DType::kFloat32, {3, 0, 2}},
        {"odd.uint8", DType::kUInt8, {7}}},
       {}},
  };
}

Json sidecar_for(const std::string& checkpoint, const std::vector<TensorSpec>& specs,
                 const std::map<std::string, std::string>* metadata) {
  Json tensors = Json::array();
  for (const TensorSpec& s : specs) {
    tensors.push_back({{"name", s.name},
                       {"dtype", std::string(safetensors_dtype_name(s.dtype))},
                       {"shape", s.shape},
                       {"nbytes", s.nbytes()},
                       {"xxh64", xxh64_hex(content_of(s))}});
  }
  Json side = {{"checkpoint", checkpoint}, {"writer", "refit (src/checkpoint/checkpoint_test.cc golden_files)"},
               {"tensors", tensors}};
  if (metadata != nullptr) side["metadata"] = *metadata;
  return side;
}

// Writes the whole refit-written set into `dir`.
Status write_golden_set(const std::string& dir) {
  for (const GoldenFile& g : golden_files()) {
    std::vector<Bytes> data;
    std::vector<SafetensorsWriteTensor> tensors;
    for (const TensorSpec& s : g.specs) data.push_back(content_of(s));
    for (std::size_t i = 0; i < g.specs.size(); ++i) tensors.push_back({g.specs[i], data[i]});
    RETURN_IF_ERROR(write_safetensors(dir + "/" + g.name, tensors, g.metadata));
    write_text(dir + "/" + fs::path(g.name).stem().string() + ".json",
               sidecar_for(g.name, g.specs, &g.metadata).dump(1) + "\n");
  }
  fs::create_directories(dir + "/sharded");
  RETURN_IF_ERROR(write_sharded(dir + "/sharded", kSmall, 2));
  write_text(dir + "/sharded.json", sidecar_for("sharded", kSmall, nullptr).dump(1) + "\n");
  return Status::Ok();
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// refit's writer still writes, byte for byte, the files that were checked
// with the reference implementation (scripts/check_safetensors_load.py), and
// they verify against their sidecars here. Catches: any change to the
// writer's bytes (it must then be re-checked with the Python package: set
// REFIT_UPDATE_GOLDEN=1 to rewrite the set, and run the script again).
TEST(SafetensorsFixtures, RefitWrittenFilesAreUnchangedAndVerify) {
  const std::string committed = fixtures_dir("refit_written");
  if (const char* update = std::getenv("REFIT_UPDATE_GOLDEN"); update != nullptr && std::string(update) == "1") {
    fs::create_directories(committed);
    ASSERT_TRUE(write_golden_set(committed).ok());
  }
  if (!fs::exists(committed)) GTEST_SKIP() << committed << " is missing: run with REFIT_UPDATE_GOLDEN=1 to write it";
  TempDir fresh;
  ASSERT_TRUE(write_golden_set(fresh.path()).ok());
  std::size_t compared = 0;
  for (const auto& e : fs::recursive_directory_iterator(fresh.path())) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), fresh.path()).string();
    ASSERT_TRUE(fs::exists(committed + "/" + rel)) << rel << " is not in " << committed;
    EXPECT_TRUE(read_all(e.path().string()) == read_all(committed + "/" + rel))
        << rel << " differs from the committed copy";
    ++compared;
  }
  EXPECT_EQ(compared, 2u * 2u + 3u + 1u);  // 2 files + sidecars, 2 shards + index, sharded.json
  const std::vector<std::string> files = sidecars(committed);
  EXPECT_EQ(files.size(), 3u);
  for (const std::string& s : files) EXPECT_EQ(verify_sidecar(s), "") << s;
}

}  // namespace
}  // namespace refit
