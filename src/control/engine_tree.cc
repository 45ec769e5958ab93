#include "control/engine_tree.h"

#include "control/relay_topology.h"
#include "control/topology.h"

namespace refit {

EngineTree::EngineTree(int engine_ranks, int slots, int fanout)
    : ranks_(static_cast<std::size_t>(engine_ranks)), slots_(slots), fanout_(fanout) {
  const std::size_t count = ranks_ * static_cast<std::size_t>(slots);
  joins_.resize(count);
  setups_.resize(count);
  routes_.resize(count);
  reroutes_.assign(count, std::nullopt);
  live_.assign(static_cast<std::size_t>(slots), false);
}

void EngineTree::start(const std::vector<Join>& joins, const std::vector<Setup>& setups) {
  for (std::size_t g = 0; g < joins.size() && g < joins_.size(); ++g) {
    joins_[g] = joins[g];
    setups_[g] = setups[g];
    routes_[g] = Route{setups[g].feeders, setups[g].relay};
    live_[g / ranks_] = true;
  }
}

Status EngineTree::check_joiner(std::uint64_t engine, const std::vector<Join>& joins) const {
  if (engine < root_) {
    return FailedPrecondition("engine " + std::to_string(engine) + " cannot join below engine " +
                              std::to_string(root_) + ", which the trainers feed now: join as a higher engine number");
  }
  const std::vector<Join> first(joins_.begin(), joins_.begin() + static_cast<std::ptrdiff_t>(ranks_));
  RETURN_IF_ERROR(check_relay_engine(first, joins, slots_));
  std::vector<bool> live = live_;
  live[engine] = true;
  const std::uint64_t parent = live_relay_parent(live, engine, static_cast<std::uint64_t>(fanout_));
  for (std::size_t r = 0; r < ranks_; ++r) {
    const Join& feeder = joins_[parent * ranks_ + r];
    if (feeder.catch_up) continue;
    return FailedPrecondition(join_name(joins[r], slots_) + " would first receive the committed weights from " +
                              join_name(feeder, slots_) + ", which cannot read them back (a Python engine "
                              "without host tensors)");
  }
  return Status::Ok();
}

std::vector<Setup> EngineTree::admit(std::uint64_t engine, const std::vector<Join>& joins) {
  live_[engine] = true;
  for (std::size_t r = 0; r < ranks_; ++r) joins_[engine * ranks_ + r] = joins[r];
  replan();
  std::vector<Setup> out;
  for (std::size_t r = 0; r < ranks_; ++r) {
    const std::size_t g = engine * ranks_ + r;
    Setup setup = setups_[r];  // engine 0's rank r: the same stream, seed and schedule
    setup.parts.clear();       // one relay feeder writes whole buckets
    setup.engine = engine;
    setup.feeders = routes_[g].feeders;
    setup.relay = routes_[g].relay;
    reroutes_[g].reset();  // its setup carries its route
    setups_[g] = setup;
    out.push_back(std::move(setup));
  }
  return out;
}

void EngineTree::drop(std::uint64_t engine) {
  live_[engine] = false;
  replan();
}

void EngineTree::replan() {
  for (std::uint64_t k = 0; k < live_.size(); ++k) {
    if (!live_[k]) continue;
    root_moved_ = root_moved_ || k != root_;
    root_ = k;
    break;
  }
  const std::vector<Route> routes =
      relay_routes(joins_, static_cast<int>(ranks_), static_cast<std::uint64_t>(fanout_), live_, setups_);
  for (std::size_t g = 0; g < routes.size(); ++g) {
    if (!live_[g / ranks_] || routes[g] == routes_[g]) continue;
    routes_[g] = routes[g];
    reroutes_[g] = routes[g];
  }
}

CoordinatorMessage EngineTree::routed(const CoordinatorMessage& message, std::size_t g) const {
  const auto* relink = std::get_if<Relink>(&message);
  if (relink == nullptr || g >= reroutes_.size() || !reroutes_[g]) return message;
  return CoordinatorMessage(Relink{relink->version, reroutes_[g]});
}

std::optional<EngineTarget> EngineTree::moved_root(std::uint64_t engine_rank) const {
  if (!root_moved_ || engine_rank >= ranks_) return std::nullopt;
  const Join& join = joins_[root_ * ranks_ + engine_rank];
  EngineTarget target;
  target.engine_rank = engine_rank;
  target.engine = root_;
  target.address = join.data_address;
  target.descriptor = join.descriptor;
  target.device = join.device;
  return target;
}

std::vector<std::pair<std::uint64_t, std::optional<std::uint64_t>>> EngineTree::live_tree() const {
  std::vector<std::pair<std::uint64_t, std::optional<std::uint64_t>>> out;
  for (std::uint64_t k = 0; k < live_.size(); ++k) {
    if (!live_[k]) continue;
    if (k == root_) {
      out.emplace_back(k, std::nullopt);
    } else {
      out.emplace_back(k, live_relay_parent(live_, k, static_cast<std::uint64_t>(fanout_)));
    }
  }
  return out;
}

void EngineTree::relinked() {
  reroutes_.assign(reroutes_.size(), std::nullopt);
  root_moved_ = false;
}

}  // namespace refit
