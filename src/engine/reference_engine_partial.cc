// ReferenceEngine and partial refits (refit/partial.h): the version each
// arena holds of each tensor, and the catch-up that makes the arena a
// partial refit lands in whole before the refit writes its scope. See
// reference_engine.h begin_partial.
#include <cstring>

#include "refit/device_memory.h"
#include "refit/reference_engine.h"

namespace refit {

namespace {

// held[r] sized to rank r's stream (new entries: not known).
void size_for(std::vector<std::vector<std::uint64_t>>& held, const std::vector<std::vector<TensorSpec>>& streams) {
  held.resize(streams.size());
  for (std::size_t r = 0; r < streams.size(); ++r) held[r].resize(streams[r].size(), 0);
}

}  // namespace

Status ReferenceEngine::begin_partial(std::uint64_t version, const RefitScope& scope) {
  RETURN_IF_ERROR(begin(version));
  std::vector<std::vector<bool>> moving(streams_.size());
  for (int r : hosted_) {
    ASSIGN_OR_RETURN(moving[static_cast<std::size_t>(r)],
                     select_tensors(scope, streams_[static_cast<std::size_t>(r)]));
  }
  moving_ = std::move(moving);
  if (!options_.shadow) return Status::Ok();  // live weights: the scope is written, the rest stays
  return catch_up_landing(scope);
}

Status ReferenceEngine::catch_up_landing(const RefitScope& scope) {
  const int to = landing(), from = active_;
  size_for(held_[to], streams_);
  size_for(held_[from], streams_);
  for (int r : hosted_) {
    const auto k = static_cast<std::size_t>(r);
    std::byte* dst = arena_data(to, k);
    const std::byte* src = arena_data(from, k);
    for (std::size_t i = 0; i < streams_[k].size(); ++i) {
      const std::uint64_t served = held_[from][k][i];
      if (moving_[k][i] || (served != 0 && held_[to][k][i] == served)) continue;
      const TensorSpec& spec = streams_[k][i];
      const std::uint64_t at = offsets_[k].at(spec.name), bytes = spec.nbytes();
      if (options_.memory == MemoryKind::kCuda) {
        RETURN_IF_ERROR(copy_device_to_device(dst + at, src + at, bytes)
                            .WithContext("reference engine: partial refit " + std::to_string(pending_version_) +
                                         " (" + std::to_string(scope.only.size()) + " globs), copying '" +
                                         spec.name + "' into the arena it lands in"));
      } else {
        std::memcpy(dst + at, src + at, bytes);
      }
      held_[to][k][i] = served;
      stats_.catch_up_bytes += bytes;
    }
  }
  return Status::Ok();
}

void ReferenceEngine::note_landed(std::uint64_t version) {
  std::vector<std::vector<std::uint64_t>>& held = held_[landing()];
  size_for(held, streams_);
  for (int r : hosted_) {
    const auto k = static_cast<std::size_t>(r);
    for (std::size_t i = 0; i < held[k].size(); ++i) {
      if (moving_.empty() || moving_[k][i]) held[k][i] = version;
    }
  }
}

std::uint64_t ReferenceEngine::served_version(int rank, std::size_t index) const {
  const std::vector<std::vector<std::uint64_t>>& held = held_[active_];
  const auto k = static_cast<std::size_t>(rank);
  if (k >= held.size() || index >= held[k].size() || held[k][index] == 0) return version_;
  return held[k][index];
}

void ReferenceEngine::forget_landing() {
  for (std::vector<std::uint64_t>& rank : held_[landing()]) std::fill(rank.begin(), rank.end(), 0);
}

}  // namespace refit
