#include "core/atomic_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "testing/forked_child.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// An empty directory of this test's own.
std::filesystem::path ScratchDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("refit-atomic-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The names in `dir`, sorted.
std::vector<std::string> Names(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Catches: a writer that appends instead of replacing, or leaves its
// temporary file behind.
TEST(AtomicFile, ReplacesTheContentAndLeavesNothingElse) {
  const std::filesystem::path dir = ScratchDir("replace");
  const std::string path = (dir / "report.json").string();
  ASSERT_OK(write_file_atomically(path, "first, and longer\n"));  // path is new: linked straight to its name
  ASSERT_OK(write_file_atomically(path, "second\n"));             // path exists: linked aside, renamed over it
  EXPECT_EQ(Slurp(path), "second\n");
  EXPECT_EQ(Names(dir), std::vector<std::string>{"report.json"});
  std::filesystem::remove_all(dir);
}

// Catches: an error that does not name the path the user gave.
TEST(AtomicFile, AnUnwritableDirectoryNamesThePath) {
  const Status status = write_file_atomically("/nonexistent-dir/report.json", "x");
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("/nonexistent-dir/report.json"), std::string::npos) << status.message();
}

// A writer killed by SIGKILL after its text is written and flushed, before
// the rename, leaves no name: a child runs StagedFile::Write (the first step
// of write_file_atomically) and hands the parent its descriptor; the parent
// sees the new text through /proc/PID/fd/N while the directory holds only
// report.json, kills the child, and finds report.json alone, with the old
// text. Skipped only where the directory's filesystem itself refuses
// O_TMPFILE (the named fallback is then expected to leave a name).
// Catches: a temporary file created under a name (the old
// write_file_atomically's `report.json.tmp.<pid>`, or the fallback taken
// where O_TMPFILE works): the directory lists it before and after the kill.
TEST(AtomicFile, AWriterKilledBeforeTheRenameLeavesNoName) {
  const std::filesystem::path dir = ScratchDir("kill");
  const int probe = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (probe < 0) GTEST_SKIP() << dir << " refuses O_TMPFILE: " << std::strerror(errno);
  ::close(probe);
  const std::string path = (dir / "report.json").string();
  ASSERT_OK(write_file_atomically(path, "old\n"));

  testing::ForkedChild child([&](int to_parent, int from_parent) {
    auto staged = StagedFile::Write(path, "new, and longer\n");
    const int fd = staged.ok() ? staged->fd() : -1;
    if (::write(to_parent, &fd, sizeof fd) != static_cast<ssize_t>(sizeof fd)) return 1;
    char never = 0;
    (void)::read(from_parent, &never, 1);  // blocks until the parent kills it
    return 2;
  });
  int fd = -1;
  ASSERT_EQ(::read(child.from_child(), &fd, sizeof fd), static_cast<ssize_t>(sizeof fd));
  ASSERT_GE(fd, 0) << "StagedFile::Write failed in the child";
  EXPECT_EQ(Slurp("/proc/" + std::to_string(child.pid()) + "/fd/" + std::to_string(fd)), "new, and longer\n");
  EXPECT_EQ(Names(dir), std::vector<std::string>{"report.json"}) << "a name while the text was written";
  child.Kill();
  EXPECT_EQ(Names(dir), std::vector<std::string>{"report.json"}) << "a name left by the killed writer";
  EXPECT_EQ(Slurp(path), "old\n");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace refit
