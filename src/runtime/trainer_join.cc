// A trainer rank's join: see trainer_join.h.
#include "runtime/trainer_join.h"

#include "refit/content.h"

#include <unistd.h>

#include <string>

#include "cuda/device.h"
#include "runtime/shard_channel.h"

namespace refit {

Join trainer_join(const RankOptions& options, const TrainerJoinFacts& facts) {
  Join join;
  join.role = Role::kTrainer;
  join.rank = options.rank;
  join.pid = ::getpid();
  join.device = facts.on_device ? "cuda" : "cpu";
  join.mode = options.mode;
  join.trainer_ranks = static_cast<std::uint64_t>(options.trainer_ranks);
  join.engine_ranks = static_cast<std::uint64_t>(options.engine_ranks);
  join.bucket_size = options.bucket_size;
  join.transport = options.transport;
  const StatusOr<std::uint64_t> change = change_parts(options.change_fraction);  // checked at setup
  join.change = change.ok() ? *change : kEveryElement;
  join.delta = options.delta;
  if (facts.sharded != nullptr) {
    // The caller's own layouts: their transfer digest says the rest.
    join.layout = facts.layout->full ? "per-tensor:" + std::to_string(options.trainer_ranks) : facts.layout->ToString();
    join.transfer_digest = facts.sharded->transfer.digest_hex();
    join.feeds = sharded_feeds(*facts.sharded, options.rank);
    join.stream_dtypes = sharded_stream_dtypes(*facts.sharded);
    join.quantize = options.quantize;  // sharded and quantizing: the coordinator runs the amax exchange
    return join;
  }
  join.engine_rank = static_cast<std::uint64_t>(facts.engine_rank);
  join.plan_digest = facts.plan->digest_hex();
  join.specs = facts.plan->specs;  // and the rule that cut each (engine_stream: one spec per weight, model order)
  for (const Weight& w : facts.model->weights) join.rules.push_back(w.rule);
  for (const TensorSpec& s : facts.plan->specs) join.stream_dtypes.emplace(std::string(dtype_name(s.dtype)), s.name);
  // Which GPU this rank uses (the coordinator warns where two ranks share one); a rank that cannot tell says nothing.
  if (facts.on_device) {
    if (auto uuid = cuda_device_uuid(facts.device); uuid.ok()) join.gpu = *uuid;
  }
  return join;
}

}  // namespace refit
