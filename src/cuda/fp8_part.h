// FP8 quantization of parts that cut 128-blocks, on the GPU (issue 20,
// sharded trainers on the GPU): quant/fp8_part.h's two steps in device
// memory, bit for bit the CPU reference's (cuda/fp8_part_gpu_test.cc).
//
//   launch_amax      step 1: each touched block's partial amax over the
//                    part's elements, and the non-finite report;
//   (the caller combines the partial amaxes of the ranks that share a block
//    on the host, and writes the combined amax over the partial one)
//   launch_quantize  step 3: the codes of every local element with
//                    s = fp8_block_scale(amax) of the combined amax, and the
//                    scales of the blocks in each job's `owned` box.
//
// One CUDA block per touched block of every job, the element path of
// cuda/fp8_block.cu (the same amax reduction, scale, Markstein quotient and
// conversion); a batch covers a rank's selected weights in one launch.
// Without CUDA, src/cuda/no_cuda_stubs.cc defines these to fail with
// kFailedPrecondition.
#pragma once

#include <cstdint>
#include <span>

#include "cuda/device.h"
#include "quant/fp8_part.h"
#include "refit/status.h"

namespace refit {

// The block box whose scales a job writes, in the weight's block
// coordinates, inside the part's touched range (fp8_part_blocks): block rows
// [row_begin, row_begin + rows) x block columns [col_begin, col_begin + cols)
// of each of the part's matrices, dense in that order.
struct Fp8OwnedBlocks {
  std::int64_t row_begin = 0, rows = 0;
  std::int64_t col_begin = 0, cols = 0;
};

// One part, all pointers device memory: `part.local.data` its elements;
// `amax` one fp32 per touched block (fp8_part_blocks order): launch_amax
// writes the partial amax there, launch_quantize reads the combined one;
// `codes` the local elements' codes (dense [matrices, rows, cols]);
// `scales` the owned blocks' scales (dense [matrices, owned.rows,
// owned.cols]); `report` one word, the non-finite report of
// quant/fp8_block.h over the part's local C order (its index i is
// (m * local.rows + r) * local.cols + c): launch_amax lowers it with an
// atomic minimum, so it must hold kFp8AllFinite before.
struct Fp8PartDeviceJob {
  Fp8Part part;
  Fp8OwnedBlocks owned;
  float* amax = nullptr;
  std::uint8_t* codes = nullptr;
  float* scales = nullptr;
  std::uint64_t* report = nullptr;
};

class Fp8PartDeviceBatch {
 public:
  // Checks every job (validate_fp8_part, non-null and aligned pointers, an
  // owned box inside the touched range; errors name the job's index) and
  // copies their descriptors to `device`. Empty parts are left out.
  static StatusOr<Fp8PartDeviceBatch> Prepare(std::span<const Fp8PartDeviceJob> jobs, int device);
  // ASYNCHRONOUS on `stream` (a cudaStream_t of the batch's device). After
  // the stream reached launch_amax, a job whose report is not kFp8AllFinite
  // holds a NaN or Inf (fp8_part_nonfinite_status names it) and its amax
  // must not be used.
  Status launch_amax(void* stream) const;
  // ASYNCHRONOUS, as above. REQUIRES: every amax finite and >= the part's
  // partial amax of its block (the caller checks the combination).
  Status launch_quantize(void* stream) const;
  int jobs() const { return count_; }
  unsigned long long blocks() const { return blocks_; }

 private:
  Status launch(bool amax, void* stream) const;

  DeviceBuffer table_;  // the jobs' kernel arguments, then each job's first block index (jobs + 1 of them)
  int count_ = 0;
  unsigned long long blocks_ = 0;
};

}  // namespace refit
