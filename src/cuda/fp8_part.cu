// Fp8PartDeviceBatch: quant/fp8_part.h's steps on the GPU (see fp8_part.h).
//
// Each CUDA block takes one touched block (m, i, j) of one job: the part's
// elements in it are local rows [r0, r1) x columns [c0, c1), where the
// block's rows [128 i, 128 i + 128) of the weight meet the part's rows
// [row_offset, row_offset + local.rows) (the same for columns). Thread
// (tx, ty) takes rows r0 + ty + 8 k and columns c0 + tx + 32 l of them, as
// fp8_block.cu's element path does. Bit exactness: the amax is a maximum of
// exact magnitudes, s and the quotients are fp8_block.cu's (fp8_kernel.cuh,
// quant/fp8_quotient.h), so a part's codes with the combined amax equal
// quantize_fp8_part's.
#include "cuda/fp8_part.h"

#include <algorithm>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "cuda/fp8_kernel.cuh"
#include "quant/fp8_quotient.h"
#include "refit/device_memory.h"

namespace refit {
namespace {

using namespace fp8_kernel;  // NOLINT(google-build-using-namespace): the shared kernel pieces

struct PartArgs {
  const std::byte* data;       // the part's local element [0, 0, 0]
  std::int64_t row_stride;     // elements
  std::int64_t matrix_stride;  // elements
  std::int64_t matrices, rows, cols;        // the part's local sizes
  std::int64_t row_offset, col_offset;      // the part's place in the weight
  std::int64_t full_rows, full_cols;        // the weight's matrix
  Fp8BlockRange range;                      // the touched blocks
  Fp8OwnedBlocks owned;                     // the blocks whose scales it writes
  float* amax;
  std::uint8_t* codes;
  float* scales;
  unsigned long long* report;
  bool bf16;
};

// The part's elements in touched block b = (m, bi, bj) of the range: local
// rows [r0, r1) x columns [c0, c1) of matrix m.
struct Cell {
  std::int64_t m, bi, bj;  // range-relative
  std::int64_t r0, r1, c0, c1;
};

__device__ __forceinline__ Cell cell_of(const PartArgs& a, std::int64_t b) {
  Cell c;
  c.bj = b % a.range.cols;
  c.bi = b / a.range.cols % a.range.rows;
  c.m = b / a.range.cols / a.range.rows;
  const std::int64_t row = (a.range.row_begin + c.bi) * kFp8BlockSize;
  const std::int64_t col = (a.range.col_begin + c.bj) * kFp8BlockSize;
  c.r0 = max(row, a.row_offset) - a.row_offset;
  c.r1 = min(min(row + kFp8BlockSize, a.full_rows), a.row_offset + a.rows) - a.row_offset;
  c.c0 = max(col, a.col_offset) - a.col_offset;
  c.c1 = min(min(col + kFp8BlockSize, a.full_cols), a.col_offset + a.cols) - a.col_offset;
  return c;
}

// fn(local index, fp32 value) for each of this thread's elements of the cell.
template <bool kBf16, class Fn>
__device__ __forceinline__ void each_element(const PartArgs& a, const Cell& c, Fn fn) {
  for (std::int64_t r = c.r0 + threadIdx.y; r < c.r1; r += kTileY) {
    const std::byte* row = a.data + (c.m * a.matrix_stride + r * a.row_stride) * (kBf16 ? 2 : 4);
    for (std::int64_t col = c.c0 + threadIdx.x; col < c.c1; col += kTileX) {
      fn((c.m * a.rows + r) * a.cols + col, load_element<kBf16>(row, col));
    }
  }
}

template <bool kBf16>
__device__ __forceinline__ void amax_cell(const PartArgs& a, std::int64_t b, unsigned* warp_amax) {
  const Cell c = cell_of(a, b);
  unsigned amax = 0;  // |x| as fp32 bits: integers order them, NaN and Inf above every finite value
  each_element<kBf16>(a, c, [&](std::int64_t i, float x) {
    const unsigned bits = __float_as_uint(x);
    if (nonfinite_bits(bits)) report_nonfinite(a.report, i, bits);
    amax = max(amax, bits & 0x7FFFFFFFu);
  });
  amax = block_amax_bits(amax, warp_amax);
  if (threadIdx.x == 0 && threadIdx.y == 0) a.amax[b] = __uint_as_float(amax);
  __syncthreads();  // warp_amax is reused by the next cell
}

template <bool kBf16>
__device__ __forceinline__ void quantize_cell(const PartArgs& a, std::int64_t b) {
  const Cell c = cell_of(a, b);
  const float s = block_scale_of(__float_as_uint(a.amax[b])), inv_s = __frcp_rn(s);
  const std::uint32_t floor = fp8_nonzero_floor(__float_as_uint(s));
  each_element<kBf16>(a, c, [&](std::int64_t i, float x) {
    a.codes[i] = e4m3_rn_satfinite(fp8_block_quotient(x, s, inv_s, floor));
  });
  const std::int64_t oi = a.range.row_begin + c.bi - a.owned.row_begin;
  const std::int64_t oj = a.range.col_begin + c.bj - a.owned.col_begin;
  if (threadIdx.x == 0 && threadIdx.y == 0 && oi >= 0 && oi < a.owned.rows && oj >= 0 && oj < a.owned.cols) {
    a.scales[(c.m * a.owned.rows + oi) * a.owned.cols + oj] = s;
  }
}

// Every touched block of every job; CUDA block g grid-strides over them.
__global__ void __launch_bounds__(kThreads, kMinBlocks) part_kernel(const PartArgs* jobs,
                                                      const unsigned long long* first, int count, bool amax) {
  __shared__ unsigned warp_amax[kTileY];
  const unsigned long long total = first[count];
  for (unsigned long long g = blockIdx.x; g < total; g += gridDim.x) {
    const int k = job_of(first, count, g);
    const PartArgs a = jobs[k];  // in registers: see fp8_block.cu's batch kernel
    const auto b = static_cast<std::int64_t>(g - first[k]);
    if (amax) {
      a.bf16 ? amax_cell<true>(a, b, warp_amax) : amax_cell<false>(a, b, warp_amax);
    } else {
      a.bf16 ? quantize_cell<true>(a, b) : quantize_cell<false>(a, b);
    }
  }
}

StatusOr<PartArgs> part_args(const Fp8PartDeviceJob& j, const std::string& what) {
  RETURN_IF_ERROR(validate_fp8_part(j.part).WithContext(what));
  const Fp8Part& p = j.part;
  if (j.amax == nullptr || j.codes == nullptr || j.report == nullptr || (j.scales == nullptr && j.owned.rows > 0)) {
    return InvalidArgument(what + ": null output (amax, codes, report, and scales where it owns blocks)");
  }
  if (reinterpret_cast<std::uintptr_t>(p.local.data) % dtype_size(p.local.dtype) != 0 ||
      reinterpret_cast<std::uintptr_t>(j.amax) % alignof(float) != 0 ||
      reinterpret_cast<std::uintptr_t>(j.scales) % alignof(float) != 0 ||
      reinterpret_cast<std::uintptr_t>(j.report) % alignof(std::uint64_t) != 0) {
    return InvalidArgument(what + ": misaligned source, amax, scales or report pointer");
  }
  const Fp8BlockRange range = fp8_part_blocks(p);
  const Fp8OwnedBlocks& o = j.owned;
  if (o.rows < 0 || o.cols < 0 ||
      (o.rows > 0 && o.cols > 0 &&
       (o.row_begin < range.row_begin || o.row_begin + o.rows > range.row_begin + range.rows ||
        o.col_begin < range.col_begin || o.col_begin + o.cols > range.col_begin + range.cols))) {
    return InvalidArgument(what + ": its owned blocks lie outside the blocks the part touches");
  }
  static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
  return PartArgs{
      .data = p.local.data,
      .row_stride = p.local.row_stride,
      .matrix_stride = p.local.matrix_stride,
      .matrices = p.local.matrices,
      .rows = p.local.rows,
      .cols = p.local.cols,
      .row_offset = p.row_offset,
      .col_offset = p.col_offset,
      .full_rows = p.full_rows,
      .full_cols = p.full_cols,
      .range = range,
      .owned = o,
      .amax = j.amax,
      .codes = j.codes,
      .scales = j.scales,
      .report = reinterpret_cast<unsigned long long*>(j.report),
      .bf16 = p.local.dtype == DType::kBFloat16,
  };
}

}  // namespace

StatusOr<Fp8PartDeviceBatch> Fp8PartDeviceBatch::Prepare(std::span<const Fp8PartDeviceJob> jobs, int device) {
  std::vector<PartArgs> args;
  std::vector<unsigned long long> first{0};
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    const Fp8Part& p = jobs[k].part;
    if (p.local.matrices * p.local.rows * p.local.cols == 0) continue;
    ASSIGN_OR_RETURN(PartArgs a, part_args(jobs[k], "FP8 part batch job " + std::to_string(k)));
    first.push_back(first.back() + static_cast<unsigned long long>(a.range.blocks()));
    args.push_back(a);
  }
  Fp8PartDeviceBatch batch;
  batch.count_ = static_cast<int>(args.size());
  batch.blocks_ = first.back();
  if (args.empty()) return StatusOr<Fp8PartDeviceBatch>(std::move(batch));
  ASSIGN_OR_RETURN(batch.table_, upload_job_table(args, first, device));
  return StatusOr<Fp8PartDeviceBatch>(std::move(batch));
}

Status Fp8PartDeviceBatch::launch_amax(void* stream) const { return launch(true, stream); }
Status Fp8PartDeviceBatch::launch_quantize(void* stream) const { return launch(false, stream); }

Status Fp8PartDeviceBatch::launch(bool amax, void* stream) const {
  if (count_ == 0) return Status::Ok();
  const std::string what = std::string("FP8 part ") + (amax ? "amax" : "quantization") + " of " +
                           std::to_string(count_) + " parts (" + std::to_string(blocks_) + " blocks) on device " +
                           std::to_string(table_.device());
  ScopedDevice scope(table_.device());
  RETURN_IF_ERROR(scope.status().WithContext(what));
  const auto* args = reinterpret_cast<const PartArgs*>(table_.data());
  const auto* first = reinterpret_cast<const unsigned long long*>(table_.data() + count_ * sizeof(PartArgs));
  const auto grid = static_cast<unsigned>(std::min<unsigned long long>(blocks_, 1u << 20));
  part_kernel<<<grid, dim3(kTileX, kTileY), 0, static_cast<cudaStream_t>(stream)>>>(args, first, count_, amax);
  return cuda_check_launch(what);
}

}  // namespace refit
