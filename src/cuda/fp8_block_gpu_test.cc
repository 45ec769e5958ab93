// GPU tests of cuda/fp8_block.h (label gpu): the kernel must produce the CPU
// reference's bytes (quant/fp8_block.h defines the format) bit for bit, and
// report NaN and Inf exactly as the CPU check names them.
#include "cuda/fp8_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.h"
#include "cuda/fp8_test_values.h"
#include "cuda/gpu_test_util.h"
#include "quant/fp8_block.h"

namespace refit {
namespace {

// The device entry points, or (refit built without CUDA, where no stub
// defines them) a failure the tests never reach: SetUp skips first.
Status quantize_device(const Fp8Source& source, const Fp8Box& box, const Fp8DeviceOutput& out, void* stream) {
#if REFIT_HAVE_CUDA
  return quantize_fp8_block_device(source, box, out, stream);
#else
  (void)source, (void)box, (void)out, (void)stream;
  return FailedPrecondition("quantize_fp8_block_device: refit was built without CUDA");
#endif
}

Status e4m3_bits_device(std::uint32_t first, std::uint64_t count, std::uint8_t* dst, void* stream) {
#if REFIT_HAVE_CUDA
  return e4m3_from_float_bits_device(first, count, dst, stream);
#else
  (void)first, (void)count, (void)dst, (void)stream;
  return FailedPrecondition("e4m3_from_float_bits_device: refit was built without CUDA");
#endif
}

class Fp8BlockGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !REFIT_HAVE_CUDA
    GTEST_SKIP() << "no CUDA device: refit was built without CUDA";
#endif
    REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  }
};

using namespace fp8_test;  // NOLINT(google-build-using-namespace): the shared test inputs

struct Result {
  std::vector<std::uint8_t> weight;
  std::vector<float> scale;
  std::uint64_t report = 0;
};

// The CPU reference over `box` of `source` (host memory).
void cpu_quantize(const Fp8Source& source, const Fp8Box& box, Result* out) {
  out->weight.assign(box.elements(), 0);
  out->scale.assign(box.scales(), 0.0f);
  REFIT_ASSERT_OK(quantize_fp8_block(source, box, out->weight, out->scale));
  out->report = kFp8AllFinite;
}

// `source` describes host bytes inside `host`; the same bytes go to the
// device, the kernel quantizes `box` there, and the outputs come back.
// Output buffers start poisoned (0xA5) with a guard after each.
void gpu_quantize(const std::vector<std::byte>& host, const Fp8Source& source, const Fp8Box& box, Result* out) {
  const std::uint64_t n = box.elements(), ns = box.scales();
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer src, DeviceBuffer::Allocate(0, std::max<std::size_t>(host.size(), 1)));
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer w, DeviceBuffer::Allocate(0, n + 64));
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer sc, DeviceBuffer::Allocate(0, ns * 4 + 64));
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer report, DeviceBuffer::Allocate(0, 8));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  REFIT_ASSERT_OK(copy_host_to_device(src.data(), host));
  REFIT_ASSERT_OK(device_memset(w.data(), 0xA5, w.size()));
  REFIT_ASSERT_OK(device_memset(sc.data(), 0xA5, sc.size()));
  REFIT_ASSERT_OK(device_memset(report.data(), 0xFF, 8));
  Fp8Source dev = source;
  dev.data = src.data() + (source.data - host.data());
  const Fp8DeviceOutput o{reinterpret_cast<std::uint8_t*>(w.data()), reinterpret_cast<float*>(sc.data()),
                          reinterpret_cast<std::uint64_t*>(report.data())};
  REFIT_ASSERT_OK(quantize_device(dev, box, o, stream.handle()));
  REFIT_ASSERT_OK(stream.synchronize());
  std::vector<std::byte> wb(n + 64), sb(ns * 4 + 64), rb(8);
  REFIT_ASSERT_OK(copy_device_to_host(wb, w.data()));
  REFIT_ASSERT_OK(copy_device_to_host(sb, sc.data()));
  REFIT_ASSERT_OK(copy_device_to_host(rb, report.data()));
  for (std::size_t i = n; i < wb.size(); ++i) ASSERT_EQ(wb[i], std::byte{0xA5}) << "wrote past the codes";
  for (std::size_t i = ns * 4; i < sb.size(); ++i) ASSERT_EQ(sb[i], std::byte{0xA5}) << "wrote past the scales";
  out->weight.resize(n);
  out->scale.resize(ns);
  std::memcpy(out->weight.data(), wb.data(), n);
  std::memcpy(out->scale.data(), sb.data(), ns * 4);
  std::memcpy(&out->report, rb.data(), 8);
}

