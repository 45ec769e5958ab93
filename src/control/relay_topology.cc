#include "control/relay_topology.h"

#include <algorithm>

#include "control/spec_diff.h"

namespace refit {
namespace {

std::string quoted(const std::string& s) { return "\"" + s + "\""; }
std::string flag(bool on, const char* name) { return on ? std::string(name) : std::string("no ") + name; }

// The first setting in which `other` (engine k's rank r) differs from
// `first` (engine 0's rank r), as "<field> differs: <first> has A, <other>
// has B"; "" when they agree.
std::string setting_difference(const Join& first, const Join& other, int engines) {
  const std::string a = join_name(first, engines), b = join_name(other, engines);
  auto differs = [&](const char* field, const std::string& x, const std::string& y) {
    return std::string(field) + " differs: " + a + " has " + x + ", " + b + " has " + y;
  };
  if (other.device != first.device) return differs("device", quoted(first.device), quoted(other.device));
  if (other.mode != first.mode) return differs("mode", quoted(first.mode), quoted(other.mode));
  if (other.transport != first.transport) return differs("transport", quoted(first.transport), quoted(other.transport));
  if (other.bucket_size != first.bucket_size) {
    return differs("bucket_size", std::to_string(first.bucket_size), std::to_string(other.bucket_size));
  }
  if (other.trainer_ranks != first.trainer_ranks) {
    return differs("trainer_ranks", std::to_string(first.trainer_ranks), std::to_string(other.trainer_ranks));
  }
  if (other.engine_ranks != first.engine_ranks) {
    return differs("engine_ranks", std::to_string(first.engine_ranks), std::to_string(other.engine_ranks));
  }
  if (other.change != first.change) {
    return differs("change_fraction", std::to_string(first.change) + "/2^32", std::to_string(other.change) + "/2^32");
  }
  if (other.delta != first.delta) return differs("delta", flag(first.delta, "--delta"), flag(other.delta, "--delta"));
  if (other.shadow != first.shadow) {
    return differs("shadow", flag(first.shadow, "--shadow"), flag(other.shadow, "--shadow"));
  }
  if (other.quantize != first.quantize) return differs("quantize", quoted(first.quantize), quoted(other.quantize));
  if (other.plan_digest != first.plan_digest) {
    std::string why = first_spec_difference({a, &first.specs, &first.rules}, {b, &other.specs, &other.rules});
    if (why.empty()) why = "the specs agree: run the same refit build everywhere";
    return differs("plan digest", first.plan_digest, other.plan_digest) + ": " + why;
  }
  return "";
}

// What relays carry today; the first setting they do not, named.
Status check_relayable(const Join& first, bool release_between_refits, int engines, int slots) {
  const std::string why = (slots > engines ? "--max-engines " + std::to_string(slots) : "--engines " +
                           std::to_string(engines)) + " relays landed buckets from engine to engine";
  if (first.mode != "staged") {
    return FailedPrecondition(why + " out of the receive pool, which --mode " + first.mode +
                              " has not: use --mode staged");
  }
  if (first.device != "cpu" && first.transport != "cuda_ipc" && first.transport != "nccl") {
    return FailedPrecondition(why + " between device pools over cuda_ipc and nccl only so far, not --transport " +
                              first.transport + " with --device " + first.device);
  }
  if (release_between_refits) {
    return FailedPrecondition(why + " over links kept from refit to refit: --release-between-refits is not "
                              "supported with more than one engine yet");
  }
  return Status::Ok();
}

}  // namespace

std::uint64_t relay_parent(std::uint64_t engine, std::uint64_t fanout) { return (engine - 1) / fanout; }

std::uint64_t live_relay_parent(const std::vector<bool>& live, std::uint64_t engine, std::uint64_t fanout) {
  std::vector<std::uint64_t> order;  // the live engines, in engine order
  for (std::size_t k = 0; k < live.size(); ++k) {
    if (live[k]) order.push_back(k);
  }
  const auto at = std::find(order.begin(), order.end(), engine);
  if (at == order.begin() || at == order.end()) return 0;
  return order[(static_cast<std::size_t>(at - order.begin()) - 1) / fanout];
}

Status check_relay_engine(const std::vector<Join>& first, const std::vector<Join>& other, int slots) {
  for (std::size_t r = 0; r < first.size() && r < other.size(); ++r) {
    const std::string differs = setting_difference(first[r], other[r], slots);
    if (!differs.empty()) return FailedPrecondition(differs);
    if (other[r].pool_slots < 2) {
      return FailedPrecondition("pool_slots of " + join_name(other[r], slots) + " is " +
                                std::to_string(other[r].pool_slots) +
                                ": the rotating receive pool needs at least 2 slots");
    }
  }
  return Status::Ok();
}

Status plan_relay(const std::vector<Join>& engines, int engine_ranks, std::uint64_t fanout, bool release_between_refits,
                  int slots, Topology& topology) {
  const std::size_t ranks = static_cast<std::size_t>(engine_ranks);
  const std::size_t count = engines.size() / ranks;
  if (slots <= 1) return Status::Ok();
  if (fanout < 1) return InvalidArgument("--relay-fanout must be at least 1, got " + std::to_string(fanout));
  RETURN_IF_ERROR(check_relayable(engines[0], release_between_refits, static_cast<int>(count), slots));
  const std::vector<Join> first(engines.begin(), engines.begin() + static_cast<std::ptrdiff_t>(ranks));
  for (std::size_t k = 1; k < count; ++k) {
    const auto at = engines.begin() + static_cast<std::ptrdiff_t>(k * ranks);
    RETURN_IF_ERROR(check_relay_engine(first, std::vector<Join>(at, at + static_cast<std::ptrdiff_t>(ranks)), slots));
  }
  topology.engine_setups.resize(engines.size());
  for (std::size_t g = ranks; g < engines.size(); ++g) {
    Setup& setup = topology.engine_setups[g];
    setup = topology.engine_setups[g % ranks];  // the same stream, seed and schedule
    setup.parts.clear();                        // one relay feeder writes whole buckets
    setup.relay.clear();  // engine 0's children; this engine's come after it (k' > k)
    const std::uint64_t k = g / ranks, parent = relay_parent(k, fanout);
    setup.feeders = {relay_feeder(parent)};
    EngineTarget child;
    child.engine_rank = g % ranks;
    child.engine = k;
    child.address = engines[g].data_address;
    child.descriptor = engines[g].descriptor;
    child.device = engines[g].device;
    topology.engine_setups[parent * ranks + g % ranks].relay.push_back(std::move(child));
  }
  for (std::size_t g = 0; g < engines.size(); ++g) {
    topology.engine_setups[g].engines = static_cast<std::uint64_t>(slots);
    topology.engine_setups[g].engine = g / ranks;
  }
  return Status::Ok();
}

std::vector<Route> relay_routes(const std::vector<Join>& engines, int engine_ranks, std::uint64_t fanout,
                                const std::vector<bool>& live, const std::vector<Setup>& setups) {
  const std::size_t ranks = static_cast<std::size_t>(engine_ranks);
  std::vector<Route> routes(engines.size());
  const auto first = std::find(live.begin(), live.end(), true);
  if (first == live.end()) return routes;
  const std::uint64_t root = static_cast<std::uint64_t>(first - live.begin());
  // The root is fed by the trainer ranks, as engine 0 was at setup.
  for (std::size_t r = 0; r < ranks; ++r) {
    routes[root * ranks + r].feeders = setups[r].feeders;
    routes[root * ranks + r].parts = setups[r].parts;  // sharded trainers: who writes each bucket
  }
  for (std::uint64_t k = root + 1; k < live.size(); ++k) {
    if (!live[k]) continue;
    const std::uint64_t parent = live_relay_parent(live, k, fanout);
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::size_t g = k * ranks + r;
      routes[g].feeders = {relay_feeder(parent)};
      EngineTarget child;
      child.engine_rank = r;
      child.engine = k;
      child.address = engines[g].data_address;
      child.descriptor = engines[g].descriptor;
      child.device = engines[g].device;
      routes[parent * ranks + r].relay.push_back(std::move(child));
    }
  }
  return routes;
}

}  // namespace refit
