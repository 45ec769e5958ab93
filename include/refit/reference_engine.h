// ReferenceEngine: an embedded Engine (engine.h) that behaves like a server.
// `refit engine` and the tests run it; a server with its own weights
// implements Engine instead.
//
// Thread safety: one thread drives an engine; read_active() may be called
// from any number of other threads at the same time (a server's forward
// passes).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "refit/arena_versions.h"
#include "refit/engine.h"
#include "refit/plan.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

class BatchedCopier;  // src/cuda/batched_copy.h
class CudaStream;     // src/cuda/device.h

struct ReferenceEngineStats {
  std::uint64_t begins = 0;
  std::uint64_t posts = 0;           // one per dtype group per apply
  std::uint64_t cache_flushes = 0;   // one per commit
  std::uint64_t tensors_applied = 0; // per local rank, summed
  std::uint64_t bytes_applied = 0;
  // Partial refits into shadow weights: bytes copied from the served arena
  // into the one a partial refit lands in (the tensors outside its scope
  // that the landing arena held at another version), summed.
  std::uint64_t catch_up_bytes = 0;
};

// An embedded engine that behaves like a server: it allocates its weights once
// (one buffer per tensor per local rank) and copies each applied batch into
// them. It can host every rank of an engine (one process per engine) or a
// subset (one process per engine rank): payloads of ranks it does not host are
// skipped and must have data == nullptr.
//
// Checks on every apply, each failing with kFailedPrecondition naming the
// tensor and rank: a post holds one dtype; payload[r]'s name equals the
// name at that position; its shape equals rank r's own parameter shape; a
// hosted rank's payload has bytes.
//
// Weights of a hosted rank live in one arena (host memory, or device memory
// with memory == kCuda) at weight_arena_offsets() of its stream, so that the
// arena can be exposed whole for direct mode. On a device, each post is one
// BatchedCopier launch and apply() returns once its copies finished, so the
// staging slots it read may be recycled at once. A device engine remembers
// the batches it validated: a later batch with the same sequence number,
// the same spec pointers and the same data pointers on every rank is the
// same batch (specs are immutable while an engine uses them: they point into
// the receiver's plan), and its prepared copies are replayed with no
// per-tensor host work (a MoE refit has ~10,000 tensors).
//
// Shadow weights (`shadow`, issue 21): each hosted rank has two arenas.
// apply() writes into the inactive one, which no reader sees; commit()
// flips them (the new version becomes the active one) while no reader is
// inside read_active(), and abort() leaves the active version untouched and
// complete. Without `shadow` apply() writes into the weights readers read,
// one batch at a time (a reader never sees a half-copied batch, but between
// batches it sees a mixture of versions: what a server serving from live
// weights during a staged refit reads).
struct ReferenceEngineOptions {
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;  // local CUDA index for kCuda
  bool shadow = false;
  // Shadow weights whose arena not served can be freed between refits
  // (release_idle): each arena its own allocation. Staged mode only: direct
  // mode exposes both arenas as one region (arena(), shadow_arena_stride).
  bool releasable_shadow = false;
  // The flip hook: called by commit() with the committed version at the
  // moment weight_version() changes (in shadow mode, the flip), while no
  // reader is inside read_active(); a server invalidates caches built from
  // older weights here. Runs on the thread that drives the engine, and must
  // not call read_active() (the flip holds the readers out).
  std::function<void(std::uint64_t version)> on_flip;
};

// Offsets of each tensor of `stream` inside a weight arena (stream order,
// every tensor at a multiple of kPlanAlignment); *total = arena bytes. A pure
// function of the specs: trainers writing in direct mode compute the same.
std::vector<std::uint64_t> weight_arena_offsets(const std::vector<TensorSpec>& stream, std::uint64_t* total);

// Shadow weights in direct mode: an engine rank's two arenas lie in one
// region, arena k at k * shadow_arena_stride(stream) (weight_arena_offsets'
// total, a multiple of kPlanAlignment), and the trainers write the arena
// each start names (protocol Start::arena).
std::uint64_t shadow_arena_stride(const std::vector<TensorSpec>& stream);

class ReferenceEngine : public Engine {
 public:
  // streams[r] = rank r's specs (all ranks of the engine, in TP order);
  // `hosted` = the ranks whose weights live in this process. Allocation
  // failures (device memory) are reported by Create.
  static StatusOr<std::unique_ptr<ReferenceEngine>> Create(std::vector<std::vector<TensorSpec>> streams,
                                                           std::vector<int> hosted,
                                                           ReferenceEngineOptions options = {});
  ReferenceEngine(std::vector<std::vector<TensorSpec>> streams, std::vector<int> hosted);
  ~ReferenceEngine() override;

