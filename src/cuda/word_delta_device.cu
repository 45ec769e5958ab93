// delta/word_delta.h's encodings on the GPU: see word_delta_device.h.
//
// Words: a bucket of n bytes has W = ceil(n / 8) words; word w covers bytes
// [8w, min(8w + 8, n)). A block of kThreads threads handles kWordsPerBlock
// words in kWordsPerThread rounds of kThreads consecutive words (one per
// thread: coalesced loads, and a warp ballot covers 32 consecutive words);
// a block's changed words are written in word order at their ranks from
// the rounds' ballots. 8-byte loads where the bucket and base are 8-byte
// aligned; byte loads otherwise and for the payload (it follows the
// bitmap, at any alignment).
#include "cuda/word_delta_device.h"

#include <algorithm>
#include <cstring>
#include <string>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace refit {
namespace {

constexpr int kThreads = 256;
constexpr int kWordsPerThread = 4;
constexpr std::uint64_t kWordsPerBlock = kThreads * kWordsPerThread;

std::uint64_t words_of(std::uint64_t n) { return (n + 7) / 8; }
std::uint64_t blocks_of(std::uint64_t n) { return std::max<std::uint64_t>(1, (words_of(n) + kWordsPerBlock - 1) / kWordsPerBlock); }
bool aligned8(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 8 == 0; }

__device__ __forceinline__ unsigned word_len(std::uint64_t n, std::uint64_t w) {
  const std::uint64_t left = n - w * 8;
  return left < 8 ? static_cast<unsigned>(left) : 8u;
}

// Word w of the block's round k for this thread: the block's words in
// rounds of kThreads consecutive words, one per thread, so that a warp's
// loads of the bucket are coalesced and a warp ballot is 32 consecutive
// words (4 bitmap bytes).
__device__ __forceinline__ std::uint64_t word_of(int k) {
  return blockIdx.x * kWordsPerBlock + static_cast<std::uint64_t>(k) * kThreads + threadIdx.x;
}

// `aligned`: both pointers are 8-byte aligned (uniform over the launch),
// so whole words compare as one 8-byte load each.
__device__ __forceinline__ bool word_differs(const std::byte* now, const std::byte* base, std::uint64_t n,
                                             std::uint64_t w, bool aligned) {
  const unsigned len = word_len(n, w);
  if (aligned && len == 8) {
    return *reinterpret_cast<const unsigned long long*>(now + w * 8) !=
           *reinterpret_cast<const unsigned long long*>(base + w * 8);
  }
  for (unsigned i = 0; i < len; ++i) {
    if (now[w * 8 + i] != base[w * 8 + i]) return true;
  }
  return false;
}

// Whether this thread's word of each round changed (false past the bucket).
__device__ __forceinline__ void changed_in_rounds(const std::byte* now, const std::byte* base, std::uint64_t n,
                                                  bool aligned, bool (&changed)[kWordsPerThread]) {
  const std::uint64_t words = (n + 7) / 8;
  for (int k = 0; k < kWordsPerThread; ++k) {
    const std::uint64_t w = word_of(k);
    changed[k] = w < words && word_differs(now, base, n, w, aligned);
  }
}

// The place of this thread's word of round k among the block's set words
// (in word order), given each round's per-warp ballots: every thread of
// the block calls it for every round, after the ballots are in `totals`.
__device__ __forceinline__ unsigned rank_in_block(const unsigned (&totals)[kWordsPerThread][kThreads / 32], int k,
                                                  unsigned ballot) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned rank = __popc(ballot & ((1u << lane) - 1u));
  for (int r = 0; r < k; ++r) {
    for (unsigned v = 0; v < kThreads / 32; ++v) rank += totals[r][v];
  }
  for (unsigned v = 0; v < warp; ++v) rank += totals[k][v];
  return rank;
}

