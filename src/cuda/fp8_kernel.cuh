// The device pieces both FP8 kernels share (cuda/fp8_block.cu for whole
// boxes, cuda/fp8_part.cu for parts that cut blocks): the thread tile, the
// block's amax reduction, the scale, the e4m3 conversion and the non-finite
// report. Included by .cu files only. See fp8_block.cu's header for why each
// step is bit for bit the CPU reference's.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cuda/device.h"
#include "quant/fp8_block.h"
#include "refit/device_memory.h"

namespace refit::fp8_kernel {

// One CUDA block of kTileX x kTileY threads per 128 x 128 block; thread
// (tx, ty) takes columns tx + 32 j (j < 4) of rows ty + 8 i (i < 16).
constexpr int kTileX = 32;
constexpr int kTileY = 8;
constexpr int kThreads = kTileX * kTileY;
constexpr int kColsPerThread = static_cast<int>(kFp8BlockSize) / kTileX;  // 4
constexpr int kRowsPerThread = static_cast<int>(kFp8BlockSize) / kTileY;  // 16
static_assert(kColsPerThread * kTileX == kFp8BlockSize && kRowsPerThread * kTileY == kFp8BlockSize);
// CUDA blocks an SM must hold at once: 64 registers per thread (65536 /
// (256 * 4)), enough for both paths without spills (-Xptxas -v, 2026-12-05).
constexpr int kMinBlocks = 4;

__device__ __forceinline__ std::uint8_t e4m3_rn_satfinite(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// True for NaN and Inf (every exponent bit set).
__device__ __forceinline__ bool nonfinite_bits(unsigned bits) { return (bits & 0x7F800000u) == 0x7F800000u; }

// Lowers the report to (at << 2) | kind for a NaN or Inf at index `at`
// (fp8_block.h's report: kind 0 NaN, 1 +inf, 2 -inf).
__device__ __forceinline__ void report_nonfinite(unsigned long long* report, std::int64_t at, unsigned bits) {
  const unsigned long long kind = (bits & 0x7FFFFFu) != 0 ? 0 : (bits >> 31) ? 2 : 1;
  atomicMin(report, (static_cast<unsigned long long>(at) << 2) | kind);
}

// The block's largest |x| as fp32 bits, from each thread's: a warp
// reduction, then the 8 warps' through shared memory. Every thread of the
// CUDA block must call it, and must pass __syncthreads() before the next
// call reuses `warp_amax`.
__device__ __forceinline__ unsigned block_amax_bits(unsigned amax, unsigned* warp_amax) {
  amax = __reduce_max_sync(0xFFFFFFFFu, amax);
  if (threadIdx.x == 0) warp_amax[threadIdx.y] = amax;
  __syncthreads();
  unsigned block = warp_amax[0];
#pragma unroll
  for (int k = 1; k < kTileY; ++k) block = max(block, warp_amax[k]);
  return block;
}

// s = max(amax, 1e-12f) / 448 (IEEE division, nearest even).
__device__ __forceinline__ float block_scale_of(unsigned amax_bits) {
  return __fdiv_rn(fmaxf(__uint_as_float(amax_bits), kFp8ScaleFloor), kFp8E4M3Max);
}

template <bool kBf16>
__device__ __forceinline__ float load_element(const std::byte* data, std::int64_t i) {
  if constexpr (kBf16) {
    const unsigned short bits = reinterpret_cast<const unsigned short*>(data)[i];
    return __uint_as_float(static_cast<unsigned>(bits) << 16);
  } else {
    return reinterpret_cast<const float*>(data)[i];
  }
}

// The job of global block g in a batch whose job k starts at first[k]
// (first ascending, first[0] = 0): the last job whose first block is <= g.
__device__ __forceinline__ int job_of(const unsigned long long* first, int count, unsigned long long g) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= g) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// A batch's table on `device`: the jobs' kernel arguments, then each job's
// first block index (`first`: args.size() + 1 of them, the last the total),
// where the kernels find them (job_of). Host code.
template <class Args>
StatusOr<DeviceBuffer> upload_job_table(const std::vector<Args>& args, const std::vector<unsigned long long>& first,
                                        int device) {
  const std::uint64_t args_bytes = args.size() * sizeof(Args);
  ASSIGN_OR_RETURN(DeviceBuffer table, DeviceBuffer::Allocate(device, args_bytes + first.size() * sizeof(first[0])));
  RETURN_IF_ERROR(copy_host_to_device(table.data(), {reinterpret_cast<const std::byte*>(args.data()), args_bytes}));
  RETURN_IF_ERROR(copy_host_to_device(table.data() + args_bytes, {reinterpret_cast<const std::byte*>(first.data()),
                                                                  first.size() * sizeof(first[0])}));
  return StatusOr<DeviceBuffer>(std::move(table));
}

}  // namespace refit::fp8_kernel
