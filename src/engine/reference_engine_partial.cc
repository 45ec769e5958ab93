// ReferenceEngine and partial refits (refit/partial.h): the version each
// arena holds of each tensor, and the catch-up that makes the arena a
// partial refit lands in whole before the refit writes its scope. See
// reference_engine.h begin_partial.
#include <cstring>

#include "refit/device_memory.h"
#include "refit/reference_engine.h"

namespace refit {

Status ReferenceEngine::begin_partial(std::uint64_t version, const RefitScope& scope) {
  RETURN_IF_ERROR(begin(version));
  for (int r : hosted_) {
    const auto k = static_cast<std::size_t>(r);
    ASSIGN_OR_RETURN(std::vector<bool> moving, select_tensors(scope, streams_[k]));
    versions_[k].open(std::move(moving));
  }
  if (!options_.shadow) return Status::Ok();  // live weights: the scope is written, the rest stays
  return catch_up_landing(scope);
}

Status ReferenceEngine::catch_up_landing(const RefitScope& scope) {
  const int to = landing(), from = active_;
  for (int r : hosted_) {
    const auto k = static_cast<std::size_t>(r);
    std::byte* dst = arena_data(to, k);
    const std::byte* src = arena_data(from, k);
    for (std::size_t i = 0; i < streams_[k].size(); ++i) {
      if (!versions_[k].stale(to, from, i)) continue;
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
      versions_[k].copied(to, from, i);
      stats_.catch_up_bytes += bytes;
    }
  }
  return Status::Ok();
}

void ReferenceEngine::note_landed(std::uint64_t version) {
  for (int r : hosted_) versions_[static_cast<std::size_t>(r)].landed(landing(), version);
}

std::uint64_t ReferenceEngine::served_version(int rank, std::size_t index) const {
  const auto k = static_cast<std::size_t>(rank);
  const std::uint64_t held = k < versions_.size() ? versions_[k].held(active_, index) : 0;
  return held != 0 ? held : version_;
}

}  // namespace refit
