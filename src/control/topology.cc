#include "control/topology.h"

#include <cstdio>

#include "control/gpu_sharing.h"
#include "control/spec_diff.h"
#include "control/sharded_topology.h"
#include "control/spec_json.h"
#include "aligner/aligner.h"
#include "refit/plan.h"
#include "refit/transfer_defaults.h"
#include "transport/transport.h"

namespace refit {
namespace {

std::string names(const std::vector<std::string>& list) {
  std::string out = "[";
  for (std::size_t i = 0; i < list.size(); ++i) out += (i ? "," : "") + ("\"" + list[i] + "\"");
  return out + "]";
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// Settings every rank must agree on: the first difference from engine rank 0,
// naming the setting, both ranks and both values.
Status check_agreement(const std::vector<Join>& trainers, const std::vector<Join>& engines) {
  const Join& first = engines[0];
  const std::string first_name = rank_name(Role::kEngine, 0);
  for (const auto* group : {&trainers, &engines}) {
    for (const Join& j : *group) {
      const std::string name = rank_name(j.role, j.rank);
      auto differs = [&](const char* field, const std::string& a, const std::string& b) {
        return FailedPrecondition(std::string(field) + " differs: " + first_name + " has " + a + ", " + name +
                                  " has " + b);
      };
      if (j.bucket_size == 0) return FailedPrecondition(name + " joined without 'bucket_size'");
      if (j.transport.empty()) return FailedPrecondition(name + " joined without 'transport'");
      if (j.mode.empty()) return FailedPrecondition(name + " joined without 'mode'");
      if (j.bucket_size != first.bucket_size) {
        return differs("bucket_size", format_bytes(first.bucket_size) + " (" + std::to_string(first.bucket_size) + ")",
                       format_bytes(j.bucket_size) + " (" + std::to_string(j.bucket_size) + ")");
      }
      if (j.transport != first.transport) return differs("transport", quoted(first.transport), quoted(j.transport));
      if (j.mode != first.mode) return differs("mode", quoted(first.mode), quoted(j.mode));
      if (j.trainer_ranks != first.trainer_ranks) {
        return differs("trainer_ranks", std::to_string(first.trainer_ranks), std::to_string(j.trainer_ranks));
      }
      if (j.engine_ranks != first.engine_ranks) {
        return differs("engine_ranks", std::to_string(first.engine_ranks), std::to_string(j.engine_ranks));
      }
      if (j.change != first.change) {  // parts of 2^32, shown as the fraction given
        auto fraction = [](std::uint64_t parts) {
          char text[48];
          std::snprintf(text, sizeof text, "--change-fraction %g", static_cast<double>(parts) / 4294967296.0);
          return std::string(text);
        };
        return differs("change_fraction", fraction(first.change), fraction(j.change));
      }
      if (j.delta != first.delta) {
        return differs("delta", first.delta ? "--delta" : "no --delta", j.delta ? "--delta" : "no --delta");
      }
    }
  }
  // Direct mode writes into whichever arena start names: every engine rank
  // must hold two, or none.
  for (const Join& j : engines) {
    if (first.mode == "direct" && j.shadow != first.shadow) {
      return FailedPrecondition(std::string("shadow differs in direct mode: ") + first_name + " has " +
                                (first.shadow ? "--shadow" : "no --shadow") + ", " + rank_name(j.role, j.rank) +
                                " has " + (j.shadow ? "--shadow" : "no --shadow"));
    }
  }
  if (first.trainer_ranks != trainers.size() || first.engine_ranks != engines.size()) {
    return FailedPrecondition("the ranks were started for " + std::to_string(first.trainer_ranks) + " trainer and " +
                              std::to_string(first.engine_ranks) + " engine ranks, the coordinator for " +
                              std::to_string(trainers.size()) + " and " + std::to_string(engines.size()));
  }
  return Status::Ok();
}

// Why trainer `t` and engine `e` computed different plans of e's stream:
// the first tensor that differs (spec_diff.h) when t sent its specs, with
// each side's shard rule when both sent rules; else, or when the specs
// agree, the settings to compare.
std::string why_digests_differ(const Join& t, const Join& e) {
  const std::string tn = rank_name(Role::kTrainer, t.rank), en = rank_name(Role::kEngine, e.rank);
  if (t.specs.empty()) {
    return "the two sides disagree on the tensor specs; compare the --model, --layers and --rule of " + tn +
           " and " + en;
  }
  const std::string diff = first_spec_difference({tn, &t.specs, &t.rules}, {en, &e.specs, &e.rules});
  if (!diff.empty()) return diff;
  return "the tensor specs agree, so the two refit builds plan differently; run the same refit build everywhere";
}

// Bytes per receive pool slot of engine `e`: its plan's largest bucket
// (pool_slot_bytes), as the engine allocated it.
StatusOr<std::uint64_t> engine_slot_bytes(const Join& e) {
  const std::string name = rank_name(Role::kEngine, e.rank);
  RETURN_IF_ERROR(check_plan_bounds(e.specs, e.bucket_size, name));
  auto plan = make_plan(e.specs, e.bucket_size);
  if (!plan.ok()) return plan.status().WithContext(name);
  return pool_slot_bytes(*plan);
}

// Engine-local resources: the receive pool against the memory limit.
Status check_engine_pools(const std::vector<Join>& engines) {
  for (const Join& e : engines) {
    const std::string name = rank_name(Role::kEngine, e.rank);
    if (e.pool_slots < 2) {
      return FailedPrecondition("pool_slots of " + name + " is " + std::to_string(e.pool_slots) +
                                ": the rotating receive pool needs at least 2 slots");
    }
    ASSIGN_OR_RETURN(const std::uint64_t slot_bytes, engine_slot_bytes(e));
    const std::uint64_t pool = e.pool_slots * slot_bytes;
    if (e.memory_limit != 0 && pool > e.memory_limit) {
      return FailedPrecondition("the receive pool of " + name + " (" + std::to_string(e.pool_slots) + " x " +
                                format_bytes(slot_bytes) + " = " + format_bytes(pool) +
                                ") does not fit its memory limit " + format_bytes(e.memory_limit) +
                                (e.pool_slots > 2 ? " (raise --memory-limit, or lower --bucket-size or --pool-slots)"
                                                  : " (raise --memory-limit, or lower --bucket-size)"));
    }
  }
  return Status::Ok();
}

}  // namespace

Status check_dtypes(const Join& t, const Join& e) {
  const std::string tn = rank_name(Role::kTrainer, t.rank), en = rank_name(Role::kEngine, e.rank);
  for (const auto& [dtype, example] : t.stream_dtypes) {
    bool ok = false;
    for (const std::string& s : e.supported_dtypes) ok = ok || s == dtype;
    if (!ok) {
      return FailedPrecondition("unsupported dtype: " + tn + " sends " + dtype + " (tensor '" + example + "') but " +
                                en + " supports only " + names(e.supported_dtypes));
    }
  }
  return Status::Ok();
}

namespace {

// Full-weight trainers: each against the engine rank it feeds (t % N).
Status check_full_trainers(const std::vector<Join>& trainers, const std::vector<Join>& engines) {
  if (trainers.size() < engines.size()) {
    return FailedPrecondition("fewer trainer ranks (" + std::to_string(trainers.size()) + ") than engine ranks (" +
                              std::to_string(engines.size()) +
                              "): every engine rank needs at least one full-weight trainer rank to feed it (or "
                              "give the trainers a sharded --trainer-layout)");
  }
  for (const Join& t : trainers) {
    const Join& e = engines[static_cast<std::size_t>(t.rank) % engines.size()];
    const std::string tn = rank_name(Role::kTrainer, t.rank), en = rank_name(Role::kEngine, e.rank);
    if (t.plan_digest != e.plan_digest) {
      auto shown = [](const std::string& d) { return d.empty() ? std::string("?") : d; };
      return FailedPrecondition("plan digest mismatch: " + tn + " computed " + shown(t.plan_digest) + " for " + en +
                                "'s stream, " + en + " computed " + shown(e.plan_digest) + " (same bucket_size " +
                                std::to_string(e.bucket_size) + "): " + why_digests_differ(t, e));
    }
    RETURN_IF_ERROR(check_dtypes(t, e));
  }
  return Status::Ok();
}

bool boundaries_differ(const std::vector<Plan>& plans) {
  auto boundaries = [](const Plan& p) {
    std::vector<std::size_t> ends;
    std::size_t n = 0;
    for (const Bucket& b : p.buckets) {
      n += b.completes.size();
      if (!b.completes.empty()) ends.push_back(n);
    }
    return ends;
  };
  for (const Plan& p : plans) {
    if (boundaries(p) != boundaries(plans[0])) return true;
  }
  return false;
}

// Alignment across the engine's ranks (rule 4), decided here at setup.
Status check_alignment(const std::vector<Join>& engines, Topology* topology) {
  std::vector<Plan> plans;
  for (const Join& e : engines) {
    const std::string name = rank_name(Role::kEngine, e.rank);
    RETURN_IF_ERROR(check_plan_bounds(e.specs, e.bucket_size, name));
    auto plan = make_plan(e.specs, e.bucket_size);
    if (!plan.ok()) return plan.status().WithContext(name);
    if (plan->digest_hex() != e.plan_digest) {
      return FailedPrecondition("plan digest mismatch: " + name + " sent " +
                                (e.plan_digest.empty() ? std::string("?") : e.plan_digest) + " but its specs give " +
                                plan->digest_hex());
    }
    plans.push_back(std::move(*plan));
  }
  std::vector<const Plan*> plan_ptrs;
  for (const Plan& p : plans) plan_ptrs.push_back(&p);
  auto schedule = aligned_schedule(plan_ptrs);
  if (!schedule.ok()) return schedule.status().WithContext("engine streams cannot be aligned");
  topology->aligned_batches = schedule->size();
  topology->divergent_boundaries = boundaries_differ(plans);
  for (const Plan& p : plans) topology->bytes_per_refit += p.total_bytes;
  return Status::Ok();
}

}  // namespace

std::string rank_name(Role role, int rank) { return std::string(role_name(role)) + " rank " + std::to_string(rank); }

std::string join_name(const Join& join, int engines) {
  if (join.role == Role::kTrainer || (engines <= 1 && join.engine == 0)) return rank_name(join.role, join.rank);
  return "engine " + std::to_string(join.engine) + " rank " + std::to_string(join.rank);
}

Status check_join(const Join& join, int trainer_ranks, int engine_ranks, int engines) {
  if (join.protocol != kControlProtocolVersion) {
    return FailedPrecondition(join_name(join, engines) + " speaks control protocol version " +
                              std::to_string(join.protocol) + ", this coordinator version " +
                              std::to_string(kControlProtocolVersion) + " (run the same refit build everywhere)");
  }
  const int count = join.role == Role::kTrainer ? trainer_ranks : engine_ranks;
  const std::string role = role_name(join.role);
  if (join.rank < 0 || join.rank >= count) {
    return FailedPrecondition(role + " rank " + std::to_string(join.rank) + " is out of range: the coordinator expects " +
                              std::to_string(count) + " " + role + " ranks (0.." + std::to_string(count - 1) + ")");
  }
  if (join.role == Role::kEngine && join.engine >= static_cast<std::uint64_t>(engines)) {
    return FailedPrecondition("engine " + std::to_string(join.engine) + " is out of range: the coordinator expects " +
                              std::to_string(engines) + (engines == 1 ? " engine (0)" : " engines (0.." +
                              std::to_string(engines - 1) + ")") + " (--engines)");
  }
  return Status::Ok();
}

namespace {

// Full-weight trainers: engine rank e is fed by trainers e, e + N, ...; each
// trainer writes whole buckets (bucket j from feeder j % feeders).
void full_setups(const std::vector<Join>& trainers, const std::vector<Join>& engines, Topology& topology) {
  const std::size_t engine_count = engines.size();
  for (std::size_t e = 0; e < engine_count; ++e) {
    for (std::size_t t = e; t < trainers.size(); t += engine_count) topology.engine_setups[e].feeders.push_back(t);
  }
  for (const Join& t : trainers) {
    const std::size_t e = static_cast<std::size_t>(t.rank) % engine_count;
    Setup& setup = topology.trainer_setups[static_cast<std::size_t>(t.rank)];
    setup.engine_rank = e;
    setup.engine_address = engines[e].data_address;
    setup.descriptor = engines[e].descriptor;
    setup.engine_device = engines[e].device;
    setup.trainer_index = static_cast<std::uint64_t>(t.rank) / engine_count;
    setup.feeder_count = (trainers.size() - e + engine_count - 1) / engine_count;
  }
}

}  // namespace

StatusOr<Topology> plan_topology(const std::vector<Join>& trainers, const std::vector<Join>& engines,
                                 std::uint64_t seed, bool on_demand) {
  RETURN_IF_ERROR(check_agreement(trainers, engines));
  RETURN_IF_ERROR(check_engine_pools(engines));
  const bool sharded = trainers[0].layout != "full";
  RETURN_IF_ERROR(sharded ? check_sharded_trainers(trainers, engines) : check_full_trainers(trainers, engines));
  Topology topology;
  RETURN_IF_ERROR(check_alignment(engines, &topology));
  if (transport_topology(engines[0].transport).shared_gpu_serializes) {
    std::vector<RankGpu> placed;
    for (const auto* group : {&trainers, &engines}) {
      for (const Join& j : *group) placed.push_back({rank_name(j.role, j.rank), j.gpu});
    }
    topology.warnings = shared_gpu_warnings(placed);
  }
  std::vector<std::vector<TensorSpec>> streams;
  for (const Join& e : engines) streams.push_back(e.specs);
  topology.engine_setups.assign(engines.size(), Setup{});
  for (Setup& setup : topology.engine_setups) setup.streams = streams;
  topology.trainer_setups.assign(trainers.size(), Setup{});
  if (sharded) {
    sharded_setups(trainers, engines, topology);
  } else {
    full_setups(trainers, engines, topology);
  }
  for (auto* group : {&topology.engine_setups, &topology.trainer_setups}) {
    for (Setup& setup : *group) setup.seed = seed;
  }
  for (Setup& setup : topology.trainer_setups) setup.on_demand = on_demand;
  return topology;
}

}  // namespace refit