// Each round's ballot of `flag` per warp, into `totals` (popcounts); returns
// this thread's ballots. Synchronizes the block.
__device__ __forceinline__ void ballot_rounds(const bool (&flag)[kWordsPerThread], unsigned (&ballots)[kWordsPerThread],
                                              unsigned (&totals)[kWordsPerThread][kThreads / 32]) {
  for (int k = 0; k < kWordsPerThread; ++k) {
    ballots[k] = __ballot_sync(0xFFFFFFFFu, flag[k]);
    if (threadIdx.x % 32 == 0) totals[k][threadIdx.x / 32] = __popc(ballots[k]);
  }
  __syncthreads();
}

// Pass 1 of the encode: the bitmap (bit w % 8 of byte w / 8: lanes 0..3 of
// each warp write its ballot's 4 bytes) and each block's count of changed words.
__global__ void __launch_bounds__(kThreads) mark_kernel(const std::byte* now, const std::byte* base, std::uint64_t n,
                                                        bool aligned, std::uint8_t* bitmap, unsigned* counts) {
  __shared__ unsigned totals[kWordsPerThread][kThreads / 32];
  bool changed[kWordsPerThread];
  unsigned ballots[kWordsPerThread];
  changed_in_rounds(now, base, n, aligned, changed);
  ballot_rounds(changed, ballots, totals);
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t words = (n + 7) / 8;
  for (int k = 0; k < kWordsPerThread; ++k) {
    const std::uint64_t first = word_of(k) - lane;  // the warp's first word: a multiple of 32
    if (lane < 4 && first + lane * 8 < words) {
      bitmap[first / 8 + lane] = static_cast<std::uint8_t>(ballots[k] >> (8 * lane));
    }
  }
  if (threadIdx.x == 0) {
    unsigned sum = 0;
    for (int k = 0; k < kWordsPerThread; ++k) {
      for (unsigned v = 0; v < kThreads / 32; ++v) sum += totals[k][v];
    }
    counts[blockIdx.x] = sum;
  }
}

// Pass 2 of the encode: every changed word's bytes at its place in the
// payload (offsets: each block's first changed word's index).
__global__ void __launch_bounds__(kThreads) scatter_kernel(const std::byte* now, const std::byte* base,
                                                           std::uint64_t n, bool aligned,
                                                           const std::uint64_t* offsets, std::byte* payload) {
  __shared__ unsigned totals[kWordsPerThread][kThreads / 32];
  bool changed[kWordsPerThread];
  unsigned ballots[kWordsPerThread];
  changed_in_rounds(now, base, n, aligned, changed);
  ballot_rounds(changed, ballots, totals);
  for (int k = 0; k < kWordsPerThread; ++k) {
    if (!changed[k]) continue;
    const std::uint64_t w = word_of(k);
    const std::uint64_t at = (offsets[blockIdx.x] + rank_in_block(totals, k, ballots[k])) * 8;
    const unsigned len = word_len(n, w);  // only the last word may be partial, and it is the last written
    for (unsigned i = 0; i < len; ++i) payload[at + i] = now[w * 8 + i];
  }
}

__device__ __forceinline__ bool bit_of(const std::uint8_t* bitmap, std::uint64_t w) {
  return (bitmap[w / 8] >> (w % 8)) & 1u;
}

// Pass 1 of the decode: each block's count of set bits (its 128 bitmap bytes).
__global__ void __launch_bounds__(kThreads) count_kernel(const std::uint8_t* bitmap, std::uint64_t words,
                                                         unsigned* counts) {
  const std::uint64_t bytes = (words + 7) / 8, at = blockIdx.x * (kWordsPerBlock / 8) + threadIdx.x;
  unsigned count = threadIdx.x < kWordsPerBlock / 8 && at < bytes ? __popc(bitmap[at]) : 0;
  for (int offset = 16; offset > 0; offset /= 2) count += __shfl_down_sync(0xFFFFFFFFu, count, offset);
  __shared__ unsigned warps[kThreads / 32];
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned sum = 0;
    for (unsigned v = 0; v < kThreads / 32; ++v) sum += warps[v];
    counts[blockIdx.x] = sum;
  }
}

