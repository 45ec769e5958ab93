// make_mapped_transfer_plan on whole models: the name maps' correspondences
// between a trainer's and an engine's tensors (Megatron's fused linear_qkv
// and linear_fc1, stacked experts; Hugging Face's separate tensors; vLLM's
// fusions), each side split by its own layouts over M and N ranks; every
// plan executed on real bytes (each trainer rank's local shards into each
// engine rank's local shards) and compared with the hand conversion
// (testing/hand_conversion.h) byte by byte. The small, hand-written plans,
// the digest and the errors: mapped_transfer_plan_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "refit/mapped_transfer_plan.h"
#include "refit/transfer_plan.h"
#include "reshard/name_map.h"
#include "testing/mapped_case.h"
#include "testing/mapped_plan_checks.h"
#include "testing/random_layout.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

using testing::LayoutOf;
using testing::MappedCase;

TransferPlan MustMap(MappedTransferInput input) {
  auto plan = make_mapped_transfer_plan(std::move(input));
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? std::move(plan).value() : TransferPlan{};
}

// Catches, against the hand conversions of name_map_test (Megatron's
// per-group linear_qkv, [gate; up] fc1, stacked and per-expert experts;
// vLLM's qkv_proj, gate_up_proj, w13 and w2): a run reading the engine
// tensor's index instead of src_tensor's, a stacked box's unit slot mapped
// onto a trainer dimension (or a per-expert tensor's rows onto the slot), a
// source stride of the engine's shape, pieces of two correspondences
// interleaved or not merged where they meet, a byte sent twice or never, a
// byte read from a rank that does not hold it: random families, directions,
// dims, M and N in 1..8, random, FSDP and TP trainer layouts, random, TP and
// EP engine layouts, byte by byte.
TEST(MappedTransferPlanModel, RandomMapsMoveTheHandConversion) {
  std::mt19937 rng(1907);
  std::set<std::string> maps;
  int cross = 0;    // runs whose source tensor is another tensor than its destination
  int strided = 0;  // runs of count > 1
  int fewer = 0;    // M < N
  int more = 0;     // M > N
  for (int iter = 0; iter < 300; ++iter) {
    const MappedCase mc = testing::random_mapped_case(rng);
    SCOPED_TRACE("iteration " + std::to_string(iter) + ": " + mc.what);
    maps.insert(mc.map.ToString());
    const TransferPlan plan = MustMap(mc.input);
    ASSERT_EQ(plan.engine_tensors.size(), mc.input.engine.size());
    ASSERT_NO_FATAL_FAILURE(testing::ExpectMovesTheHandConversion(mc, plan));
    ASSERT_NO_FATAL_FAILURE(testing::ExpectRunsInOrderAndMaximal(plan));
    for (const TransferPair& p : plan.pairs) {
      for (const TransferRun& r : p.runs) {
        cross += plan.trainer_tensors[r.src_tensor].spec.name != plan.engine_tensors[r.tensor].spec.name;
        strided += r.count > 1;
      }
    }
    fewer += mc.input.trainer_ranks < mc.input.engine_ranks;
    more += mc.input.trainer_ranks > mc.input.engine_ranks;
  }
  EXPECT_EQ(maps.size(), 6u) << "every family in every direction";
  EXPECT_GT(cross, 1000);
  EXPECT_GT(strided, 300);
  EXPECT_GT(fewer, 50);
  EXPECT_GT(more, 50);
}


// Megatron's TP over `tp` ranks as a layout of its global tensors:
// column-parallel weights (linear_qkv, linear_fc1, the embedding,
// output_layer) split their rows, row-parallel ones (linear_proj,
// linear_fc2) their columns, norms and the router are replicated; a stacked
// expert tensor splits its rows or columns the same way. For linear_qkv a
// TP shard is whole query groups (kv_heads a multiple of tp), as Megatron
// holds it. For linear_fc1 it is NOT Megatron's shard ([gate_r; up_r], no
// box of the global tensor; name_map.h's TP CAUTION): a row range of [gate;
// up] stands in for it, which still cuts through the gate/up seam.
LayoutLevel MegatronTpLevel(const TensorSpec& spec, int tp) {
  const int d = testing::tp_dim(spec.name, spec.shape.size());
  return d < 0 ? LayoutLevel::replicate(tp) : LayoutLevel::even(d, tp);
}

LayoutOf MegatronTp(int tp) {
  return [tp](const TensorSpec& spec) { return Layout::of(MegatronTpLevel(spec, tp)); };
}

// torchtitan's (dp_shard, tp) mesh: TP ranks consecutive, then FSDP's
// chunk of dim 0 of each TP shard (trainer_layout.h's tp:X,fsdp:Y).
LayoutOf MegatronTpFsdp(int tp, int fsdp) {
  return [tp, fsdp](const TensorSpec& spec) {
    return Layout{{MegatronTpLevel(spec, tp), LayoutLevel::chunk(0, fsdp)}, RankOrder::kOuterFastest};
  };
}

