// BatchSource: anything the Aligner can pull batches from: a Receiver
// (real bytes) or a PlanReplay (the same batch boundaries, metadata only,
// computed from a plan: used to align against ranks whose bytes live in other
// processes, and to validate alignment at setup).
#pragma once

#include <cstdint>
#include <optional>

#include "refit/batch.h"
#include "refit/deadline.h"
#include "refit/plan.h"
#include "refit/status.h"

namespace refit {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next batch; std::nullopt at the end of the stream.
  virtual StatusOr<std::optional<Batch>> next(Deadline deadline) = 0;
  // The engine TP rank this source feeds.
  virtual int rank() const = 0;
  virtual const Plan& plan() const = 0;
};

// Replays a plan's batch boundaries without bytes: batch k holds the tensors
// completed by the k-th bucket that completes any, with data == nullptr.
// Thread safety: one thread.
class PlanReplay : public BatchSource {
 public:
  // `plan` must outlive the replay.
  PlanReplay(const Plan* plan, int rank) : plan_(plan), rank_(rank) {}
  StatusOr<std::optional<Batch>> next(Deadline deadline) override;
  int rank() const override { return rank_; }
  const Plan& plan() const override { return *plan_; }
  // Starts over from the first bucket.
  void reset() { next_bucket_ = 0; sequence_ = 0; }

 private:
  const Plan* plan_;
  int rank_;
  std::uint64_t next_bucket_ = 0;
  std::uint64_t sequence_ = 0;
};

}  // namespace refit
