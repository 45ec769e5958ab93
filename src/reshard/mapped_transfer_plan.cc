// The mapped transfer plan: see refit/mapped_transfer_plan.h. Validates the
// two tensor lists and the correspondences, turns each correspondence into a
// link (indices and a dimension map) and hands the links to the planner
// both transfer plans share (transfer_links.h).
#include "refit/mapped_transfer_plan.h"

#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "reshard/name_map.h"
#include "reshard/plan_encoder.h"
#include "reshard/transfer_links.h"

namespace refit {
namespace {

using transfer_plan_detail::check_side;
using transfer_plan_detail::Encoder;
using transfer_plan_detail::is_c_order_range;
using transfer_plan_detail::link_dims;
using transfer_plan_detail::plan_links;
using transfer_plan_detail::TransferLink;

constexpr std::string_view kMappedPlanFormatTag = "refit-mapped-transfer-plan-v1";

using NameIndex = std::unordered_map<std::string_view, std::uint32_t>;

// One side's list: not empty, valid specs, one name each, layouts that fit
// and span `ranks`. Returns the names' positions.
StatusOr<NameIndex> check_list(std::string_view side, const std::vector<SideTensor>& tensors, int ranks) {
  const std::string what(side);
  if (tensors.empty()) return InvalidArgument("the mapped transfer plan has no " + what + " tensors");
  if (tensors.size() > std::numeric_limits<std::uint32_t>::max()) {
    return InvalidArgument("the mapped transfer plan has " + std::to_string(tensors.size()) + " " + what +
                           " tensors; too many");
  }
  NameIndex index;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const SideTensor& t = tensors[i];
    RETURN_IF_ERROR(validate_spec(t.spec).WithContext(what + " tensor position " + std::to_string(i)));
    const auto [it, inserted] = index.emplace(t.spec.name, static_cast<std::uint32_t>(i));
    if (!inserted) {
      return InvalidArgument("duplicate " + what + " tensor name '" + t.spec.name + "' at positions " +
                             std::to_string(it->second) + " and " + std::to_string(i));
    }
    RETURN_IF_ERROR(check_side(t.spec, side, t.layout, ranks));
  }
  return index;
}

std::vector<MappedTensor> names_and_shapes(const std::vector<SideTensor>& tensors) {
  std::vector<MappedTensor> out;
  out.reserve(tensors.size());
  for (const SideTensor& t : tensors) out.push_back(MappedTensor{t.spec.name, t.spec.shape});
  return out;
}

// What check_correspondences leaves to the plan: one dtype, and boxes that
// are C-order ranges (the planner's and the bucket feed's requirement).
Status check_supported(const Correspondence& c, const SideTensor& engine, const SideTensor& trainer) {
  const auto fail = [&](const std::string& why) {
    return InvalidArgument("correspondence " + c.ToString() + ": " + why);
  };
  if (engine.spec.dtype != trainer.spec.dtype) {
    return fail("engine tensor '" + engine.spec.name + "' is " + std::string(dtype_name(engine.spec.dtype)) +
                ", trainer tensor '" + trainer.spec.name + "' is " + std::string(dtype_name(trainer.spec.dtype)) +
                ": the plan moves bytes and converts none");
  }
  for (const auto& [side, tensor, box] : {std::tuple{"engine", &engine, &c.engine_box},
                                          std::tuple{"trainer", &trainer, &c.trainer_box}}) {
    if (is_c_order_range(*box, tensor->spec.shape)) continue;
    return fail(std::string("the ") + side + " box " + box_text(*box) + " is not one C-order range of " +
                tensor->spec.ToString() + ": every dimension after the box's first of extent > 1 must be whole "
                "(the mapped transfer plan moves such boxes only)");
  }
  return Status::Ok();
}

// The input's correspondences in plan order: by engine tensor, then by the
// engine box's begin (its position: the boxes of one tensor are disjoint
// C-order ranges). Ties (an empty box where another begins) go by the other
// fields, so that the order is total and the input's order never shows.
std::vector<Correspondence> in_plan_order(std::vector<Correspondence> cs, const NameIndex& engine) {
  std::vector<std::size_t> order(cs.size());
  std::iota(order.begin(), order.end(), 0);
  const auto key = [&](std::size_t i) {
    const Correspondence& c = cs[i];
    return std::tie(engine.at(c.engine_name), c.engine_box.begin, c.engine_box.end, c.trainer_name, c.trainer_box.begin,
                    c.trainer_box.end, c.component, c.component_box.begin, c.component_box.end);
  };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
  std::vector<Correspondence> out;
  out.reserve(cs.size());
  for (const std::size_t i : order) out.push_back(std::move(cs[i]));
  return out;
}

// Per engine tensor, the links of its non-empty correspondences in plan
// order. REQUIRES: `plan.correspondences` passed the checks.
std::vector<std::vector<TransferLink>> mapped_links(const TransferPlan& plan, const NameIndex& engine,
                                                    const NameIndex& trainer) {
  std::vector<std::vector<TransferLink>> links(plan.engine_tensors.size());
  for (const Correspondence& c : plan.correspondences) {
    if (c.engine_box.numel() == 0) continue;
    const std::uint32_t e = engine.at(c.engine_name);
    links[e].push_back(TransferLink{e, trainer.at(c.trainer_name), c.engine_box, c.trainer_box,
                                    link_dims(c.engine_box, c.trainer_box)});
  }
  return links;
}

void encode_side(Encoder& enc, const std::vector<SideTensor>& tensors) {
  enc.u64(tensors.size());
  for (const SideTensor& t : tensors) {
    enc.spec(t.spec);
    enc.layout(t.layout);
  }
}

std::uint64_t compute_digest(const TransferPlan& plan, const NameIndex& engine, const NameIndex& trainer) {
  Encoder enc;
  enc.text(kMappedPlanFormatTag);
  enc.u64(static_cast<std::uint64_t>(plan.trainer_ranks));
  enc.u64(static_cast<std::uint64_t>(plan.engine_ranks));
  enc.u64(plan.options.min_split_bytes);
  encode_side(enc, plan.trainer_tensors);
  encode_side(enc, plan.engine_tensors);
  enc.u64(plan.correspondences.size());
  for (const Correspondence& c : plan.correspondences) {
    enc.u64(engine.at(c.engine_name));
    enc.box(c.engine_box);
    enc.u64(trainer.at(c.trainer_name));
    enc.box(c.trainer_box);
  }
  for (const TransferPair& p : plan.pairs) {
    enc.u64(p.runs.size());
    for (const TransferRun& r : p.runs) enc.run(r, /*with_source=*/true);
  }
  return XXH64(enc.str().data(), enc.str().size(), 0);
}

}  // namespace

