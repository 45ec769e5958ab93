// make_megatron_shard_source (runtime/shard_source.h) and the trainer's
// `--trainer-names megatron` settings: every byte of every rank's local
// shard of every Megatron tensor must be the content of the Hugging Face
// byte that a conversion written by hand (testing/hand_conversion.h, which
// shares nothing with the name map's tables) puts there, so that engines
// verify a Megatron-named trainer's refit against their own tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "refit/content.h"
#include "refit/roles.h"
#include "refit/trainer_layout.h"
#include "refit/trainer_rank.h"
#include "reshard/megatron_model.h"
#include "runtime/shard_source.h"
#include "testing/expect_has.h"
#include "testing/hand_conversion.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

using testing::Dense;
using testing::Store;

constexpr std::uint64_t kSeed = 4242;

// Where each value of testing::hf_model lives: the values run 1, 2, ...
// through the tensors, so a value's tensor is the last that starts at or
// below it.
struct ValueIndex {
  struct Start {
    std::uint32_t first;
    std::string name;
  };
  std::vector<Start> starts;  // ascending `first`

  explicit ValueIndex(const Store& hf) {
    for (const auto& [name, t] : hf) starts.push_back(Start{t.v.at(0), name});
    std::sort(starts.begin(), starts.end(), [](const Start& a, const Start& b) { return a.first < b.first; });
  }
  // The tensor and element index of `value`.
  std::pair<const std::string*, std::uint64_t> find(std::uint32_t value) const {
    auto it = std::upper_bound(starts.begin(), starts.end(), value,
                               [](std::uint32_t v, const Start& s) { return v < s.first; });
    --it;
    return {&it->name, value - it->first};
  }
};

// Checks rank `rank`'s shard of Megatron tensor `spec` (box `box`) at
// `data` against the hand conversion `megatron` of `hf`: element by element
// in the box's C order, grouped into runs of consecutive Hugging Face
// elements of one tensor, each run compared with that tensor's content.
void ExpectShardHoldsHandContent(const TensorSpec& spec, const Box& box, const std::byte* data, const Dense& megatron,
                                 const ValueIndex& values, const Model& engine, std::uint64_t version) {
  const std::uint64_t element = dtype_size(spec.dtype);
  const std::size_t nd = spec.shape.size();
  std::vector<std::int64_t> index = box.begin;
  std::vector<std::uint32_t> run;  // the run's Hugging Face values
  std::int64_t run_local = 0;      // its first local element
  std::vector<std::byte> want;
  const auto check_run = [&]() {
    if (run.empty()) return true;
    // Not a structured binding: clang 14 (the asan stage) cannot capture one in a lambda.
    const auto found = values.find(run.front());
    const auto name = found.first;
    const auto first = found.second;
    const auto w = std::find_if(engine.weights.begin(), engine.weights.end(),
                                [&](const Weight& x) { return x.spec.name == *name; });
    EXPECT_NE(w, engine.weights.end()) << *name;
    EXPECT_EQ(dtype_size(w->spec.dtype), element) << spec.name << " holds " << *name;
    want.resize(run.size() * element);
    fill_content(content_key(kSeed, version, *name), first * element, want);
    const bool same = std::memcmp(data + run_local * element, want.data(), want.size()) == 0;
    EXPECT_TRUE(same) << spec.ToString() << ": local elements [" << run_local << ", +" << run.size()
                      << ") are not the content of " << *name << " elements [" << first << ", +" << run.size() << ")";
    run.clear();
    return same;
  };
  for (std::int64_t e = 0; e < box.numel(); ++e) {
    std::uint64_t flat = 0;
    for (std::size_t d = 0; d < nd; ++d) {
      flat = flat * static_cast<std::uint64_t>(spec.shape[d]) + static_cast<std::uint64_t>(index[d]);
    }
    const std::uint32_t value = megatron.v.at(flat);
    const bool continues = !run.empty() && value == run.back() + 1 &&
                           values.find(value).first == values.find(run.front()).first;
    if (!continues) {
      if (!check_run()) return;
      run_local = e;
    }
    run.push_back(value);
    for (std::size_t d = nd; d-- > 0;) {  // last dim fastest, wrapping back to the box's begin
      if (++index[d] < box.end[d]) break;
      index[d] = box.begin[d];
    }
  }
  check_run();
}

