// quantize_fp8_block_device: quant/fp8_block.h's format on the GPU.
//
// Layout of the work: one CUDA block of 32 x 8 threads per 128 x 128 block
// of one matrix of the box (grid x: column blocks, y: row blocks, z:
// matrices, each grid-striding past CUDA's limits). A whole block whose rows
// start 16-byte aligned takes the vector path (quantize_vector_block: each
// thread 8 consecutive values of 8 rows, 16-byte loads, 8-byte stores of
// codes); edge and unaligned blocks the element path (quantize_block: thread
// (tx, ty) takes columns tx + 32 j (j < 4) of rows ty + 8 i (i < 16), 2- or
// 4-byte loads). Both read their 64 values for the amax and again (from L1
// or L2) for the codes. The amax is kept as fp32 bits (unsigned integers
// order non-negative floats, and NaN and Inf lie above every finite value,
// so one comparison finds them): bf16 pairs by 16-bit SIMD maxima, the warp
// by one redux, the 8 warps through shared memory. Every thread then makes
// s, 1/s and fp8_nonzero_floor(s) and converts its values.
//
// On the H100 and H200 (2026-12-05, docs/PERF.md) the vector path halved
// llama3-8b's quantizing refit (42 to 22 ms).
//
// Bit exactness with the CPU reference (src/quant/fp8_block.cc):
//   - amax is a maximum of exact magnitudes, so the reduction order does not
//     matter;
//   - s uses __fdiv_rn (IEEE division, nearest even), whatever -prec-div
//     says; the quotients are fp8_block_quotient's (quant/fp8_quotient.h):
//     the IEEE division's result by one reciprocal per block and two fmas
//     per element (Markstein), or the zero of x's sign where that is the
//     only code x / s can have; its host test checks it against the
//     division for every bf16 value under every scale exponent;
//   - the conversion is __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3),
//     on sm_89+ one cvt.rn.satfinite.e4m3x2.f32: nearest even, saturating
//     to +-448, sign of zero kept (checked against e4m3_from_float for every
//     fp32 by the gpu test); NaN would give 0x7F, but a NaN is reported and
//     the outputs (codes and scales) are then not to be used.
#include "cuda/fp8_block.h"

#include <algorithm>
#include <string>
#include <vector>

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "cuda/fp8_kernel.cuh"
#include "quant/fp8_quotient.h"
#include "refit/device_memory.h"