LayoutOf Fsdp(int ranks) {
  return [ranks](const TensorSpec&) { return Layout::of(LayoutLevel::chunk(0, ranks)); };
}

LayoutOf Replicated(int ranks) {
  return [ranks](const TensorSpec&) { return Layout::of(LayoutLevel::replicate(ranks)); };
}

// A stacked expert tensor [E, ...] split into whole experts over `ep`
// ranks, every other tensor chunked along dim 0 over them (FSDP).
LayoutOf ExpertsAndFsdp(int ep) {
  return [ep](const TensorSpec& spec) {
    const bool stacked = spec.name.find("mlp.experts.") != std::string::npos && spec.shape.size() == 3;
    return Layout::of(stacked ? LayoutLevel::experts(ep) : LayoutLevel::chunk(0, ep));
  };
}

// The engine's TP rules on Hugging Face names (tensor_split: q, k, v, gate,
// up, the embedding and lm_head by rows; o and down by columns; norms and
// the router replicated).
LayoutOf HfTp(int ranks) {
  return [ranks](const TensorSpec& spec) {
    std::mt19937 unused(0);
    return testing::engine_layout_of_kind(1, spec, ranks, unused);
  };
}

// Expert parallelism on Hugging Face names: expert J of `experts` whole on
// its owner (contiguous ranges, the first experts % ranks ranks holding one
// more, as vLLM deals them), the rest by the TP rules.
LayoutOf HfExpertParallel(int ranks, int experts) {
  return [ranks, experts](const TensorSpec& spec) {
    const std::string key = ".mlp.experts.";
    const std::size_t at = spec.name.find(key);
    if (at == std::string::npos) return HfTp(ranks)(spec);
    const int expert = std::stoi(spec.name.substr(at + key.size()));
    int owner = 0;
    for (int first = 0; owner < ranks; ++owner) {
      first += experts / ranks + (owner < experts % ranks ? 1 : 0);
      if (expert < first) break;
    }
    return Layout::of(LayoutLevel::owned_by(owner, ranks));
  };
}

struct Scenario {
  const char* what;
  int m;
  LayoutOf trainer;
  int n;
  LayoutOf engine;
  std::uint64_t min_split_bytes;
};

// Runs each scenario of `map`: the plan moves the hand conversion, its runs
// have the header's shape, some read another tensor than they fill, and
// every trainer rank that holds something sends something (replicas share).
void ExpectScenariosMoveTheHandConversion(const NameMap& map, DType dtype, const std::vector<Scenario>& scenarios) {
  for (const Scenario& s : scenarios) {
    SCOPED_TRACE(map.ToString() + ": " + s.what);
    MappedCase mc = testing::make_mapped_case(map, dtype, s.m, s.trainer, s.n, s.engine, s.what);
    mc.input.options.min_split_bytes = s.min_split_bytes;
    const TransferPlan plan = MustMap(mc.input);
    ASSERT_EQ(plan.pairs.size(), static_cast<std::size_t>(s.m * s.n));
    ASSERT_NO_FATAL_FAILURE(testing::ExpectMovesTheHandConversion(mc, plan));
    ASSERT_NO_FATAL_FAILURE(testing::ExpectRunsInOrderAndMaximal(plan));
    int cross = 0;
    for (const TransferPair& p : plan.pairs) {
      for (const TransferRun& r : p.runs) {
        cross += plan.trainer_tensors[r.src_tensor].spec.name != plan.engine_tensors[r.tensor].spec.name;
      }
    }
    EXPECT_GT(cross, 0) << "no run reads another tensor than it fills";
    const std::vector<std::uint64_t> load = plan.bytes_per_trainer_rank();
    for (int t = 0; t < s.m; ++t) EXPECT_GT(load[static_cast<std::size_t>(t)], 0u) << "trainer rank " << t;
  }
}

// Catches, on Llama's Megatron -> Hugging Face map (linear_qkv's per-group
// q, k, v rows into three tensors; linear_fc1's [gate; up] into two) at
// named layouts with M != N: FSDP into TP, Megatron TP 2 into TP 3 (qkv
// shards of whole query groups), replicas (dealing among holders dropped
// or a part given to two of them: bytes twice or never), tp:2,fsdp:2 into
// TP 3, FSDP into a replicated engine: a source offset or stride of the
// wrong shard or tensor, a q head landing in k's place, gate rows in up's.
TEST(MappedTransferPlanModel, LlamaMegatronToHfAtNamedLayouts) {
  const NameMap map{ModelFamily::kLlama, MapDirection::kMegatronToHf,
                    ModelDims{.hidden = 6, .heads = 4, .kv_heads = 2, .head_dim = 2, .intermediate = 4, .experts = 0,
                              .layers = 2, .vocab = 8}};
  ExpectScenariosMoveTheHandConversion(
      map, DType::kBFloat16,
      {{"fsdp 4 -> tp 2", 4, Fsdp(4), 2, HfTp(2), 1},
       {"megatron tp 2 -> tp 3", 2, MegatronTp(2), 3, HfTp(3), 0},
       {"replicated 3 -> tp 2", 3, Replicated(3), 2, HfTp(2), 1},
       {"tp:2,fsdp:2 (4) -> tp 3", 4, MegatronTpFsdp(2, 2), 3, HfTp(3), 16},
       {"fsdp 2 -> replicated 3", 2, Fsdp(2), 3, Replicated(3), 1ull << 20},
       {"whole 1 -> tp 5", 1, Replicated(1), 5, HfTp(5), 0}});
}

