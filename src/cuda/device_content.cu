// fill_content_device / first_content_mismatch_device: refit/content.h's byte
// function on the GPU (see src/model/content.cc for the format).
//
// Layout of the work: the bytes are cut at dst's (src's) 16-byte boundaries
// into an unaligned head (< 16 bytes), a body of 16-byte vectors and a tail
// (< 16 bytes). Body vector j covers content bytes b = offset + head + 16 j;
// since 16 j is a multiple of 8, b % 8 (the shift between content words and
// the vector) is the same for every j, so each thread builds its vector from
// two content words (shift 0) or three (funnel-shifted), with no divergence.
#include "refit/device_content.h"

#include <algorithm>
#include <string>

#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace refit {
namespace {

constexpr int kThreads = 256;
constexpr unsigned long long kNoMismatch = ~0ull;
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

__device__ __forceinline__ std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

__device__ __forceinline__ std::uint64_t content_word(std::uint64_t key, std::uint64_t w) {
  return mix64(key + (w + 1) * kGolden);
}

__device__ __forceinline__ unsigned char content_byte(std::uint64_t key, std::uint64_t b) {
  return static_cast<unsigned char>(content_word(key, b / 8) >> (8 * (b % 8)));
}

// The 16 content bytes starting at b (b % 8 == shift), as two little-endian words.
__device__ __forceinline__ ulonglong2 content_vec(std::uint64_t key, std::uint64_t b, unsigned shift) {
  const std::uint64_t w = b / 8;
  const std::uint64_t a0 = content_word(key, w);
  const std::uint64_t a1 = content_word(key, w + 1);
  if (shift == 0) return make_ulonglong2(a0, a1);
  const std::uint64_t a2 = content_word(key, w + 2);
  const unsigned sh = 8 * shift;
  return make_ulonglong2((a0 >> sh) | (a1 << (64 - sh)), (a1 >> sh) | (a2 << (64 - sh)));
}

struct Split {
  std::uint64_t head;   // bytes before the first 16-byte boundary
  std::uint64_t nvec;   // 16-byte vectors in the body
  std::uint64_t tail;   // bytes after the body
};

Split split(const void* p, std::uint64_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  Split s;
  s.head = std::min<std::uint64_t>(bytes, (16 - a % 16) % 16);
  s.nvec = (bytes - s.head) / 16;
  s.tail = bytes - s.head - 16 * s.nvec;
  return s;
}

__global__ void __launch_bounds__(kThreads) fill_kernel(std::uint64_t key, std::uint64_t offset, std::byte* dst,
                                                        Split sp) {
  const std::uint64_t tid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t threads = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t body_b = offset + sp.head;
  const unsigned shift = static_cast<unsigned>(body_b % 8);
  auto* body = reinterpret_cast<ulonglong2*>(dst + sp.head);
  for (std::uint64_t j = tid; j < sp.nvec; j += threads) body[j] = content_vec(key, body_b + 16 * j, shift);
  if (tid < sp.head) dst[tid] = static_cast<std::byte>(content_byte(key, offset + tid));
  if (tid < sp.tail) {
    const std::uint64_t i = sp.head + 16 * sp.nvec + tid;
    dst[i] = static_cast<std::byte>(content_byte(key, offset + i));
  }
}

// Offset of the first differing byte of two little-endian words; REQUIRES a != b.
__device__ __forceinline__ unsigned first_diff_byte(std::uint64_t a, std::uint64_t b) {
  return static_cast<unsigned>(__ffsll(static_cast<long long>(a ^ b)) - 1) / 8;
}

__global__ void __launch_bounds__(kThreads) mismatch_kernel(std::uint64_t key, std::uint64_t offset,
                                                            const std::byte* src, Split sp,
                                                            unsigned long long* first) {
  const std::uint64_t tid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t threads = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t body_b = offset + sp.head;
  const unsigned shift = static_cast<unsigned>(body_b % 8);
  const auto* body = reinterpret_cast<const ulonglong2*>(src + sp.head);
  for (std::uint64_t j = tid; j < sp.nvec; j += threads) {
    const ulonglong2 got = body[j];
    const ulonglong2 want = content_vec(key, body_b + 16 * j, shift);
    if (got.x != want.x || got.y != want.y) {
      const std::uint64_t at = sp.head + 16 * j +
                               (got.x != want.x ? first_diff_byte(got.x, want.x) : 8 + first_diff_byte(got.y, want.y));
      atomicMin(first, static_cast<unsigned long long>(at));
      // Later vectors of this thread are at higher offsets: nothing smaller to find.
      break;
    }
  }
  if (tid < sp.head && static_cast<unsigned char>(src[tid]) != content_byte(key, offset + tid)) {
    atomicMin(first, static_cast<unsigned long long>(tid));
  }
  if (tid < sp.tail) {
    const std::uint64_t i = sp.head + 16 * sp.nvec + tid;
    if (static_cast<unsigned char>(src[i]) != content_byte(key, offset + i)) {
      atomicMin(first, static_cast<unsigned long long>(i));
    }
  }
}

// The device to launch on: the stream's, or the pointer's for the default stream.
StatusOr<int> launch_device(void* stream, const void* p, std::string_view what) {
  int device = -1;
  if (stream != nullptr) {
    RETURN_IF_ERROR(cuda_check(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device),
                               std::string(what) + ": cudaStreamGetDevice"));
    return device;
  }
  cudaPointerAttributes attr{};
  RETURN_IF_ERROR(cuda_check(cudaPointerGetAttributes(&attr, p), std::string(what) + ": cudaPointerGetAttributes"));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return InvalidArgument(std::string(what) + ": the pointer is not device memory (pass a stream to use mapped memory)");
  }
  return attr.device;
}

