// See refit/target_engine.h.
#include "refit/target_engine.h"

#include <cstring>
#include <new>

#include "cuda/batched_copy.h"
#include "cuda/device.h"
#include "refit/plan.h"

namespace refit {

// ---- WeightArena ------------------------------------------------------------

// An arena of `stream` owning `copies` arenas' bytes (zeroed) from data_.
StatusOr<std::shared_ptr<WeightArena>> WeightArena::Own(const std::vector<TensorSpec>& stream, MemoryKind memory,
                                                        int device, int copies) {
  std::shared_ptr<WeightArena> arena(new WeightArena());
  arena->offsets_ = weight_arena_offsets(stream, &arena->bytes_);
  arena->memory_ = memory;
  arena->device_ = memory == MemoryKind::kCuda ? device : -1;
  const std::uint64_t bytes = static_cast<std::uint64_t>(copies) * arena->bytes_;
  if (memory == MemoryKind::kCuda) {
    ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(device, bytes));
    arena->device_buffer_ = std::make_unique<DeviceBuffer>(std::move(buffer));
    arena->data_ = arena->device_buffer_->data();
  } else if (bytes != 0) {
    arena->data_ = static_cast<std::byte*>(::operator new(bytes, std::align_val_t(kPlanAlignment), std::nothrow));
    if (arena->data_ == nullptr) {
      return ResourceExhausted("cannot allocate a host weight arena of " + std::to_string(bytes) + " bytes");
    }
    std::memset(arena->data_, 0, bytes);
  }
  return arena;
}

StatusOr<std::shared_ptr<WeightArena>> WeightArena::Allocate(const std::vector<TensorSpec>& stream, MemoryKind memory,
                                                              int device) {
  return Own(stream, memory, device, 1);
}

StatusOr<std::array<std::shared_ptr<WeightArena>, 2>> WeightArena::AllocatePair(const std::vector<TensorSpec>& stream,
                                                                                  MemoryKind memory, int device) {
  std::array<std::shared_ptr<WeightArena>, 2> pair;
  ASSIGN_OR_RETURN(pair[0], Own(stream, memory, device, 2));
  pair[1] = std::shared_ptr<WeightArena>(new WeightArena());
  pair[1]->offsets_ = pair[0]->offsets_;
  pair[1]->bytes_ = pair[0]->bytes_;
  pair[1]->memory_ = pair[0]->memory_;
  pair[1]->device_ = pair[0]->device_;
  pair[1]->data_ = pair[0]->data_ + pair[0]->bytes_;
  pair[1]->owner_ = pair[0];
  return pair;
}

WeightArena::~WeightArena() {
  if (owner_ == nullptr && memory_ == MemoryKind::kHost && data_ != nullptr) {
    ::operator delete(data_, std::align_val_t(kPlanAlignment));
  }
}

// ---- TargetEngine ------------------------------------------------------------

struct TargetEngine::DeviceCopies {
  BatchedCopier copier;
  CudaStream stream;
  std::vector<CopyRun> runs;
};

TargetEngine::TargetEngine(int rank, std::vector<TensorSpec> stream, MemoryKind memory, int device)
    : rank_(rank), stream_(std::move(stream)), memory_(memory), device_(device) {
  for (std::size_t i = 0; i < stream_.size(); ++i) index_[stream_[i].name] = i;
}

TargetEngine::~TargetEngine() = default;

Status TargetEngine::set_targets(std::vector<std::byte*> targets) {
  if (targets.size() != stream_.size()) {
    return Internal("engine: " + std::to_string(targets.size()) + " copy targets for " +
                    std::to_string(stream_.size()) + " tensors");
  }
  targets_ = std::move(targets);
  if (memory_ == MemoryKind::kCuda && !device_copies_) {
    ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(device_));
    ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(device_));
    device_copies_ = std::unique_ptr<DeviceCopies>(new DeviceCopies{std::move(copier), std::move(stream), {}});
  }
  return Status::Ok();
}

