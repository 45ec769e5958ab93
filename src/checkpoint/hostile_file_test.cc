// Files that are not what they claim, or that change under refit: a FIFO, a
// directory or a device given as a checkpoint, a shard, an index or a secret
// file is refused before it is read and without blocking; a file truncated,
// rewritten or replaced while mapped fails check_unchanged() naming it,
// never a SIGBUS; a header listing too many tensors is refused as it is read.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <string>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/json_member_stream.h"
#include "control/auth.h"
#include "core/regular_file.h"
#include "refit/checkpoint.h"
#include "refit/safetensors.h"
#include "testing/status_matchers.h"

namespace refit::testing {
namespace {

using namespace std::chrono_literals;

// Runs `open` (which must not block on the FIFO at `fifo`) on another
// thread; if it is still running after 5 s, the test fails and a writer is
// opened on the FIFO so the blocked open returns and the test can end.
template <typename Fn>
auto without_blocking(const std::string& fifo, Fn open) {
  auto result = std::async(std::launch::async, open);
  if (result.wait_for(5s) != std::future_status::ready) {
    ADD_FAILURE() << "opening the FIFO " << fifo << " blocked";
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
  }
  return result.get();
}

// Catches: an open without O_NONBLOCK (the open of a FIFO blocks until a
// writer appears: the test then fails after 5 s), and a check that refuses
// without saying what the file is.
TEST(HostileFile, AFifoIsRefusedWithoutBlockingEverywhereAFileIsRead) {
  TempDir dir;
  const std::string fifo = dir.file("model.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);

  auto file = without_blocking(fifo, [&] { return SafetensorsFile::Open(fifo); });
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("'" + fifo + "' is a FIFO, not a regular file"), std::string::npos)
      << file.status().ToString();

  // The same FIFO found as a directory's single file, and as the index.
  auto single = without_blocking(fifo, [&] { return Checkpoint::Open(dir.path()); });
  EXPECT_NE(single.status().message().find("is a FIFO"), std::string::npos) << single.status().ToString();
  const std::string index = dir.file(std::string(kSafetensorsIndexName));
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  auto indexed = without_blocking(index, [&] { return Checkpoint::Open(dir.path()); });
  EXPECT_NE(indexed.status().message().find("'" + index + "' is a FIFO"), std::string::npos)
      << indexed.status().ToString();

  auto secret = without_blocking(fifo, [&] { return Secret::FromFile(fifo); });
  EXPECT_NE(secret.status().message().find("the secret file " + fifo + " is a FIFO"), std::string::npos)
      << secret.status().ToString();
}

// Catches: ErrnoStatus mapping ELOOP (or ENOTDIR) to kInternal, as it did:
// a symbolic link loop given as a checkpoint, a shard or a secret file read
// "internal: ... Too many levels of symbolic links". Mutation tried: the
// ELOOP case removed from ErrnoStatus (src/core/status.cc).
TEST(HostileFile, ASymlinkLoopIsTheCallersArgumentNamingThePath) {
  TempDir dir;
  const std::string loop = dir.file("model.safetensors");
  ASSERT_EQ(::symlink(loop.c_str(), loop.c_str()), 0) << std::strerror(errno);

  auto file = SafetensorsFile::Open(loop);
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument) << file.status().ToString();
  EXPECT_NE(file.status().message().find("'" + loop + "'"), std::string::npos) << file.status().ToString();
  EXPECT_NE(file.status().message().find("symbolic links"), std::string::npos) << file.status().ToString();

  auto checkpoint = Checkpoint::Open(loop);
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kInvalidArgument) << checkpoint.status().ToString();
  EXPECT_NE(checkpoint.status().message().find(loop), std::string::npos) << checkpoint.status().ToString();

  auto secret = Secret::FromFile(loop);
  EXPECT_EQ(secret.status().code(), StatusCode::kInvalidArgument) << secret.status().ToString();
  EXPECT_NE(secret.status().message().find("the secret file " + loop), std::string::npos)
      << secret.status().ToString();

