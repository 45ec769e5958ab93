// EngineTree: the coordinator's view of a job's engines (many engines,
// issue 18; coordinator.cc is its only user): every engine slot's joins and
// setups (engine k's rank r at k * R + r, up to --max-engines slots), which
// engines are live, each engine rank's route in the relay tree of the live
// engines (relay_topology.h), and the routes the next relink carries to the
// ranks whose route changed since the last one.
//
// Thread safety: none; the coordinator's thread.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "control/protocol.h"
#include "refit/status.h"

namespace refit {

class EngineTree {
 public:
  // `engine_ranks`: R; `slots`: --max-engines; `fanout`: --relay-fanout.
  EngineTree(int engine_ranks, int slots, int fanout);

  // After setup: the joins and setups of the engines that joined it
  // (engines 0..E-1, by k * R + r); they are live.
  void start(const std::vector<Join>& joins, const std::vector<Setup>& setups);

  // Whether engine `engine`'s ranks (`joins`, by rank) may join the running
  // job: the same settings and plan as engine 0's (check_relay_engine), and
  // a parent that can send them its committed weights (Join::catch_up).
  // kFailedPrecondition naming the rank and the reason otherwise.
  Status check_joiner(std::uint64_t engine, const std::vector<Join>& joins) const;
  // Engine `engine` (checked) becomes live: its ranks' Setups, by rank (as
  // engine 0's, with their place in the tree); the ranks whose route changed
  // get theirs with the next relink.
  std::vector<Setup> admit(std::uint64_t engine, const std::vector<Join>& joins);
  // Engine `engine` left the job: the tree is planned again without it.
  void drop(std::uint64_t engine);

  // `message` as engine rank g (k * R + r) gets it: a relink carries its
  // new route when the tree changed since the last relink.
  CoordinatorMessage routed(const CoordinatorMessage& message, std::size_t g) const;
  // The root (the lowest live engine, which the trainer ranks feed) changed
  // since the last relink: the root's rank `engine_rank`, which a trainer
  // rank feeding that rank links to from now on; nullopt otherwise.
  std::optional<EngineTarget> moved_root(std::uint64_t engine_rank) const;
  std::uint64_t root() const { return root_; }
  // The tree of the live engines now: each live engine and its parent
  // (none: the root, fed by the trainer ranks), in engine order.
  std::vector<std::pair<std::uint64_t, std::optional<std::uint64_t>>> live_tree() const;
  // A relink went out: every changed route was sent.
  void relinked();

 private:
  void replan();
  std::size_t ranks_;
  int slots_, fanout_;
  std::vector<Join> joins_;    // by k * R + r; empty slots default
  std::vector<Setup> setups_;  // engine 0's as at setup, the others' as last sent
  std::vector<bool> live_;     // by engine
  std::vector<Route> routes_;  // by k * R + r
  std::vector<std::optional<Route>> reroutes_;
  std::uint64_t root_ = 0;
  bool root_moved_ = false;  // since the last relink
};

}  // namespace refit
