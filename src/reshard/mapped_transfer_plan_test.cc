// make_mapped_transfer_plan on small inputs: plans written out by hand, the
// identity case against make_transfer_plan, the digest, the dealing among
// replicas and every refusal. Whole models moved byte by byte against the
// hand conversions: mapped_transfer_plan_model_test.cc.
#include "refit/mapped_transfer_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "refit/transfer_plan.h"
#include "reshard/name_map.h"
#include "testing/expect_has.h"
#include "testing/random_layout.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

using Runs = std::vector<TransferRun>;

TensorSpec U8(std::string name, std::vector<std::int64_t> shape) {
  return TensorSpec{std::move(name), DType::kUInt8, std::move(shape)};
}

Box B(std::vector<std::int64_t> begin, std::vector<std::int64_t> end) { return Box{std::move(begin), std::move(end)}; }

// Box `eb` of engine tensor `e` is box `tb` of trainer tensor `t`.
Correspondence Link(std::string e, Box eb, std::string t, Box tb) {
  return Correspondence{std::move(e), std::move(eb), std::move(t), std::move(tb), "", {}};
}

// The whole box of a tensor of `shape`.
Box Whole(const std::vector<std::int64_t>& shape) { return B(std::vector<std::int64_t>(shape.size(), 0), shape); }

TransferPlan MustMap(MappedTransferInput input) {
  auto plan = make_mapped_transfer_plan(std::move(input));
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? std::move(plan).value() : TransferPlan{};
}

// A strided or contiguous run of engine tensor `tensor` from trainer tensor `src`.
TransferRun R(std::uint32_t tensor, std::uint32_t src, std::uint64_t src_offset, std::uint64_t dst_offset,
              std::uint64_t bytes, std::uint64_t count = 1, std::uint64_t src_stride = 0,
              std::uint64_t dst_stride = 0) {
  return TransferRun{tensor, src_offset, dst_offset, bytes, count, src_stride, dst_stride, src};
}

// vLLM's qkv_proj [8, 3] from Hugging Face's q [4, 3], k [2, 3], v [2, 3];
// trainer chunk(dim 1, 2): columns [0, 2) and [2, 3); engine
// tensor_split(dim 0, 2): rows [0, 4) (q) and [4, 8) (k, v), local [4, 3].
// Catches: src_tensor left at the engine tensor's index (or 0), source
// offsets or strides taken from the engine's shard, k and v rows landing at
// the offsets of the component instead of the fused tensor.
TEST(MappedTransferPlan, QkvFromThreeTensorsByHand) {
  const Layout cols = Layout::of(LayoutLevel::chunk(1, 2));
  const Layout rows = Layout::of(LayoutLevel::tensor_split(0, 2));
  MappedTransferInput in;
  in.trainer = {{U8("q", {4, 3}), cols}, {U8("k", {2, 3}), cols}, {U8("v", {2, 3}), cols}};
  in.engine = {{U8("qkv", {8, 3}), rows}};
  in.correspondences = {Link("qkv", B({4, 0}, {6, 3}), "k", Whole({2, 3})),
                        Link("qkv", B({0, 0}, {4, 3}), "q", Whole({4, 3})),
                        Link("qkv", B({6, 0}, {8, 3}), "v", Whole({2, 3}))};
  in.trainer_ranks = 2;
  in.engine_ranks = 2;
  const TransferPlan plan = MustMap(in);
  EXPECT_EQ(plan.pair(0, 0).runs, (Runs{R(0, 0, 0, 0, 2, 4, 2, 3)}));  // q: 4 rows of 2 bytes
  EXPECT_EQ(plan.pair(1, 0).runs, (Runs{R(0, 0, 0, 2, 1, 4, 1, 3)}));
  EXPECT_EQ(plan.pair(0, 1).runs, (Runs{R(0, 1, 0, 0, 2, 2, 2, 3), R(0, 2, 0, 6, 2, 2, 2, 3)}));  // k, then v
  EXPECT_EQ(plan.pair(1, 1).runs, (Runs{R(0, 1, 0, 2, 1, 2, 1, 3), R(0, 2, 0, 8, 1, 2, 1, 3)}));
  EXPECT_EQ(plan.total_bytes, 24u);
  ASSERT_EQ(plan.correspondences.size(), 3u);
  EXPECT_EQ(plan.correspondences[0].trainer_name, "q") << "kept in plan order";
}

