// fill_content_device / first_content_mismatch_device: refit/content.h's byte
// function on the GPU (see src/model/content.cc for the format).
//
// Layout of the work: the bytes are cut at dst's (src's) 16-byte boundaries
// into an unaligned head (< 16 bytes), a body of 16-byte vectors and a tail
// (< 16 bytes). Body vector j covers content bytes b = offset + head + 16 j;
// since 16 j is a multiple of 8, b % 8 (the shift between content words and
// the vector) is the same for every j, so each thread builds its vector from
// two content words (shift 0) or three (funnel-shifted), with no divergence.
#include "cuda/device_content.h"

#include <algorithm>
#include <string>

#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "model/content_change.h"

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

// Row r of `rows` rows holds content bytes [offset + r * stride, + run) at
// src + r * run. Block row blockIdx.y (grid-striding over rows) checks one row
// at a time, cut like split() at that row's own 16-byte boundaries; `first`
// receives the smallest differing offset relative to src (rows are in src
// order, so the smallest offset is the first mismatch).
__global__ void __launch_bounds__(kThreads) mismatch_kernel(std::uint64_t key, std::uint64_t offset,
                                                            std::uint64_t stride, std::uint64_t run,
                                                            std::uint64_t rows, const std::byte* src,
                                                            unsigned long long* first) {
  const std::uint64_t tid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t threads = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::byte* row = src + r * run;
    const std::uint64_t row_at = r * run;  // the row's first byte, relative to src
    const std::uint64_t row_b = offset + r * stride;
    const auto a = reinterpret_cast<std::uintptr_t>(row);
    const std::uint64_t to_boundary = (16 - a % 16) % 16;
    const std::uint64_t head = run < to_boundary ? run : to_boundary;
    const std::uint64_t nvec = (run - head) / 16;
    const std::uint64_t tail = run - head - 16 * nvec;
    const std::uint64_t body_b = row_b + head;
    const unsigned shift = static_cast<unsigned>(body_b % 8);
    const auto* body = reinterpret_cast<const ulonglong2*>(row + head);
    for (std::uint64_t j = tid; j < nvec; j += threads) {
      const ulonglong2 got = body[j];
      const ulonglong2 want = content_vec(key, body_b + 16 * j, shift);
      if (got.x != want.x || got.y != want.y) {
        const std::uint64_t at = head + 16 * j +
                                 (got.x != want.x ? first_diff_byte(got.x, want.x) : 8 + first_diff_byte(got.y, want.y));
        atomicMin(first, static_cast<unsigned long long>(row_at + at));
        // Later vectors of this thread in this row are at higher offsets.
        break;
      }
    }
    if (tid < head && static_cast<unsigned char>(row[tid]) != content_byte(key, row_b + tid)) {
      atomicMin(first, static_cast<unsigned long long>(row_at + tid));
    }
    if (tid < tail) {
      const std::uint64_t i = head + 16 * nvec + tid;
      if (static_cast<unsigned char>(row[i]) != content_byte(key, row_b + i)) {
        atomicMin(first, static_cast<unsigned long long>(row_at + i));
      }
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

// "fn(key K, offset O, B bytes)": what a call was asked, for its errors.
std::string asked(std::string_view fn, std::uint64_t key, std::uint64_t offset, std::uint64_t bytes) {
  return std::string(fn) + "(key " + std::to_string(key) + ", offset " + std::to_string(offset) + ", " +
         std::to_string(bytes) + " bytes)";
}

std::string describe(std::string_view fn, std::uint64_t key, std::uint64_t offset, std::uint64_t bytes, int device) {
  return asked(fn, key, offset, bytes) + " on device " + std::to_string(device);
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
  return first_content_mismatch_device(key, ContentRows{offset, bytes, bytes, 1}, src, stream);
}

namespace {

// Runs `launch(first, across, down, stream)` with `first` in stream-ordered
// scratch set to "no mismatch", and returns the answer it left there.
template <class Launch>
StatusOr<std::int64_t> find_first(const ContentRows& rows, const std::byte* src, void* stream, std::string what,
                                  Launch launch) {
  if (rows.run == 0 || rows.count == 0) return std::int64_t{-1};
  if (src == nullptr) return InvalidArgument("first_content_mismatch_device: null src");
  ASSIGN_OR_RETURN(const int device, launch_device(stream, src, "first_content_mismatch_device"));
  what += " on device " + std::to_string(device);
  if (rows.count > 1) {
    what += " in " + std::to_string(rows.count) + " rows of " + std::to_string(rows.run) + " bytes, stride " +
            std::to_string(rows.stride);
  }
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext(what));
  // Blocks across a row as for one run of rows.run bytes, then enough block
  // rows to fill the device a few times over (at most CUDA's grid y limit).
  ASSIGN_OR_RETURN(const unsigned across, grid_for(device, split(src, rows.run)));
  int sms = 0;
  RETURN_IF_ERROR(cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                             "multiprocessor count of device " + std::to_string(device)));
  const std::uint64_t budget = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(sms) * 8 / across);
  const auto down = static_cast<unsigned>(std::min<std::uint64_t>({rows.count, budget, 65535}));
  auto* s = static_cast<cudaStream_t>(stream);

  // The answer lives in stream-ordered scratch (pooled: cheap per call).
  void* scratch = nullptr;
  RETURN_IF_ERROR(cuda_check(cudaMallocAsync(&scratch, sizeof(unsigned long long), s), what + ": cudaMallocAsync"));
  auto* first = static_cast<unsigned long long*>(scratch);
  Status status = cuda_check(cudaMemsetAsync(first, 0xFF, sizeof(unsigned long long), s), what + ": cudaMemsetAsync");
  if (status.ok()) {
    launch(first, dim3(across, down), s);
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

// Content that changes (ContentKey): one thread per byte, grid-striding.
__global__ void __launch_bounds__(kThreads) fill_change_kernel(ContentKey key, std::uint64_t offset, std::byte* dst,
                                                               std::uint64_t bytes) {
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < bytes; i += step) {
    dst[i] = static_cast<std::byte>(content_math::content_byte(key, offset + i));
  }
}

__global__ void __launch_bounds__(kThreads) mismatch_change_kernel(ContentKey key, ContentRows rows,
                                                                   const std::byte* src, unsigned long long* first) {
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t r = blockIdx.y; r < rows.count; r += gridDim.y) {
    for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < rows.run; i += step) {
      const unsigned char want = content_math::content_byte(key, rows.offset + r * rows.stride + i);
      if (static_cast<unsigned char>(src[r * rows.run + i]) != want) {
        atomicMin(first, static_cast<unsigned long long>(r * rows.run + i));
        break;
      }
    }
  }
}

}  // namespace

