// The bucket delta codec on the GPU (cuda/word_delta_device.h) against the
// CPU codec (delta/word_delta.h), the reference: the same encoded bytes for
// every change pattern and size, the same decoded bytes (in place too), and
// the same refusals, with nothing written before the checks passed.
// Skips where no GPU exists.
#include "cuda/word_delta_device.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cuda/gpu_test_util.h"
#include "refit/device_memory.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

class WordDeltaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

// Catches: a bitmap byte built from the wrong threads' words, a block's
// payload offset off by one (the scan), the partial last word written as 8
// bytes, the full encoding's choice differing from the CPU's.
TEST_F(WordDeltaGpuTest, EncodesAndDecodesAsTheCpuCodecDoes) {
  const std::uint64_t max = 3 << 20;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceDeltaCodec codec, DeviceDeltaCodec::Create(0, max));
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer now_d, DeviceBuffer::Allocate(0, max));
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer base_d, DeviceBuffer::Allocate(0, max));
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer out_d, DeviceBuffer::Allocate(0, max_encoded_bytes(max)));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  std::mt19937_64 rng(7);
  for (std::size_t n : {1u, 7u, 8u, 9u, 8191u, 8192u, 65537u, 3u << 20}) {
    const std::vector<std::byte> base = random_bytes(n, n);
    for (double fraction : {0.0, 0.001, 0.05, 1.0}) {
      std::vector<std::byte> now = base;
      for (auto& b : now) {
        if (std::uniform_real_distribution<double>(0, 1)(rng) < fraction) b ^= std::byte{0x41};
      }
      if (fraction > 0) now.back() ^= std::byte{1};  // the bucket's last byte
      REFIT_ASSERT_OK(copy_host_to_device(now_d.data(), now));
      REFIT_ASSERT_OK(copy_host_to_device(base_d.data(), base));
      std::vector<std::byte> want(max_encoded_bytes(n));
      REFIT_ASSERT_OK_AND_ASSIGN(const EncodedDelta cpu, encode_delta(now, base, 4, want));
      REFIT_ASSERT_OK_AND_ASSIGN(const EncodedDelta gpu,
                                 codec.encode(now_d.data(), base_d.data(), n, 4, out_d.data(), stream.handle()));
      ASSERT_EQ(gpu.encoding, cpu.encoding) << n << " " << fraction;
      ASSERT_EQ(gpu.bytes, cpu.bytes) << n << " " << fraction;
      std::vector<std::byte> got(gpu.bytes);
      REFIT_ASSERT_OK(copy_device_to_host(got, out_d.data()));
      want.resize(cpu.bytes);
      ASSERT_EQ(got, want) << "size " << n << ", fraction " << fraction;
      // Decode in place over the base.
      REFIT_ASSERT_OK(codec.decode(out_d.data(), gpu.bytes, base_d.data(), 4, base_d.data(), n, stream.handle()));
      REFIT_ASSERT_OK(stream.synchronize());
      std::vector<std::byte> decoded(n);
      REFIT_ASSERT_OK(copy_device_to_host(decoded, base_d.data()));
      ASSERT_EQ(decoded, now) << "size " << n << ", fraction " << fraction;
    }
  }
}

// A delta against another version, or whose count disagrees with its
// bitmap, is refused and leaves the output as it was. Catches: a decode
// that writes before its checks (the base would be half patched).
TEST_F(WordDeltaGpuTest, RefusesWithoutWritingAnything) {
  const std::uint64_t n = 4096;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceDeltaCodec codec, DeviceDeltaCodec::Create(0, n));
  const std::vector<std::byte> base = random_bytes(n, 1);
  std::vector<std::byte> now = base;
  now[100] ^= std::byte{1};
  std::vector<std::byte> wire(max_encoded_bytes(n));
  REFIT_ASSERT_OK_AND_ASSIGN(const EncodedDelta e, encode_delta(now, base, 9, wire));
  wire.resize(e.bytes);
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer wire_d, DeviceBuffer::Allocate(0, wire.size()));
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer held_d, DeviceBuffer::Allocate(0, n));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  REFIT_ASSERT_OK(copy_host_to_device(held_d.data(), base));
  REFIT_ASSERT_OK(copy_host_to_device(wire_d.data(), wire));
  const Status other = codec.decode(wire_d.data(), wire.size(), held_d.data(), 8, held_d.data(), n, stream.handle());
  EXPECT_EQ(other.code(), StatusCode::kDataLoss);
  EXPECT_HAS(other.message(), "encoded against version 9, the engine holds version 8");
  wire[24] = std::byte{2};  // the header's count: 2, the bitmap sets 1
  REFIT_ASSERT_OK(copy_host_to_device(wire_d.data(), wire));
  const Status count = codec.decode(wire_d.data(), wire.size(), held_d.data(), 9, held_d.data(), n, stream.handle());
  EXPECT_HAS(count.message(), "says 2 changed words, its bitmap sets 1");
  REFIT_ASSERT_OK(stream.synchronize());
  std::vector<std::byte> held(n);
  REFIT_ASSERT_OK(copy_device_to_host(held, held_d.data()));
  EXPECT_EQ(held, base) << "a refused decode wrote into the output";
}

}  // namespace
}  // namespace refit
