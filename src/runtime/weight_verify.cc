// The engine's verification of a refit: see weight_verify.h.
#include "runtime/weight_verify.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.h"
#include "cuda/device_content.h"
#include "quant/fp8_shard.h"
#include "refit/content.h"
#include "refit/device_memory.h"

namespace refit {

namespace {

// The first byte of `got` (rank's shard of `w`, on the device when
// `on_device`) that differs from the content of `key`, or -1.
StatusOr<std::int64_t> synthetic_mismatch(const Weight& w, const std::byte* got, int rank, int ranks, bool on_device,
                                          const ContentKey& key) {
  ShardRunLayout l = shard_run_layout(w, rank, ranks);
  if (l.count > 1 && l.run == l.stride) {  // contiguous in the full tensor: one check
    l.run *= l.count;
    l.stride = l.run;
    l.count = 1;
  }
  // One launch for every row on a device: a row-sharded tensor has thousands of them.
  if (on_device) return first_content_mismatch_device(key, ContentRows{l.base, l.stride, l.run, l.count}, got, nullptr);
  for (std::uint64_t i = 0; i < l.count; ++i) {
    const std::int64_t at =
        first_content_mismatch(key, l.base + i * l.stride, std::span<const std::byte>(got + i * l.run, l.run));
    if (at >= 0) return at + static_cast<std::int64_t>(i * l.run);
  }
  return std::int64_t{-1};
}

}  // namespace

Status verify_synthetic(const Model& model, const ReferenceEngine& engine, int rank, int ranks, bool on_device,
                        const WeightVersions& versions, const ContentSeed& seed) {
  const std::string name = "engine rank " + std::to_string(rank);
  if (!versions.each.empty() && versions.each.size() != model.weights.size()) {
    return Internal(name + ": " + std::to_string(versions.each.size()) + " weight versions for " +
                    std::to_string(model.weights.size()) + " weights");
  }
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    const Weight& w = model.weights[i];
    const std::uint64_t version = versions.of(i);
    const std::byte* got = engine.landed_weight(rank, w.spec.name);
    if (got == nullptr) return Internal(name + " holds no weight '" + w.spec.name + "'");
    ASSIGN_OR_RETURN(const std::int64_t at,
                     synthetic_mismatch(w, got, rank, ranks, on_device, seed.key(version, w.spec.name, w.spec.dtype)));
    if (at >= 0) {
      const std::string held =
          version == versions.refit ? "" : " (it must still hold refit " + std::to_string(version) + "'s bytes)";
      return DataLoss(name + ": tensor '" + w.spec.name + "' is wrong at byte " + std::to_string(at) +
                      " of its shard after refit " + std::to_string(versions.refit) + held +
                      " (stale, misplaced or corrupted bytes)");
    }
  }
  return Status::Ok();
}

StatusOr<bool> served_weight_is_version(const Model& model, std::size_t index, const ReferenceEngine& engine,
                                        int rank, int ranks, bool on_device, std::uint64_t version,
                                        const ContentSeed& seed) {
  const Weight& w = model.weights.at(index);
  const std::byte* got = engine.weight(rank, w.spec.name);
  if (got == nullptr) return Internal("engine rank " + std::to_string(rank) + " holds no weight '" + w.spec.name + "'");
  ASSIGN_OR_RETURN(const std::int64_t at,
                   synthetic_mismatch(w, got, rank, ranks, on_device, seed.key(version, w.spec.name, w.spec.dtype)));
  return at < 0;
}

