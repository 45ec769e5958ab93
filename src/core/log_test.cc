#include "refit/log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace refit {
namespace {

struct Line {
  LogLevel level;
  std::string source;
  std::string message;
};

// Catches: log() writing to stderr past an installed sink, or set_log_sink({})
// not restoring the default.
TEST(Log, AnInstalledSinkGetsEveryMessageAndStderrNone) {
  std::vector<Line> lines;
  set_log_sink([&](LogLevel level, std::string_view source, std::string_view message) {
    lines.push_back({level, std::string(source), std::string(message)});
  });
  testing::internal::CaptureStderr();
  log(LogLevel::kWarning, "engine rank 1", "refused a data connection from 10.0.0.9");
  log(LogLevel::kInfo, "refit coordinator", "trainer rank 0 joined");
  const std::string err = testing::internal::GetCapturedStderr();
  set_log_sink({});
  EXPECT_EQ(err, "");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].level, LogLevel::kWarning);
  EXPECT_EQ(lines[0].source, "engine rank 1");
  EXPECT_EQ(lines[0].message, "refused a data connection from 10.0.0.9");
  EXPECT_EQ(lines[1].source, "refit coordinator");

  testing::internal::CaptureStderr();
  log(LogLevel::kError, "trainer rank 0", "lost the coordinator");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "trainer rank 0: lost the coordinator\n");
}

// Catches: the default sink adding a source or a newline to a progress line.
TEST(Log, ProgressLinesAreWrittenAsTheyAre) {
  testing::internal::CaptureStderr();
  log(LogLevel::kProgress, "refit", "\r[###   ] 50%");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "\r[###   ] 50%");
}

}  // namespace
}  // namespace refit
