// synchronize_device: see refit/device_memory.h.
#include "refit/device_memory.h"

#include <string>

#if REFIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#endif

namespace refit {

Status synchronize_device(int device) {
#if REFIT_HAVE_CUDA
  ScopedDevice scoped(device);
  RETURN_IF_ERROR(scoped.status());
  return cuda_check(static_cast<int>(cudaDeviceSynchronize()),
                    "cudaDeviceSynchronize on local device " + std::to_string(device));
#else
  return FailedPrecondition("synchronizing local device " + std::to_string(device) + ": refit was built without CUDA");
#endif
}

}  // namespace refit
