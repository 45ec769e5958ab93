#include "refit/transfer_plan.h"

#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <limits>
#include <string_view>
#include <unordered_map>

#include "reshard/plan_encoder.h"
#include "reshard/transfer_links.h"

namespace refit {
namespace {

using transfer_plan_detail::check_side;
using transfer_plan_detail::Encoder;
using transfer_plan_detail::link_dims;
using transfer_plan_detail::plan_links;
using transfer_plan_detail::TransferLink;

constexpr std::string_view kTransferPlanFormatTag = "refit-transfer-plan-v1";

Status validate_tensors(const std::vector<TensorLayouts>& tensors, int m, int n) {
  if (tensors.empty()) return InvalidArgument("the transfer plan has no tensors: at least one must move");
  if (m < 1 || n < 1) {
    return InvalidArgument("the transfer plan needs at least one rank per side: trainer ranks " + std::to_string(m) +
                           ", engine ranks " + std::to_string(n));
  }
  if (tensors.size() > std::numeric_limits<std::uint32_t>::max()) {
    return InvalidArgument("the transfer plan has " + std::to_string(tensors.size()) + " tensors; too many");
  }
  std::unordered_map<std::string_view, std::size_t> seen;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorLayouts& tl = tensors[i];
    RETURN_IF_ERROR(validate_spec(tl.spec).WithContext("tensor position " + std::to_string(i)));
    auto [it, inserted] = seen.emplace(tl.spec.name, i);
    if (!inserted) {
      return InvalidArgument("duplicate tensor name '" + tl.spec.name + "' at positions " +
                             std::to_string(it->second) + " and " + std::to_string(i));
    }
    RETURN_IF_ERROR(check_side(tl.spec, "trainer", tl.trainer, m));
    RETURN_IF_ERROR(check_side(tl.spec, "engine", tl.engine, n));
  }
  return Status::Ok();
}

// One link per tensor, whole box to whole box, dimension by dimension.
std::vector<std::vector<TransferLink>> identity_links(const TransferPlan& plan) {
  std::vector<std::vector<TransferLink>> links(plan.engine_tensors.size());
  for (std::size_t i = 0; i < links.size(); ++i) {
    const std::vector<std::int64_t>& shape = plan.engine_tensors[i].spec.shape;
    const Box whole{std::vector<std::int64_t>(shape.size(), 0), shape};
    const auto index = static_cast<std::uint32_t>(i);
    links[i].push_back(TransferLink{index, index, whole, whole, link_dims(whole, whole)});
  }
  return links;
}

// The digest of a plan of make_transfer_plan: the same encoding as before
// mapped plans (no src_tensor, which equals tensor), so that its digests
// did not change.
std::uint64_t compute_digest(const TransferPlan& plan) {
  Encoder enc;
  enc.text(kTransferPlanFormatTag);
  enc.u64(static_cast<std::uint64_t>(plan.trainer_ranks));
  enc.u64(static_cast<std::uint64_t>(plan.engine_ranks));
  enc.u64(plan.options.min_split_bytes);
  enc.u64(plan.engine_tensors.size());
  for (std::size_t i = 0; i < plan.engine_tensors.size(); ++i) {
    enc.spec(plan.engine_tensors[i].spec);
    enc.layout(plan.trainer_tensors[i].layout);
    enc.layout(plan.engine_tensors[i].layout);
  }
  for (const TransferPair& p : plan.pairs) {
    enc.u64(p.runs.size());
    for (const TransferRun& r : p.runs) enc.run(r, /*with_source=*/false);
  }
  return XXH64(enc.str().data(), enc.str().size(), 0);
}

}  // namespace

std::vector<TransferRun> contiguous_pieces(const TransferRun& run) {
  std::vector<TransferRun> out;
  out.reserve(run.count);
  for (std::uint64_t i = 0; i < run.count; ++i) {
    out.push_back(TransferRun{run.tensor, run.src_offset + i * run.src_stride, run.dst_offset + i * run.dst_stride,
                              run.bytes, 1, 0, 0, run.src_tensor});
  }
  return out;
}

std::vector<std::uint64_t> TransferPlan::bytes_per_trainer_rank() const {
  std::vector<std::uint64_t> out(static_cast<std::size_t>(trainer_ranks), 0);
  for (const TransferPair& p : pairs) out[static_cast<std::size_t>(p.trainer_rank)] += p.bytes;
  return out;
}

std::string TransferPlan::digest_hex() const {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, digest);
  return buf;
}

StatusOr<TransferPlan> make_transfer_plan(std::vector<TensorLayouts> tensors, int trainer_ranks, int engine_ranks,
                                          TransferPlanOptions options) {
  RETURN_IF_ERROR(validate_tensors(tensors, trainer_ranks, engine_ranks));
  TransferPlan plan;
  for (TensorLayouts& tl : tensors) {
    plan.trainer_tensors.push_back(SideTensor{tl.spec, std::move(tl.trainer)});
    plan.engine_tensors.push_back(SideTensor{std::move(tl.spec), std::move(tl.engine)});
  }
  plan.trainer_ranks = trainer_ranks;
  plan.engine_ranks = engine_ranks;
  plan.options = options;
  RETURN_IF_ERROR(plan_links(identity_links(plan), plan));
  plan.digest = compute_digest(plan);
  return plan;
}

std::vector<TensorSpec> PairStream::specs() const {
  std::vector<TensorSpec> out;
  out.reserve(entries.size());
  for (const PairStreamEntry& entry : entries) out.push_back(entry.spec);
  return out;
}

std::vector<PairStream> pair_streams(const TransferPlan& plan) {
  std::vector<PairStream> out;
  for (const TransferPair& p : plan.pairs) {
    if (p.bytes == 0) continue;
    PairStream stream{p.trainer_rank, p.engine_rank, {}};
    for (const TransferRun& run : p.runs) {
      if (stream.entries.empty() || stream.entries.back().runs.front().tensor != run.tensor) {
        const TensorSpec& full = plan.engine_tensors[run.tensor].spec;
        stream.entries.push_back(PairStreamEntry{TensorSpec{full.name, full.dtype, {0}}, {}});
      }
      PairStreamEntry& entry = stream.entries.back();
      entry.runs.push_back(run);
      entry.spec.shape[0] += static_cast<std::int64_t>(run.total_bytes() / dtype_size(entry.spec.dtype));
    }
    out.push_back(std::move(stream));
  }
  return out;
}

}  // namespace refit