// Pass 2 of the decode: each word from the payload (set) or the base.
// `aligned`: base and out are 8-byte aligned.
__global__ void __launch_bounds__(kThreads) apply_kernel(const std::uint8_t* bitmap, const std::byte* payload,
                                                         const std::uint64_t* offsets, const std::byte* base,
                                                         std::byte* out, std::uint64_t n, bool aligned) {
  const std::uint64_t words = (n + 7) / 8;
  __shared__ unsigned totals[kWordsPerThread][kThreads / 32];
  bool set[kWordsPerThread];
  unsigned ballots[kWordsPerThread];
  for (int k = 0; k < kWordsPerThread; ++k) {
    const std::uint64_t w = word_of(k);
    set[k] = w < words && bit_of(bitmap, w);
  }
  ballot_rounds(set, ballots, totals);
  for (int k = 0; k < kWordsPerThread; ++k) {
    const std::uint64_t w = word_of(k);
    if (w >= words) break;
    const unsigned len = word_len(n, w);
    if (set[k]) {
      const std::uint64_t at = (offsets[blockIdx.x] + rank_in_block(totals, k, ballots[k])) * 8;
      for (unsigned i = 0; i < len; ++i) out[w * 8 + i] = payload[at + i];
    } else if (out != base) {
      if (aligned && len == 8) {
        const auto word = *reinterpret_cast<const unsigned long long*>(base + w * 8);
        *reinterpret_cast<unsigned long long*>(out + w * 8) = word;
      } else {
        for (unsigned i = 0; i < len; ++i) out[w * 8 + i] = base[w * 8 + i];
      }
    }
  }
}

void put_header(std::byte* h, DeltaEncoding encoding, std::uint64_t base_version, std::uint64_t n,
                std::uint64_t changed) {
  auto put = [&](int at, std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) h[at + i] = static_cast<std::byte>(v >> (8 * i));
  };
  put(0, kDeltaMagic, 4);
  put(4, static_cast<std::uint32_t>(encoding), 4);
  put(8, base_version, 8);
  put(16, n, 8);
  put(24, changed, 8);
}

}  // namespace

StatusOr<DeviceDeltaCodec> DeviceDeltaCodec::Create(int device, std::uint64_t max_bytes) {
  DeviceDeltaCodec codec;
  codec.device_ = device;
  codec.max_bytes_ = max_bytes;
  const std::uint64_t blocks = blocks_of(max_bytes);
  ASSIGN_OR_RETURN(codec.counts_, DeviceBuffer::Allocate(device, blocks * sizeof(unsigned)));
  ASSIGN_OR_RETURN(codec.offsets_, DeviceBuffer::Allocate(device, blocks * sizeof(std::uint64_t)));
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("DeviceDeltaCodec::Create"));
  std::size_t temp = 0;
  RETURN_IF_ERROR(cuda_check(cub::DeviceScan::ExclusiveSum(nullptr, temp, static_cast<unsigned*>(nullptr),
                                                           static_cast<std::uint64_t*>(nullptr),
                                                           static_cast<int>(blocks)),
                             "sizing the delta codec's scan"));
  codec.scan_temp_bytes_ = std::max<std::size_t>(temp, 1);
  ASSIGN_OR_RETURN(codec.scan_temp_, DeviceBuffer::Allocate(device, codec.scan_temp_bytes_));
  return StatusOr<DeviceDeltaCodec>(std::move(codec));
}

namespace {

// The sum of the per-block counts, read back: `offsets` gets each block's
// exclusive prefix, the host the total. Synchronizes the stream.
StatusOr<std::uint64_t> scan_counts(void* temp, std::uint64_t temp_bytes, unsigned* counts, std::uint64_t* offsets,
                                    std::uint64_t blocks, cudaStream_t s, const std::string& what) {
  std::size_t bytes = temp_bytes;
  RETURN_IF_ERROR(cuda_check(cub::DeviceScan::ExclusiveSum(temp, bytes, counts, offsets, static_cast<int>(blocks), s),
                             what + ": the scan of the block counts"));
  unsigned last_count = 0;
  std::uint64_t last_offset = 0;
  RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(&last_count, counts + blocks - 1, sizeof last_count,
                                             cudaMemcpyDeviceToHost, s), what));
  RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(&last_offset, offsets + blocks - 1, sizeof last_offset,
                                             cudaMemcpyDeviceToHost, s), what));
  RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(s), what));
  return last_offset + last_count;
}

}  // namespace