Status TargetEngine::begin(std::uint64_t version) {
  if (in_refit_) return FailedPrecondition("engine: begin(" + std::to_string(version) + ") while a refit is open");
  if (version <= version_) {
    return FailedPrecondition("engine: refit " + std::to_string(version) +
                              " does not advance the committed weight version " + std::to_string(version_));
  }
  in_refit_ = true;
  return Status::Ok();
}

Status TargetEngine::apply(const AlignedBatch& batch) {
  const std::string where = "engine rank " + std::to_string(rank_) + ", aligned batch " + std::to_string(batch.sequence);
  if (!in_refit_) return FailedPrecondition(where + " applied outside begin()..commit()");
  if (rank_ < 0 || static_cast<std::size_t>(rank_) >= batch.payload.size() ||
      batch.payload[static_cast<std::size_t>(rank_)].size() != batch.specs.size()) {
    return Internal(where + ": no payload for this rank");
  }
  if (!loader_ && targets_.empty()) {
    return FailedPrecondition(where + ": nothing to apply it with (no load_fn and no registered tensors)");
  }
  const std::vector<refit::TensorView>& payload = batch.payload[static_cast<std::size_t>(rank_)];  // rule 8
  for (const AlignedBatch::DTypeGroup& group : batch.groups()) {  // rule 5: one post per dtype group
    std::vector<refit::TensorView> views;
    views.reserve(group.indices.size());
    for (std::size_t i : group.indices) {
      const refit::TensorView& v = payload[i];
      if (v.spec == nullptr || v.data == nullptr) {
        return Internal(where + ": tensor " + std::to_string(i) + " of this rank's payload has no bytes");
      }
      if (v.spec->dtype != group.dtype) {
        return Internal(where + ": tensor '" + v.spec->name + "' is " + std::string(dtype_name(v.spec->dtype)) +
                        " in the " + std::string(dtype_name(group.dtype)) + " group");
      }
      views.push_back(v);
    }
    if (loader_) {
      RETURN_IF_ERROR(loader_(group.dtype, views));
    } else {
      RETURN_IF_ERROR(copy_group(batch, group).WithContext(where));
    }
    ++posts_;
    tensors_ += views.size();
  }
  return Status::Ok();
}

Status TargetEngine::copy_group(const AlignedBatch& batch, const AlignedBatch::DTypeGroup& group) {
  const std::vector<refit::TensorView>& payload = batch.payload[static_cast<std::size_t>(rank_)];
  std::vector<CopyRun>* runs = device_copies_ ? &device_copies_->runs : nullptr;
  if (runs) runs->clear();
  for (std::size_t i : group.indices) {
    const refit::TensorView& v = payload[i];
    auto it = index_.find(v.spec->name);
    if (it == index_.end()) return Internal("tensor '" + v.spec->name + "' is not in this rank's stream");
    const TensorSpec& own = stream_[it->second];
    if (own.nbytes() != v.spec->nbytes()) {
      return FailedPrecondition("tensor '" + v.spec->name + "' arrived as " + v.spec->ToString() +
                                " but the registered tensor is " + own.ToString());
    }
    if (memory_ == MemoryKind::kCuda) {
      runs->push_back(copy_run_1d(v.data, targets_[it->second], own.nbytes()));
    } else if (own.nbytes() != 0) {
      std::memcpy(targets_[it->second], v.data, own.nbytes());
    }
  }
  if (memory_ == MemoryKind::kCuda && !runs->empty()) {
    // Finished before apply returns: the receiver may recycle the slots it read.
    RETURN_IF_ERROR(device_copies_->copier.copy(*runs, device_copies_->stream.handle()));
    RETURN_IF_ERROR(device_copies_->stream.synchronize());
  }
  return Status::Ok();
}

Status TargetEngine::commit(std::uint64_t version) {
  if (!in_refit_) return FailedPrecondition("engine: commit(" + std::to_string(version) + ") without begin()");
  in_refit_ = false;
  version_ = version;  // DESIGN.md rule 6: once per refit, only here
  complete_ = true;
  return Status::Ok();
}

void TargetEngine::abort(std::uint64_t, const Status&) {
  in_refit_ = false;
  complete_ = false;
}

}  // namespace refit