namespace refit {
namespace {

using namespace fp8_kernel;  // NOLINT(google-build-using-namespace): the shared kernel pieces

struct QuantizeArgs {
  const std::byte* data;        // the source's element [0, 0, 0]
  std::int64_t row_stride;      // elements
  std::int64_t matrix_stride;   // elements
  std::int64_t matrix_begin, row_begin, col_begin;  // the box in the source
  std::int64_t matrices, rows, cols;                // the box's sizes
  std::int64_t block_rows, block_cols;              // ceil(rows / 128), ceil(cols / 128)
  std::uint8_t* weight;
  float* scale;
  unsigned long long* report;
  bool bf16;  // the batch kernel's dtype; the single kernel's is its template argument
};

// The fast path for a whole 128 x 128 block whose rows start 16-byte aligned
// (and whose codes' rows start 8-byte aligned): thread t of the CUDA block
// takes columns 8 (t % 16) .. 8 (t % 16) + 7 of rows t / 16 + 16 i (i < 8),
// loaded as one 16-byte vector per row (bf16; two for fp32), once for the
// amax and again (from L1 or L2) for the codes: holding the 64 values in
// registers across the divisions spilled (ptxas -v). A warp reads two whole
// 256-byte (bf16) rows per load and stores its codes 8 bytes per thread.
// The per-element arithmetic is quantize_block's.
template <bool kBf16>
__device__ __forceinline__ bool vector_block(const QuantizeArgs& a, const std::byte* src, std::int64_t out, int h,
                                             int w) {
  constexpr std::int64_t kVector = kBf16 ? 8 : 4;  // elements per 16 bytes
  return h == kFp8BlockSize && w == kFp8BlockSize && a.row_stride % kVector == 0 && a.cols % 8 == 0 &&
         reinterpret_cast<std::uintptr_t>(src) % 16 == 0 && reinterpret_cast<std::uintptr_t>(a.weight + out) % 8 == 0;
}

constexpr int kVecGroups = static_cast<int>(kFp8BlockSize) / 8;  // 16 threads per row
constexpr int kVecRows = static_cast<int>(kFp8BlockSize) * kVecGroups / kThreads;  // 8 rows per thread

// Element k (< 8) of a row's 8 values, loaded as 32-bit words. `k` must be a
// constant after unrolling (else `words` leaves the registers).
template <bool kBf16>
__device__ __forceinline__ unsigned element_bits(const unsigned (&words)[kBf16 ? 4 : 8], int k) {
  if constexpr (kBf16) {
    return k % 2 == 0 ? words[k / 2] << 16 : words[k / 2] & 0xFFFF0000u;
  } else {
    return words[k];
  }
}

// Row i (< kVecRows) of the thread's part: 8 values as 32-bit words.
template <bool kBf16>
__device__ __forceinline__ void load_row(const std::byte* src, std::int64_t row_stride, int r, int c,
                                         unsigned (&words)[kBf16 ? 4 : 8]) {
  constexpr int kBytes = kBf16 ? 2 : 4;
  const auto* p = reinterpret_cast<const uint4*>(src + (r * row_stride + c) * kBytes);
#pragma unroll
  for (int k = 0; k < (kBf16 ? 1 : 2); ++k) {
    const uint4 v = p[k];
    words[4 * k] = v.x;
    words[4 * k + 1] = v.y;
    words[4 * k + 2] = v.z;
    words[4 * k + 3] = v.w;
  }
}

template <bool kBf16>
__device__ __forceinline__ void quantize_vector_block(const QuantizeArgs& a, std::int64_t m, std::int64_t bi,
                                                      std::int64_t bj, const std::byte* src, std::int64_t out,
                                                      unsigned* warp_amax) {
  const int t = static_cast<int>(threadIdx.y * kTileX + threadIdx.x);
  const int c = 8 * (t % kVecGroups), r0 = t / kVecGroups;
  unsigned amax = 0;  // the largest |x| as fp32 bits (integers order non-negative floats; NaN and Inf above all)
#pragma unroll
  for (int i = 0; i < kVecRows; ++i) {
    unsigned words[kBf16 ? 4 : 8];
    load_row<kBf16>(src, a.row_stride, r0 + kVecGroups * i, c, words);
#pragma unroll
    for (int k = 0; k < (kBf16 ? 4 : 8); ++k) {
      // bf16: both halves of a word at once (two 16-bit maxima).
      amax = kBf16 ? __vmaxu2(amax, words[k] & 0x7FFF7FFFu) : max(amax, words[k] & 0x7FFFFFFFu);
    }
  }
  if constexpr (kBf16) amax = max(amax & 0xFFFFu, amax >> 16) << 16;
  amax = block_amax_bits(amax, warp_amax);
  if (nonfinite_bits(amax)) {  // rare: report each NaN or Inf as quantize_block does
    for (int i = 0; i < kVecRows; ++i) {
      const int r = r0 + kVecGroups * i;
      for (int k = 0; k < 8; ++k) {
        const unsigned bits = __float_as_uint(load_element<kBf16>(src, r * a.row_stride + c + k));
        if (nonfinite_bits(bits)) report_nonfinite(a.report, out + static_cast<std::int64_t>(r) * a.cols + c + k, bits);
      }
    }
  }
  const float s = block_scale_of(amax), inv_s = __frcp_rn(s);
  const std::uint32_t floor = fp8_nonzero_floor(__float_as_uint(s));
  if (t == 0) a.scale[(m * a.block_rows + bi) * a.block_cols + bj] = s;
#pragma unroll 4
  for (int i = 0; i < kVecRows; ++i) {
    const int r = r0 + kVecGroups * i;
    unsigned words[kBf16 ? 4 : 8];
    load_row<kBf16>(src, a.row_stride, r, c, words);  // again: from L1 or L2 by now
    unsigned packed[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      unsigned codes = 0;
#pragma unroll
      for (int k = 0; k < 4; k += 2) {
        const float2 q{fp8_block_quotient(__uint_as_float(element_bits<kBf16>(words, 4 * half + k)), s, inv_s, floor),
                       fp8_block_quotient(__uint_as_float(element_bits<kBf16>(words, 4 * half + k + 1)), s, inv_s, floor)};
        const unsigned pair = __nv_cvt_float2_to_fp8x2(q, __NV_SATFINITE, __NV_E4M3);  // .x in the low byte
        codes |= pair << (8 * k);
      }
      packed[half] = codes;
    }
    *reinterpret_cast<uint2*>(a.weight + out + static_cast<std::int64_t>(r) * a.cols + c) = uint2{packed[0], packed[1]};
  }
  __syncthreads();  // warp_amax is reused by the next block
}

// Block (m, bi, bj) of the box of `a`: amax, s, codes. Every thread of the
// CUDA block calls it with the same block; `warp_amax` is the CUDA block's
// shared memory. Two passes over the thread's 64 elements:
// the amax, then the codes, reading them again (the block's 32 KB or 64 KB
// are in L1 by then) instead of holding them in registers, so that several
// CUDA blocks fit on an SM and hide the memory latency.
template <bool kBf16>
__device__ __forceinline__ void quantize_block(const QuantizeArgs& a, std::int64_t m, std::int64_t bi,
                                               std::int64_t bj, unsigned* warp_amax) {
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const std::int64_t r0 = bi * kFp8BlockSize, c0 = bj * kFp8BlockSize;
  const int h = static_cast<int>(min(kFp8BlockSize, a.rows - r0));
  const int w = static_cast<int>(min(kFp8BlockSize, a.cols - c0));
  // Element (r, c) of this block: source index base + r * row_stride + c;
  // box C-order index out + r * cols + c.
  const std::byte* src = a.data + ((a.matrix_begin + m) * a.matrix_stride + (a.row_begin + r0) * a.row_stride +
                                   a.col_begin + c0) * (kBf16 ? 2 : 4);
  const std::int64_t out = (m * a.rows + r0) * a.cols + c0;
  if (vector_block<kBf16>(a, src, out, h, w)) return quantize_vector_block<kBf16>(a, m, bi, bj, src, out, warp_amax);
  unsigned amax = 0;  // as in quantize_vector_block
#pragma unroll 4
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = ty + kTileY * i;
    if (r >= h) break;
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int c = tx + kTileX * j;
      if (c >= w) break;
      const unsigned bits = __float_as_uint(load_element<kBf16>(src, r * a.row_stride + c));
      if (nonfinite_bits(bits)) report_nonfinite(a.report, out + static_cast<std::int64_t>(r) * a.cols + c, bits);
      amax = max(amax, bits & 0x7FFFFFFFu);
    }
  }
  const float s = block_scale_of(block_amax_bits(amax, warp_amax)), inv_s = __frcp_rn(s);
  const std::uint32_t floor = fp8_nonzero_floor(__float_as_uint(s));
  if (tx == 0 && ty == 0) a.scale[(m * a.block_rows + bi) * a.block_cols + bj] = s;
  std::uint8_t* dst = a.weight + out;
#pragma unroll 4
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = ty + kTileY * i;
    if (r >= h) break;
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int c = tx + kTileX * j;
      if (c >= w) break;
      dst[static_cast<std::int64_t>(r) * a.cols + c] =
          e4m3_rn_satfinite(fp8_block_quotient(load_element<kBf16>(src, r * a.row_stride + c), s, inv_s, floor));
    }
  }
  __syncthreads();  // warp_amax is reused by the next block
}

