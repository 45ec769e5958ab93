#include "aligner/aligner.h"

#include <algorithm>
#include <string>
#include <utility>

namespace refit {
namespace {

std::string quoted(const TensorSpec* spec) { return "'" + spec->name + "'"; }

}  // namespace

std::vector<AlignedBatch::DTypeGroup> AlignedBatch::groups() const {
  std::vector<DTypeGroup> out;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    DType d = specs[i]->dtype;
    auto it = std::find_if(out.begin(), out.end(), [d](const DTypeGroup& g) { return g.dtype == d; });
    if (it == out.end()) {
      out.push_back(DTypeGroup{d, {}});
      it = out.end() - 1;
    }
    it->indices.push_back(i);
  }
  return out;
}

Aligner::Aligner(std::vector<BatchSource*> ranks)
    : ranks_(std::move(ranks)),
      queues_(ranks_.size()),
      ended_(ranks_.size(), false),
      pulls_(ranks_.size(), 0),
      yielded_(ranks_.size(), 0) {}

StatusOr<Aligner> Aligner::Create(std::vector<BatchSource*> ranks) {
  if (ranks.empty()) return InvalidArgument("aligner: an engine needs at least one rank");
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r] == nullptr) return InvalidArgument("aligner: the source of engine rank " + std::to_string(r) + " is null");
    if (ranks[r]->rank() != static_cast<int>(r)) {
      return InvalidArgument("aligner: source " + std::to_string(r) + " feeds engine rank " +
                             std::to_string(ranks[r]->rank()) + "; payload index " + std::to_string(r) +
                             " must be engine TP rank " + std::to_string(r));
    }
  }
  return Aligner(std::move(ranks));
}

StatusOr<std::optional<AlignedBatch>> Aligner::next(Deadline deadline) {
  RETURN_IF_ERROR(pull(deadline));
  ASSIGN_OR_RETURN(const bool all_ended, ended_together());
  if (all_ended) return std::optional<AlignedBatch>();
  ASSIGN_OR_RETURN(const std::size_t n, agreed_prefix());
  return std::optional<AlignedBatch>(take(n));
}

Status Aligner::pull(Deadline deadline) {
  const std::size_t n_ranks = ranks_.size();
  // Advance only ranks whose queue is empty (DESIGN.md rule 3): one pull each.
  for (std::size_t r = 0; r < n_ranks; ++r) {
    if (!queues_[r].empty() || ended_[r]) continue;
    ++pulls_[r];
    auto batch = ranks_[r]->next(deadline);
    if (!batch.ok()) return batch.status().WithContext("engine rank " + std::to_string(r));
    if (!batch->has_value()) {
      ended_[r] = true;
      continue;
    }
    if ((*batch)->tensors.empty()) {
      return Internal("engine rank " + std::to_string(r) + " yielded an empty batch (sequence " +
                      std::to_string((*batch)->sequence) + ") after " + std::to_string(yielded_[r]) + " tensors");
    }
    for (const TensorView& v : (*batch)->tensors) {
      if (v.spec == nullptr) {
        return Internal("engine rank " + std::to_string(r) + " yielded a tensor view without a spec at position " +
                        std::to_string(yielded_[r] + queues_[r].size()));
      }
      queues_[r].push_back(v);
    }
  }
  return Status::Ok();
}