// Enough blocks to fill the device a few times over; grid-stride loops do the rest.
StatusOr<unsigned> grid_for(int device, Split sp) {
  int sms = 0;
  RETURN_IF_ERROR(cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                             "multiprocessor count of device " + std::to_string(device)));
  const std::uint64_t items = std::max({sp.nvec, sp.head, sp.tail, std::uint64_t{1}});
  const std::uint64_t wanted = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<std::uint64_t>(wanted, static_cast<std::uint64_t>(sms) * 8));
}

std::string describe(std::string_view fn, std::uint64_t key, std::uint64_t offset, std::uint64_t bytes, int device) {
  return std::string(fn) + "(key " + std::to_string(key) + ", offset " + std::to_string(offset) + ", " +
         std::to_string(bytes) + " bytes) on device " + std::to_string(device);
}

}  // namespace

Status fill_content_device(std::uint64_t key, std::uint64_t offset, std::byte* dst, std::uint64_t bytes,
                           void* stream) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr) return InvalidArgument("fill_content_device: null dst");
  ASSIGN_OR_RETURN(const int device, launch_device(stream, dst, "fill_content_device"));
  const std::string what = describe("fill_content_device", key, offset, bytes, device);
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext(what));
  const Split sp = split(dst, bytes);
  ASSIGN_OR_RETURN(const unsigned blocks, grid_for(device, sp));
  fill_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(key, offset, dst, sp);
  return cuda_check_launch(what);
}

StatusOr<std::int64_t> first_content_mismatch_device(std::uint64_t key, std::uint64_t offset, const std::byte* src,
                                                     std::uint64_t bytes, void* stream) {
  if (bytes == 0) return std::int64_t{-1};
  if (src == nullptr) return InvalidArgument("first_content_mismatch_device: null src");
  ASSIGN_OR_RETURN(const int device, launch_device(stream, src, "first_content_mismatch_device"));
  const std::string what = describe("first_content_mismatch_device", key, offset, bytes, device);
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext(what));
  const Split sp = split(src, bytes);
  ASSIGN_OR_RETURN(const unsigned blocks, grid_for(device, sp));
  auto* s = static_cast<cudaStream_t>(stream);

  // The answer lives in stream-ordered scratch (pooled: cheap per call).
  void* scratch = nullptr;
  RETURN_IF_ERROR(cuda_check(cudaMallocAsync(&scratch, sizeof(unsigned long long), s), what + ": cudaMallocAsync"));
  auto* first = static_cast<unsigned long long*>(scratch);
  Status status = cuda_check(cudaMemsetAsync(first, 0xFF, sizeof(unsigned long long), s), what + ": cudaMemsetAsync");
  if (status.ok()) {
    mismatch_kernel<<<blocks, kThreads, 0, s>>>(key, offset, src, sp, first);
    status = cuda_check_launch(what);
  }
  unsigned long long host = kNoMismatch;
  if (status.ok()) {
    status = cuda_check(cudaMemcpyAsync(&host, first, sizeof host, cudaMemcpyDeviceToHost, s), what + ": reading the answer");
  }
  const Status freed = cuda_check(cudaFreeAsync(scratch, s), what + ": cudaFreeAsync");
  if (status.ok()) status = cuda_check(cudaStreamSynchronize(s), what + ": cudaStreamSynchronize");
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(freed);
  if (host == kNoMismatch) return std::int64_t{-1};
  return static_cast<std::int64_t>(host);
}

}  // namespace refit