template <bool kBf16>
__global__ void __launch_bounds__(kThreads, kMinBlocks) quantize_kernel(QuantizeArgs a) {
  __shared__ unsigned warp_amax[kTileY];
  for (std::int64_t m = blockIdx.z; m < a.matrices; m += gridDim.z) {
    for (std::int64_t bi = blockIdx.y; bi < a.block_rows; bi += gridDim.y) {
      for (std::int64_t bj = blockIdx.x; bj < a.block_cols; bj += gridDim.x) {
        quantize_block<kBf16>(a, m, bi, bj, warp_amax);
      }
    }
  }
}

// Every block of every job: `first[k]` is job k's first global block index
// (first[jobs] the total); CUDA block g grid-strides over global blocks and
// finds its job by binary search.
__global__ void __launch_bounds__(kThreads, kMinBlocks) quantize_batch_kernel(const QuantizeArgs* jobs,
                                                                 const unsigned long long* first, int count) {
  __shared__ unsigned warp_amax[kTileY];
  const unsigned long long total = first[count];
  for (unsigned long long g = blockIdx.x; g < total; g += gridDim.x) {
    const int lo = job_of(first, count, g);
    // A copy in registers: through a reference into `jobs` every field would
    // be loaded again after each store (the compiler cannot rule out that
    // the codes alias the table).
    const QuantizeArgs a = jobs[lo];
    const auto local = static_cast<std::int64_t>(g - first[lo]);
    std::int64_t m, bi, bj;
    if (local <= 0xFFFFFFFFll && a.block_cols <= 0xFFFFFFFFll && a.block_rows <= 0xFFFFFFFFll) {
      // 32-bit division: 64-bit division is a long software routine, paid
      // by every thread of every block.
      const auto l = static_cast<std::uint32_t>(local), cols = static_cast<std::uint32_t>(a.block_cols);
      const std::uint32_t row = l / cols;
      bj = l - row * cols;
      bi = row % static_cast<std::uint32_t>(a.block_rows);
      m = row / static_cast<std::uint32_t>(a.block_rows);
    } else {
      bj = local % a.block_cols;
      bi = local / a.block_cols % a.block_rows;
      m = local / a.block_cols / a.block_rows;
    }
    if (a.bf16) {
      quantize_block<true>(a, m, bi, bj, warp_amax);
    } else {
      quantize_block<false>(a, m, bi, bj, warp_amax);
    }
  }
}