// Per-expert [2, 3] tensors e0, e1 into a stacked [2, 2, 3] whose engine
// splits columns (tensor_split(dim 2, 2): [0, 2) and [2, 3)), and back:
// the stacked tensor split by experts(2) on the trainer into whole
// per-expert engine tensors. Catches: the stacked box's unit slot walked
// as the per-expert tensor's rows (the boxes' dims matched by position), a
// slot's source offset not skipping the other experts.
TEST(MappedTransferPlan, StackedExpertsDropTheirUnitDimensionByHand) {
  MappedTransferInput in;
  in.trainer = {{U8("e0", {2, 3}), Layout{}}, {U8("e1", {2, 3}), Layout{}}};
  in.engine = {{U8("stack", {2, 2, 3}), Layout::of(LayoutLevel::tensor_split(2, 2))}};
  in.correspondences = {Link("stack", B({0, 0, 0}, {1, 2, 3}), "e0", Whole({2, 3})),
                        Link("stack", B({1, 0, 0}, {2, 2, 3}), "e1", Whole({2, 3}))};
  in.trainer_ranks = 1;
  in.engine_ranks = 2;
  const TransferPlan split = MustMap(in);
  EXPECT_EQ(split.pair(0, 0).runs, (Runs{R(0, 0, 0, 0, 2, 2, 3, 2), R(0, 1, 0, 4, 2, 2, 3, 2)}));
  EXPECT_EQ(split.pair(0, 1).runs, (Runs{R(0, 0, 2, 0, 1, 2, 3, 1), R(0, 1, 2, 2, 1, 2, 3, 1)}));

  MappedTransferInput back;
  back.trainer = {{U8("stack", {2, 2, 3}), Layout::of(LayoutLevel::experts(2))}};
  back.engine = {{U8("e0", {2, 3}), Layout{}}, {U8("e1", {2, 3}), Layout{}}};
  for (Correspondence c : in.correspondences) {
    std::swap(c.engine_name, c.trainer_name);
    std::swap(c.engine_box, c.trainer_box);
    back.correspondences.push_back(std::move(c));
  }
  back.trainer_ranks = 2;
  back.engine_ranks = 1;
  const TransferPlan gathered = MustMap(back);
  EXPECT_EQ(gathered.pair(0, 0).runs, (Runs{R(0, 0, 0, 0, 6)}));  // trainer 0 holds expert 0: its whole shard
  EXPECT_EQ(gathered.pair(1, 0).runs, (Runs{R(1, 0, 0, 0, 6)}));
}

