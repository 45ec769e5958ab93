// GPU tests of cuda/fp8_part.h (label gpu): parts of weights that cut
// 128-blocks, as FSDP ranks hold them, quantized on the device in the two
// steps around the amax exchange, bit for bit quant/fp8_part.h's CPU
// reference: the partial amax of every touched block, then the codes and
// the owned blocks' scales from the combined amax; NaN and Inf reported as
// the CPU step names them.
#include "cuda/fp8_part.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/fp8_test_values.h"
#include "cuda/gpu_test_util.h"
#include "refit/device_memory.h"

namespace refit {
namespace {

using namespace fp8_test;  // NOLINT(google-build-using-namespace): the shared test inputs

class Fp8PartGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

// A weight [e, rows, cols] and the parts of it the test quantizes: each part
// rows [r0, r1) x columns [c0, c1) of every matrix, copied dense.
struct Cut {
  std::int64_t r0, r1, c0, c1;
};
struct Weight {
  DType dtype;
  std::int64_t e, rows, cols;
  std::vector<Cut> cuts;
};

// Part `cut` of `full` (dense [e, rows, cols] of `w`), dense, and its Fp8Part
// over `data`.
std::vector<std::byte> part_bytes(const Weight& w, const std::vector<std::byte>& full, const Cut& cut) {
  const std::size_t size = dtype_size(w.dtype);
  std::vector<std::byte> out;
  for (std::int64_t m = 0; m < w.e; ++m) {
    for (std::int64_t r = cut.r0; r < cut.r1; ++r) {
      const std::byte* row = full.data() + ((m * w.rows + r) * w.cols + cut.c0) * size;
      out.insert(out.end(), row, row + (cut.c1 - cut.c0) * size);
    }
  }
  return out;
}
Fp8Part part_of(const Weight& w, const Cut& cut, const std::byte* data) {
  return Fp8Part{fp8_dense_source(w.dtype, data, w.e, cut.r1 - cut.r0, cut.c1 - cut.c0), cut.r0, cut.c0, w.rows,
                 w.cols};
}

// The combined amax of every block the part touches: the whole weight's
// (fp8_part_amax of the whole weight as one part).
std::vector<float> combined_amax(const Weight& w, const std::vector<std::byte>& full, const Fp8Part& part) {
  const Fp8Part whole = part_of(w, {0, w.rows, 0, w.cols}, full.data());
  const Fp8BlockRange all = fp8_part_blocks(whole), range = fp8_part_blocks(part);
  std::vector<float> amax(static_cast<std::size_t>(all.blocks()));
  EXPECT_TRUE(fp8_part_amax(whole, amax).ok());
  std::vector<float> out;
  for (std::int64_t m = 0; m < range.matrices; ++m) {
    for (std::int64_t i = range.row_begin; i < range.row_begin + range.rows; ++i) {
      for (std::int64_t j = range.col_begin; j < range.col_begin + range.cols; ++j) {
        out.push_back(amax[static_cast<std::size_t>((m * all.rows + i) * all.cols + j)]);
      }
    }
  }
  return out;
}

// The blocks whose first element the part holds (its owner's scales).
Fp8OwnedBlocks owned_blocks(const Fp8Part& p) {
  const std::int64_t r0 = fp8_blocks(p.row_offset), r1 = fp8_blocks(p.row_offset + p.local.rows);
  const std::int64_t c0 = fp8_blocks(p.col_offset), c1 = fp8_blocks(p.col_offset + p.local.cols);
  return {r0, std::max<std::int64_t>(0, r1 - r0), c0, std::max<std::int64_t>(0, c1 - c0)};
}

struct DevicePart {
  DeviceBuffer src, amax, codes, scales;
};

template <class T>
std::vector<T> from_device(const DeviceBuffer& b, std::size_t n) {
  std::vector<T> out(n);
  EXPECT_TRUE(copy_device_to_host(std::as_writable_bytes(std::span(out)), b.data()).ok());
  return out;
}

// Every part of every weight in one batch: step 1 equals fp8_part_amax,
// step 3 with the whole weight's amax equals quantize_fp8_part (codes, and
// the scales of the blocks each part owns). The cuts are FSDP's (tiny's
// 1408 rows over 3 ranks: 470 rows each), TP x FSDP's (columns cut too),
// single rows and columns, and stacked experts. Catches: a cell bounded by
// the block and not the part (reads a neighbour's rows), the amax of a
// partial block taken over the block's full 128 rows, a scale written for
// a block the part does not own or at the touched range's index instead of
// the owned box's, codes indexed by the weight's row instead of the
// part's. Tried once: `c.r0 = max(row, a.row_offset)` without subtracting
// the part's offset failed every cut part.
TEST_F(Fp8PartGpuTest, BothStepsEqualTheCpuReferenceForCutParts) {
  const std::vector<Weight> weights = {
      {DType::kBFloat16, 1, 1408, 384, {{0, 470, 0, 384}, {470, 940, 0, 384}, {940, 1408, 0, 384}}},
      {DType::kFloat32, 1, 300, 260, {{0, 150, 0, 130}, {150, 300, 0, 130}, {0, 300, 130, 260}}},
      {DType::kBFloat16, 3, 257, 129, {{0, 1, 0, 129}, {1, 256, 0, 100}, {1, 256, 100, 129}, {256, 257, 0, 129}}},
      {DType::kBFloat16, 1, 128, 128, {{0, 128, 0, 128}, {5, 6, 7, 8}}}};
  std::vector<Fp8PartDeviceJob> jobs;
  std::vector<DevicePart> device;
  std::vector<std::vector<std::byte>> fulls, hosts;
  std::vector<Fp8Part> cpu_parts;
  std::vector<std::vector<float>> combined;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer reports, DeviceBuffer::Allocate(0, 8 * 16));
  REFIT_ASSERT_OK(device_memset(reports.data(), 0xFF, reports.size()));
  for (std::size_t k = 0; k < weights.size(); ++k) {
    const Weight& w = weights[k];
    fulls.push_back(encode(w.dtype, random_values(w.dtype, 700 + k, w.e, w.rows, w.cols)));
    for (const Cut& cut : w.cuts) {
      hosts.push_back(part_bytes(w, fulls.back(), cut));
      const Fp8Part host = part_of(w, cut, hosts.back().data());
      const Fp8BlockRange range = fp8_part_blocks(host);
      const Fp8OwnedBlocks owned = owned_blocks(host);
      DevicePart d;
      REFIT_ASSERT_OK_AND_ASSIGN(d.src, DeviceBuffer::Allocate(0, hosts.back().size()));
      REFIT_ASSERT_OK(copy_host_to_device(d.src.data(), hosts.back()));
      REFIT_ASSERT_OK_AND_ASSIGN(d.amax, DeviceBuffer::Allocate(0, 4 * range.blocks()));
      const std::int64_t elements = host.local.matrices * host.local.rows * host.local.cols;
      REFIT_ASSERT_OK_AND_ASSIGN(d.codes, DeviceBuffer::Allocate(0, elements));
      const std::int64_t owned_scales = std::max<std::int64_t>(1, w.e * owned.rows * owned.cols);
      REFIT_ASSERT_OK_AND_ASSIGN(d.scales, DeviceBuffer::Allocate(0, 4 * owned_scales));
      REFIT_ASSERT_OK(device_memset(d.scales.data(), 0xA5, d.scales.size()));
      jobs.push_back({part_of(w, cut, d.src.data()), owned, reinterpret_cast<float*>(d.amax.data()),
                      reinterpret_cast<std::uint8_t*>(d.codes.data()), reinterpret_cast<float*>(d.scales.data()),
                      reinterpret_cast<std::uint64_t*>(reports.data()) + jobs.size()});
      cpu_parts.push_back(host);
      combined.push_back(combined_amax(w, fulls.back(), host));
      device.push_back(std::move(d));
    }
  }
  REFIT_ASSERT_OK_AND_ASSIGN(const Fp8PartDeviceBatch batch, Fp8PartDeviceBatch::Prepare(jobs, 0));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  REFIT_ASSERT_OK(batch.launch_amax(stream.handle()));
  REFIT_ASSERT_OK(stream.synchronize());
  const std::vector<std::uint64_t> got_reports = from_device<std::uint64_t>(reports, jobs.size());
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    const std::string where = "part " + std::to_string(k);
    EXPECT_EQ(got_reports[k], kFp8AllFinite) << where;
    std::vector<float> want(combined[k].size());
    REFIT_ASSERT_OK(fp8_part_amax(cpu_parts[k], want));
    const std::vector<float> got = from_device<float>(device[k].amax, want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), 4 * want.size())) << where << ": partial amax";
    REFIT_ASSERT_OK(copy_host_to_device(device[k].amax.data(), std::as_bytes(std::span(combined[k]))));
  }
  REFIT_ASSERT_OK(batch.launch_quantize(stream.handle()));
  REFIT_ASSERT_OK(stream.synchronize());
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    const std::string where = "part " + std::to_string(k);
    const Fp8Part& p = cpu_parts[k];
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(p.local.matrices * p.local.rows * p.local.cols));
    std::vector<float> scales(combined[k].size(), -1.0f);
    REFIT_ASSERT_OK(quantize_fp8_part(p, combined[k], codes, scales));
    EXPECT_EQ(from_device<std::uint8_t>(device[k].codes, codes.size()), codes) << where << ": codes";
    const Fp8BlockRange range = fp8_part_blocks(p);
    const Fp8OwnedBlocks o = jobs[k].owned;
    const auto owned_scales = static_cast<std::size_t>(p.local.matrices * o.rows * o.cols);
    const std::vector<float> got = from_device<float>(device[k].scales, owned_scales);
    for (std::int64_t m = 0, n = 0; m < p.local.matrices; ++m) {
      for (std::int64_t i = o.row_begin; i < o.row_begin + o.rows; ++i) {
        for (std::int64_t j = o.col_begin; j < o.col_begin + o.cols; ++j, ++n) {
          const float want = scales[((m * range.rows) + i - range.row_begin) * range.cols + j - range.col_begin];
          ASSERT_EQ(bits_of(got[n]), bits_of(want))
              << where << ": scale of block [" << m << ", " << i << ", " << j << "]";
        }
      }
    }
  }
}

