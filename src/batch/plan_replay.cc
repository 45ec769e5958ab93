#include "batch/batch_source.h"

namespace refit {

StatusOr<std::optional<Batch>> PlanReplay::next(Deadline /*deadline: nothing to wait for*/) {
  const std::vector<Bucket>& buckets = plan_->buckets;
  while (next_bucket_ < buckets.size() && buckets[next_bucket_].completes.empty()) ++next_bucket_;
  if (next_bucket_ >= buckets.size()) return std::optional<Batch>();
  Batch batch;
  batch.sequence = sequence_++;
  batch.bucket = next_bucket_;
  const Bucket& bucket = buckets[next_bucket_++];
  batch.tensors.reserve(bucket.completes.size());
  for (std::uint32_t t : bucket.completes) {
    TensorView view;
    view.spec = &plan_->specs[t];
    batch.tensors.push_back(view);
  }
  return std::optional<Batch>(std::move(batch));
}

}  // namespace refit
