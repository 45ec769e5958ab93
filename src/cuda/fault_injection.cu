// inject_illegal_address (refit/device.h): a test's way to break a process's
// CUDA context with a sticky error, as a faulty kernel would.
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "refit/device.h"

namespace refit {
namespace {

// Writes through a pointer no allocation maps (the first page is never
// mapped), so the GPU raises an illegal-address exception.
__global__ void write_to_unmapped_address(unsigned* p) { *p = 0xDEADu; }

}  // namespace

Status inject_illegal_address(int device, void* stream) {
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("inject_illegal_address"));
  write_to_unmapped_address<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(reinterpret_cast<unsigned*>(16));
  return cuda_check_launch("inject_illegal_address on device " + std::to_string(device));
}

}  // namespace refit