// Bit-for-bit equality, naming the first difference.
void expect_identical(const Result& gpu, const Result& cpu, const std::string& where) {
  ASSERT_EQ(gpu.report, cpu.report) << where;
  ASSERT_EQ(gpu.scale.size(), cpu.scale.size()) << where;
  for (std::size_t i = 0; i < cpu.scale.size(); ++i) {
    ASSERT_EQ(bits_of(gpu.scale[i]), bits_of(cpu.scale[i])) << where << ": scale " << i << " gpu " << gpu.scale[i]
                                                            << " cpu " << cpu.scale[i];
  }
  const auto mm = std::mismatch(cpu.weight.begin(), cpu.weight.end(), gpu.weight.begin());
  ASSERT_TRUE(mm.first == cpu.weight.end()) << where << ": code " << (mm.first - cpu.weight.begin()) << " cpu 0x"
                                            << std::hex << int(*mm.first) << " gpu 0x" << int(*mm.second);
}

// Catches: a device conversion that differs from e4m3_from_float anywhere
// (ties away from zero, no saturation above 448 or for Inf, a lost sign of
// zero, flushed fp32 subnormals turned into the wrong zero), checked on all
// 2^32 fp32 bit patterns but NaN.
TEST_F(Fp8BlockGpuTest, ConversionMatchesTheReferenceForEveryFp32) {
  constexpr std::uint64_t kChunk = 1ull << 28;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::Allocate(0, kChunk));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  std::vector<std::byte> got(kChunk);
  const unsigned workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (std::uint64_t first = 0; first < (1ull << 32); first += kChunk) {
    REFIT_ASSERT_OK(e4m3_bits_device(static_cast<std::uint32_t>(first), kChunk,
                                     reinterpret_cast<std::uint8_t*>(buf.data()), stream.handle()));
    REFIT_ASSERT_OK(stream.synchronize());
    REFIT_ASSERT_OK(copy_device_to_host(got, buf.data()));
    std::vector<std::uint64_t> bad(workers, ~0ull);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < workers; ++t) {
      threads.emplace_back([&, t] {
        for (std::uint64_t i = t; i < kChunk; i += workers) {
          const auto bits = static_cast<std::uint32_t>(first + i);
          if ((bits & 0x7FFFFFFFu) > 0x7F800000u) continue;  // NaN: refused before conversion
          if (static_cast<std::uint8_t>(got[i]) != e4m3_from_float(from_bits(bits))) {
            bad[t] = std::min(bad[t], i);
            return;
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
    const std::uint64_t i = *std::min_element(bad.begin(), bad.end());
    ASSERT_EQ(i, ~0ull) << "fp32 bits 0x" << std::hex << (first + i) << " (" << std::hexfloat
                        << from_bits(static_cast<std::uint32_t>(first + i)) << "): gpu 0x"
                        << int(static_cast<std::uint8_t>(got[i])) << ", reference 0x"
                        << int(e4m3_from_float(from_bits(static_cast<std::uint32_t>(first + i))));
  }
}

// Catches: any difference from the CPU reference in the amax reduction
// (a lane or warp left out, a stale shared value from the previous block of
// a grid-strided loop), in s or the quotient (a fast division), in partial
// edge blocks (reading across rows or matrices), in stacked experts, in grid
// striding past 65535 row blocks or matrices, and writes past the outputs.
// Both paths of the kernel: [1, 128, 128], [8, 256, 384] and [1, 4096,
// 4096] are whole aligned blocks (the vector path), the rest edge blocks or
// rows of odd length (the element path), so a wrong lane-to-column map or
// packing order in either shows here. (The vector path's mutations have not
// been tried on a GPU yet: it passed as written, session 19.)
TEST_F(Fp8BlockGpuTest, MatchesTheCpuReferenceOnRandomInputs) {
  struct Shape {
    std::int64_t e, r, c;
  };
  const Shape shapes[] = {{1, 1, 1},     {1, 127, 129},  {1, 128, 128}, {1, 130, 257},
                          {1, 300, 260}, {3, 130, 129},  {2, 1, 300},   {1, 513, 5},
                          {8, 256, 384}, {1, 1000, 4100}};
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    for (const Shape& s : shapes) {
      const std::vector<std::byte> b = encode(dtype, random_values(dtype, 77 + s.r * 3 + s.c, s.e, s.r, s.c));
      const Fp8Source src = fp8_dense_source(dtype, b.data(), s.e, s.r, s.c);
      Result cpu, gpu;
      ASSERT_NO_FATAL_FAILURE(cpu_quantize(src, fp8_whole_box(src), &cpu));
      ASSERT_NO_FATAL_FAILURE(gpu_quantize(b, src, fp8_whole_box(src), &gpu));
      ASSERT_NO_FATAL_FAILURE(expect_identical(gpu, cpu,
                                               std::string(dtype_name(dtype)) + " [" + std::to_string(s.e) + ", " +
                                                   std::to_string(s.r) + ", " + std::to_string(s.c) + "]"));
    }
  }
  // Grid striding: 65537 row blocks (y limit 65535), 65537 matrices (z).
  for (const Shape& s : {Shape{1, 65536 * 128 + 5, 1}, Shape{65537, 1, 2}, Shape{1, 4096, 4096}}) {
    const std::vector<std::byte> b = encode(DType::kBFloat16, random_values(DType::kBFloat16, 5, s.e, s.r, s.c));
    const Fp8Source src = fp8_dense_source(DType::kBFloat16, b.data(), s.e, s.r, s.c);
    Result cpu, gpu;
    ASSERT_NO_FATAL_FAILURE(cpu_quantize(src, fp8_whole_box(src), &cpu));
    ASSERT_NO_FATAL_FAILURE(gpu_quantize(b, src, fp8_whole_box(src), &gpu));
    ASSERT_NO_FATAL_FAILURE(expect_identical(gpu, cpu, "bfloat16 [" + std::to_string(s.e) + ", " +
                                                           std::to_string(s.r) + ", " + std::to_string(s.c) + "]"));
  }
}

// Catches: box offsets or strides applied differently on the device (a TP
// shard quantized in place from the full tensor, a source with padded rows).
TEST_F(Fp8BlockGpuTest, BoxesAndStridesMatchTheCpuReference) {
  const std::int64_t E = 2, R = 300, C = 260, padded = 300;
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    // Rows padded to 300 elements: columns 260..299 hold NaN, outside every box.
    std::vector<float> v = random_values(dtype, 3, E, R, padded);
    for (std::int64_t i = 0; i < E * R; ++i) {
      for (std::int64_t c = C; c < padded; ++c) v[i * padded + c] = std::nanf("");
    }
    const std::vector<std::byte> b = encode(dtype, v);
    const Fp8Source src{dtype, b.data(), E, R, C, padded, R * padded};
    const Fp8Box boxes[] = {fp8_whole_box(src),          {1, 1, 128, 172, 128, 128}, {0, 2, 0, 128, 256, 4},
                            {0, 1, 256, 44, 0, 260},     {1, 1, 0, 300, 0, 128}};
    for (const Fp8Box& box : boxes) {
      Result cpu, gpu;
      ASSERT_NO_FATAL_FAILURE(cpu_quantize(src, box, &cpu));
      ASSERT_NO_FATAL_FAILURE(gpu_quantize(b, src, box, &gpu));
      ASSERT_NO_FATAL_FAILURE(expect_identical(gpu, cpu,
                                               std::string(dtype_name(dtype)) + " box rows " +
                                                   std::to_string(box.row_begin) + "+" + std::to_string(box.rows) +
                                                   " cols " + std::to_string(box.col_begin) + "+" +
                                                   std::to_string(box.cols)));
    }
    // The shard as its own source (data at its first element).
    const std::int64_t offset = (1 * R + 128) * padded + 128;
    const Fp8Source shard{dtype, b.data() + offset * dtype_size(dtype), 1, 172, 128, padded, R * padded};
    Result cpu, gpu;
    ASSERT_NO_FATAL_FAILURE(cpu_quantize(src, boxes[1], &cpu));
    ASSERT_NO_FATAL_FAILURE(gpu_quantize(b, shard, fp8_whole_box(shard), &gpu));
    ASSERT_NO_FATAL_FAILURE(expect_identical(gpu, cpu, "shard as its own source"));
  }
}

// The hand cases of quant/fp8_block_test.cc, on the device: exact values
// where the answer is known without the reference.
// Catches: a multiplication by the reciprocal (the 3.125 and 3.625 ties of
// amax 1.53125 go up), no floor (1e-13 would become 448), a quotient above
// 448 not saturated, a lost sign of zero, NaN from an all-zero block.
TEST_F(Fp8BlockGpuTest, HandCases) {
  struct Case {
    DType dtype;
    std::vector<float> values;
    std::vector<std::uint8_t> codes;
    std::uint32_t scale_bits;
  };
  const Case cases[] = {
      {DType::kBFloat16, {448.0f, 1.0625f, 1.1875f, 432.0f, 400.0f, 0.0009765625f, 0.0029296875f, 0.0146484375f,
                          -1.0625f, 0.0f, -0.0f, -0.00048828125f},
       {0x7E, 0x38, 0x3A, 0x7E, 0x7C, 0x00, 0x02, 0x08, 0xB8, 0x00, 0x80, 0x80}, 0x3F800000u},
      {DType::kBFloat16, {1.53125f, bf16_to_float(0x3C2F), bf16_to_float(0x3C4B)}, {0x7E, 0x44, 0x46}, 0x3B600000u},
      {DType::kBFloat16, {1.0f, 0.5f, -0.5f}, {0x7E, 0x76, 0xF6}, 0x3B124925u},
      {DType::kBFloat16, {bf16_to_float(0x3F83), -bf16_to_float(0x3F83)}, {0x7E, 0xFE}, 0},  // q > 448
      {DType::kFloat32, {1e-13f, -1e-13f, 0.0f}, {0x63, 0xE3, 0x00}, 0x2720D7C5u},
      {DType::kFloat32, {from_bits(0x007FFFFF), from_bits(0x00000001), from_bits(0x80000001), from_bits(0x80400000)},
       {0x00, 0x00, 0x80, 0x80}, 0x2720D7C5u},
      {DType::kFloat32, {448.0f, from_bits(0x007FFFFF), from_bits(0x80000001)}, {0x7E, 0x00, 0x80}, 0x3F800000u},
      {DType::kBFloat16, {0.0f, -0.0f, 0.0f, -0.0f}, {0x00, 0x80, 0x00, 0x80}, 0x2720D7C5u},
  };
  for (const Case& c : cases) {
    const std::vector<std::byte> b = encode(c.dtype, c.values);
    const Fp8Source src = fp8_dense_source(c.dtype, b.data(), 1, 1, static_cast<std::int64_t>(c.values.size()));
    Result gpu;
    ASSERT_NO_FATAL_FAILURE(gpu_quantize(b, src, fp8_whole_box(src), &gpu));
    EXPECT_EQ(gpu.weight, c.codes) << c.values[0];
    if (c.scale_bits != 0) {
      EXPECT_EQ(bits_of(gpu.scale[0]), c.scale_bits) << c.values[0];
    }
    EXPECT_EQ(gpu.report, kFp8AllFinite);
  }
}

// Catches: NaN or Inf not reported, a report that is not the first element
// in C order when several blocks hold one (the atomic minimum across
// blocks), box-relative indices decoded into the wrong coordinates.
TEST_F(Fp8BlockGpuTest, NanAndInfAreReportedAsTheCpuCheckNamesThem) {
  const std::int64_t E = 2, R = 300, C = 260;
  std::vector<float> v(E * R * C, 1.0f);
  auto at = [&](std::int64_t m, std::int64_t r, std::int64_t c) -> float& { return v[(m * R + r) * C + c]; };
  at(1, 5, 3) = std::nanf("");                       // block (0, 0)
  at(1, 0, 200) = -std::numeric_limits<float>::infinity();  // block (0, 1), first in C order
  at(1, 299, 259) = std::numeric_limits<float>::infinity();  // block (2, 2)
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    const std::vector<std::byte> b = encode(dtype, v);
    const Fp8Source src = fp8_dense_source(dtype, b.data(), E, R, C);
    struct Expect {
      Fp8Box box;
      std::string message;
    };
    const Expect expects[] = {
        {fp8_whole_box(src), "element [1, 0, 200] is -inf"},
        {{1, 1, 0, 300, 0, 128}, "element [1, 5, 3] is nan"},
        {{1, 1, 256, 44, 256, 4}, "element [1, 299, 259] is inf;"},
        {{0, 1, 0, 300, 0, 260}, ""},
    };
    for (const Expect& e : expects) {
      Result gpu;
      ASSERT_NO_FATAL_FAILURE(gpu_quantize(b, src, e.box, &gpu));
      const Status device = fp8_nonfinite_status(src, e.box, gpu.report, "experts.w2.weight", 41);
      const Status host = check_fp8_finite(src, e.box, "experts.w2.weight", 41);
      EXPECT_EQ(device.ToString(), host.ToString());
      if (e.message.empty()) {
        EXPECT_EQ(gpu.report, kFp8AllFinite);
      } else {
        EXPECT_NE(device.message().find(e.message), std::string::npos) << device.ToString();
      }
    }
  }
}

