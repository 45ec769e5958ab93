// EngineRank: one engine rank of a refit job, driven in-process.
//
// Join() validates the settings, allocates and registers the receive pool
// (staged mode) or exposes the engine's weight arena (direct mode), joins the
// coordinator and accepts the data-plane links of the trainer ranks that feed
// it; all of it once, kept for every refit. Then
//   serve()      takes part in every refit until the coordinator shuts down
//   next()       takes part in one refit: returns its version once committed,
//                or std::nullopt when the coordinator shut the job down
//
// Recovery: when a refit fails while every process lives, the coordinator
// aborts it on every rank, then tells every rank to relink: the data-plane
// connections are made again, the registered pool or exposed weights are
// kept, and the next refit starts clean (DESIGN.md: known state after a
// failure).
//
// What it drives is an EngineBinding: the rank's stream (its shard of every
// tensor, model order), the Engine that applies aligned batches (engine.h),
// and, for direct mode, the arena the trainers write into. A failed refit
// calls engine->abort() (the version stays at the last committed one, the
// weights are reported incomplete) and is reported to the coordinator.
//
// Thread safety: one thread drives an EngineRank; the Engine is called on
// that thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "refit/committed_read.h"
#include "refit/engine.h"
#include "refit/model.h"
#include "refit/status.h"
#include "refit/tensor.h"
#include "refit/roles.h"

namespace refit {

// What a server's reads of its weights saw during refits (--readers).
struct ReadCounts {
  std::uint64_t reads = 0;       // checks of a served tensor against the committed version
  std::uint64_t torn_reads = 0;  // ... that found bytes of another version
};

struct EngineBinding {
  // This rank's stream: the specs of its shards, in model order.
  std::vector<TensorSpec> stream;
  // The shard rule that cut each tensor of `stream` (one per tensor), sent
  // in the join so that a plan digest mismatch names each side's rule;
  // empty: unknown (the join carries none).
  std::vector<ShardRule> rules;
  // When not empty: every rank's stream as this process expects it (its own
  // sharding of the model); setup fails when the coordinator's differ.
  std::vector<std::vector<TensorSpec>> expected_streams;
  // Applies the aligned batches; not owned, must outlive the EngineRank.
  Engine* engine = nullptr;
  // Direct mode: the weights, laid out by weight_arena_offsets(stream); not
  // owned. memory/device also say where staged pools live.
  std::byte* arena = nullptr;
  std::uint64_t arena_bytes = 0;
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;  // local CUDA index for kCuda
  // Checks this rank's weights after refit `version` (seed: the job's);
  // `moved`: the tensors of `stream` the refit moved (a partial refit,
  // refit/partial.h: the others hold what the last refit that moved them
  // delivered); empty: every tensor. Empty function: the rank reports its
  // refits as unverified.
  std::function<Status(std::uint64_t version, std::uint64_t seed, const std::vector<bool>& moved)> verify;
  // --quantize (quantize.h): how many of the model's weights this engine
  // holds as FP8 codes and scales converted from the trainer's bf16 or
  // fp32 (EngineOptions::quantize names the conversion), for the report.
  std::uint64_t quantized_tensors = 0;
  // The engine serves from shadow weights (a refit lands in an arena not
  // served until its commit; in direct mode both arenas are exposed as one
  // region). For the report.
  bool shadow = false;
  // Reader threads beside the engine (EngineOptions::readers): their counts
  // so far, sent with each refit's done; empty: no readers.
  std::function<ReadCounts()> read_counts;
  // The weight memory the engine holds (both arenas with --shadow), for the
  // report; 0: not said.
  std::uint64_t weight_memory_bytes = 0;
  // Copies into each read's `out` the served bytes of tensor `tensor` of
  // `stream` from byte `offset` (refit/committed_read.h; the version
  // Engine::weight_version() names; not called unless weights_complete());
  // `out` is in the weights' memory (`memory`: host, or device memory of
  // `device`); a bucket's reads come in one call. Delta refits decode
  // encoded buckets over them; many engines: this rank sends them to the
  // same rank of an engine joining the job (it is its relay parent). Empty:
  // the engine cannot say, so its trainers send every bucket's bytes, and
  // no engine joins the job below it.
  ReadCommitted read_committed;
};

class EngineRank {
 public:
  static StatusOr<std::unique_ptr<EngineRank>> Join(const EngineOptions& options, EngineBinding binding);
  ~EngineRank();

  Status serve();
  StatusOr<std::optional<std::uint64_t>> next();
  // After next() failed: true when the failure was reported and the rank
  // recovered (relinked, weights at the last committed version, incomplete),
  // so it can take part in the next refit; false when the job ended.
  bool recovered() const;
  // The job's seed of the synthetic content, from the coordinator's setup.
  std::uint64_t seed() const;
  // The globs of the last committed refit (a partial refit, refit/partial.h:
  // only the tensors they select changed); empty when it moved every tensor.
  std::vector<std::string> last_only() const;

  class Impl;

 private:
  explicit EngineRank(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit
