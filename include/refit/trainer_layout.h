// How a trainer's ranks hold a model's weights: `--trainer-layout`.
//
//   full         every trainer rank holds every weight whole (today's
//                trainers; each engine rank's buckets are dealt round-robin
//                over the trainer ranks that feed it)
//   fsdp         FSDP2 / DTensor Shard(0) over all M ranks: every weight
//                chunk(dim 0, M) (torch.chunk: pieces of ceil(D0 / M), the
//                trailing ranks may hold less or nothing)
//   tp           Megatron tensor parallel over all M ranks, by each weight's
//                shard rule (model.h): column and vocab weights even(dim 0),
//                row weights even(dim 1), replicated weights replicate(M);
//                an extent that is not a multiple of M is refused, naming
//                the tensor
//   tp:X,fsdp:Y  both, X * Y = M: the tp level splits the full weight, FSDP
//                chunks each TP shard along dim 0; TP ranks are consecutive
//                (rank = fsdp index * X + tp index, torchtitan's (dp_shard,
//                tp) mesh): Layout order kOuterFastest
//
// Thread safety: values; the functions are pure.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "refit/layout.h"
#include "refit/model.h"
#include "refit/status.h"

namespace refit {

struct TrainerLayout {
  int tp = 1;          // Megatron TP degree (1: none)
  int fsdp = 1;        // FSDP degree (1: none)
  bool full = true;    // "full": no split at all (tp == fsdp == 1)

  // "full", "fsdp", "tp", "tp:2,fsdp:4" as parse_trainer_layout reads them,
  // with the degrees resolved ("fsdp" over 4 ranks prints "fsdp:4").
  std::string ToString() const;
  friend bool operator==(const TrainerLayout&, const TrainerLayout&) = default;
};

// Parses `text` for `ranks` trainer ranks (M). "fsdp" and "tp" take all M
// ranks; "tp:X,fsdp:Y" (either order, either part alone: "fsdp:4" == "fsdp"
// over 4 ranks) needs X * Y == M. Errors (kInvalidArgument) quote the text
// and say what is accepted, or say the product and M.
StatusOr<TrainerLayout> parse_trainer_layout(std::string_view text, int ranks);

// One layout per weight of `model`, in model order, over tp * fsdp ranks.
// "full" gives layouts with no level (one holder: the whole tensor). Errors
// (kInvalidArgument) name the tensor and the extent: a tp split of an
// extent that is not a multiple of the tp degree. A weight of no dimensions
// is replicated by every layout (a scalar is never split).
StatusOr<std::vector<Layout>> trainer_layouts(const TrainerLayout& layout, const Model& model);

// Full-weight trainers feed engine rank t % N each, so every engine rank
// needs one: kFailedPrecondition "fewer trainer ranks (M) than engine ranks
// (N) ..." when a full layout has M < N. Sharded layouts pass (a trainer
// rank feeds every engine rank its shards reach).
Status validate_full_trainer_counts(const TrainerLayout& layout, int trainer_ranks, int engine_ranks);

}  // namespace refit
