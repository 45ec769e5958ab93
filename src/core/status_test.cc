#include "refit/status.h"

#include <gtest/gtest.h>

namespace refit {
namespace {

// Catches: a code missing from the parser (its errors would come back as
// aborted, and a demo's exit status would say so), or a message cut at the
// first ": ".
TEST(StatusText, EveryCodeRoundTripsThroughItsText) {
  for (int c = static_cast<int>(StatusCode::kInvalidArgument); c <= static_cast<int>(StatusCode::kInternal); ++c) {
    const Status s(static_cast<StatusCode>(c), "engine rank 0: lost trainer rank 1: closed");
    const Status back = status_from_text(s.ToString());
    EXPECT_EQ(back.code(), s.code()) << s.ToString();
    EXPECT_EQ(back.message(), s.message());
  }
  EXPECT_TRUE(status_from_text("ok").ok());
}

TEST(StatusText, TextWithoutACodeIsAbortedWithTheWholeText) {
  const Status s = status_from_text("something went wrong: badly");
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_EQ(s.message(), "something went wrong: badly");
}

}  // namespace
}  // namespace refit
