// Fault injection for tests (refit/device.h): inject_illegal_address breaks
// a process's CUDA context with a sticky error, as a faulty kernel would;
// inject_gpu_delay holds a stream behind a kernel that spins.
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "cuda/device.h"

namespace refit {
namespace {

// Writes through a pointer no allocation maps (the first page is never
// mapped), so the GPU raises an illegal-address exception.
__global__ void write_to_unmapped_address(unsigned* p) { *p = 0xDEADu; }

// One thread spins until the GPU's global timer (nanoseconds) passed `ns`.
__global__ void spin_for(std::uint64_t ns) {
  auto now = [] {
    std::uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  const std::uint64_t until = now() + ns;
  while (now() < until) __nanosleep(1000);
}

}  // namespace

Status inject_illegal_address(int device, void* stream) {
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("inject_illegal_address"));
  write_to_unmapped_address<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(reinterpret_cast<unsigned*>(16));
  return cuda_check_launch("inject_illegal_address on device " + std::to_string(device));
}

Status inject_gpu_delay(int device, void* stream, std::uint32_t ms) {
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("inject_gpu_delay"));
  spin_for<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(std::uint64_t{ms} * 1000000u);
  return cuda_check_launch("inject_gpu_delay on device " + std::to_string(device));
}

}  // namespace refit