// A NaN or Inf in a part is reported, and the lowest local index wins, so
// fp8_part_nonfinite_status gives exactly the CPU step's refusal (the
// element in the weight's coordinates). Catches: the weight's index reported
// instead of the part's, or the report's kind bits read wrong.
TEST_F(Fp8PartGpuTest, NanAndInfAreReportedAsTheCpuStepNamesThem) {
  const Weight w{DType::kBFloat16, 2, 300, 260, {{130, 290, 5, 250}}};
  const Cut cut = w.cuts[0];
  std::vector<float> values = random_values(w.dtype, 77, w.e, w.rows, w.cols);
  const auto at = [&](std::int64_t m, std::int64_t r, std::int64_t c) -> float& {
    return values[static_cast<std::size_t>((m * w.rows + r) * w.cols + c)];
  };
  at(1, 200, 9) = std::numeric_limits<float>::quiet_NaN();
  at(1, 250, 200) = -std::numeric_limits<float>::infinity();
  at(0, 10, 9) = std::numeric_limits<float>::infinity();  // outside the part: never seen
  for (int round = 0; round < 2; ++round) {
    if (round == 1) at(1, 140, 100) = -std::numeric_limits<float>::infinity();  // now the first
    const std::vector<std::byte> full = encode(w.dtype, values);
    std::vector<std::byte> host = part_bytes(w, full, cut);
    const Fp8Part cpu = part_of(w, cut, host.data());
    std::vector<float> amax(static_cast<std::size_t>(fp8_part_blocks(cpu).blocks()));
    const Status want = fp8_part_amax(cpu, amax);
    ASSERT_FALSE(want.ok());
    REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer src, DeviceBuffer::Allocate(0, host.size()));
    REFIT_ASSERT_OK(copy_host_to_device(src.data(), host));
    const std::int64_t elements = cpu.local.matrices * cpu.local.rows * cpu.local.cols;
    REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer out, DeviceBuffer::Allocate(0, 4 * amax.size() + elements + 8));
    REFIT_ASSERT_OK(device_memset(out.data(), 0xFF, 8));
    const Fp8PartDeviceJob job{part_of(w, cut, src.data()), {}, reinterpret_cast<float*>(out.data() + 8),
                               reinterpret_cast<std::uint8_t*>(out.data() + 8 + 4 * amax.size()), nullptr,
                               reinterpret_cast<std::uint64_t*>(out.data())};
    REFIT_ASSERT_OK_AND_ASSIGN(const Fp8PartDeviceBatch batch, Fp8PartDeviceBatch::Prepare({&job, 1}, 0));
    REFIT_ASSERT_OK(batch.launch_amax(nullptr));
    const std::uint64_t report = from_device<std::uint64_t>(out, 1)[0];
    const Status got = fp8_part_nonfinite_status(cpu, report);
    EXPECT_EQ(got.ToString(), want.ToString()) << "round " << round;
  }
}

