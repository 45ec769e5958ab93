// ShadowEngine: shadow weights for a server that holds refit's arenas (the
// Python binding's refit.Engine(shadow=True); a C++ server can use it as is).
//
// Two WeightArenas (target_engine.h) of the engine rank's stream, in one
// allocation (region(); ShadowArenas::kOneRegion, what direct mode exposes)
// or two (kSeparate, staged mode: release_idle() frees the one not served
// between refits of a colocated job, acquire_idle() allocates it again).
// One is served (`served()`); each refit lands in the other: staged, a TargetEngine in copy mode underneath copies into it;
// direct, the trainers write it. commit(v) makes that one the served arena
// and then calls the flip hook with v. A refit that aborts leaves the served
// arena untouched and whole: weights_complete() stays true, and the next
// refit overwrites the landing arena whole (a staged refit writes every
// byte of the stream). weight_version() is the served arena's version: it
// changes exactly at the flip.
//
// The flip, as a server sees it: the served arena changes inside commit(),
// and the old one is written again only by the next refit's begin(), so a
// reader still on the old arena is safe until the server's engine thread
// starts the next refit. The server adopts served() in the flip hook (for
// example under the lock its forward pass takes) and must not read the old
// arena after it starts the next refit.
//
// A partial refit (begin_partial, refit/partial.h) lands in the arena not
// served like any other, after the tensors outside its scope were copied
// into it from the served arena where it held another version of them (it
// knows which version each arena holds of each tensor), so the flip serves
// a whole version; a job that repeats one scope copies nothing after the
// first time.
//
// Thread safety: one thread drives it (the engine rank's), as any Engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "refit/arena_versions.h"
#include "refit/engine.h"
#include "refit/status.h"
#include "refit/target_engine.h"
#include "refit/tensor.h"

namespace refit {

enum class ShadowArenas { kOneRegion, kSeparate };

class ShadowEngine : public Engine {
 public:
  // Called inside commit(v), after the flip: served() holds version v.
  using FlipHook = std::function<Status(std::uint64_t version)>;

  // `rank`: the engine TP rank; `stream`: its shard specs; both arenas on
  // `memory` (device `device`), zero-filled.
  static StatusOr<std::unique_ptr<ShadowEngine>> Create(int rank, std::vector<TensorSpec> stream, MemoryKind memory,
                                                        int device, ShadowArenas arenas = ShadowArenas::kOneRegion);

  void set_flip_hook(FlipHook hook) { on_flip_ = std::move(hook); }

  Status begin(std::uint64_t version) override;
  Status begin_partial(std::uint64_t version, const RefitScope& scope) override;
  bool takes_partial_refits() const override { return true; }
  Status apply(const AlignedBatch& batch) override;
  Status commit(std::uint64_t version) override;
  void abort(std::uint64_t version, const Status& why) override;
  std::uint64_t weight_version() const override { return copies_.weight_version(); }
  bool weights_complete() const override { return true; }  // the served arena is never written
  // kSeparate: drops the arena not served (views a server still holds keep
  // it alive until they go) and returns its bytes; begin() is refused until
  // acquire_idle() allocated a fresh one. kOneRegion: nothing (0).
  StatusOr<std::uint64_t> release_idle() override;
  Status acquire_idle() override;

  // The arena served now, and the one the next refit lands in (null while
  // released).
  const std::shared_ptr<WeightArena>& served() const { return arenas_[served_]; }
  const std::shared_ptr<WeightArena>& landing() const { return arenas_[1 - served_]; }
  // Both arenas' bytes (what shadow weights cost).
  std::uint64_t weight_memory_bytes() const { return 2 * served()->bytes(); }
  // Direct mode: both arenas as one region (arena 1 at shadow_arena_stride),
  // what the engine rank exposes; the trainers write the arena each start
  // names, which is landing() (arena 1 before the first commit).
  std::byte* region() const { return arenas_[0]->data(); }
  std::uint64_t region_bytes() const { return weight_memory_bytes(); }
  std::uint64_t posts() const { return copies_.posts(); }
  // Partial refits: bytes copied from the served arena into the landing one.
  std::uint64_t catch_up_bytes() const { return catch_up_bytes_; }

 private:
  ShadowEngine(int rank, std::vector<TensorSpec> stream, MemoryKind memory, int device, ShadowArenas arenas);

  TargetEngine copies_;  // copy mode into landing()
  std::vector<TensorSpec> stream_;
  MemoryKind memory_;
  int device_;
  ShadowArenas layout_;
  bool released_ = false;  // release_idle() dropped landing()
  std::shared_ptr<WeightArena> arenas_[2];
  int served_ = 0;
  FlipHook on_flip_;
  ArenaVersions versions_;  // what each arena holds of each tensor (partial refits)
  std::uint64_t catch_up_bytes_ = 0;
  Status catch_up_landing(std::uint64_t version);
};

}  // namespace refit
