// ArenaVersions: which version each of an engine's two weight arenas holds
// of each tensor of one stream, for partial refits into shadow weights
// (refit/partial.h; the ReferenceEngine and the ShadowEngine keep one per
// stream, and a C++ server with shadow weights can too).
//
// A refit opens with the tensors it moves; before a partial refit lands in
// an arena, every tensor it does not move that the arena holds at another
// version than the served arena (or at one not known) must be copied in
// (stale); once it lands, the moved tensors hold its version there (or, if
// it aborted, a version not known). Version 0 means not known: a fresh or
// released arena.
//
// Thread safety: none; the engine's thread (readers of held() hold the
// engine's readers out of its commit).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace refit {

class ArenaVersions {
 public:
  explicit ArenaVersions(std::size_t tensors = 0) {
    for (auto& held : held_) held.assign(tensors, 0);
  }

  // A refit opens, moving the tensors `moving` marks (empty: every tensor).
  void open(std::vector<bool> moving) { moving_ = std::move(moving); }
  bool moves(std::size_t i) const { return moving_.empty() || moving_[i]; }
  // Tensor i must be copied from arena `served` into `landing` before the
  // open refit lands there: it does not move it, and `landing` holds
  // another version of it than `served` (or one not known).
  bool stale(int landing, int served, std::size_t i) const {
    return !moves(i) && (held_[served][i] == 0 || held_[landing][i] != held_[served][i]);
  }
  // Tensor i was copied from `served` into `landing`.
  void copied(int landing, int served, std::size_t i) { held_[landing][i] = held_[served][i]; }
  // The open refit landed in `arena` as `version` (0: it aborted, and what
  // it wrote there is not known).
  void landed(int arena, std::uint64_t version) {
    for (std::size_t i = 0; i < held_[arena].size(); ++i) {
      if (moves(i)) held_[arena][i] = version;
    }
  }
  // `arena` holds nothing known (released, or allocated again).
  void forget(int arena) { std::fill(held_[arena].begin(), held_[arena].end(), 0); }
  // The version `arena` holds of tensor i (0: not known).
  std::uint64_t held(int arena, std::size_t i) const { return i < held_[arena].size() ? held_[arena][i] : 0; }

 private:
  std::vector<std::uint64_t> held_[2];
  std::vector<bool> moving_;
};

}  // namespace refit