__global__ void e4m3_bits_kernel(std::uint32_t first, std::uint64_t count, std::uint8_t* dst) {
  const std::uint64_t threads = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += threads) {
    dst[i] = e4m3_rn_satfinite(__uint_as_float(first + static_cast<std::uint32_t>(i)));
  }
}

// The device to launch on: the stream's, or the pointer's for the default stream.
StatusOr<int> launch_device(void* stream, const void* p, const std::string& what) {
  int device = -1;
  if (stream != nullptr) {
    RETURN_IF_ERROR(cuda_check(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device),
                               what + ": cudaStreamGetDevice"));
    return device;
  }
  cudaPointerAttributes attr{};
  RETURN_IF_ERROR(cuda_check(cudaPointerGetAttributes(&attr, p), what + ": cudaPointerGetAttributes"));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return InvalidArgument(what + ": the pointer is not device memory (pass a stream to use mapped memory)");
  }
  return attr.device;
}

unsigned grid_dim(std::int64_t n, std::int64_t limit) {
  return static_cast<unsigned>(std::clamp<std::int64_t>(n, 1, limit));
}

}  // namespace

namespace {

// The checks of one job and its kernel arguments; `what` names it in errors.
StatusOr<QuantizeArgs> job_args(const Fp8Source& source, const Fp8Box& box, const Fp8DeviceOutput& out,
                                const std::string& what) {
  RETURN_IF_ERROR(validate_fp8_box(source, box).WithContext(what));
  if (out.weight == nullptr || out.scale == nullptr || out.report == nullptr) {
    return InvalidArgument(what + ": null output (weight, scale and report are all required)");
  }
  if (reinterpret_cast<std::uintptr_t>(source.data) % dtype_size(source.dtype) != 0 ||
      reinterpret_cast<std::uintptr_t>(out.scale) % alignof(float) != 0 ||
      reinterpret_cast<std::uintptr_t>(out.report) % alignof(std::uint64_t) != 0) {
    return InvalidArgument(what + ": misaligned source, scale or report pointer");
  }
  static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
  return QuantizeArgs{
      .data = source.data,
      .row_stride = source.row_stride,
      .matrix_stride = source.matrix_stride,
      .matrix_begin = box.matrix_begin,
      .row_begin = box.row_begin,
      .col_begin = box.col_begin,
      .matrices = box.matrices,
      .rows = box.rows,
      .cols = box.cols,
      .block_rows = fp8_blocks(box.rows),
      .block_cols = fp8_blocks(box.cols),
      .weight = out.weight,
      .scale = out.scale,
      .report = reinterpret_cast<unsigned long long*>(out.report),
      .bf16 = source.dtype == DType::kBFloat16,
  };
}

}  // namespace

