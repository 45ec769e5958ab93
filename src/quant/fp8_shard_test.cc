// quantized_shard_range (quant/fp8_shard.h) against an independent path:
// the whole tensor quantized at once by the format's reference, then each
// engine rank's shard cut out of the codes and the scales by the sharding
// code (copy_shard_range over quantize_model's engine weights).
#include "quant/fp8_shard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "quant/fp8_block.h"
#include "refit/checkpoint.h"  // shard_rule_name
#include "testing/expect_has.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

// Finite values of `dtype` spread over many magnitudes, as bytes.
std::vector<std::byte> random_tensor(DType dtype, std::int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 8);
  std::vector<std::byte> out(static_cast<std::size_t>(n) * dtype_size(dtype));
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = std::ldexp(normal(rng), exponent(rng));
    if (dtype == DType::kFloat32) {
      std::memcpy(out.data() + i * 4, &x, 4);
    } else {
      std::uint32_t bits;
      std::memcpy(&bits, &x, 4);
      const std::uint16_t top = static_cast<std::uint16_t>(bits >> 16);  // truncated: still finite
      std::memcpy(out.data() + i * 2, &top, 2);
    }
  }
  return out;
}

struct Reference {
  std::vector<std::byte> codes, scales;  // of the whole tensor
};

Reference quantize_whole(const Weight& w, const std::byte* full) {
  const std::vector<std::int64_t>& s = w.spec.shape;
  const std::size_t nd = s.size();
  const Fp8Source src = fp8_dense_source(w.spec.dtype, full, nd == 3 ? s[0] : 1, s[nd - 2], s[nd - 1]);
  const Fp8Box box = fp8_whole_box(src);
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(box.elements()));
  std::vector<float> scales(static_cast<std::size_t>(box.scales()));
  EXPECT_OK(quantize_fp8_block(src, box, codes, scales));
  Reference r;
  r.codes.resize(codes.size());
  std::memcpy(r.codes.data(), codes.data(), codes.size());
  r.scales.resize(scales.size() * 4);
  std::memcpy(r.scales.data(), scales.data(), r.scales.size());
  return r;
}

// Catches: a shard's rows, columns or experts taken from the wrong place
// (the box's dim mapping), block rows quantized from the wrong full rows
// (a shard's first block not on its first row), a scale row offset counted
// in rows instead of blocks, a range that starts or ends inside a row or a
// scale copied from the wrong byte, and a range spanning two experts
// (tried: the scale rows' offset counted in rows, and 2-D splits mapped as
// if 3-D: the test crashes or fails).
TEST(Fp8Shard, EveryRangeOfEveryShardEqualsTheWholeTensorQuantizedThenCut) {
  std::mt19937 rng(4041);
  int checked = 0;
  for (int iter = 0; iter < 90; ++iter) {
    const bool stacked = iter % 3 == 0;
    const int ranks = std::uniform_int_distribution<int>(1, 3)(rng);
    // Shapes whose splits mostly fall on block edges: multiples of 128 per rank, plus a ragged tail.
    const auto extent = [&]() -> std::int64_t {
      const std::int64_t tail = rng() % 2 == 0 ? std::uniform_int_distribution<std::int64_t>(0, 100)(rng) : 0;
      return std::uniform_int_distribution<std::int64_t>(1, 2)(rng) * 128 * ranks - tail;
    };
    std::vector<std::int64_t> shape = {extent(), extent()};
    if (stacked) shape.insert(shape.begin(), std::uniform_int_distribution<std::int64_t>(ranks, 5)(rng));
    const DType dtype = iter % 2 == 0 ? DType::kBFloat16 : DType::kFloat32;
    const ShardRule rules[] = {ShardRule::kColumn, ShardRule::kRow, ShardRule::kReplicated};
    Model model;
    model.weights = {Weight{TensorSpec{"layer.w.weight", dtype, shape}, rules[iter % 3]}};
    const StatusOr<QuantizedModel> q = quantize_model(model, *parse_quantize("fp8-block128:*"), ranks);
    if (!q.ok()) continue;  // a split that cuts a block: QuantizeModel's tests
    const Weight& w = model.weights[0];
    const std::vector<std::byte> full = random_tensor(dtype, w.spec.numel(), rng);
    const Reference ref = quantize_whole(w, full.data());
    for (int r = 0; r < ranks; ++r) {
      for (const QuantPart part : {QuantPart::kCodes, QuantPart::kScales}) {
        const Weight& engine = q->engine.weights[part == QuantPart::kCodes ? 0 : 1];
        const std::vector<std::byte>& whole = part == QuantPart::kCodes ? ref.codes : ref.scales;
        const std::uint64_t bytes = quantized_shard_bytes(w, r, ranks, part);
        ASSERT_EQ(bytes, shard_spec(engine, r, ranks).nbytes());
        std::vector<std::byte> want(bytes);
        copy_shard_range(engine, r, ranks, whole.data(), 0, want);
        for (int k = 0; k < 4 && bytes > 0; ++k) {
          const std::uint64_t b = k == 0 ? 0 : std::uniform_int_distribution<std::uint64_t>(0, bytes - 1)(rng);
          const std::uint64_t n = k == 0 ? bytes : std::uniform_int_distribution<std::uint64_t>(1, bytes - b)(rng);
          std::vector<std::byte> got(n, std::byte{0xEE});
          SCOPED_TRACE(w.spec.ToString() + " rule " + std::string(shard_rule_name(w.rule)) + " rank " +
                       std::to_string(r) + "/" + std::to_string(ranks) +
                       (part == QuantPart::kCodes ? " codes" : " scales") + " [" + std::to_string(b) + ", +" +
                       std::to_string(n) + ")");
          ASSERT_OK(quantized_shard_range(w, r, ranks, part, full.data(), b, got, 1));
          ASSERT_EQ(std::memcmp(got.data(), want.data() + b, n), 0);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 150);
}

// Catches: a NaN sent (quantized) instead of refused, a refusal that names
// neither the tensor nor the version, a copy part or a range past the
// shard's end accepted.
TEST(Fp8Shard, RefusalsNameTheTensor) {
  Weight w{TensorSpec{"a.weight", DType::kFloat32, {256, 128}}, ShardRule::kColumn};
  std::vector<float> values(256 * 128, 1.0f);
  values[200 * 128 + 5] = std::numeric_limits<float>::quiet_NaN();
  const std::byte* full = reinterpret_cast<const std::byte*>(values.data());
  std::vector<std::byte> out(128);
  // Rank 1 of 2 holds rows [128, 256): row 200 is its.
  const Status nan = quantized_shard_range(w, 1, 2, QuantPart::kCodes, full, 0, out, 7);
  EXPECT_HAS(nan.message(), "a.weight");
  EXPECT_HAS(nan.message(), "version 7");
  EXPECT_OK(quantized_shard_range(w, 0, 2, QuantPart::kCodes, full, 0, out, 7));  // rank 0's rows are finite
  EXPECT_HAS(quantized_shard_range(w, 0, 2, QuantPart::kCopy, full, 0, out, 7).message(), "not a quantized part");
  EXPECT_HAS(quantized_shard_range(w, 0, 2, QuantPart::kScales, full, 0, out, 7).message(),
             "past engine rank 0's 4 bytes of its scales");
  Weight cut{TensorSpec{"b.weight", DType::kFloat32, {256, 128}}, ShardRule::kColumn};
  EXPECT_HAS(quantized_shard_range(cut, 0, 3, QuantPart::kCodes, full, 0, out, 7).message(), "cut 128-blocks");
}

}  // namespace
}  // namespace refit