StatusOr<TransferPlan> make_mapped_transfer_plan(MappedTransferInput input) {
  const int m = input.trainer_ranks;
  const int n = input.engine_ranks;
  if (m < 1 || n < 1) {
    return InvalidArgument("the mapped transfer plan needs at least one rank per side: trainer ranks " +
                           std::to_string(m) + ", engine ranks " + std::to_string(n));
  }
  ASSIGN_OR_RETURN(const NameIndex trainer, check_list("trainer", input.trainer, m));
  ASSIGN_OR_RETURN(const NameIndex engine, check_list("engine", input.engine, n));
  if (input.correspondences.empty()) {
    return InvalidArgument("the mapped transfer plan has no correspondences: nothing says where the engine's " +
                           std::to_string(input.engine.size()) + " tensors come from");
  }
  RETURN_IF_ERROR(check_correspondences(input.correspondences, names_and_shapes(input.engine),
                                        names_and_shapes(input.trainer)));
  for (const Correspondence& c : input.correspondences) {
    RETURN_IF_ERROR(
        check_supported(c, input.engine[engine.at(c.engine_name)], input.trainer[trainer.at(c.trainer_name)]));
  }
  TransferPlan plan;
  plan.correspondences = in_plan_order(std::move(input.correspondences), engine);
  // The name indexes view the specs' names: moving a vector keeps its elements where they are.
  plan.trainer_tensors = std::move(input.trainer);
  plan.engine_tensors = std::move(input.engine);
  plan.trainer_ranks = m;
  plan.engine_ranks = n;
  plan.options = input.options;
  RETURN_IF_ERROR(plan_links(mapped_links(plan, engine, trainer), plan));
  plan.digest = compute_digest(plan, engine, trainer);
  return plan;
}

}  // namespace refit