  Status begin(std::uint64_t version) override;
  // Live weights take a partial refit as a full one (the batches carry the
  // scope's tensors; the others are not written). Shadow weights first make
  // the arena it lands in hold the served bytes of every tensor outside the
  // scope (reference_engine_partial.cc): copied from the served arena where
  // the landing arena holds another version of them (after one full refit,
  // a job that repeats one scope copies nothing), so the flip serves a
  // whole version.
  Status begin_partial(std::uint64_t version, const RefitScope& scope) override;
  bool takes_partial_refits() const override { return true; }
  Status apply(const AlignedBatch& batch) override;
  Status commit(std::uint64_t version) override;
  void abort(std::uint64_t version, const Status& why) override;
  std::uint64_t weight_version() const override { return version_; }
  bool weights_complete() const override { return complete_; }
  // With releasable_shadow: frees the arena not served (after a commit, it
  // holds the version before the served one) and returns its bytes;
  // acquire_idle() allocates it again (contents undefined: the next refit
  // writes every byte). begin() in between is refused.
  StatusOr<std::uint64_t> release_idle() override;
  Status acquire_idle() override;

  // The bytes of `name` on hosted rank `rank` as served (the active arena),
  // or nullptr.
  const std::byte* weight(int rank, const std::string& name) const;
  std::byte* mutable_weight(int rank, const std::string& name);
  // Where apply() writes `name`: the inactive arena in shadow mode (what a
  // refit's verification reads before the commit), else weight().
  const std::byte* landed_weight(int rank, const std::string& name) const;
  // Runs `pass` with the committed version while no flip (and, without
  // shadow, no apply) can happen: the reads of weight() inside it see one
  // version's arena. Thread-safe.
  void read_active(const std::function<void(std::uint64_t version)>& pass) const;
  // The memory direct mode exposes for hosted rank `rank` (nullptr for
  // another): its arena, or in shadow mode both arenas in one region (arena
  // k at k * shadow_arena_stride), and that region's bytes (releasable_shadow:
  // arena 0 alone).
  std::byte* arena(int rank);
  std::uint64_t arena_bytes(int rank) const;
  // Bytes of weight memory held for every hosted rank: both arenas in
  // shadow mode.
  std::uint64_t weight_memory_bytes() const;
  const ReferenceEngineOptions& options() const { return options_; }
  const std::vector<TensorSpec>& stream(int rank) const { return streams_.at(rank); }
  const std::vector<int>& hosted() const { return hosted_; }
  const ReferenceEngineStats& stats() const { return stats_; }
  // The version the served weights hold of tensor `index` of hosted rank
  // `rank`'s stream: the last committed refit that moved it (partial
  // refits), or weight_version() when not known. Inside read_active (or on
  // the thread that drives the engine).
  std::uint64_t served_version(int rank, std::size_t index) const;

 private:
  struct Arena;  // host or device memory of one hosted rank
  ReferenceEngine(std::vector<std::vector<TensorSpec>> streams, std::vector<int> hosted,
                  ReferenceEngineOptions options, int tag);
  Status allocate();
  Status allocate_arena(Arena& arena) const;

  std::vector<std::vector<TensorSpec>> streams_;
  std::vector<int> hosted_;
  ReferenceEngineOptions options_;
  // arenas_[k][r]: arena k (0, and 1 in shadow mode) of rank r; null for
  // ranks hosted elsewhere. Readers read arena active_, apply() writes
  // arena landing().
  std::vector<std::unique_ptr<Arena>> arenas_[2];
  int active_ = 0;  // written under flip_mu_ held exclusively
  mutable std::shared_mutex flip_mu_;
  // Taken by a writer before flip_mu_, and passed through by every reader
  // before it: a stream of readers cannot starve a flip.
  mutable std::mutex flip_gate_;
  std::unique_lock<std::shared_mutex> exclude_readers() const;
  int landing() const { return options_.shadow ? 1 - active_ : active_; }
  const std::byte* weight_in(int arena, int rank, const std::string& name) const;
  // offsets_[r][name] into rank r's arena (hosted ranks). Hashed: apply()
  // looks up every tensor of every batch (a MoE refit has ~10,000).
  std::vector<std::unordered_map<std::string, std::uint64_t>> offsets_;
  std::vector<std::unordered_map<std::string, const TensorSpec*>> shapes_;
  std::uint64_t version_ = 0;
  std::uint64_t pending_version_ = 0;
  bool in_refit_ = false;
  bool complete_ = true;
  bool idle_released_ = false;  // release_idle() freed the arena not served
  ReferenceEngineStats stats_;
  // Partial refits (reference_engine_partial.cc): what each arena holds of
  // each tensor of rank r's stream, and the open refit's tensors
  // (versions_[r]; hosted ranks only).
  std::vector<ArenaVersions> versions_;
  Status catch_up_landing(const RefitScope& scope);
  std::byte* arena_data(int k, std::size_t rank);  // arena k of hosted rank `rank`
  // The open refit committed as `version` (before the flip) or aborted (0).
  void note_landed(std::uint64_t version);
  std::unique_ptr<BatchedCopier> copier_;  // device engines only
  std::unique_ptr<CudaStream> stream_;
  // Device engines: batches already validated, with their posts' copies
  // prepared, by batch sequence (at most kPreparedPerSequence each, twice
  // that with shadow weights, whose arenas alternate; a refit repeats the
  // same batches from the same staging slots).
  struct PreparedApply;
  static constexpr std::size_t kPreparedPerSequence = 2;
  std::vector<std::vector<std::unique_ptr<PreparedApply>>> prepared_;
  const PreparedApply* find_prepared(std::uint64_t sequence, const std::vector<const void*>& key) const;
  Status apply_prepared(const PreparedApply& prepared, const std::string& where);
};

}  // namespace refit
