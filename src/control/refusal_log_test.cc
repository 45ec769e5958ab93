// RefusalLog (refusal_log.h): at most one line per cause per period, with
// the count of the refusals in between.
#include "control/refusal_log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "refit/log.h"

namespace refit {
namespace {

using namespace std::chrono_literals;

struct Captured {
  Captured() {
    set_log_sink([this](LogLevel, std::string_view, std::string_view m) { lines.emplace_back(m); });
  }
  ~Captured() { set_log_sink({}); }
  std::vector<std::string> lines;
};

// Catches: a log line per refusal (a flood of connections wrote 10,900
// lines in 30 s), a count that is lost, and causes that share one budget
// (an eviction storm would hide a wrong secret).
TEST(RefusalLog, OneLinePerCausePerPeriodWithACount) {
  Captured c;
  {
    RefusalLog log("refit coordinator", 1h);
    for (int i = 0; i < 500; ++i) log.refused(RefusalCause::kEvicted, "A" + std::to_string(i), "evicted");
    log.refused(RefusalCause::kAuthentication, "B", "wrong secret");
    log.flush();  // the period is not over: nothing more yet
    ASSERT_EQ(c.lines.size(), 2u);
    EXPECT_EQ(c.lines[0], "refused a connection from A0: evicted");
    EXPECT_EQ(c.lines[1], "refused a connection from B: wrong secret");
  }  // the destructor logs what was counted
  ASSERT_EQ(c.lines.size(), 3u);
  EXPECT_NE(c.lines[2].find("refused 499 more connections in the last "), std::string::npos) << c.lines[2];
  EXPECT_NE(c.lines[2].find("evicted to make room"), std::string::npos) << c.lines[2];
  EXPECT_NE(c.lines[2].find("; the last from A499: evicted"), std::string::npos) << c.lines[2];
}

// Catches: counts that are only logged at the next refusal of that cause
// (a flood that stops would never be reported).
TEST(RefusalLog, FlushLogsTheCountOnceThePeriodIsOver) {
  Captured c;
  RefusalLog log("refit coordinator", 0ms);
  log.refused(RefusalCause::kTimedOut, "a", "x");
  log.refused(RefusalCause::kTimedOut, "b", "x");  // period 0: logged at once
  EXPECT_EQ(c.lines.size(), 2u);
  log.flush();
  EXPECT_EQ(c.lines.size(), 2u);  // nothing was counted
}

}  // namespace
}  // namespace refit
