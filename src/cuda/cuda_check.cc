#include "cuda/cuda_check.h"

#if REFIT_HAVE_CUDA

#include <string>

#include <cuda_runtime.h>

namespace refit {

Status cuda_check(int cuda_error, std::string_view what) {
  const auto err = static_cast<cudaError_t>(cuda_error);
  if (err == cudaSuccess) return Status::Ok();
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case cudaErrorMemoryAllocation: code = StatusCode::kResourceExhausted; break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorStubLibrary: code = StatusCode::kFailedPrecondition; break;
    case cudaErrorInvalidValue: code = StatusCode::kInvalidArgument; break;
    default: break;
  }
  std::string m(what);
  m += ": ";
  m += cudaGetErrorString(err);
  m += " (";
  m += cudaGetErrorName(err);
  m += ")";
  return Status(code, std::move(m));
}

Status cuda_check_launch(std::string_view what) {
  return cuda_check(cudaGetLastError(), std::string("launching ") + std::string(what));
}

ScopedDevice::ScopedDevice(int device) {
  int current = -1;
  status_ = cuda_check(cudaGetDevice(&current), "cudaGetDevice");
  if (!status_.ok()) return;
  if (current == device) return;
  status_ = cuda_check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  if (status_.ok()) previous_ = current;
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

}  // namespace refit

#endif  // REFIT_HAVE_CUDA
