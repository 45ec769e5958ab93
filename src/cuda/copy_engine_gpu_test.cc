// GPU tests of copy_runs_with_copy_engine (label gpu): the copy engine reading
// a registered, read-only file mapping (how a checkpoint reaches a GPU
// engine) into device memory, 1-D and 2-D runs, checked byte for byte.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/gpu_test_util.h"
#include "cuda/copy_engine.h"
#include "cuda/device.h"

namespace refit {
namespace {

// Catches: runs copied from or to the wrong offsets, merged runs of the
// wrong length, 2-D rows at the wrong pitch, a batch that skips copies, and a
// registration of a read-only file mapping that fails or hangs.
TEST(CopyEngineGpuTest, CopiesRunsOutOfARegisteredReadOnlyFileMapping) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const std::size_t n = 8 << 20;
  char path[] = "/tmp/refit-copy-engine-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  std::vector<std::byte> contents(n);
  for (std::size_t i = 0; i < n; ++i) contents[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  ASSERT_EQ(::write(fd, contents.data(), n), static_cast<ssize_t>(n));
  void* map = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  ::unlink(path);
  ASSERT_NE(map, MAP_FAILED);
  const auto* file = static_cast<const std::byte*>(map);
  {
    REFIT_ASSERT_OK_AND_ASSIGN(HostRegistration registration, HostRegistration::Register(file, n));
    REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer device, DeviceBuffer::Allocate(0, n));
    REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
    REFIT_ASSERT_OK(device_memset(device.data(), 0, n));
    std::vector<CopyRun> runs;
    // 1,000 back-to-back runs of 1 KiB at [0, 1 MiB) -> device [1 MiB, ...).
    for (std::size_t k = 0; k < 1000; ++k) runs.push_back(copy_run_1d(file + k * 1024, device.data() + (1 << 20) + k * 1024, 1024));
    // One big run.
    runs.push_back(copy_run_1d(file + (2 << 20), device.data() + (4 << 20), 3 << 20));
    // A column shard: 256 rows of 96 bytes out of rows of 1000 bytes.
    runs.push_back(CopyRun{file + 7, device.data() + 100, 96, 256, 1000, 96});
    REFIT_ASSERT_OK(copy_runs_with_copy_engine(runs, stream.handle()));
    REFIT_ASSERT_OK(stream.synchronize());
    std::vector<std::byte> back(n);
    REFIT_ASSERT_OK(copy_device_to_host(back, device.data()));
    for (std::size_t i = 0; i < 1000 * 1024; ++i) ASSERT_EQ(back[(1 << 20) + i], file[i]) << "1-D run byte " << i;
    for (std::size_t i = 0; i < (3u << 20); ++i) ASSERT_EQ(back[(4 << 20) + i], file[(2 << 20) + i]) << "big run byte " << i;
    for (std::size_t r = 0; r < 256; ++r) {
      for (std::size_t c = 0; c < 96; ++c) ASSERT_EQ(back[100 + r * 96 + c], file[7 + r * 1000 + c]) << "row " << r;
    }
    EXPECT_EQ(back[99], std::byte{0});                // nothing before the 2-D destination
    EXPECT_EQ(back[100 + 256 * 96], std::byte{0});    // nor after it
  }
  ::munmap(map, n);
}

}  // namespace
}  // namespace refit
