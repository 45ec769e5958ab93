// The coordinator's admission check of one join (topology.h).
#include "control/topology.h"
#include "testing/expect_has.h"

#include <gtest/gtest.h>

namespace refit {
namespace {

// A rank of another control protocol version is refused, naming both
// versions, before anything else of its join is judged. Catches: no version
// check (an old rank would misread the new messages), a check that names
// only one side, and one that comes after the rank's range check (an old
// rank would be told its rank is wrong).
TEST(CheckJoin, AnotherProtocolVersionIsRefusedNamingBothVersions) {
  refit::Join join;
  join.role = Role::kEngine;
  join.rank = 7;  // also out of range: the version is judged first
  join.protocol = kControlProtocolVersion + 1;
  Status s = check_join(join, 2, 2);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(s.message(), "engine rank 7 speaks control protocol version " + std::to_string(kControlProtocolVersion + 1));
  EXPECT_HAS(s.message(), "this coordinator version " + std::to_string(kControlProtocolVersion));
  join.protocol = 0;  // a join without a version: a build from before versions
  EXPECT_HAS(check_join(join, 2, 2).message(), "speaks control protocol version 0");
  join.protocol = kControlProtocolVersion;
  EXPECT_HAS(check_join(join, 2, 2).message(), "engine rank 7 is out of range");
  join.rank = 1;
  EXPECT_TRUE(check_join(join, 2, 2).ok());
}

}  // namespace
}  // namespace refit