// Catches: a mapped planner that departs from make_transfer_plan where the
// two should agree (dealing order, holder choice, cuts, flattening, unit
// dimensions, scalars and empty tensors): random identity correspondences
// (each tensor whole into itself) give make_transfer_plan's runs, pair by
// pair, over the transfer plan property test's random specs and layouts.
TEST(MappedTransferPlan, IdentityCorrespondencesEqualMakeTransferPlan) {
  std::mt19937 rng(77);
  for (int iter = 0; iter < 200; ++iter) {
    const int m = testing::uniform(rng, 1, 8);
    const int n = testing::uniform(rng, 1, 8);
    std::vector<TensorLayouts> tensors;
    const auto split = static_cast<std::uint64_t>(testing::uniform(rng, 0, 64));
    MappedTransferInput in{{}, {}, {}, m, n, TransferPlanOptions{split}};
    for (int i = testing::uniform(rng, 1, 4); i > 0; --i) {
      TensorSpec spec = testing::random_spec(rng, "t" + std::to_string(i));
      if (testing::uniform(rng, 0, 3) == 0) spec.shape = {testing::uniform(rng, 8, 12), 3, 2};
      Layout trainer = testing::random_layout(spec, m, rng);
      Layout engine = testing::random_layout(spec, n, rng);
      tensors.push_back(TensorLayouts{spec, trainer, engine});
      in.trainer.push_back(SideTensor{spec, tensors.back().trainer});
      in.engine.push_back(SideTensor{spec, tensors.back().engine});
      in.correspondences.push_back(Link(spec.name, Whole(spec.shape), spec.name, Whole(spec.shape)));
    }
    ASSERT_OK_AND_ASSIGN(const TransferPlan want, make_transfer_plan(tensors, m, n, in.options));
    const TransferPlan got = MustMap(in);
    ASSERT_EQ(got.pairs.size(), want.pairs.size());
    for (std::size_t k = 0; k < want.pairs.size(); ++k) {
      ASSERT_EQ(got.pairs[k].runs, want.pairs[k].runs) << "iteration " << iter << " pair " << k;
      ASSERT_EQ(got.pairs[k].bytes, want.pairs[k].bytes);
    }
    EXPECT_EQ(got.total_bytes, want.total_bytes);
    EXPECT_NE(got.digest, want.digest) << "a mapped digest has its own format tag";
  }
}

// Llama hf -> vLLM at small dims, M = N = 1 whole: every run contiguous.
MappedTransferInput SmallHfToVllm() {
  const NameMap map{ModelFamily::kLlama, MapDirection::kHfToVllm,
                    ModelDims{.hidden = 4, .heads = 2, .kv_heads = 1, .head_dim = 2, .intermediate = 3, .experts = 0,
                              .layers = 1, .vocab = 5}};
  MappedTransferInput in;
  const std::vector<MappedTensor> trainer = mapped_tensors(map, MapSide::kTrainer).value();
  const std::vector<MappedTensor> engine = mapped_tensors(map, MapSide::kEngine).value();
  for (const MappedTensor& t : trainer) in.trainer.push_back(SideTensor{U8(t.name, t.shape), Layout{}});
  for (const MappedTensor& t : engine) in.engine.push_back(SideTensor{U8(t.name, t.shape), Layout{}});
  in.correspondences = model_correspondences(map).value();
  in.trainer_ranks = 1;
  in.engine_ranks = 1;
  return in;
}

// The index of the correspondence whose trainer tensor's name ends with
// `suffix`.
std::size_t Find(const std::vector<Correspondence>& cs, std::string_view suffix) {
  const auto it = std::find_if(cs.begin(), cs.end(), [&](const Correspondence& c) {
    return c.trainer_name.ends_with(suffix);
  });
  EXPECT_NE(it, cs.end()) << suffix;
  return static_cast<std::size_t>(it - cs.begin());
}

// Catches: a plan that depends on the order correspondences come in (links
// planned in input order, a sort whose ties keep the input's order), or
// that is not a pure function: the same input, and ten shuffles of its
// correspondences, over 2 replicated trainer ranks into 3 engine ranks
// (dealing and cuts involved), give the same runs, correspondences and
// digest.
TEST(MappedTransferPlan, PlanAndDigestDoNotDependOnTheCorrespondencesOrder) {
  MappedTransferInput base = SmallHfToVllm();
  base.trainer_ranks = 2;
  base.engine_ranks = 3;
  for (SideTensor& t : base.trainer) t.layout = Layout::of(LayoutLevel::replicate(2));
  for (SideTensor& t : base.engine) t.layout = Layout::of(LayoutLevel::tensor_split(0, 3));
  base.options.min_split_bytes = 1;
  const TransferPlan a = MustMap(base);
  EXPECT_EQ(a.digest, MustMap(base).digest);
  std::mt19937 rng(5);
  for (int i = 0; i < 10; ++i) {
    MappedTransferInput shuffled = base;
    std::shuffle(shuffled.correspondences.begin(), shuffled.correspondences.end(), rng);
    const TransferPlan b = MustMap(shuffled);
    EXPECT_EQ(b.digest, a.digest) << "shuffle " << i;
    EXPECT_EQ(b.correspondences, a.correspondences) << "shuffle " << i;
    for (std::size_t k = 0; k < a.pairs.size(); ++k) EXPECT_EQ(b.pairs[k].runs, a.pairs[k].runs) << "pair " << k;
  }
}