StatusOr<std::int64_t> first_content_mismatch_device(std::uint64_t key, const ContentRows& rows, const std::byte* src,
                                                     void* stream) {
  return find_first(rows, src, stream, asked("first_content_mismatch_device", key, rows.offset, rows.run * rows.count),
                    [&](unsigned long long* first, dim3 grid, cudaStream_t s) {
                      mismatch_kernel<<<grid, kThreads, 0, s>>>(key, rows.offset, rows.stride, rows.run, rows.count,
                                                                src, first);
                    });
}

StatusOr<std::int64_t> first_content_mismatch_device(const ContentKey& key, const ContentRows& rows,
                                                     const std::byte* src, void* stream) {
  if (key.change >= kEveryElement) return first_content_mismatch_device(key.key, rows, src, stream);
  return find_first(rows, src, stream,
                    asked("first_content_mismatch_device", key.key, rows.offset, rows.run * rows.count) +
                        " (changing content)",
                    [&](unsigned long long* first, dim3 grid, cudaStream_t s) {
                      mismatch_change_kernel<<<grid, kThreads, 0, s>>>(key, rows, src, first);
                    });
}

Status fill_content_device(const ContentKey& key, std::uint64_t offset, std::byte* dst, std::uint64_t bytes,
                           void* stream) {
  if (key.change >= kEveryElement) return fill_content_device(key.key, offset, dst, bytes, stream);
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr) return InvalidArgument("fill_content_device: null dst");
  ASSIGN_OR_RETURN(const int device, launch_device(stream, dst, "fill_content_device"));
  const std::string what = describe("fill_content_device", key.key, offset, bytes, device) + " (changing content)";
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext(what));
  ASSIGN_OR_RETURN(const unsigned blocks, grid_for(device, Split{0, 0, bytes}));
  fill_change_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(key, offset, dst, bytes);
  return cuda_check_launch(what);
}

namespace {

// Clears bit 0x40 of the last byte of each of `elements` elements of `size` bytes.
__global__ void finite_kernel(unsigned char* dst, std::uint64_t elements, unsigned size) {
  const std::uint64_t step = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < elements; i += step) {
    dst[i * size + size - 1] &= 0xBF;
  }
}

}  // namespace

Status make_finite_content_device(DType dtype, std::byte* dst, std::uint64_t bytes, void* stream) {
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat32) return Status::Ok();
  const unsigned size = static_cast<unsigned>(dtype_size(dtype));
  const std::uint64_t elements = bytes / size;
  if (elements == 0) return Status::Ok();
  if (dst == nullptr) return InvalidArgument("make_finite_content_device: null dst");
  ASSIGN_OR_RETURN(const int device, launch_device(stream, dst, "make_finite_content_device"));
  const std::string what = "make_finite_content_device of " + std::to_string(bytes) + " bytes on device " +
                           std::to_string(device);
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext(what));
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((elements + kThreads - 1) / kThreads, 65536));
  finite_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(reinterpret_cast<unsigned char*>(dst),
                                                                           elements, size);
  return cuda_check_launch(what);
}

}  // namespace refit
