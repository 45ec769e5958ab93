// check_sharded_settings (runtime/shard_channel.h): what a sharded trainer
// rank runs on in this build, checked before it joins.
#include <gtest/gtest.h>

#include "refit/roles.h"
#include "refit/trainer_layout.h"
#include "refit/weight_source.h"
#include "runtime/shard_channel.h"
#include "testing/expect_has.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

std::unique_ptr<WeightSource> fsdp_shards(int ranks) {
  const Model model = make_model("tiny", 1).value();
  const TrainerLayout layout = parse_trainer_layout("fsdp", ranks).value();
  return make_synthetic_shard_source("tiny", 1, trainer_layouts(layout, model).value(), 0, MemoryKind::kHost, -1)
      .value();
}

// Catches: a sharded rank accepted over nccl (an nccl target takes one
// trainer rank: the second writer of an engine rank would fail mid-refit),
// a refusal that does not name the transport, and a refusal of a transport
// the sharded senders drive (shm, tcp, ucx, cuda_ipc, staged or direct).
TEST(ShardedSettings, NcclIsRefusedNamingWhyAndTheOthersPass) {
  const auto source = fsdp_shards(2);
  RankOptions options;
  options.trainer_layout = "fsdp";
  options.trainer_ranks = 2;
  options.transport = "nccl";
  options.mode = "direct";
  const Status nccl = check_sharded_settings(options, *source);
  EXPECT_EQ(nccl.code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(nccl.message(), "an nccl target takes one trainer rank");
  EXPECT_HAS(nccl.message(), "got --transport nccl");
  for (const char* transport : {"shm", "tcp", "ucx", "cuda_ipc"}) {
    for (const char* mode : {"staged", "direct"}) {
      options.transport = transport;
      options.mode = mode;
      SCOPED_TRACE(std::string(transport) + " " + mode);
      EXPECT_OK(check_sharded_settings(options, *source));
    }
  }
}

// Catches: a source of full tensors taken for one of shards (every rank
// would send whole tensors as if they were its shards).
TEST(ShardedSettings, AFullSourceIsRefused) {
  auto full = make_synthetic_source("tiny", 1, MemoryKind::kHost, -1).value();
  RankOptions options;
  options.trainer_layout = "fsdp";
  EXPECT_HAS(check_sharded_settings(options, *full).message(), "holds full tensors, not this rank's shards");
}

}  // namespace
}  // namespace refit
