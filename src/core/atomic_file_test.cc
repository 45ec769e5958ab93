#include "core/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "testing/status_matchers.h"

namespace refit {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Catches: a writer that appends instead of replacing, or leaves its
// temporary file behind.
TEST(AtomicFile, ReplacesTheContentAndLeavesNothingElse) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("refit-atomic-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "report.json").string();
  ASSERT_OK(write_file_atomically(path, "first, and longer\n"));
  ASSERT_OK(write_file_atomically(path, "second\n"));
  EXPECT_EQ(Slurp(path), "second\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);
  std::filesystem::remove_all(dir);
}

// Catches: an error that does not name the path the user gave.
TEST(AtomicFile, AnUnwritableDirectoryNamesThePath) {
  const Status status = write_file_atomically("/nonexistent-dir/report.json", "x");
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("/nonexistent-dir/report.json"), std::string::npos) << status.message();
}

}  // namespace
}  // namespace refit