// Catches, on Qwen3-MoE's Megatron -> Hugging Face map with stacked experts
// (linear_fc1 [E, 2I, H] into E gate and E up tensors, linear_fc2 [E, H, I]
// into E down tensors, the stacked box's unit expert slot dropped): whole
// experts on the trainer (kExperts) into expert-parallel engine ranks
// (kOwner), FSDP 4 into TP 2 (a rank holding no expert), replicas into TP
// 3, Megatron TP 2 into expert parallelism over 3: an expert's slot offset
// not skipping the other experts, gate and up swapped, a per-expert tensor
// sent to an engine rank that does not own it, bytes twice or never.
TEST(MappedTransferPlanModel, Qwen3MoeStackedMegatronToHfAtNamedLayouts) {
  const NameMap map{ModelFamily::kQwen3Moe, MapDirection::kMegatronToHf,
                    ModelDims{.hidden = 4, .heads = 4, .kv_heads = 2, .head_dim = 2, .intermediate = 4, .experts = 5,
                              .layers = 2, .vocab = 6, .megatron_experts = MegatronExperts::kStacked}};
  ExpectScenariosMoveTheHandConversion(
      map, DType::kFloat32,
      {{"experts+fsdp 2 -> ep 3", 2, ExpertsAndFsdp(2), 3, HfExpertParallel(3, 5), 1},
       {"fsdp 4 -> tp 2", 4, Fsdp(4), 2, HfTp(2), 0},
       {"replicated 2 -> tp 3", 2, Replicated(2), 3, HfTp(3), 1},
       {"megatron tp 2 -> ep 3", 2, MegatronTp(2), 3, HfExpertParallel(3, 5), 16}});
}

ModelDims Qwen3_30bA3bDims(MegatronExperts form) {
  return ModelDims{.hidden = 2048, .heads = 32, .kv_heads = 4, .head_dim = 128, .intermediate = 768, .experts = 128,
                   .layers = 48, .vocab = 151936, .megatron_experts = form};
}

// Catches: planning cost that grows with (tensors x correspondences) or
// (correspondences x trainer tensors) instead of with the runs, and a
// real-size map whose plan misses bytes: qwen3-30b-a3b's maps (48 layers,
// 128 experts) from 8 FSDP trainer ranks into 2 engine ranks by the TP
// rules, each direction, in well under the bound (the figure is printed).
TEST(MappedTransferPlanModel, Qwen3_30bA3bPlansInSeconds) {
  for (const MapDirection dir : {MapDirection::kMegatronToHf, MapDirection::kMegatronToVllm, MapDirection::kHfToVllm}) {
    const NameMap map{ModelFamily::kQwen3Moe, dir, Qwen3_30bA3bDims(MegatronExperts::kStacked)};
    std::mt19937 unused(0);
    MappedTransferInput in;
    const std::vector<MappedTensor> trainer = mapped_tensors(map, MapSide::kTrainer).value();
    const std::vector<MappedTensor> engine = mapped_tensors(map, MapSide::kEngine).value();
    for (const MappedTensor& t : trainer) {
      TensorSpec spec{t.name, DType::kBFloat16, t.shape};
      in.trainer.push_back(SideTensor{spec, testing::trainer_layout_of_kind(1, spec, 8, unused)});
    }
    std::uint64_t engine_bytes = 0;
    for (const MappedTensor& t : engine) {
      TensorSpec spec{t.name, DType::kBFloat16, t.shape};
      engine_bytes += spec.nbytes();
      in.engine.push_back(SideTensor{spec, testing::engine_layout_of_kind(1, spec, 2, unused)});
    }
    in.trainer_ranks = 8;
    in.engine_ranks = 2;
    const auto start = std::chrono::steady_clock::now();
    in.correspondences = model_correspondences(map).value();
    const std::size_t links = in.correspondences.size();
    const TransferPlan plan = MustMap(std::move(in));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::size_t runs = 0;
    for (const TransferPair& p : plan.pairs) runs += p.runs.size();
    std::printf("[ info     ] %s: %zu correspondences, %zu runs, planned in %.2f s (map included)\n",
                map.ToString().c_str(), links, runs, seconds);
    EXPECT_LT(seconds, 30.0) << map.ToString();
    std::uint64_t replicated = 0;  // norms and the router: every engine rank holds them whole
    for (const SideTensor& t : plan.engine_tensors) {
      if (t.layout.levels.front().kind == LevelKind::kReplicate) replicated += t.spec.nbytes();
    }
    EXPECT_EQ(plan.total_bytes, engine_bytes + replicated) << map.ToString();
  }
}

}  // namespace
}  // namespace refit
