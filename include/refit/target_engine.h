// TargetEngine: an Engine (engine.h) for one engine rank whose weights live
// in the caller's own tensors, applying aligned batches in one of three ways.
// The Python binding's refit.Engine is one; a C++ server can use it as is.
//
//   loader  apply() hands each dtype group of this rank's payload to a Loader
//           (the binding wraps the user's load_fn in one): one post per dtype
//           group (DESIGN.md rule 5), payload[rank] only (rule 8).
//   copy    apply() copies each tensor into a registered destination
//           (the caller's tensors): memcpy on the host, one BatchedCopier
//           launch per dtype group on a device, finished before apply returns.
//   direct  trainers write into the WeightArena themselves; apply() is never
//           called (the engine rank only waits for the buckets to land).
//
// begin/commit/abort keep the weight version (rule 6: bumped once per refit,
// at commit); after an abort the weights are reported incomplete.
//
// Thread safety: one thread (the engine rank's) drives it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "refit/engine.h"
#include "refit/reference_engine.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

class DeviceBuffer;  // src/cuda/device.h

// The weights of one engine rank in one block, laid out by
// weight_arena_offsets(stream) (reference_engine.h), so that it can be exposed whole
// for direct mode. Host memory (kPlanAlignment-aligned) or device memory on
// one local CUDA device. Shared by every view handed out, so it lives until
// the last tensor made from a view is gone.
class WeightArena {
 public:
  static StatusOr<std::shared_ptr<WeightArena>> Allocate(const std::vector<TensorSpec>& stream, MemoryKind memory,
                                                         int device);
  // Two arenas of `stream` in one allocation, the second right after the
  // first (at shadow_arena_stride: shadow weights in direct mode expose
  // both as one region); the second keeps the first alive.
  static StatusOr<std::array<std::shared_ptr<WeightArena>, 2>> AllocatePair(const std::vector<TensorSpec>& stream,
                                                                             MemoryKind memory, int device);
  ~WeightArena();
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;

  std::byte* data() const { return data_; }
  std::uint64_t bytes() const { return bytes_; }
  MemoryKind memory() const { return memory_; }
  int device() const { return device_; }
  // Tensor i of the stream.
  std::byte* tensor(std::size_t i) const { return data_ + offsets_[i]; }

 private:
  WeightArena() = default;
  static StatusOr<std::shared_ptr<WeightArena>> Own(const std::vector<TensorSpec>& stream, MemoryKind memory,
                                                    int device, int copies);
  std::vector<std::uint64_t> offsets_;
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
  MemoryKind memory_ = MemoryKind::kHost;
  int device_ = -1;
  std::unique_ptr<DeviceBuffer> device_buffer_;
  std::shared_ptr<WeightArena> owner_;  // AllocatePair's second arena: the arena that owns its memory
};

class TargetEngine : public Engine {
 public:
  // Receives one dtype group of this rank's payload (views valid during the call).
  using Loader = std::function<Status(DType dtype, const std::vector<refit::TensorView>& views)>;

  // `rank`: the engine TP rank this process hosts; `stream`: its shard specs.
  TargetEngine(int rank, std::vector<TensorSpec> stream, MemoryKind memory, int device);
  ~TargetEngine() override;

  // Copy mode: destination of each stream tensor, in stream order (the same
  // memory kind and device as the engine). Allocates the device copier.
  Status set_targets(std::vector<std::byte*> targets);
  // Loader mode for the refits to come (empty: copy mode, or direct mode).
  void set_loader(Loader loader) { loader_ = std::move(loader); }

  Status begin(std::uint64_t version) override;
  // The batches carry the scope's tensors, copied or loaded as they come.
  Status begin_partial(std::uint64_t version, const RefitScope&) override { return begin(version); }
  bool takes_partial_refits() const override { return true; }
  Status apply(const AlignedBatch& batch) override;
  Status commit(std::uint64_t version) override;
  void abort(std::uint64_t version, const Status& why) override;
  std::uint64_t weight_version() const override { return version_; }
  bool weights_complete() const override { return complete_; }

  // Dtype groups handed to the loader or copied (one per group per batch), and tensors.
  std::uint64_t posts() const { return posts_; }
  std::uint64_t tensors_applied() const { return tensors_; }

 private:
  Status copy_group(const AlignedBatch& batch, const AlignedBatch::DTypeGroup& group);

  int rank_;
  std::vector<TensorSpec> stream_;
  std::map<std::string, std::size_t> index_;  // name -> position in stream_
  MemoryKind memory_;
  int device_;
  Loader loader_;
  std::vector<std::byte*> targets_;
  struct DeviceCopies;  // copy mode on a device: the copier, its stream, the runs of a post
  std::unique_ptr<DeviceCopies> device_copies_;
  std::uint64_t version_ = 0;
  bool in_refit_ = false;
  bool complete_ = true;
  std::uint64_t posts_ = 0, tensors_ = 0;
};

}  // namespace refit