StatusOr<bool> Aligner::ended_together() const {
  const std::size_t n_ranks = ranks_.size();
  // Ends: together, or at different points (a loud error).
  std::size_t first_ended = n_ranks, first_open = n_ranks;
  for (std::size_t r = 0; r < n_ranks; ++r) {
    if (queues_[r].empty()) {
      // A rank with an empty queue after the pulls above has ended.
      if (first_ended == n_ranks) first_ended = r;
    } else if (first_open == n_ranks) {
      first_open = r;
    }
  }
  if (first_open == n_ranks) return true;
  if (first_ended != n_ranks) {
    const std::uint64_t count = yielded_[first_ended];
    std::string last;
    const std::vector<TensorSpec>& specs = ranks_[first_ended]->plan().specs;
    if (count > 0 && count <= specs.size()) last = " (last '" + specs[count - 1].name + "')";
    return FailedPrecondition("streams end at different points: engine rank " + std::to_string(first_ended) +
                              " ended after " + std::to_string(count) + " tensors" + last + " while engine rank " +
                              std::to_string(first_open) + " still has " +
                              quoted(queues_[first_open].front().spec) + " at position " +
                              std::to_string(yielded_[first_open]));
  }
  return false;
}

StatusOr<std::size_t> Aligner::agreed_prefix() const {
  const std::size_t n_ranks = ranks_.size();
  // The common prefix of every queue, checked against rank 0.
  std::size_t n = queues_[0].size();
  for (std::size_t r = 1; r < n_ranks; ++r) n = std::min(n, queues_[r].size());
  for (std::size_t i = 0; i < n; ++i) {
    const TensorSpec* want = queues_[0][i].spec;
    for (std::size_t r = 1; r < n_ranks; ++r) {
      const TensorSpec* got = queues_[r][i].spec;
      // Built only for an error: this loop runs once per tensor and rank.
      const auto position = [&] { return std::to_string(yielded_[0] + i); };
      if (got->name != want->name) {
        return FailedPrecondition("engine ranks disagree at stream position " + position() + ": rank 0 has " +
                                  quoted(want) + " (" + std::string(dtype_name(want->dtype)) + "), rank " +
                                  std::to_string(r) + " has " + quoted(got) + " (" +
                                  std::string(dtype_name(got->dtype)) + ")");
      }
      if (got->dtype != want->dtype) {
        return FailedPrecondition("engine ranks disagree at stream position " + position() + ": tensor " +
                                  quoted(want) + " is " + std::string(dtype_name(want->dtype)) +
                                  " on rank 0 but " + std::string(dtype_name(got->dtype)) + " on rank " +
                                  std::to_string(r));
      }
    }
  }
  return n;
}

AlignedBatch Aligner::take(std::size_t n) {
  const std::size_t n_ranks = ranks_.size();
  AlignedBatch out;
  out.sequence = sequence_++;
  out.specs.reserve(n);
  out.payload.resize(n_ranks);
  for (std::size_t r = 0; r < n_ranks; ++r) {
    out.payload[r].assign(queues_[r].begin(), queues_[r].begin() + static_cast<std::ptrdiff_t>(n));
    queues_[r].erase(queues_[r].begin(), queues_[r].begin() + static_cast<std::ptrdiff_t>(n));
    yielded_[r] += n;
  }
  for (const TensorView& v : out.payload[0]) out.specs.push_back(v.spec);
  return out;
}

StatusOr<std::vector<std::size_t>> aligned_schedule(const std::vector<const Plan*>& plans) {
  if (plans.empty()) return InvalidArgument("aligned_schedule: an engine needs at least one rank");
  std::vector<PlanReplay> replays;
  replays.reserve(plans.size());
  for (std::size_t r = 0; r < plans.size(); ++r) {
    if (plans[r] == nullptr) return InvalidArgument("aligned_schedule: the plan of engine rank " + std::to_string(r) + " is null");
    replays.emplace_back(plans[r], static_cast<int>(r));
  }
  std::vector<BatchSource*> sources;
  for (PlanReplay& p : replays) sources.push_back(&p);
  ASSIGN_OR_RETURN(Aligner aligner, Aligner::Create(std::move(sources)));
  std::vector<std::size_t> sizes;
  for (;;) {
    ASSIGN_OR_RETURN(std::optional<AlignedBatch> batch, aligner.next(Deadline::Never()));
    if (!batch) return sizes;
    sizes.push_back(batch->size());
  }
}

}  // namespace refit