Status quantize_fp8_block_device(const Fp8Source& source, const Fp8Box& box, const Fp8DeviceOutput& out,
                                 void* stream) {
  std::string what = "quantize_fp8_block_device";
  RETURN_IF_ERROR(validate_fp8_box(source, box).WithContext(what));
  if (box.elements() == 0) return Status::Ok();
  ASSIGN_OR_RETURN(const QuantizeArgs args, job_args(source, box, out, what));
  ASSIGN_OR_RETURN(const int device, launch_device(stream, source.data, what));
  what += "(" + std::string(dtype_name(source.dtype)) + " box of " + std::to_string(box.matrices) + " x " +
          std::to_string(box.rows) + " x " + std::to_string(box.cols) + ") on device " + std::to_string(device);
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext(what));
  const dim3 grid(grid_dim(args.block_cols, 0x7FFFFFFF), grid_dim(args.block_rows, 65535),
                  grid_dim(args.matrices, 65535));
  const dim3 threads(kTileX, kTileY);
  auto* s = static_cast<cudaStream_t>(stream);
  if (args.bf16) {
    quantize_kernel<true><<<grid, threads, 0, s>>>(args);
  } else {
    quantize_kernel<false><<<grid, threads, 0, s>>>(args);
  }
  return cuda_check_launch(what);
}

StatusOr<Fp8DeviceBatch> Fp8DeviceBatch::Prepare(std::span<const Fp8DeviceJob> jobs, int device) {
  std::vector<QuantizeArgs> args;
  std::vector<unsigned long long> first{0};
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    const Fp8DeviceJob& j = jobs[k];
    if (j.box.elements() == 0) continue;
    ASSIGN_OR_RETURN(QuantizeArgs a,
                     job_args(j.source, j.box, j.out, "quantize_fp8_block batch job " + std::to_string(k)));
    first.push_back(first.back() + static_cast<unsigned long long>(a.matrices * a.block_rows * a.block_cols));
    args.push_back(a);
  }
  Fp8DeviceBatch batch;
  batch.count_ = static_cast<int>(args.size());
  batch.blocks_ = first.back();
  if (args.empty()) return StatusOr<Fp8DeviceBatch>(std::move(batch));
  ASSIGN_OR_RETURN(batch.table_, upload_job_table(args, first, device));
  return StatusOr<Fp8DeviceBatch>(std::move(batch));
}

Status Fp8DeviceBatch::launch(void* stream) const {
  if (count_ == 0) return Status::Ok();
  const std::string what = "quantize_fp8_block batch of " + std::to_string(count_) + " jobs (" +
                           std::to_string(blocks_) + " blocks) on device " + std::to_string(table_.device());
  ScopedDevice scope(table_.device());
  RETURN_IF_ERROR(scope.status().WithContext(what));
  const auto* args = reinterpret_cast<const QuantizeArgs*>(table_.data());
  const auto* first = reinterpret_cast<const unsigned long long*>(table_.data() + count_ * sizeof(QuantizeArgs));
  const auto grid = static_cast<unsigned>(std::min<unsigned long long>(blocks_, 1u << 20));
  quantize_batch_kernel<<<grid, dim3(kTileX, kTileY), 0, static_cast<cudaStream_t>(stream)>>>(args, first, count_);
  return cuda_check_launch(what);
}

Status e4m3_from_float_bits_device(std::uint32_t first_bits, std::uint64_t count, std::uint8_t* dst, void* stream) {
  if (count == 0) return Status::Ok();
  if (dst == nullptr) return InvalidArgument("e4m3_from_float_bits_device: null dst");
  const std::string what = "e4m3_from_float_bits_device(" + std::to_string(count) + " values)";
  ASSIGN_OR_RETURN(const int device, launch_device(stream, dst, what));
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext(what));
  constexpr int kBitsThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((count + kBitsThreads - 1) / kBitsThreads, 65536));
  e4m3_bits_kernel<<<blocks, kBitsThreads, 0, static_cast<cudaStream_t>(stream)>>>(first_bits, count, dst);
  return cuda_check_launch(what);
}

}  // namespace refit
