// TensorSpec lists as JSON ([[name, dtype, [dims...]], ...]) for control
// messages. Parsing validates every element and names the bad one.
#pragma once

#include <vector>

#include "control/control_message.h"
#include "refit/tensor.h"

namespace refit {

Json specs_to_json(const std::vector<TensorSpec>& specs);
StatusOr<std::vector<TensorSpec>> specs_from_json(const Json& json, const std::string& what);

// The most buckets a plan made from a peer's specs may have: make_plan's
// time and memory grow with the bucket count, so an absurd shape from the
// network (a 2^62-byte tensor in 4 KiB buckets) must be refused before it is
// planned. 4M buckets: 4 TiB per engine rank at 1 MiB buckets.
inline constexpr std::uint64_t kMaxPlanBuckets = 1ull << 22;

// kInvalidArgument naming `what`, the bucket size and the count when the plan
// of `specs` (valid specs) with `bucket_size` (> 0) could have more than
// kMaxPlanBuckets buckets (bound: the sum over tensors of
// ceil(bytes / bucket_size)).
Status check_plan_bounds(const std::vector<TensorSpec>& specs, std::uint64_t bucket_size, const std::string& what);

}  // namespace refit
