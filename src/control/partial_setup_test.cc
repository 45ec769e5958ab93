// The coordinator's setup check of scheduled partial refits
// (partial_setup.h). Catches: an engine rank whose engine does not take
// partial refits accepted (every partial refit would fail at its begin and
// the job recover from it forever); only engine rank 0 checked (a second
// rank of another kind slips through: the first case's rank 1).
#include "control/partial_setup.h"

#include <gtest/gtest.h>

#include "testing/expect_has.h"

namespace refit {
namespace {

Join engine_join(int rank, bool partial) {
  Join j;
  j.role = Role::kEngine;
  j.rank = rank;
  j.partial = partial;
  j.specs = {TensorSpec{"model.layers.0.self_attn.q_proj.weight", DType::kBFloat16, {4, 4}},
             TensorSpec{"model.norm.weight", DType::kBFloat16, {4}}};
  return j;
}

TEST(PartialSetup, EveryEngineRankMustTakePartialRefits) {
  Join trainer;
  trainer.role = Role::kTrainer;
  const std::vector<std::string> only{"*norm*"};
  const Status refused = check_partial_refits(only, trainer, {engine_join(0, true), engine_join(1, false)}, false);
  ASSERT_FALSE(refused.ok());
  EXPECT_HAS(refused.message(), "--only (partial refits): engine rank 1's engine does not take partial refits");
  EXPECT_TRUE(check_partial_refits(only, trainer, {engine_join(0, true), engine_join(1, true)}, false).ok());
  EXPECT_TRUE(check_partial_refits({}, trainer, {engine_join(0, false)}, false).ok()) << "full refits: no check";
  const Status typo = check_partial_refits({"*nrom*"}, trainer, {engine_join(0, true)}, false);
  EXPECT_HAS(typo.message(), "glob '*nrom*' selects none");
}

}  // namespace
}  // namespace refit