Status verify_served_synthetic(const Model& model, const ReferenceEngine& engine, int rank, int ranks,
                               bool on_device, const WeightVersions& versions, const ContentSeed& seed) {
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    const std::uint64_t version = versions.of(i);
    ASSIGN_OR_RETURN(const bool whole,
                     served_weight_is_version(model, i, engine, rank, ranks, on_device, version, seed));
    if (!whole) {
      return DataLoss("engine rank " + std::to_string(rank) + ": served tensor '" + model.weights[i].spec.name +
                      "' is not refit " + std::to_string(version) + "'s");
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
    const std::byte* held = engine.landed_weight(rank, w.spec.name);
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

namespace {

// Which of an engine's weights a check reads: those the refit landed (a
// verification) or those served (a reader's check).
enum class HeldWeights { kLanded, kServed };

// Weight i of an FP8 engine rank against its source's expected bytes.
Status verify_quantized_weight(const Model& unquantized, const QuantizedModel& quantized, std::size_t i,
                               const Checkpoint* checkpoint, const ReferenceEngine& engine, int rank, int ranks,
                               bool on_device, std::uint64_t version, const ContentSeed& seed, HeldWeights which) {
  const std::string name = "engine rank " + std::to_string(rank);
  const QuantSource& q = quantized.sources[i];
  const Weight& source = unquantized.weights[q.source];
  const Weight& held_weight = quantized.engine.weights[i];
  if (shard_spec(held_weight, rank, ranks).nbytes() == 0) return Status::Ok();  // an expert it does not own
  const std::byte* held = which == HeldWeights::kLanded ? engine.landed_weight(rank, held_weight.spec.name)
                                                        : engine.weight(rank, held_weight.spec.name);
  if (held == nullptr) return Internal(name + " holds no weight '" + held_weight.spec.name + "'");
  std::vector<std::byte> full;
  const std::byte* expected = nullptr;  // the source's full tensor
  if (checkpoint != nullptr) {
    expected = checkpoint->data(q.source).data();
  } else {
    full.resize(source.spec.nbytes());
    fill_content(seed.key(version, source.spec.name, source.spec.dtype), 0, full);
    if (q.part != QuantPart::kCopy) make_finite_content(source.spec.dtype, full);
    expected = full.data();
  }
  std::vector<std::byte> want(shard_spec(held_weight, rank, ranks).nbytes()), got;
  if (q.part == QuantPart::kCopy) {
    copy_shard_range(held_weight, rank, ranks, expected, 0, want);
  } else {
    RETURN_IF_ERROR(quantized_shard_range(source, rank, ranks, q.part, expected, 0, want, version));
  }
  const std::byte* have = held;
  if (on_device) {
    got.resize(want.size());
    RETURN_IF_ERROR(copy_device_to_host(got, held));
    have = got.data();
  }
  if (std::memcmp(have, want.data(), want.size()) == 0) return Status::Ok();
  std::uint64_t at = 0;
  while (have[at] == want[at]) ++at;
  const char* what = q.part == QuantPart::kCopy ? "" : q.part == QuantPart::kCodes ? " (FP8 codes)" : " (FP8 scales)";
  return DataLoss(name + ": tensor '" + held_weight.spec.name + "'" + what + " is wrong at byte " +
                  std::to_string(at) + " of its shard after refit " + std::to_string(version) +
                  (checkpoint != nullptr ? " (against " + checkpoint->path() + ")" : std::string()));
}

}  // namespace

Status verify_quantized(const Model& unquantized, const QuantizedModel& quantized, const Checkpoint* checkpoint,
                        const ReferenceEngine& engine, int rank, int ranks, bool on_device, std::uint64_t version,
                        const ContentSeed& seed) {
  const std::size_t n = quantized.engine.weights.size();
  const unsigned threads =
      static_cast<unsigned>(std::min<std::size_t>({n, 16, std::max(std::thread::hardware_concurrency(), 1u)}));
  std::vector<Status> results(n);
  auto work = [&](unsigned t) {
    for (std::size_t i = t; i < n; i += threads) {
      results[i] = verify_quantized_weight(unquantized, quantized, i, checkpoint, engine, rank, ranks, on_device,
                                           version, seed, HeldWeights::kLanded);
    }
  };
  std::vector<std::thread> workers;
  for (unsigned t = 1; t < threads; ++t) workers.emplace_back(work, t);
  if (threads > 0) work(0);
  for (auto& w : workers) w.join();
  for (const Status& s : results) RETURN_IF_ERROR(s);  // the first tensor in stream order
  if (checkpoint != nullptr) return checkpoint->check_unchanged();
  return Status::Ok();
}

StatusOr<bool> served_quantized_weight_is_version(const Model& unquantized, const QuantizedModel& quantized,
                                                  std::size_t index, const ReferenceEngine& engine, int rank,
                                                  int ranks, bool on_device, std::uint64_t version,
                                                  const ContentSeed& seed) {
  const Status same = verify_quantized_weight(unquantized, quantized, index, nullptr, engine, rank, ranks, on_device,
                                              version, seed, HeldWeights::kServed);
  if (same.code() == StatusCode::kDataLoss) return false;
  RETURN_IF_ERROR(same);
  return true;
}

Status verify_engine_weights(const ModelChoice& choice, const ReferenceEngine& engine, int rank, int ranks,
                             bool on_device, const WeightVersions& versions, const ContentSeed& seed) {
  const std::uint64_t version = versions.refit;  // a checkpoint's bytes are every version's
  if (!choice.quantized.sources.empty()) {
    return verify_quantized(choice.unquantized, choice.quantized, choice.checkpoint.get(), engine, rank, ranks,
                            on_device, version, seed);
  }
  if (choice.checkpoint != nullptr) {
    return verify_checkpoint(choice.model, *choice.checkpoint, engine, rank, ranks, on_device, version);
  }
  return verify_synthetic(choice.model, engine, rank, ranks, on_device, versions, seed);
}

}  // namespace refit