// Every rank of an FSDP layout over `ranks`, at two versions.
void ExpectEveryRankHoldsHandContent(const std::string& preset, int layers, int ranks) {
  ASSERT_OK_AND_ASSIGN(const MegatronModel m, megatron_model(preset, layers));
  const Store hf = testing::hf_model(m.map.family, m.map.dims);
  const Store megatron = testing::megatron_from_hf(m.map.family, m.map.dims, hf);
  const ValueIndex values(hf);
  ASSERT_EQ(megatron.size(), m.trainer.weights.size());
  ASSERT_OK_AND_ASSIGN(const TrainerLayout layout, parse_trainer_layout("fsdp", ranks));
  ASSERT_OK_AND_ASSIGN(const std::vector<Layout> layouts, trainer_layouts(layout, m.trainer));
  for (int r = 0; r < ranks; ++r) {
    ASSERT_OK_AND_ASSIGN(auto source, make_megatron_shard_source(m, layouts, r, MemoryKind::kHost, -1));
    EXPECT_EQ(source->trainer_layouts(), layouts);
    for (const std::uint64_t version : {1u, 7u}) {
      ASSERT_OK(source->prepare(version, kSeed));
      for (std::size_t i = 0; i < m.trainer.weights.size(); ++i) {
        const TensorSpec& spec = m.trainer.weights[i].spec;
        SCOPED_TRACE(preset + " rank " + std::to_string(r) + " of " + std::to_string(ranks) + ", v" +
                     std::to_string(version) + ", " + spec.name);
        ASSERT_EQ(megatron.at(spec.name).shape, spec.shape);
        ASSERT_OK_AND_ASSIGN(const Box box, layout_box(spec, layouts[i], r));
        ExpectShardHoldsHandContent(spec, box, source->data(i), megatron.at(spec.name), values, m.engine, version);
      }
    }
  }
}

// Catches: a segment that reads the wrong Hugging Face tensor or offset (k
// and v of a query group swapped, gate and up swapped, an expert off by
// one; tried: swapping the sources of the first two segments of every
// tensor fails on linear_qkv at local element 0), a piece filled from its
// own name's content instead of the segments, and a piece that crosses a
// segment boundary filled from one segment only (FSDP chunks of 3 cut
// segments).
TEST(MegatronShardSource, EveryRankHoldsTheHandConvertedContentOfTheEngineTensors) {
  ExpectEveryRankHoldsHandContent("tiny", 1, 3);
  ExpectEveryRankHoldsHandContent("tiny-moe", 1, 3);
}

// Catches: segments that leave a gap or overlap (a byte nobody generates,
// or one generated twice), and a trainer tensor list other than the name
// map's.
TEST(MegatronModel, SegmentsTileEveryTrainerTensorInOrder) {
  for (const char* preset : {"tiny", "tiny-moe"}) {
    ASSERT_OK_AND_ASSIGN(const MegatronModel m, megatron_model(preset, 2));
    ASSERT_OK_AND_ASSIGN(const auto megatron, mapped_tensors(m.map, MapSide::kTrainer));
    ASSERT_EQ(m.trainer.weights.size(), megatron.size());
    ASSERT_EQ(m.content.size(), megatron.size());
    for (std::size_t i = 0; i < megatron.size(); ++i) {
      EXPECT_EQ(m.trainer.weights[i].spec.name, megatron[i].name);
      EXPECT_EQ(m.trainer.weights[i].spec.shape, megatron[i].shape);
      std::uint64_t at = 0;
      for (const ContentSegment& s : m.content[i]) {
        EXPECT_EQ(s.begin, at) << megatron[i].name;
        EXPECT_GT(s.bytes, 0u) << megatron[i].name;
        at = s.begin + s.bytes;
      }
      EXPECT_EQ(at, m.trainer.weights[i].spec.nbytes()) << megatron[i].name;
    }
  }
}

// Catches: a misspelt value accepted (a trainer that silently names its
// tensors as the engine does), and a Megatron trainer accepted with a layout
// it has no boxes for (tp: linear_fc1's TP shard is [gate_r; up_r]) or with
// a checkpoint (whose names are its own).
TEST(MegatronTrainer, SettingsItCannotRunAreRefusedNamingThem) {
  EXPECT_HAS(parse_trainer_names("Megatron").status().message(), "expected hf");
  EXPECT_HAS(megatron_model("no-such-preset", 1).status().message(), "no-such-preset");
  RankOptions options;
  options.trainer_names = "megatron";
  options.trainer_ranks = 2;
  options.trainer_layout = "tp";
  EXPECT_HAS(make_rank_source(options).status().message(), "Megatron-named trainers run with --trainer-layout fsdp");
  options.trainer_layout = "full";
  EXPECT_HAS(make_rank_source(options).status().message(), "--trainer-layout full");
  options.trainer_layout = "fsdp";
  ASSERT_OK(make_rank_source(options).status());
}

}  // namespace
}  // namespace refit
