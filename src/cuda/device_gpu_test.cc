// GPU tests of refit/device.h (label gpu): skipped with the reason when there
// is no CUDA device. Each test says which mistake it catches.
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#if REFIT_HAVE_CUDA  // the GPU tests build without CUDA too, and skip
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuMemGetAddressRange (a driver entry point; no libcuda link)
#endif

#include "cuda/gpu_test_util.h"
#include "cuda/batched_copy.h"
#include "cuda/device.h"

namespace refit {
namespace {

class DeviceGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7 + (i >> 9)) & 0xFF);
  return v;
}

// Catches: copies in the wrong direction or of the wrong length, memset not
// landing before the call returns, a moved-from buffer still owning memory.
TEST_F(DeviceGpuTest, AllocateCopyMemsetAndMove) {
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer a, DeviceBuffer::Allocate(0, 1 << 20));
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), 1u << 20);
  EXPECT_EQ(a.device(), 0);
  const std::vector<std::byte> in = pattern(a.size(), 1);
  REFIT_ASSERT_OK(copy_host_to_device(a.data(), in));
  std::vector<std::byte> out(a.size());
  REFIT_ASSERT_OK(copy_device_to_host(out, a.data()));
  EXPECT_EQ(out, in);

  REFIT_ASSERT_OK(device_memset(a.data() + 100, 0x5A, 1000));
  REFIT_ASSERT_OK(copy_device_to_host(out, a.data()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::byte want = (i >= 100 && i < 1100) ? std::byte{0x5A} : in[i];
    ASSERT_EQ(out[i], want) << "byte " << i;
  }

  DeviceBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(a.size(), 0u);
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer c, DeviceBuffer::Allocate(0, 4096));
  REFIT_ASSERT_OK(copy_device_to_device(c.data(), b.data(), 4096));
  std::vector<std::byte> back(4096);
  REFIT_ASSERT_OK(copy_device_to_host(back, c.data()));
  EXPECT_EQ(0, std::memcmp(back.data(), out.data(), 4096));
  c = std::move(b);  // frees c's old allocation
  EXPECT_EQ(c.size(), 1u << 20);
}

// Catches: a large buffer allocated at its exact size. Another process
// maps such an allocation over CUDA IPC ~27% slower (docs/PERF.md), so
// DeviceBuffer::Allocate asks for whole 2 MiB pages; the buffer still reports
// the size asked for.
#if REFIT_HAVE_CUDA
TEST_F(DeviceGpuTest, LargeBuffersAreWhole2MiBPages) {
  PFN_cuMemGetAddressRange_v3020 range = nullptr;
  cudaDriverEntryPointQueryResult found{};
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", reinterpret_cast<void**>(&range), 3020,
                                             cudaEnableDefault, &found),
            cudaSuccess);
  ASSERT_NE(range, nullptr);
  const std::uint64_t asked = (3ull << 20) + 5;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer b, DeviceBuffer::Allocate(0, asked));
  EXPECT_EQ(b.size(), asked);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  ASSERT_EQ(range(&base, &size, reinterpret_cast<CUdeviceptr>(b.data())), CUDA_SUCCESS);
  EXPECT_EQ(base, reinterpret_cast<CUdeviceptr>(b.data()));
  EXPECT_EQ(size, 4ull << 20) << "the allocation behind a " << asked << "-byte buffer";
}
#endif  // REFIT_HAVE_CUDA

// Catches: an allocation failure reported without the device, the size or the
// CUDA error text, or with a code that does not say "out of memory".
TEST_F(DeviceGpuTest, AllocationFailureNamesDeviceAndBytes) {
  const std::uint64_t huge = 1ull << 50;  // 1 PiB
  const StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(0, huge);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted) << b.status().ToString();
  const Status st = b.status();
  const std::string& m = st.message();
  EXPECT_NE(m.find("device 0"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(huge)), std::string::npos) << m;
  // The failure must not poison later calls (sticky error left behind).
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer ok, DeviceBuffer::Allocate(0, 256));
  EXPECT_NE(ok.data(), nullptr);
}

