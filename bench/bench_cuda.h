// What the CUDA benchmarks share: dying loudly on a CUDA error or a failed
// Status (a benchmark has nobody to return an error to), and counting the
// bytes where two device buffers differ (each benchmark checks its results).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <utility>

#include <cuda_runtime.h>

#include "refit/status.h"

#define CHECK_CUDA(expr)                                                                              \
  do {                                                                                                \
    const cudaError_t e_ = (expr);                                                                    \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_), \
                   cudaGetErrorName(e_));                                                             \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

#define CHECK_OK(expr)                                                                          \
  do {                                                                                          \
    const refit::Status s_ = (expr);                                                            \
    if (!s_.ok()) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, s_.ToString().c_str()); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

template <typename T>
T value_or_die(refit::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(v).value();
}

// Adds to *diff the bytes of [0, n) where a and b differ.
__global__ inline void count_differences(const unsigned char* a, const unsigned char* b, unsigned long long n,
                                         unsigned long long* diff) {
  unsigned long long local = 0;
  for (unsigned long long i = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<unsigned long long>(gridDim.x) * blockDim.x) {
    local += a[i] != b[i];
  }
  if (local) atomicAdd(diff, local);
}
