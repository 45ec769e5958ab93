#include "refit/transfer_defaults.h"

#include <algorithm>

namespace refit {

std::uint64_t default_bucket_size(std::string_view transport) {
  if (transport == "cuda_ipc" || transport == "nccl") return 1ull << 30;
  return 64ull << 20;
}

std::uint64_t effective_bucket_size(std::uint64_t bucket_size, std::string_view transport) {
  return bucket_size == kAutoBucketSize ? default_bucket_size(transport) : bucket_size;
}

std::uint64_t pool_slot_bytes(const Plan& plan) {
  std::uint64_t largest = kPlanAlignment;
  for (const Bucket& b : plan.buckets) largest = std::max(largest, b.bytes);
  const std::uint64_t aligned = (largest + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment;
  return std::min(aligned, plan.bucket_size);
}

int effective_pool_slots(int pool_slots, std::uint64_t slot_bytes, std::uint64_t memory_limit) {
  if (pool_slots != kAutoPoolSlots) return pool_slots;
  const bool three_fit = memory_limit == 0 || (slot_bytes != 0 && memory_limit / slot_bytes >= 3);
  return three_fit ? 3 : 2;
}

}  // namespace refit
