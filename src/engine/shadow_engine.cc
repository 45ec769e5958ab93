// See refit/shadow_engine.h.
#include "refit/shadow_engine.h"

#include <algorithm>
#include <cstring>

#include "refit/device_memory.h"

namespace refit {

ShadowEngine::ShadowEngine(int rank, std::vector<TensorSpec> stream, MemoryKind memory, int device,
                           ShadowArenas arenas)
    : copies_(rank, stream, memory, device), stream_(std::move(stream)), memory_(memory), device_(device),
      layout_(arenas), versions_(stream_.size()) {}

StatusOr<std::unique_ptr<ShadowEngine>> ShadowEngine::Create(int rank, std::vector<TensorSpec> stream,
                                                             MemoryKind memory, int device, ShadowArenas arenas) {
  std::unique_ptr<ShadowEngine> engine(new ShadowEngine(rank, std::move(stream), memory, device, arenas));
  if (arenas == ShadowArenas::kOneRegion) {
    ASSIGN_OR_RETURN(auto pair, WeightArena::AllocatePair(engine->stream_, memory, device));
    engine->arenas_[0] = std::move(pair[0]);
    engine->arenas_[1] = std::move(pair[1]);
  } else {
    for (auto& arena : engine->arenas_) {
      ASSIGN_OR_RETURN(arena, WeightArena::Allocate(engine->stream_, memory, device));
    }
  }
  return engine;
}

StatusOr<std::uint64_t> ShadowEngine::release_idle() {
  if (layout_ != ShadowArenas::kSeparate || released_) return std::uint64_t{0};
  const std::uint64_t bytes = landing()->bytes();
  arenas_[1 - served_].reset();
  versions_.forget(1 - served_);
  released_ = true;
  return bytes;
}

Status ShadowEngine::acquire_idle() {
  if (!released_) return Status::Ok();
  ASSIGN_OR_RETURN(arenas_[1 - served_], WeightArena::Allocate(stream_, memory_, device_));
  released_ = false;
  return Status::Ok();
}

Status ShadowEngine::begin(std::uint64_t version) {
  if (released_) {
    return FailedPrecondition("shadow engine: begin(" + std::to_string(version) +
                              ") while the arena not served is released (acquire_idle() first)");
  }
  std::vector<std::byte*> targets;
  targets.reserve(stream_.size());
  for (std::size_t i = 0; i < stream_.size(); ++i) targets.push_back(landing()->tensor(i));
  RETURN_IF_ERROR(copies_.set_targets(std::move(targets)));
  versions_.open({});  // every tensor (begin_partial says otherwise)
  return copies_.begin(version);
}

Status ShadowEngine::begin_partial(std::uint64_t version, const RefitScope& scope) {
  ASSIGN_OR_RETURN(std::vector<bool> moving, select_tensors(scope, stream_));
  RETURN_IF_ERROR(begin(version));
  versions_.open(std::move(moving));
  return catch_up_landing(version);
}

Status ShadowEngine::catch_up_landing(std::uint64_t version) {
  const int to = 1 - served_;
  for (std::size_t i = 0; i < stream_.size(); ++i) {
    if (!versions_.stale(to, served_, i)) continue;
    const std::uint64_t bytes = stream_[i].nbytes();
    if (memory_ == MemoryKind::kCuda) {
      RETURN_IF_ERROR(copy_device_to_device(landing()->tensor(i), served()->tensor(i), bytes)
                          .WithContext("shadow engine: partial refit " + std::to_string(version) + ", copying '" +
                                       stream_[i].name + "' into the arena it lands in"));
    } else {
      std::memcpy(landing()->tensor(i), served()->tensor(i), bytes);
    }
    versions_.copied(to, served_, i);
    catch_up_bytes_ += bytes;
  }
  return Status::Ok();
}

Status ShadowEngine::apply(const AlignedBatch& batch) { return copies_.apply(batch); }

Status ShadowEngine::commit(std::uint64_t version) {
  RETURN_IF_ERROR(copies_.commit(version));
  versions_.landed(1 - served_, version);
  served_ = 1 - served_;
  return on_flip_ ? on_flip_(version) : Status::Ok();
}

void ShadowEngine::abort(std::uint64_t version, const Status& why) {
  versions_.landed(1 - served_, 0);
  copies_.abort(version, why);
}

}  // namespace refit