StatusOr<EncodedDelta> DeviceDeltaCodec::encode(const std::byte* now, const std::byte* base, std::uint64_t n,
                                                std::uint64_t base_version, std::byte* out, void* stream) {
  const std::string what = "delta encode of a bucket of " + std::to_string(n) + " bytes on device " +
                           std::to_string(device_);
  if (n > max_bytes_) return InvalidArgument(what + ": the codec was made for " + std::to_string(max_bytes_));
  ScopedDevice scope(device_);
  RETURN_IF_ERROR(scope.status().WithContext(what));
  auto* s = static_cast<cudaStream_t>(stream);
  const std::uint64_t words = words_of(n), bitmap_bytes = (words + 7) / 8, blocks = blocks_of(n);
  EncodedDelta result;
  std::byte header[kDeltaHeaderBytes];
  if (base != nullptr && n > 0) {
    auto* bitmap = reinterpret_cast<std::uint8_t*>(out + kDeltaHeaderBytes);
    auto* counts = reinterpret_cast<unsigned*>(counts_.data());
    auto* offsets = reinterpret_cast<std::uint64_t*>(offsets_.data());
    const bool aligned = aligned8(now) && aligned8(base);
    mark_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(now, base, n, aligned, bitmap, counts);
    RETURN_IF_ERROR(cuda_check_launch(what + ": marking the changed words"));
    ASSIGN_OR_RETURN(result.changed_words,
                     scan_counts(scan_temp_.data(), scan_temp_bytes_, counts, offsets, blocks, s, what));
    // The last word carries only its bytes (and none when it did not change).
    bool tail_set = false;
    if (n % 8 != 0) {
      std::uint8_t last = 0;
      RETURN_IF_ERROR(cuda_check(cudaMemcpy(&last, bitmap + (words - 1) / 8, 1, cudaMemcpyDeviceToHost), what));
      tail_set = (last >> ((words - 1) % 8)) & 1u;
    }
    const std::uint64_t payload = result.changed_words * 8 - (tail_set ? 8 - n % 8 : 0);
    const std::uint64_t size = kDeltaHeaderBytes + bitmap_bytes + payload;
    if (size < kDeltaHeaderBytes + n) {
      scatter_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(now, base, n, aligned, offsets,
                                                                         out + kDeltaHeaderBytes + bitmap_bytes);
      RETURN_IF_ERROR(cuda_check_launch(what + ": writing the changed words"));
      put_header(header, DeltaEncoding::kWords, base_version, n, result.changed_words);
      RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(out, header, sizeof header, cudaMemcpyHostToDevice, s), what));
      RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(s), what));  // the header lives on this stack
      result.encoding = DeltaEncoding::kWords;
      result.bytes = size;
      return result;
    }
  }
  put_header(header, DeltaEncoding::kFull, 0, n, 0);
  RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(out, header, sizeof header, cudaMemcpyHostToDevice, s), what));
  if (n > 0) {
    RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(out + kDeltaHeaderBytes, now, n, cudaMemcpyDeviceToDevice, s), what));
  }
  RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(s), what));
  result.encoding = DeltaEncoding::kFull;
  result.changed_words = 0;
  result.bytes = kDeltaHeaderBytes + n;
  return result;
}

