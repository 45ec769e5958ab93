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
// lines in 30 s), a count that is lost, causes that share one budget (a
// flood would hide a wrong secret), and causes told apart by address or
// byte counts (every stranger would get its own line).
TEST(RefusalLog, OneLinePerCausePerPeriodWithACount) {
  Captured c;
  {
    RefusalLog log("refit coordinator", 1h);
    for (int i = 0; i < 500; ++i) {
      const std::string peer = "127.0.0.1:" + std::to_string(40000 + i);
      log.refused(peer, "timed out after " + std::to_string(5000 + i % 7) + "ms waiting for a frame from " + peer);
    }
    log.refused("B", "wrong secret");
    log.flush();  // the period is not over: nothing more yet
    ASSERT_EQ(c.lines.size(), 2u);
    EXPECT_EQ(c.lines[0], "refused a connection from 127.0.0.1:40000: timed out after 5000ms waiting for a frame "
                          "from 127.0.0.1:40000");
    EXPECT_EQ(c.lines[1], "refused a connection from B: wrong secret");
  }  // the destructor logs what was counted
  ASSERT_EQ(c.lines.size(), 3u);
  EXPECT_NE(c.lines[2].find("refused 499 more connections in the last "), std::string::npos) << c.lines[2];
  EXPECT_NE(c.lines[2].find("s for the same reason; the last from 127.0.0.1:40499: timed out"), std::string::npos)
      << c.lines[2];
}

// Catches: a table of causes without a bound (reasons quote a peer's
// bytes: each stranger could make its own cause and its own line).
TEST(RefusalLog, ReasonsBeyondTheCauseLimitShareOneCount) {
  Captured c;
  {
    RefusalLog log("refit coordinator", 1h);
    for (std::size_t i = 0; i < kMaxRefusalCauses + 100; ++i) {
      log.refused("A", "unknown role '" + std::string(1 + i % 26, static_cast<char>('a' + i % 26)) +
                           std::string(i / 26, 'x') + "'");
    }
    EXPECT_EQ(c.lines.size(), kMaxRefusalCauses + 1);
  }
  EXPECT_EQ(c.lines.size(), kMaxRefusalCauses + 2);
}

// Catches: counts that are only logged at the next refusal of that cause
// (a flood that stops would never be reported).
TEST(RefusalLog, FlushLogsTheCountOnceThePeriodIsOver) {
  Captured c;
  RefusalLog log("refit coordinator", 50ms);
  log.refused("a", "x");
  log.refused("b", "x");
  EXPECT_EQ(c.lines.size(), 1u);
  const auto until = std::chrono::steady_clock::now() + 50ms;
  while (std::chrono::steady_clock::now() < until) {
  }
  log.flush();
  ASSERT_EQ(c.lines.size(), 2u);
  EXPECT_NE(c.lines[1].find("refused 1 more connection in the last"), std::string::npos) << c.lines[1];
}

}  // namespace
}  // namespace refit