// Catches: a digest that leaves out any input: the correspondences (one
// split in two moves the same runs; k and v read from each other's
// tensors), a layout of either side (chunk and tensor_split give equal boxes
// here), the ranks of either side, the options, the dtype, the order of a
// list.
TEST(MappedTransferPlan, DigestCoversEveryInput) {
  const MappedTransferInput base = SmallHfToVllm();
  const TransferPlan a = MustMap(base);
  std::set<std::uint64_t> digests{a.digest};
  int variants = 1;
  const auto add = [&](const MappedTransferInput& in) {
    digests.insert(MustMap(in).digest);
    ++variants;
  };
  MappedTransferInput split = base;
  Correspondence& q = split.correspondences[Find(split.correspondences, "q_proj.weight")];
  Correspondence first = q;  // rows [0, 1) of q_proj
  first.engine_box.end[0] = first.engine_box.begin[0] + 1;
  first.trainer_box.end[0] = 1;
  q.engine_box.begin[0] += 1;
  q.trainer_box.begin[0] = 1;
  split.correspondences.push_back(first);
  EXPECT_EQ(MustMap(split).pairs[0].runs, a.pairs[0].runs) << "the halves' runs meet and merge";
  add(split);
  MappedTransferInput swapped = base;  // k_proj and v_proj have one shape
  std::swap(swapped.correspondences[Find(swapped.correspondences, "k_proj.weight")].trainer_name,
            swapped.correspondences[Find(swapped.correspondences, "v_proj.weight")].trainer_name);
  add(swapped);
  MappedTransferInput layout = base;
  layout.trainer_ranks = 2;
  layout.trainer[0].layout = Layout::of(LayoutLevel::chunk(0, 2));
  for (std::size_t i = 1; i < layout.trainer.size(); ++i) {
    layout.trainer[i].layout = Layout::of(LayoutLevel::replicate(2));
  }
  add(layout);
  layout.trainer[0].layout = Layout::of(LayoutLevel::tensor_split(0, 2));  // vocab 5: the same boxes as chunk
  add(layout);
  MappedTransferInput engine = base;
  engine.engine_ranks = 2;
  for (SideTensor& t : engine.engine) t.layout = Layout::of(LayoutLevel::replicate(2));
  add(engine);
  engine.engine[0].layout = Layout::of(LayoutLevel::chunk(0, 2));
  add(engine);
  engine.engine[0].layout = Layout::of(LayoutLevel::tensor_split(0, 2));
  add(engine);
  MappedTransferInput options = base;
  options.options.min_split_bytes = 1;
  add(options);
  MappedTransferInput dtype = base;
  for (SideTensor& t : dtype.trainer) t.spec.dtype = DType::kInt8;
  for (SideTensor& t : dtype.engine) t.spec.dtype = DType::kInt8;
  add(dtype);
  MappedTransferInput order = base;
  std::reverse(order.trainer.begin(), order.trainer.end());
  add(order);
  order = base;
  std::reverse(order.engine.begin(), order.engine.end());
  add(order);
  EXPECT_EQ(digests.size(), static_cast<std::size_t>(variants));
}

// Catches: replicated trainer ranks not sharing the load under a map (the
// first holder always chosen): two replicas of every Hugging Face tensor
// into vLLM's fused ones, cut to single rows, send about half each.
TEST(MappedTransferPlan, ReplicatedTrainersShareTheLoad) {
  MappedTransferInput in = SmallHfToVllm();
  in.trainer_ranks = 2;
  for (SideTensor& t : in.trainer) t.layout = Layout::of(LayoutLevel::replicate(2));
  in.options.min_split_bytes = 1;
  const TransferPlan plan = MustMap(in);
  const std::vector<std::uint64_t> load = plan.bytes_per_trainer_rank();
  EXPECT_EQ(load[0] + load[1], plan.total_bytes);
  EXPECT_LE(std::max(load[0], load[1]) - std::min(load[0], load[1]), 4u) << load[0] << " vs " << load[1];
}