// Catches: invalid boxes or missing outputs launched anyway (the host
// checks come first; nothing touches the device).
TEST_F(Fp8BlockGpuTest, RefusesBadArgumentsBeforeLaunching) {
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::Allocate(0, 1 << 20));
  std::byte* d = buf.data();
  const Fp8Source src = fp8_dense_source(DType::kBFloat16, d, 1, 256, 256);
  const Fp8DeviceOutput out{reinterpret_cast<std::uint8_t*>(d + 131072), reinterpret_cast<float*>(d + 262144),
                            reinterpret_cast<std::uint64_t*>(d + 262400)};
  Status s = quantize_device(src, {0, 1, 64, 128, 0, 256}, out, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not a multiple of 128"), std::string::npos) << s.ToString();
  s = quantize_device(src, fp8_whole_box(src), Fp8DeviceOutput{out.weight, out.scale, nullptr}, nullptr);
  EXPECT_NE(s.message().find("null output"), std::string::npos) << s.ToString();
  Fp8Source odd = src;
  odd.data = d + 1;
  s = quantize_device(odd, fp8_whole_box(src), out, nullptr);
  EXPECT_NE(s.message().find("misaligned"), std::string::npos) << s.ToString();
  EXPECT_TRUE(quantize_device(src, {0, 1, 0, 0, 0, 256}, Fp8DeviceOutput{}, nullptr).ok());  // empty: nothing to do
}

