// The committed-bytes reader on device weights (label gpu; committed_
// reader.h): one batched copy per call. Skips where no GPU exists.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "cuda/device.h"
#include "cuda/gpu_test_util.h"
#include "refit/device_memory.h"
#include "runtime/committed_reader.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

// 3,000 reads in one call (a MoE bucket's entries: small tensors, each read
// whole or from an odd offset) from device weights into a device buffer:
// each range equals the served bytes it names, read back to the host.
// Catches: runs built from the wrong source or destination, a call that
// returns before the copy finished (the host reads 0xEE), reads after the
// first one dropped.
TEST(CommittedReaderGpu, ThousandsOfReadsInOneCallEachLandWhereTheySay) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<TensorSpec> stream;
  for (int i = 0; i < 3000; ++i) stream.push_back({"t" + std::to_string(i), DType::kUInt8, {64 + i % 97}});
  ReferenceEngineOptions options;
  options.memory = MemoryKind::kCuda;
  options.device = 0;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReferenceEngine> engine, ReferenceEngine::Create({stream}, {0}, options));
  std::uint64_t total = 0;
  std::vector<std::vector<std::byte>> served(stream.size());
  for (std::size_t i = 0; i < stream.size(); ++i) {
    served[i].resize(stream[i].nbytes());
    for (std::size_t k = 0; k < served[i].size(); ++k) served[i][k] = static_cast<std::byte>(i * 31 + k);
    ASSERT_OK(copy_host_to_device(engine->mutable_weight(0, stream[i].name), served[i]));
    total += served[i].size();
  }
  ASSERT_OK_AND_ASSIGN(DeviceBuffer out, DeviceBuffer::Allocate(0, total));
  ASSERT_OK(device_memset(out.data(), 0xEE, total));
  std::vector<CommittedRead> reads;
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < stream.size(); ++i) {
    const std::uint64_t offset = i % 3 == 0 ? 0 : i % 5;  // whole, or from an odd byte on
    const std::uint64_t n = served[i].size() - offset;
    reads.push_back({static_cast<std::uint32_t>(i), offset, {out.data() + at, n}});
    at += n;
  }
  const ReadCommitted read = make_committed_reader(engine.get(), 0, &stream, 0);
  ASSERT_OK(read(reads));
  std::vector<std::byte> host(at);
  ASSERT_OK(copy_device_to_host(host, out.data()));
  for (const CommittedRead& r : reads) {
    const std::byte* got = host.data() + (r.out.data() - out.data());
    ASSERT_EQ(std::memcmp(got, served[r.tensor].data() + r.offset, r.out.size()), 0) << "tensor " << r.tensor;
  }
}

}  // namespace
}  // namespace refit