Status MapError(MappedTransferInput in) { return make_mapped_transfer_plan(std::move(in)).status(); }

// Catches: bad lists, ranks or layouts accepted, or an error that names
// neither the tensor nor the value: empty lists, no correspondences, no
// ranks, a duplicate name, an invalid spec on either side, layouts over the
// wrong rank count on either side, a layout the tensor does not fit.
TEST(MappedTransferPlan, BadListsAndLayoutsAreRefusedNamed) {
  const MappedTransferInput good = SmallHfToVllm();
  MappedTransferInput in = good;
  in.engine.clear();
  EXPECT_HAS(MapError(in).message(), "the mapped transfer plan has no engine tensors");
  in = good;
  in.trainer.clear();
  EXPECT_HAS(MapError(in).message(), "the mapped transfer plan has no trainer tensors");
  in = good;
  in.correspondences.clear();
  EXPECT_HAS(MapError(in).message(), "has no correspondences");
  in = good;
  in.engine_ranks = 0;
  EXPECT_HAS(MapError(in).message(), "trainer ranks 1, engine ranks 0");
  in = good;
  in.trainer_ranks = -2;
  EXPECT_HAS(MapError(in).message(), "trainer ranks -2, engine ranks 1");
  in = good;
  in.engine.push_back(in.engine.front());
  EXPECT_HAS(MapError(in).message(), "duplicate engine tensor name 'model.embed_tokens.weight' at positions 0 and");
  in = good;
  in.trainer.push_back(in.trainer[2]);
  EXPECT_HAS(MapError(in).message(), "duplicate trainer tensor name '" + good.trainer[2].spec.name +
                                         "' at positions 2 and " + std::to_string(good.trainer.size()));
  in = good;
  in.trainer[1].spec.name = "";
  EXPECT_HAS(MapError(in).message(), "trainer tensor position 1");
  in = good;
  in.engine[2].spec.shape = {-3, 4};
  EXPECT_HAS(MapError(in).message(), "engine tensor position 2");

  in = good;
  in.trainer_ranks = 3;
  const Status ranks = MapError(in);
  EXPECT_EQ(ranks.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(ranks.message(), "tensor 'model.embed_tokens.weight': the trainer layout whole has 1 ranks, the trainer "
                              "side has 3");
  in = good;
  in.engine[0].layout = Layout::of(LayoutLevel::chunk(0, 2));
  EXPECT_HAS(MapError(in).message(), "the engine layout chunk(dim 0, 2 ranks) has 2 ranks, the engine side has 1");
  in = good;  // the embedding [5, 4] has no dim 2
  in.engine[0].layout = Layout::of(LayoutLevel::chunk(2, 1));
  const Status fit = MapError(in);
  EXPECT_EQ(fit.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(fit.message(), "engine layout");
  EXPECT_HAS(fit.message(), "model.embed_tokens.weight");
  in = good;
  in.trainer_ranks = 2;
  for (SideTensor& t : in.trainer) t.layout = Layout::of(LayoutLevel::replicate(2));
  in.trainer[0].layout = Layout::of(LayoutLevel::even(0, 2));  // 5 rows
  const Status even = MapError(in);
  EXPECT_HAS(even.message(), "trainer layout");
  EXPECT_HAS(even.message(), "model.embed_tokens.weight");
}

// Catches: bad correspondences accepted, or an error that names neither the
// correspondence nor the value: a tensor its side lacks (either side), a
// box outside its tensor, boxes of unequal extents, engine elements written
// twice or never, trainer elements read twice, two dtypes, boxes that are
// not one C-order range (column halves) on either side.
TEST(MappedTransferPlan, BadCorrespondencesAreRefusedNamed) {
  const MappedTransferInput good = SmallHfToVllm();
  const std::size_t k = Find(good.correspondences, "k_proj.weight");
  const std::size_t v = Find(good.correspondences, "v_proj.weight");
  MappedTransferInput in = good;
  in.correspondences[0].trainer_name = "model.embed.weight";
  EXPECT_HAS(MapError(in).message(), "names trainer tensor 'model.embed.weight', which the trainer does not hold");
  in = good;
  in.correspondences[k].engine_name = "model.layers.0.self_attn.kv_proj.weight";
  EXPECT_HAS(MapError(in).message(), "names engine tensor 'model.layers.0.self_attn.kv_proj.weight', which the "
                                     "engine does not hold");
  in = good;
  in.correspondences[k].trainer_box.end[1] = 5;  // k_proj is [2, 4]
  EXPECT_HAS(MapError(in).message(), "trainer tensor 'model.layers.0.self_attn.k_proj.weight' [2, 4]: box [0, 2) x "
                                     "[0, 5) is not inside the tensor along dim 1");
  in = good;
  in.correspondences[k].trainer_box.end[0] = 1;
  EXPECT_HAS(MapError(in).message(), "the boxes' extents differ ([2, 4] vs [1, 4]");
  in = good;
  in.correspondences.push_back(in.correspondences[k]);
  EXPECT_HAS(MapError(in).message(), "engine tensor 'model.layers.0.self_attn.qkv_proj.weight' [8, 4]: boxes [4, 6) x "
                                     "[0, 4) and [4, 6) x [0, 4) overlap: those elements would be written twice");
  in = good;
  in.correspondences.erase(in.correspondences.begin());
  EXPECT_HAS(MapError(in).message(), "engine tensor 'model.embed_tokens.weight' [5, 4]: the correspondences write 0 "
                                     "of its 20 elements");
  in = good;
  in.correspondences[v].trainer_name = in.correspondences[k].trainer_name;  // v's rows from k_proj too
  EXPECT_HAS(MapError(in).message(), "trainer tensor 'model.layers.0.self_attn.k_proj.weight' [2, 4]: boxes [0, 2) x "
                                     "[0, 4) and [0, 2) x [0, 4) overlap: those elements would be read twice");
  in = good;
  in.trainer[0].spec.dtype = DType::kBFloat16;
  EXPECT_HAS(MapError(in).message(), "engine tensor 'model.embed_tokens.weight' is uint8, trainer tensor "
                                     "'model.embed_tokens.weight' is bfloat16: the plan moves bytes and converts none");

  MappedTransferInput halves;  // an engine [4, 4] from two trainer [4, 2]: column halves
  halves.trainer = {{U8("l", {4, 2}), Layout{}}, {U8("r", {4, 2}), Layout{}}};
  halves.engine = {{U8("w", {4, 4}), Layout{}}};
  halves.correspondences = {Link("w", B({0, 0}, {4, 2}), "l", Whole({4, 2})),
                            Link("w", B({0, 2}, {4, 4}), "r", Whole({4, 2}))};
  halves.trainer_ranks = 1;
  halves.engine_ranks = 1;
  const Status engine_cut = MapError(halves);
  EXPECT_EQ(engine_cut.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(engine_cut.message(), "correspondence w [0, 4) x [0, 2) <- l [0, 4) x [0, 2): the engine box [0, 4) x "
                                   "[0, 2) is not one C-order range of w uint8[4, 4]");
  std::swap(halves.trainer, halves.engine);
  for (Correspondence& c : halves.correspondences) {
    std::swap(c.engine_name, c.trainer_name);
    std::swap(c.engine_box, c.trainer_box);
  }
  EXPECT_HAS(MapError(halves).message(), "the trainer box [0, 4) x [0, 2) is not one C-order range of w uint8[4, 4]");
}

}  // namespace
}  // namespace refit