// Catches: a batch job finding the wrong job or block (the binary search
// over first blocks off by one at a job's edge, local block indices decoded
// in another order), jobs of mixed dtypes read as one dtype, a NaN reported
// into another job's word, and writes outside a job's outputs. Every job of
// one launch (all the shapes above, bf16 and fp32, whole tensors and boxes,
// one holding a NaN) against the CPU reference.
TEST_F(Fp8BlockGpuTest, OneBatchedLaunchEqualsTheReferenceForEveryJob) {
  struct Job {
    DType dtype;
    std::int64_t e, r, c;
    Fp8Box box;  // matrices 0: the whole tensor
  };
  const Job jobs[] = {{DType::kBFloat16, 1, 1, 1, {}},       {DType::kFloat32, 1, 127, 129, {}},
                      {DType::kBFloat16, 3, 130, 129, {}},   {DType::kBFloat16, 1, 300, 260, {0, 1, 128, 128, 0, 260}},
                      {DType::kFloat32, 2, 256, 384, {1, 1, 0, 256, 128, 256}}, {DType::kBFloat16, 1, 513, 5, {}},
                      {DType::kBFloat16, 1, 1000, 4100, {}}};
  std::vector<std::vector<std::byte>> host;
  std::vector<DeviceBuffer> src, out;
  std::vector<Fp8DeviceJob> batch_jobs;
  std::vector<Result> want;
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer reports, DeviceBuffer::Allocate(0, 8 * std::size(jobs)));
  REFIT_ASSERT_OK(device_memset(reports.data(), 0xFF, reports.size()));
  for (std::size_t k = 0; k < std::size(jobs); ++k) {
    const Job& j = jobs[k];
    std::vector<float> values = random_values(j.dtype, 900 + k, j.e, j.r, j.c);
    if (k == 3) values[200 * 260 + 17] = std::numeric_limits<float>::quiet_NaN();  // inside the box: reported
    host.push_back(encode(j.dtype, values));
    const Fp8Source on_host = fp8_dense_source(j.dtype, host.back().data(), j.e, j.r, j.c);
    const Fp8Box box = j.box.matrices == 0 ? fp8_whole_box(on_host) : j.box;
    Result cpu;
    if (k == 3) {
      cpu.report = fp8_first_nonfinite(on_host, box);
    } else {
      ASSERT_NO_FATAL_FAILURE(cpu_quantize(on_host, box, &cpu));
    }
    want.push_back(cpu);
    REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer s, DeviceBuffer::Allocate(0, host.back().size()));
    REFIT_ASSERT_OK(copy_host_to_device(s.data(), host.back()));
    REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer o, DeviceBuffer::Allocate(0, box.elements() + box.scales() * 4 + 64));
    REFIT_ASSERT_OK(device_memset(o.data(), 0xA5, o.size()));
    Fp8Source on_device = on_host;
    on_device.data = s.data();
    batch_jobs.push_back({on_device, box,
                          {reinterpret_cast<std::uint8_t*>(o.data() + box.scales() * 4),
                           reinterpret_cast<float*>(o.data()), reinterpret_cast<std::uint64_t*>(reports.data()) + k}});
    src.push_back(std::move(s));
    out.push_back(std::move(o));
  }
  REFIT_ASSERT_OK_AND_ASSIGN(const Fp8DeviceBatch batch, Fp8DeviceBatch::Prepare(batch_jobs, 0));
  EXPECT_EQ(batch.jobs(), static_cast<int>(std::size(jobs)));
  REFIT_ASSERT_OK_AND_ASSIGN(CudaStream stream, CudaStream::Create(0));
  REFIT_ASSERT_OK(batch.launch(stream.handle()));
  REFIT_ASSERT_OK(stream.synchronize());
  std::vector<std::uint64_t> got_reports(std::size(jobs));
  REFIT_ASSERT_OK(copy_device_to_host({reinterpret_cast<std::byte*>(got_reports.data()), reports.size()}, reports.data()));
  for (std::size_t k = 0; k < std::size(jobs); ++k) {
    const Fp8Box& box = batch_jobs[k].box;
    std::vector<std::byte> bytes(out[k].size());
    REFIT_ASSERT_OK(copy_device_to_host(bytes, out[k].data()));
    const std::string where = "job " + std::to_string(k);
    EXPECT_EQ(got_reports[k], want[k].report) << where;
    for (std::size_t i = box.elements() + box.scales() * 4; i < bytes.size(); ++i) {
      ASSERT_EQ(bytes[i], std::byte{0xA5}) << where << ": wrote past its outputs";
    }
    if (k == 3) continue;  // a reported job's outputs are not to be used
    Result gpu;
    gpu.report = got_reports[k];
    gpu.scale.resize(box.scales());
    gpu.weight.resize(box.elements());
    std::memcpy(gpu.scale.data(), bytes.data(), box.scales() * 4);
    std::memcpy(gpu.weight.data(), bytes.data() + box.scales() * 4, box.elements());
    ASSERT_NO_FATAL_FAILURE(expect_identical(gpu, want[k], where));
  }
}

}  // namespace
}  // namespace refit
