// Private helpers that turn CUDA runtime results into refit Status values.
// Usable from .cc (host compiler) and .cu (nvcc) files; only built with CUDA.
#pragma once

#include <string_view>

#include "refit/status.h"

namespace refit {

// OK when `cuda_error` is cudaSuccess; else "<what>: <cudaGetErrorString>
// (<cudaGetErrorName>)" with a code chosen from the error: out of memory ->
// kResourceExhausted, no device / driver problems -> kFailedPrecondition,
// invalid values -> kInvalidArgument, anything else -> kInternal.
// `cuda_error` is an int so that this header needs no CUDA include.
Status cuda_check(int cuda_error, std::string_view what);

// After a kernel launch: checks cudaGetLastError() (launch configuration
// errors, e.g. too many threads) and names the kernel in `what`.
Status cuda_check_launch(std::string_view what);

// Makes `device` current for the scope and restores the caller's current
// device after. Check status() before using the device.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

}  // namespace refit
