// See refit/shadow_engine.h.
#include "refit/shadow_engine.h"

namespace refit {

ShadowEngine::ShadowEngine(int rank, std::vector<TensorSpec> stream, MemoryKind memory, int device)
    : copies_(rank, stream, memory, device), stream_(std::move(stream)) {}

StatusOr<std::unique_ptr<ShadowEngine>> ShadowEngine::Create(int rank, std::vector<TensorSpec> stream,
                                                             MemoryKind memory, int device) {
  std::unique_ptr<ShadowEngine> engine(new ShadowEngine(rank, std::move(stream), memory, device));
  ASSIGN_OR_RETURN(auto pair, WeightArena::AllocatePair(engine->stream_, memory, device));
  engine->arenas_[0] = std::move(pair[0]);
  engine->arenas_[1] = std::move(pair[1]);
  return engine;
}

Status ShadowEngine::begin(std::uint64_t version) {
  std::vector<std::byte*> targets;
  targets.reserve(stream_.size());
  for (std::size_t i = 0; i < stream_.size(); ++i) targets.push_back(landing()->tensor(i));
  RETURN_IF_ERROR(copies_.set_targets(std::move(targets)));
  return copies_.begin(version);
}

Status ShadowEngine::apply(const AlignedBatch& batch) { return copies_.apply(batch); }

Status ShadowEngine::commit(std::uint64_t version) {
  RETURN_IF_ERROR(copies_.commit(version));
  served_ = 1 - served_;
  return on_flip_ ? on_flip_(version) : Status::Ok();
}

void ShadowEngine::abort(std::uint64_t version, const Status& why) { copies_.abort(version, why); }

}  // namespace refit