// Catches: a device index past the visible devices accepted or reported
// without its number.
TEST_F(DeviceGpuTest, InvalidDeviceIsAnError) {
  const int n = *cuda_device_count();
  const StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(n, 256);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(std::to_string(n)), std::string::npos) << b.status().ToString();
  EXPECT_FALSE(CudaStream::Create(n).ok());
  // Rule 7 with the real count: the last visible device is valid, one past it is not.
  EXPECT_EQ(*engine_local_device(0, n - 1, n), n - 1);
  EXPECT_FALSE(engine_local_device(0, n, n).ok());
}

// Catches: pinned memory that is not usable for copies, or a wrong size.
TEST_F(DeviceGpuTest, PinnedBufferRoundTrip) {
  REFIT_ASSERT_OK_AND_ASSIGN(PinnedBuffer p, PinnedBuffer::Allocate(1 << 16));
  ASSERT_EQ(p.size(), 1u << 16);
  const std::vector<std::byte> in = pattern(p.size(), 3);
  std::memcpy(p.data(), in.data(), in.size());
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer d, DeviceBuffer::Allocate(0, p.size()));
  REFIT_ASSERT_OK(copy_host_to_device(d.data(), p.span()));
  std::memset(p.data(), 0, p.size());
  REFIT_ASSERT_OK(copy_device_to_host(p.span(), d.data()));
  EXPECT_EQ(0, std::memcmp(p.data(), in.data(), in.size()));
}

// Catches: events that never complete or report completion before the work,
// timing events that cannot time, and a stream that is not usable.
TEST_F(DeviceGpuTest, StreamAndEvents) {
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream s, CudaStream::Create(0));
  ASSERT_NE(s.handle(), nullptr);
  REFIT_ASSERT_OK_AND_ASSIGN(CudaEvent never, CudaEvent::Create(0));
  REFIT_ASSERT_OK_AND_ASSIGN(bool done, never.query());
  EXPECT_TRUE(done) << "an event never recorded counts as complete";

  REFIT_ASSERT_OK_AND_ASSIGN(CudaEvent start, CudaEvent::Create(0, /*timing=*/true));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaEvent stop, CudaEvent::Create(0, /*timing=*/true));
  const std::uint64_t bytes = 256ull << 20;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer src, DeviceBuffer::Allocate(0, bytes));
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer dst, DeviceBuffer::Allocate(0, bytes));
  REFIT_ASSERT_OK(device_memset(src.data(), 7, bytes));
  REFIT_ASSERT_OK_AND_ASSIGN(BatchedCopier copier, BatchedCopier::Create(0));
  REFIT_ASSERT_OK(start.record(s.handle()));
  const CopyRun run = copy_run_1d(src.data(), dst.data(), bytes);
  REFIT_ASSERT_OK(copier.copy({&run, 1}, s.handle()));
  REFIT_ASSERT_OK(stop.record(s.handle()));
  REFIT_ASSERT_OK(stop.synchronize());
  REFIT_ASSERT_OK_AND_ASSIGN(done, stop.query());
  EXPECT_TRUE(done);
  REFIT_ASSERT_OK_AND_ASSIGN(float ms, stop.elapsed_ms_since(start));
  EXPECT_GT(ms, 0.0f);
  REFIT_ASSERT_OK(s.synchronize());

  // wait(): work on a second stream ordered after the first stream's event.
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream s2, CudaStream::Create(0));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaEvent e, CudaEvent::Create(0));
  REFIT_ASSERT_OK(e.record(s.handle()));
  REFIT_ASSERT_OK(e.wait(s2.handle()));
  REFIT_ASSERT_OK(s2.synchronize());
  EXPECT_FALSE(CudaEvent::Create(0, true, true).ok()) << "interprocess events cannot time";
}

}  // namespace
}  // namespace refit
