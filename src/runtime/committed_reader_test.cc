// The reference engine's committed-bytes reader on host weights
// (committed_reader.h; the device path: committed_reader_gpu_test.cc).
#include "runtime/committed_reader.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "testing/expect_has.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

// Every tensor's bytes a pattern of its own (tensor i, byte k: 7 * i + k).
std::unique_ptr<ReferenceEngine> patterned(const std::vector<TensorSpec>& stream, MemoryKind memory, int device) {
  ReferenceEngineOptions options;
  options.memory = memory;
  options.device = device;
  auto engine = ReferenceEngine::Create({stream}, {0}, options);
  EXPECT_OK(engine.status());
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Several reads in one call, each landing where it says: ranges of three
// tensors (one twice, at two offsets) into one buffer, each equal to the
// served bytes it names; an empty read is skipped; a range past a tensor's
// end or a tensor outside the stream is refused naming it. Catches: reads
// taken from the wrong tensor or offset (bytes differ), only the first read
// of the call performed, a range past the end read anyway.
TEST(CommittedReader, EveryReadOfACallLandsWhereItSaysAndBadRangesAreRefusedNamed) {
  const std::vector<TensorSpec> stream = {{"a", DType::kUInt8, {100}}, {"b", DType::kUInt8, {4000}},
                                          {"c", DType::kUInt8, {33}}};
  std::unique_ptr<ReferenceEngine> engine = patterned(stream, MemoryKind::kHost, -1);
  ASSERT_NE(engine, nullptr);
  for (std::size_t i = 0; i < stream.size(); ++i) {
    std::byte* w = engine->mutable_weight(0, stream[i].name);
    for (std::uint64_t k = 0; k < stream[i].nbytes(); ++k) w[k] = static_cast<std::byte>(7 * i + k);
  }
  const ReadCommitted read = make_committed_reader(engine.get(), 0, &stream, -1);
  std::vector<std::byte> out(200, std::byte{0xEE});
  const std::vector<CommittedRead> reads = {{1, 3000, {out.data(), 50}},
                                            {0, 10, {out.data() + 50, 90}},
                                            {2, 0, {out.data() + 140, 0}},
                                            {1, 17, {out.data() + 140, 60}}};
  ASSERT_OK(read(reads));
  for (const CommittedRead& r : reads) {
    const std::byte* served = engine->weight(0, stream[r.tensor].name) + r.offset;
    EXPECT_EQ(std::memcmp(r.out.data(), served, r.out.size()), 0) << "tensor " << r.tensor << " at " << r.offset;
  }
  std::vector<CommittedRead> past = {{2, 30, {out.data(), 4}}};
  Status s = read(past);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_HAS(s.message(), "no committed bytes [30, +4) of c");
  past = {{3, 0, {out.data(), 1}}};
  EXPECT_HAS(read(past).message(), "of tensor 3");
}

}  // namespace
}  // namespace refit