// Prepare refuses, naming the job, what the kernels cannot take: an owned
// box outside the touched blocks (its scales would land outside the
// caller's array), and a missing output. Catches: either check dropped.
TEST_F(Fp8PartGpuTest, PrepareRefusesOwnedBlocksOutsideThePartAndNullOutputs) {
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer mem, DeviceBuffer::Allocate(0, 1 << 20));
  auto* f = reinterpret_cast<float*>(mem.data());
  Fp8PartDeviceJob job{Fp8Part{fp8_dense_source(DType::kBFloat16, mem.data(), 1, 150, 200), 150, 0, 300, 200},
                       {2, 1, 0, 2}, f, reinterpret_cast<std::uint8_t*>(mem.data() + 4096), f + 64,
                       reinterpret_cast<std::uint64_t*>(mem.data() + 8192)};
  REFIT_ASSERT_OK(Fp8PartDeviceBatch::Prepare({&job, 1}, 0).status());
  job.owned = {2, 2, 0, 2};  // block row 3 of a 300-row weight: not touched
  EXPECT_NE(Fp8PartDeviceBatch::Prepare({&job, 1}, 0).status().message().find("job 0: its owned blocks lie outside"),
            std::string::npos);
  job.owned = {2, 1, 0, 2};
  job.codes = nullptr;
  EXPECT_NE(Fp8PartDeviceBatch::Prepare({&job, 1}, 0).status().message().find("null output"), std::string::npos);
}

}  // namespace
}  // namespace refit
