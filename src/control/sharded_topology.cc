// Sharded trainers at setup: see sharded_topology.h.
#include "control/sharded_topology.h"

#include "control/spec_json.h"
#include "refit/format.h"
#include "refit/plan.h"

namespace refit {
namespace {

// Every trainer rank states the layout and transfer plan trainer rank 0 does.
Status check_same_transfer_plan(const std::vector<Join>& trainers) {
  const Join& first = trainers[0];
  for (const Join& t : trainers) {
    const std::string name = rank_name(Role::kTrainer, t.rank);
    if (t.layout != first.layout) {
      return FailedPrecondition("trainer layout differs: trainer rank 0 has '" + first.layout + "', " + name +
                                " has '" + t.layout + "' (give every trainer rank the same --trainer-layout)");
    }
    if (t.transfer_digest != first.transfer_digest) {
      return FailedPrecondition("transfer plan digest mismatch: trainer rank 0 computed " + first.transfer_digest +
                                ", " + name + " computed " + t.transfer_digest + " for layout '" + t.layout +
                                "' (compare their --model, --layers and --engine-ranks, and run the same refit build)");
    }
  }
  return Status::Ok();
}

// Each feed of trainer `t`: an engine rank in range, planned as that engine rank plans its stream.
Status check_feeds(const Join& t, const std::vector<Join>& engines) {
  const std::string tn = rank_name(Role::kTrainer, t.rank);
  if (t.feeds.empty()) return FailedPrecondition(tn + " (layout '" + t.layout + "') feeds no engine rank");
  for (const Feed& f : t.feeds) {
    if (f.engine_rank >= engines.size()) {
      return FailedPrecondition(tn + " feeds engine rank " + std::to_string(f.engine_rank) + ", but the job has " +
                                std::to_string(engines.size()) + " engine ranks");
    }
    const Join& e = engines[f.engine_rank];
    const std::string en = rank_name(Role::kEngine, e.rank);
    if (f.plan_digest != e.plan_digest) {
      return FailedPrecondition("plan digest mismatch: " + tn + " computed " + f.plan_digest + " for " + en +
                                "'s stream, " + en + " computed " + e.plan_digest + " (same bucket_size " +
                                std::to_string(e.bucket_size) + "; compare their --model, --layers and --rule)");
    }
    RETURN_IF_ERROR(check_dtypes(t, e));
  }
  return Status::Ok();
}

// Bytes of bucket j's entries (the parts fill them; padding is not sent).
std::uint64_t entry_bytes(const Bucket& bucket) {
  std::uint64_t bytes = 0;
  for (const PlanEntry& e : bucket.entries) bytes += e.bytes;
  return bytes;
}

// The parts every trainer writes into engine `e`'s buckets add up to each bucket.
Status check_parts_fill(const std::vector<Join>& trainers, const Join& e) {
  const std::string en = rank_name(Role::kEngine, e.rank);
  auto plan = make_plan(e.specs, e.bucket_size);
  if (!plan.ok()) return plan.status().WithContext(en);
  std::vector<std::uint64_t> filled(plan->buckets.size(), 0);
  bool fed = false;
  for (const Join& t : trainers) {
    for (const Feed& f : t.feeds) {
      if (f.engine_rank != static_cast<std::uint64_t>(e.rank)) continue;
      fed = true;
      for (const Part& p : f.parts) {
        if (p.index >= filled.size()) {
          return FailedPrecondition(rank_name(Role::kTrainer, t.rank) + " writes into bucket " +
                                    std::to_string(p.index) + " of " + en + ", whose plan has " +
                                    std::to_string(filled.size()) + " buckets");
        }
        filled[p.index] += p.bytes;
      }
    }
  }
  if (!fed) return FailedPrecondition("no trainer rank feeds " + en + " (layout '" + trainers[0].layout + "')");
  for (std::size_t j = 0; j < filled.size(); ++j) {
    const std::uint64_t want = entry_bytes(plan->buckets[j]);
    if (filled[j] != want) {
      return FailedPrecondition("the trainer ranks' parts of bucket " + std::to_string(j) + " of " + en + " add up to " +
                                std::to_string(filled[j]) + " bytes, its entries hold " + std::to_string(want) +
                                " (the trainers' transfer plan does not cover this engine rank's stream)");
    }
  }
  return Status::Ok();
}

}  // namespace

Status check_sharded_trainers(const std::vector<Join>& trainers, const std::vector<Join>& engines) {
  RETURN_IF_ERROR(check_same_transfer_plan(trainers));
  for (const Join& t : trainers) RETURN_IF_ERROR(check_feeds(t, engines));
  for (const Join& e : engines) {
    RETURN_IF_ERROR(check_plan_bounds(e.specs, e.bucket_size, rank_name(Role::kEngine, e.rank)));
    RETURN_IF_ERROR(check_parts_fill(trainers, e));
  }
  return Status::Ok();
}

void sharded_setups(const std::vector<Join>& trainers, const std::vector<Join>& engines, Topology& topology) {
  for (std::size_t e = 0; e < engines.size(); ++e) {
    Setup& setup = topology.engine_setups[e];
    const std::uint64_t buckets = make_plan(engines[e].specs, engines[e].bucket_size)->buckets.size();
    setup.parts.assign(buckets, {});
    for (const Join& t : trainers) {
      for (const Feed& f : t.feeds) {
        if (f.engine_rank != e) continue;
        const std::uint64_t feeder = setup.feeders.size();
        setup.feeders.push_back(static_cast<std::uint64_t>(t.rank));
        for (const Part& p : f.parts) setup.parts[p.index].push_back(Part{feeder, p.bytes});
      }
    }
  }
  for (const Join& t : trainers) {
    Setup& setup = topology.trainer_setups[static_cast<std::size_t>(t.rank)];
    for (const Feed& f : t.feeds) {
      const Join& e = engines[f.engine_rank];
      setup.targets.push_back(EngineTarget{f.engine_rank, e.data_address, e.descriptor, e.device});
    }
  }
}

}  // namespace refit
