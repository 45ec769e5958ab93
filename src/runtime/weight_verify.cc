// The engine's verification of a refit: see weight_verify.h.
#include "runtime/weight_verify.h"

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/device_content.h"
#include "refit/content.h"

namespace refit {

Status verify_synthetic(const Model& model, const ReferenceEngine& engine, int rank, int ranks, bool on_device,
                        std::uint64_t version, std::uint64_t seed) {
  const std::string name = "engine rank " + std::to_string(rank);
  for (const Weight& w : model.weights) {
    const std::byte* got = engine.weight(rank, w.spec.name);
    if (got == nullptr) return Internal(name + " holds no weight '" + w.spec.name + "'");
    const std::uint64_t key = content_key(seed, version, w.spec.name);
    ShardRunLayout l = shard_run_layout(w, rank, ranks);
    if (l.count > 1 && l.run == l.stride) {  // contiguous in the full tensor: one check
      l.run *= l.count;
      l.stride = l.run;
      l.count = 1;
    }
    std::int64_t at = -1;  // in the shard
    if (on_device) {
      // One launch for every row: a row-sharded tensor has thousands of them.
      ASSIGN_OR_RETURN(at, first_content_mismatch_device(key, ContentRows{l.base, l.stride, l.run, l.count}, got, nullptr));
    } else {
      for (std::uint64_t i = 0; i < l.count && at < 0; ++i) {
        at = first_content_mismatch(key, l.base + i * l.stride, std::span<const std::byte>(got + i * l.run, l.run));
        if (at >= 0) at += static_cast<std::int64_t>(i * l.run);
      }
    }
    if (at >= 0) {
      return DataLoss(name + ": tensor '" + w.spec.name + "' is wrong at byte " + std::to_string(at) +
                      " of its shard after refit " + std::to_string(version) + " (stale, misplaced or corrupted bytes)");
    }
  }
  return Status::Ok();
}

Status verify_checkpoint(const Model& model, const Checkpoint& checkpoint, const ReferenceEngine& engine, int rank,
                         int ranks, bool on_device, std::uint64_t version) {
  const std::string name = "engine rank " + std::to_string(rank);
  std::vector<std::byte> want, got;
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    const Weight& w = model.weights[i];
    const std::byte* held = engine.weight(rank, w.spec.name);
    if (held == nullptr) return Internal(name + " holds no weight '" + w.spec.name + "'");
    const std::uint64_t bytes = shard_spec(w, rank, ranks).nbytes();
    want.resize(bytes);
    copy_shard_range(w, rank, ranks, checkpoint.data(i).data(), 0, want);
    const std::byte* have = held;
    if (on_device) {
      got.resize(bytes);
      RETURN_IF_ERROR(copy_device_to_host(got, held));
      have = got.data();
    }
    if (std::memcmp(have, want.data(), bytes) != 0) {
      RETURN_IF_ERROR(checkpoint.check_unchanged());  // a file changed under this rank: that is the cause
      std::uint64_t at = 0;
      while (at < bytes && have[at] == want[at]) ++at;
      return DataLoss(name + ": tensor '" + w.spec.name + "' differs from " + checkpoint.path() + " at byte " +
                      std::to_string(at) + " of its shard after refit " + std::to_string(version));
    }
  }
  // What was compared against is the file as opened (else zeros).
  return checkpoint.check_unchanged();
}

}  // namespace refit