Status DeviceDeltaCodec::decode(const std::byte* encoded, std::uint64_t encoded_bytes, const std::byte* base,
                                std::uint64_t base_version, std::byte* out, std::uint64_t n, void* stream) {
  const std::string what = "delta decode of a bucket of " + std::to_string(n) + " bytes on device " +
                           std::to_string(device_);
  if (n > max_bytes_) return InvalidArgument(what + ": the codec was made for " + std::to_string(max_bytes_));
  ScopedDevice scope(device_);
  RETURN_IF_ERROR(scope.status().WithContext(what));
  auto* s = static_cast<cudaStream_t>(stream);
  // The header and the bitmap's last byte, checked on the host as decode_delta checks them.
  std::byte header[kDeltaHeaderBytes] = {};
  const std::uint64_t words = words_of(n), bitmap_bytes = (words + 7) / 8, blocks = blocks_of(n);
  const std::uint64_t head = std::min<std::uint64_t>(encoded_bytes, kDeltaHeaderBytes);
  RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(header, encoded, head, cudaMemcpyDeviceToHost, s), what));
  RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(s), what));
  auto get = [&](int at, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(header[at + i]) << (8 * i);
    return v;
  };
  auto bad = [](const std::string& text) { return InvalidArgument("delta-encoded bucket: " + text); };
  if (encoded_bytes < kDeltaHeaderBytes) {
    return bad(std::to_string(encoded_bytes) + " bytes, shorter than its " + std::to_string(kDeltaHeaderBytes) +
               "-byte header");
  }
  if (get(0, 4) != kDeltaMagic) return bad("no RFD1 magic (got 0x" + std::to_string(get(0, 4)) + ")");
  const std::uint64_t encoding = get(4, 4), from = get(8, 8), size = get(16, 8), changed = get(24, 8);
  if (size != n) return bad("decodes to " + std::to_string(size) + " bytes, the bucket has " + std::to_string(n));
  const std::uint64_t body = encoded_bytes - kDeltaHeaderBytes;
  if (encoding == static_cast<std::uint64_t>(DeltaEncoding::kFull)) {
    if (body != n) return bad("full encoding of " + std::to_string(n) + " bytes carries " + std::to_string(body));
    if (n > 0) {
      RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(out, encoded + kDeltaHeaderBytes, n, cudaMemcpyDeviceToDevice, s),
                                 what));
    }
    return Status::Ok();
  }
  if (encoding != static_cast<std::uint64_t>(DeltaEncoding::kWords)) {
    return bad("unknown encoding " + std::to_string(encoding));
  }
  if (from != base_version) {
    return DataLoss("delta-encoded bucket: encoded against version " + std::to_string(from) +
                    ", the engine holds version " + std::to_string(base_version));
  }
  if (body < bitmap_bytes) return bad("shorter than its bitmap of " + std::to_string(bitmap_bytes) + " bytes");
  const auto* bitmap = reinterpret_cast<const std::uint8_t*>(encoded + kDeltaHeaderBytes);
  std::uint8_t last = 0;
  if (bitmap_bytes > 0) {
    RETURN_IF_ERROR(cuda_check(cudaMemcpy(&last, bitmap + bitmap_bytes - 1, 1, cudaMemcpyDeviceToHost), what));
  }
  if (words % 8 != 0 && (last >> (words % 8)) != 0) {
    return bad("its bitmap sets bits past word " + std::to_string(words - 1));
  }
  auto* counts = reinterpret_cast<unsigned*>(counts_.data());
  auto* offsets = reinterpret_cast<std::uint64_t*>(offsets_.data());
  count_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(bitmap, words, counts);
  RETURN_IF_ERROR(cuda_check_launch(what + ": counting the changed words"));
  ASSIGN_OR_RETURN(const std::uint64_t set, scan_counts(scan_temp_.data(), scan_temp_bytes_, counts, offsets, blocks,
                                                        s, what));
  if (set != changed) {
    return bad("its header says " + std::to_string(changed) + " changed words, its bitmap sets " + std::to_string(set));
  }
  const bool tail_set = n % 8 != 0 && ((last >> ((words - 1) % 8)) & 1u);
  const std::uint64_t payload = set * 8 - (tail_set ? 8 - n % 8 : 0);
  if (body != bitmap_bytes + payload) {
    return bad(std::to_string(set) + " changed words need " + std::to_string(payload) + " bytes after the bitmap, it "
               "carries " + std::to_string(body - bitmap_bytes));
  }
  if (n == 0) return Status::Ok();
  apply_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(bitmap, encoded + kDeltaHeaderBytes + bitmap_bytes,
                                                                  offsets, base, out, n,
                                                                  aligned8(base) && aligned8(out));
  return cuda_check_launch(what + ": applying the changed words");
}

}  // namespace refit
