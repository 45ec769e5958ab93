// Builds without CUDA: the .cu files are not compiled, so their public
// functions are defined here and fail with kFailedPrecondition.
#if !REFIT_HAVE_CUDA

#include <string>

#include "cuda/batched_copy.h"
#include "cuda/device.h"
#include "cuda/device_content.h"
#include "cuda/fp8_block.h"
#include "cuda/fp8_part.h"
#include "cuda/word_delta_device.h"

namespace refit {
namespace {
Status no_cuda(std::string_view what) {
  return FailedPrecondition(std::string(what) + ": refit was built without CUDA");
}
}  // namespace

StatusOr<BatchedCopier> BatchedCopier::Create(int) { return no_cuda("BatchedCopier::Create"); }
BatchedCopier::~BatchedCopier() = default;
BatchedCopier::BatchedCopier(BatchedCopier&&) noexcept = default;
BatchedCopier& BatchedCopier::operator=(BatchedCopier&&) noexcept = default;
Status BatchedCopier::copy(std::span<const CopyRun>, void*) { return no_cuda("BatchedCopier::copy"); }
Status BatchedCopier::synchronize() { return no_cuda("BatchedCopier::synchronize"); }
StatusOr<PreparedCopy> BatchedCopier::prepare(std::span<const CopyRun>) const {
  return no_cuda("BatchedCopier::prepare");
}
Status BatchedCopier::launch(const PreparedCopy&, void*) const { return no_cuda("BatchedCopier::launch"); }

Status fill_content_device(std::uint64_t, std::uint64_t, std::byte*, std::uint64_t, void*) {
  return no_cuda("fill_content_device");
}
StatusOr<std::int64_t> first_content_mismatch_device(std::uint64_t, std::uint64_t, const std::byte*, std::uint64_t,
                                                     void*) {
  return no_cuda("first_content_mismatch_device");
}
Status quantize_fp8_block_device(const Fp8Source&, const Fp8Box&, const Fp8DeviceOutput&, void*) {
  return no_cuda("quantize_fp8_block_device");
}
StatusOr<Fp8DeviceBatch> Fp8DeviceBatch::Prepare(std::span<const Fp8DeviceJob>, int) {
  return no_cuda("Fp8DeviceBatch::Prepare");
}
Status Fp8DeviceBatch::launch(void*) const { return no_cuda("Fp8DeviceBatch::launch"); }
StatusOr<Fp8PartDeviceBatch> Fp8PartDeviceBatch::Prepare(std::span<const Fp8PartDeviceJob>, int) {
  return no_cuda("Fp8PartDeviceBatch::Prepare");
}
Status Fp8PartDeviceBatch::launch_amax(void*) const { return no_cuda("Fp8PartDeviceBatch::launch_amax"); }
Status Fp8PartDeviceBatch::launch_quantize(void*) const { return no_cuda("Fp8PartDeviceBatch::launch_quantize"); }
Status e4m3_from_float_bits_device(std::uint32_t, std::uint64_t, std::uint8_t*, void*) {
  return no_cuda("e4m3_from_float_bits_device");
}
Status make_finite_content_device(DType, std::byte*, std::uint64_t, void*) {
  return no_cuda("make_finite_content_device");
}
StatusOr<std::int64_t> first_content_mismatch_device(std::uint64_t, const ContentRows&, const std::byte*, void*) {
  return no_cuda("first_content_mismatch_device");
}
Status fill_content_device(const ContentKey&, std::uint64_t, std::byte*, std::uint64_t, void*) {
  return no_cuda("fill_content_device");
}
StatusOr<std::int64_t> first_content_mismatch_device(const ContentKey&, const ContentRows&, const std::byte*, void*) {
  return no_cuda("first_content_mismatch_device");
}
StatusOr<DeviceDeltaCodec> DeviceDeltaCodec::Create(int, std::uint64_t) { return no_cuda("DeviceDeltaCodec::Create"); }
StatusOr<EncodedDelta> DeviceDeltaCodec::encode(const std::byte*, const std::byte*, std::uint64_t, std::uint64_t,
                                                std::byte*, void*) {
  return no_cuda("DeviceDeltaCodec::encode");
}
Status DeviceDeltaCodec::decode(const std::byte*, std::uint64_t, const std::byte*, std::uint64_t, std::byte*,
                                std::uint64_t, void*) {
  return no_cuda("DeviceDeltaCodec::decode");
}
Status inject_illegal_address(int, void*) { return no_cuda("inject_illegal_address"); }
Status inject_gpu_delay(int, void*, std::uint32_t) { return no_cuda("inject_gpu_delay"); }

}  // namespace refit

#endif  // !REFIT_HAVE_CUDA