  // A regular file used as a directory on the way to the path: ENOTDIR.
  const std::string plain = dir.file("plain");
  { std::ofstream(plain) << "x"; }
  auto under_file = SafetensorsFile::Open(plain + "/model.safetensors");
  EXPECT_EQ(under_file.status().code(), StatusCode::kInvalidArgument) << under_file.status().ToString();
}

// Catches: a kind check that lets directories or devices through (a
// directory maps as nothing useful; /dev/zero would read forever).
TEST(HostileFile, DirectoriesAndDevicesAreRefusedNamingWhatTheyAre) {
  TempDir dir;
  auto d = open_regular_file(dir.path(), "x");
  EXPECT_EQ(d.status().message(), "x is a directory, not a regular file (refit reads only regular files)");
  auto zero = SafetensorsFile::Open("/dev/zero");
  EXPECT_NE(zero.status().message().find("'/dev/zero' is a character device"), std::string::npos)
      << zero.status().ToString();
  auto secret = Secret::FromFile("/dev/zero");
  EXPECT_NE(secret.status().message().find("is a character device"), std::string::npos) << secret.status().ToString();
}

// A one-tensor file of `bytes` bytes of data, big enough to span pages.
std::string write_one_tensor(const TempDir& dir, const std::string& name, std::int64_t bytes) {
  const std::string path = dir.file(name);
  const TensorSpec spec{"w", DType::kUInt8, {bytes}};
  const Bytes data = content_of(spec);
  const SafetensorsWriteTensor t{spec, data};
  EXPECT_OK(write_safetensors(path, std::span(&t, 1)));
  return path;
}

// Catches: reading a truncated mapping without the guard (the test process
// dies of SIGBUS), and a file whose vanished pages read as zeros without
// check_unchanged() saying so (the zeros would be sent as weights).
TEST(HostileFile, ATruncatedFileFailsTheCheckInsteadOfRaisingSigbus) {
  TempDir dir;
  const std::string path = write_one_tensor(dir, "a.safetensors", 1 << 20);
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
  EXPECT_OK(file.check_unchanged());
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  // Touch every page of the tensor: the pages past 4096 are gone.
  const std::span<const std::byte> data = file.data(file.tensors()[0]);
  volatile std::byte sink{};
  for (std::size_t i = 0; i < data.size(); i += 4096) sink = data[i];
  (void)sink;
  EXPECT_EQ(data.back(), std::byte{0});  // a vanished page reads as zeros
  Status s = file.check_unchanged();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("safetensors file '" + path + "' shrank while in use"), std::string::npos)
      << s.ToString();
}

// Catches: a check that looks only at the guard (a truncation whose pages
// were never read, and a rewrite in place, go unseen) or only at the open
// file (a file replaced by rename goes unseen).
TEST(HostileFile, ATruncatedRewrittenOrReplacedFileIsNamed) {
  TempDir dir;
  {
    const std::string path = write_one_tensor(dir, "t.safetensors", 1 << 16);
    ASSERT_OK_AND_ASSIGN(Checkpoint ckpt, Checkpoint::Open(path));
    ASSERT_EQ(::truncate(path.c_str(), 100), 0);
    Status s = ckpt.check_unchanged();
    EXPECT_NE(s.message().find("'" + path + "' changed while in use: it was "), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("bytes now"), std::string::npos) << s.ToString();
  }
  {
    const std::string path = write_one_tensor(dir, "m.safetensors", 1 << 16);
    ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
    const int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    struct timespec later[2] = {{0, UTIME_OMIT}, {0, 0}};
    ASSERT_EQ(::clock_gettime(CLOCK_REALTIME, &later[1]), 0);
    later[1].tv_sec += 10;  // a write within the same clock tick could keep the mtime
    ASSERT_EQ(::pwrite(fd, "x", 1, 200), 1);
    ASSERT_EQ(::futimens(fd, later), 0);
    ::close(fd);
    Status s = file.check_unchanged();
    EXPECT_NE(s.message().find("modified after refit opened it"), std::string::npos) << s.ToString();
  }
  {
    const std::string path = write_one_tensor(dir, "r.safetensors", 1 << 16);
    ASSERT_OK_AND_ASSIGN(SafetensorsFile file, SafetensorsFile::Open(path));
    write_one_tensor(dir, "r.safetensors", 1 << 16);  // the writer renames a new file over it
    Status s = file.check_unchanged();
    EXPECT_NE(s.message().find("'" + path + "' changed while in use: its path names another file now"),
              std::string::npos)
        << s.ToString();
  }
}

