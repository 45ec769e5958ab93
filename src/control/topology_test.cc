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
  Status s = check_join(join, 2, 2, 1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(s.message(), "engine rank 7 speaks control protocol version " + std::to_string(kControlProtocolVersion + 1));
  EXPECT_HAS(s.message(), "this coordinator version " + std::to_string(kControlProtocolVersion));
  join.protocol = 0;  // a join without a version: a build from before versions
  EXPECT_HAS(check_join(join, 2, 2, 1).message(), "speaks control protocol version 0");
  join.protocol = kControlProtocolVersion;
  EXPECT_HAS(check_join(join, 2, 2, 1).message(), "engine rank 7 is out of range");
  join.rank = 1;
  EXPECT_TRUE(check_join(join, 2, 2, 1).ok());
}

// Many engines: an engine rank's engine is judged against --engines, and
// the name it goes by carries its engine once the job has several.
// Catches: no range check of the engine (an engine 5 of a 3-engine job
// would take another engine's member slot), a check off by one.
TEST(CheckJoin, AnEngineOutsideTheJobsEnginesIsRefusedNamingTheCount) {
  refit::Join join;
  join.role = Role::kEngine;
  join.rank = 1;
  join.engine = 3;
  Status s = check_join(join, 2, 2, 3);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(s.message(), "engine 3 is out of range: the coordinator expects 3 engines (0..2) (--engines)");
  EXPECT_HAS(check_join(join, 2, 2, 1).message(), "expects 1 engine (0)");
  join.engine = 2;
  EXPECT_TRUE(check_join(join, 2, 2, 3).ok());
  EXPECT_EQ(join_name(join, 3), "engine 2 rank 1");
  join.engine = 0;
  EXPECT_EQ(join_name(join, 1), "engine rank 1");
  EXPECT_EQ(join_name(join, 3), "engine 0 rank 1");
}

}  // namespace
}  // namespace refit
