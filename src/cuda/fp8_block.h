// FP8 block quantization on the GPU: quant/fp8_block.h's format computed in
// device memory, bit for bit the CPU reference's bytes (the gpu test checks
// it on random bf16 and fp32 inputs, and the e4m3 conversion on every fp32).
//
// One CUDA block per 128 x 128 block of the weight: the block's amax is
// reduced in registers and shared memory, thread 0 computes s with an IEEE
// division (__fdiv_rn), and every element is divided by s with __fdiv_rn
// and converted with the hardware's cvt.rn.satfinite.e4m3x2.f32 (round to
// nearest even, saturating to +-448, sign of zero kept). The result does not
// depend on -ftz or -prec-div (see quant/fp8_block.h), but this file is built
// without fast math like the rest of refit.
//
// Pointers are device memory the stream's device can address. `stream` is a
// cudaStream_t (nullptr: the legacy default stream of the source's device).
// Without CUDA, src/cuda/no_cuda_stubs.cc defines these to fail with
// kFailedPrecondition.
#pragma once

#include <cstdint>
#include <span>

#include "cuda/device.h"
#include "quant/fp8_block.h"
#include "refit/status.h"

namespace refit {

// Where the quantized box goes, all in device memory: `weight` receives
// box.elements() e4m3fn codes (dense [box.matrices, box.rows, box.cols]),
// `scale` box.scales() fp32 scales (dense [box.matrices, ceil(box.rows/128),
// ceil(box.cols/128)]), and `report` (one word) the non-finite report of
// quant/fp8_block.h: the kernel lowers it with an atomic minimum to
// (i << 2) | kind for each NaN or Inf element i of the box, so it must hold
// kFp8AllFinite (all bits set: device_memset 0xFF) before the launch.
struct Fp8DeviceOutput {
  std::uint8_t* weight = nullptr;
  float* scale = nullptr;
  std::uint64_t* report = nullptr;
};

// Quantizes `box` of `source` (whose data is device memory) into `out`.
// ASYNCHRONOUS: enqueued on `stream`. Once the stream has reached it, the
// outputs are quantize_fp8_block's bytes when *report is still
// kFp8AllFinite; otherwise a NaN or Inf was found, the outputs must not be
// used or sent, and fp8_nonfinite_status(source, box, *report, tensor,
// version) gives the refusal naming the tensor. Errors (box or source
// invalid as validate_fp8_box says, a null output, a failed launch) are
// returned before or at the launch.
Status quantize_fp8_block_device(const Fp8Source& source, const Fp8Box& box, const Fp8DeviceOutput& out,
                                 void* stream);

// Many quantizations in one launch (a model's hundreds or thousands of
// weights: one launch each would cost more than the work), prepared once
// (the jobs' pointers stay valid for the batch's life) and launched as often
// as needed, e.g. once per refit. Each job is one quantize_fp8_block_device
// call's arguments, with its own report word; the outputs are those calls'
// bytes (the same per-block code, bit for bit).
struct Fp8DeviceJob {
  Fp8Source source;
  Fp8Box box;
  Fp8DeviceOutput out;
};
class Fp8DeviceBatch {
 public:
  // Checks every job as quantize_fp8_block_device does (errors name the job's
  // index) and copies their descriptors to `device`. Empty boxes are left out.
  static StatusOr<Fp8DeviceBatch> Prepare(std::span<const Fp8DeviceJob> jobs, int device);
  // ASYNCHRONOUS on `stream` (of the batch's device), as
  // quantize_fp8_block_device: every job's report must hold kFp8AllFinite
  // before, and is read after the stream reached the launch.
  Status launch(void* stream) const;
  int jobs() const { return count_; }
  // Thread blocks the launch covers: one per 128x128 block of every job.
  unsigned long long blocks() const { return blocks_; }

 private:
  DeviceBuffer table_;  // the jobs' kernel arguments, then each job's first block index (jobs + 1 of them)
  int count_ = 0;
  unsigned long long blocks_ = 0;
};

// For tests: dst[i] = the kernel's e4m3 code of the fp32 whose bits are
// first_bits + i (wrapping past 0xFFFFFFFF), for i < count. The same device
// conversion quantize_fp8_block_device applies to each quotient.
// ASYNCHRONOUS, as above.
Status e4m3_from_float_bits_device(std::uint32_t first_bits, std::uint64_t count, std::uint8_t* dst, void* stream);

}  // namespace refit