// Catches: a checkpoint source whose prepare() trusts its files (a shard
// truncated between two refits would be sent from a mapping that no longer
// holds it), and one whose check after the reads is a no-op.
TEST(HostileFile, ACheckpointSourceRefusesAFileThatChangedBetweenRefits) {
  TempDir dir;
  const std::string path = write_one_tensor(dir, "s.safetensors", 1 << 16);
  ASSERT_OK_AND_ASSIGN(Checkpoint ckpt, Checkpoint::Open(path));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<WeightSource> source, make_checkpoint_source(std::move(ckpt), {}));
  EXPECT_OK(source->prepare(1, 0));
  EXPECT_OK(source->check_unchanged());
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  Status before = source->prepare(2, 0);
  EXPECT_EQ(before.code(), StatusCode::kDataLoss);
  EXPECT_NE(before.message().find("safetensors file '" + path + "' changed while in use"), std::string::npos)
      << before.ToString();
  EXPECT_EQ(source->check_unchanged().code(), StatusCode::kDataLoss);
}

// A header listing `count` empty tensors ("t0", "t1", ...), and no data.
std::vector<std::byte> empty_tensors_file(std::size_t count) {
  std::string header = "{";
  for (std::size_t i = 0; i < count; ++i) {
    header += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}";
  }
  header += "}";
  std::vector<std::byte> file(8 + header.size());
  const std::uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  std::memcpy(file.data() + 8, header.data(), header.size());
  return file;
}

// Catches: a parser without the tensor-count limit (a header of millions of
// empty tensors, which need no data bytes, is accepted after seconds and
// gigabytes), and a limit that is off by one.
TEST(HostileFile, AHeaderListingMoreThanTheTensorLimitIsRefused) {
  const auto over = parse_safetensors(empty_tensors_file(kSafetensorsMaxTensors + 1), "many.safetensors");
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("safetensors file 'many.safetensors': header: it lists more than 262144 tensors"),
            std::string::npos)
      << over.status().ToString();
}

// Catches: a member limit that is off by one, or that is checked only after
// the whole text was read (the member past the limit must never be handed
// over, and nothing after it parsed: the text after it is not even JSON).
TEST(HostileFile, TheMemberLimitStopsTheStreamAtTheMemberPastIt) {
  int seen = 0;
  auto count = [&](const std::string&, const nlohmann::json&) {
    ++seen;
    return Status::Ok();
  };
  EXPECT_OK(stream_json_members(R"({"a": 1, "b": {"c": [1, 2]}, "d": "x"})", 3, "too many", "p: ", count));
  EXPECT_EQ(seen, 3);
  seen = 0;
  Status s = stream_json_members(R"({"a": 1, "b": {"c": [1, 2]}, "d": "x", "e": 5, not json at all)", 3, "too many",
                                 "p: ", count);
  EXPECT_EQ(s.message(), "p: too many");
  EXPECT_EQ(seen, 3);
}

// Catches: a streamed member that loses the strict rules of
// parse_json_strict (a duplicate key inside an entry, deep nesting).
TEST(HostileFile, StreamedMembersKeepTheStrictRules) {
  auto any = [](const std::string&, const nlohmann::json&) { return Status::Ok(); };
  EXPECT_EQ(stream_json_members(R"({"w": {"dtype": "U8", "dtype": "F32"}})", 10, "", "", any).message(),
            "duplicate key \"dtype\" inside \"w\"");
  EXPECT_EQ(stream_json_members(R"({"w": 1, "w": 2})", 10, "", "", any).message(),
            "duplicate key \"w\" at the top level");
  EXPECT_EQ(stream_json_members("{\"w\": " + std::string(40, '[') + std::string(40, ']') + "}", 10, "", "", any)
                .message(),
            "nested deeper than 32 levels");
  EXPECT_EQ(stream_json_members("[1]", 10, "", "", any).message(), "it is not a JSON object");
}

}  // namespace
}  // namespace refit::testing
