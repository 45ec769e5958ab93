// BatchedCopier: every run of a bucket in one kernel launch.
//
// Host side: each CopyRun becomes one to three descriptors (an unaligned head,
// a vector-aligned body, a tail, when src and dst share their misalignment),
// each descriptor is cut into pieces of at most kPieceBytes (several whole
// rows, or one segment of a long row), and first_piece[] holds the prefix sum
// of piece counts. Device side: warp w copies pieces w, w + W, w + 2W, ... (W
// warps in the grid); it finds a piece's descriptor with a 32-way warp search
// over first_piece[] (the last descriptor whose first piece is <= the piece),
// starting from the previous answer since its pieces only increase.
#include "cuda/batched_copy.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "refit/log.h"

namespace refit {
namespace {

// Tuning knobs (the -D overrides exist for benchmarking variants only).
#ifndef REFIT_COPY_PIECE_KIB
#define REFIT_COPY_PIECE_KIB 32
#endif
#ifndef REFIT_COPY_UNROLL
#define REFIT_COPY_UNROLL 2
#endif
#ifndef REFIT_COPY_MIN_BLOCKS
#define REFIT_COPY_MIN_BLOCKS 4
#endif
constexpr std::uint32_t kPieceBytes = REFIT_COPY_PIECE_KIB * 1024;  // one warp's unit of work
static_assert(kPieceBytes <= (1u << 16), "copy_rows' row math needs element * columns < 2^32");
constexpr int kThreads = 256;
constexpr int kUnroll = REFIT_COPY_UNROLL;    // independent vector loads in flight per lane (one row)
constexpr int kUnroll2d = 2;                  // the same across rows
constexpr int kMinBlocksPerSm = REFIT_COPY_MIN_BLOCKS;  // 4 caps registers at 64: 32 warps per SM
// A run is split into head/body/tail only when the body gains this much.
constexpr std::uint64_t kSplitMinBytes = 256;

// One descriptor as the kernel reads it (64 bytes).
struct DevRun {
  const std::byte* src;
  std::byte* dst;
  std::uint64_t src_pitch;
  std::uint64_t dst_pitch;
  std::uint64_t row_bytes;
  std::uint64_t rows;
  std::uint32_t rows_per_piece;  // whole rows per piece (1 when pieces_per_row > 1)
  std::uint32_t pieces_per_row;  // > 1 when a row is longer than kPieceBytes
  std::uint32_t vec;             // access width in bytes: 16, 8, 4, 2 or 1
  std::uint32_t tail;            // 1-D only: bytes (< 16) right after row_bytes, copied bytewise by the last piece
};
static_assert(sizeof(DevRun) == 64);

template <int V>
struct VecType;
template <>
struct VecType<16> {
  using type = uint4;
};
template <>
struct VecType<8> {
  using type = uint2;
};
template <>
struct VecType<4> {
  using type = unsigned int;
};
template <>
struct VecType<2> {
  using type = unsigned short;
};
template <>
struct VecType<1> {
  using type = unsigned char;
};

// Copies nc V-byte elements (nc * V <= kPieceBytes); the warp's lanes stride
// over them with kUnroll independent loads in flight per lane.
template <int V>
__device__ __forceinline__ void copy_row(const std::byte* __restrict__ src, std::byte* __restrict__ dst,
                                         std::uint32_t nc, unsigned lane) {
  using T = typename VecType<V>::type;
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
#pragma unroll 1
  for (std::uint32_t base = lane; base < nc; base += 32 * kUnroll) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * 32 < nc) v[u] = s[base + u * 32];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * 32 < nc) d[base + u * 32] = v[u];
    }
  }
}

// Copies an nr x nc rectangle of V-byte elements (nr * nc * V <= kPieceBytes)
// whose rows are short: the lanes stride over all elements in row-major order.
// Row of element e is e / nc, computed as (e * m) >> 32 with m = ceil(2^32 / nc):
// exact because e * nc < 2^32 (both are at most kPieceBytes <= 2^16).
template <int V>
__device__ __forceinline__ void copy_rows(const std::byte* __restrict__ src, std::byte* __restrict__ dst,
                                          std::uint32_t nr, std::uint32_t nc, std::uint64_t src_pitch,
                                          std::uint64_t dst_pitch, unsigned lane) {
  using T = typename VecType<V>::type;
  const std::uint32_t total = nr * nc;
  const std::uint64_t m = static_cast<std::uint64_t>(0xFFFFFFFFu / nc) + 1;  // ceil(2^32 / nc), 32-bit division
#pragma unroll 1
  for (std::uint32_t base = lane; base < total; base += 32 * kUnroll2d) {
    T v[kUnroll2d];
#pragma unroll
    for (int u = 0; u < kUnroll2d; ++u) {
      const std::uint32_t e = base + u * 32;
      if (e < total) {
        const std::uint32_t r = static_cast<std::uint32_t>((e * m) >> 32);
        const std::uint32_t c = e - r * nc;
        v[u] = *reinterpret_cast<const T*>(src + r * src_pitch + c * V);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll2d; ++u) {
      const std::uint32_t e = base + u * 32;
      if (e < total) {
        const std::uint32_t r = static_cast<std::uint32_t>((e * m) >> 32);
        const std::uint32_t c = e - r * nc;
        *reinterpret_cast<T*>(dst + r * dst_pitch + c * V) = v[u];
      }
    }
  }
}

// The last descriptor index r in [lo, n) with first_piece[r] <= piece. Every
// lane of the warp calls it with the same arguments and gets the same answer.
// REQUIRES first_piece[lo] <= piece < first_piece[n], first_piece non-decreasing.
__device__ __forceinline__ std::uint32_t find_run(const std::uint64_t* __restrict__ first_piece, std::uint32_t lo,
                                                  std::uint32_t n, std::uint64_t piece, unsigned lane) {
  std::uint32_t hi = n;  // the answer is in [lo, hi)
  while (hi - lo > 1) {
    const std::uint64_t span = hi - lo;
    const std::uint32_t probe = lo + static_cast<std::uint32_t>(span * lane / 32);
    const unsigned ok = __ballot_sync(0xffffffffu, __ldg(first_piece + probe) <= piece);
    const int k = 31 - __clz(static_cast<int>(ok));  // last lane whose probe is <= piece (lane 0 always is)
    const std::uint32_t new_lo = lo + static_cast<std::uint32_t>(span * k / 32);
    hi = k == 31 ? hi : lo + static_cast<std::uint32_t>(span * (k + 1) / 32);
    lo = new_lo;
  }
  return lo;
}

__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) batched_copy_kernel(const DevRun* __restrict__ runs,
                                                                const std::uint64_t* __restrict__ first_piece,
                                                                std::uint32_t n, std::uint64_t total_pieces) {
  const unsigned lane = threadIdx.x & 31u;
  const std::uint64_t warp = (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const std::uint64_t warps = (static_cast<std::uint64_t>(gridDim.x) * blockDim.x) >> 5;
  std::uint32_t r = 0;
  for (std::uint64_t p = warp; p < total_pieces; p += warps) {
    r = find_run(first_piece, r, n, p, lane);
    const DevRun& d = runs[r];
    // The host guarantees fewer than 2^32 pieces per descriptor: 32-bit math.
    const std::uint32_t local = static_cast<std::uint32_t>(p - __ldg(first_piece + r));
    const std::uint32_t ppr = d.pieces_per_row;
    std::uint64_t row0, col0;
    std::uint32_t nr, ncb;
    if (ppr > 1) {
      const std::uint32_t row = local / ppr;
      row0 = row;
      col0 = static_cast<std::uint64_t>(local - row * ppr) * kPieceBytes;
      nr = 1;
      ncb = static_cast<std::uint32_t>(min(static_cast<std::uint64_t>(kPieceBytes), d.row_bytes - col0));
    } else {
      row0 = static_cast<std::uint64_t>(local) * d.rows_per_piece;
      col0 = 0;
      nr = static_cast<std::uint32_t>(min(static_cast<std::uint64_t>(d.rows_per_piece), d.rows - row0));
      ncb = static_cast<std::uint32_t>(d.row_bytes);
    }
    const std::byte* src = d.src + row0 * d.src_pitch + col0;
    std::byte* dst = d.dst + row0 * d.dst_pitch + col0;
    const std::uint64_t sp = d.src_pitch, dp = d.dst_pitch;
    // One case per (width, one row or several): each case is one simple loop.
    switch (d.vec * 2 + (nr > 1 ? 1 : 0)) {
      case 32: copy_row<16>(src, dst, ncb / 16, lane); break;
      case 33: copy_rows<16>(src, dst, nr, ncb / 16, sp, dp, lane); break;
      case 16: copy_row<8>(src, dst, ncb / 8, lane); break;
      case 17: copy_rows<8>(src, dst, nr, ncb / 8, sp, dp, lane); break;
      case 8: copy_row<4>(src, dst, ncb / 4, lane); break;
      case 9: copy_rows<4>(src, dst, nr, ncb / 4, sp, dp, lane); break;
      case 4: copy_row<2>(src, dst, ncb / 2, lane); break;
      case 5: copy_rows<2>(src, dst, nr, ncb / 2, sp, dp, lane); break;
      case 2: copy_row<1>(src, dst, ncb, lane); break;
      default: copy_rows<1>(src, dst, nr, ncb, sp, dp, lane); break;
    }
    // A 1-D run's unaligned tail rides on its last piece (no descriptor of its own).
    if (d.tail != 0 && col0 + ncb == d.row_bytes && lane < d.tail) dst[ncb + lane] = src[ncb + lane];
  }
}

// ---------------------------------------------------------------- host side

// Largest access width that src, dst, row_bytes and (for 2-D) both pitches allow.
std::uint32_t best_vec(std::uintptr_t s, std::uintptr_t d, std::uint64_t row_bytes, std::uint64_t rows,
                       std::uint64_t sp, std::uint64_t dp) {
  std::uint64_t x = s | d | row_bytes;
  if (rows > 1) x |= sp | dp;
  // Masks, not %: a loop over run-time widths would divide (tens of ns a run).
  if ((x & 15) == 0) return 16;
  if ((x & 7) == 0) return 8;
  if ((x & 3) == 0) return 4;
  if ((x & 1) == 0) return 2;
  return 1;
}

// Appends descriptors (at most 3 per run; the caller sizes the buffers).
class DescriptorWriter {
 public:
  DescriptorWriter(DevRun* runs, std::uint64_t* first_piece) : runs_(runs), first_piece_(first_piece) {}

  void add(const CopyRun& run) {
    const auto s = reinterpret_cast<std::uintptr_t>(run.src);
    const auto d = reinterpret_cast<std::uintptr_t>(run.dst);
    const std::uint64_t rb = run.row_bytes;
    const std::uint32_t v = best_vec(s, d, rb, run.rows, run.src_pitch, run.dst_pitch);
    if (v < 16 && rb >= kSplitMinBytes) {
      for (std::uint64_t w = 16; w > v; w >>= 1) {  // widths are powers of two: masks, no division
        const std::uint64_t mask = w - 1;
        if ((s & mask) != (d & mask)) continue;
        if (run.rows > 1 && ((run.src_pitch | run.dst_pitch) & mask) != 0) continue;
        const std::uint64_t head = (w - (s & mask)) & mask;
        const std::uint64_t body = (rb - head) & ~mask;
        const std::uint64_t tail = rb - head - body;
        if (body < kSplitMinBytes) continue;
        push(run.src, run.dst, head, run);
        if (run.rows == 1) {
          push(run.src + head, run.dst + head, body, run, static_cast<std::uint32_t>(tail));
        } else {
          push(run.src + head, run.dst + head, body, run);
          push(run.src + head + body, run.dst + head + body, tail, run);
        }
        return;
      }
    }
    push(run.src, run.dst, rb, run);
  }

  std::uint32_t count() const { return n_; }
  std::uint64_t pieces() const { return pieces_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  // `tail` (1-D only): bytes after row_bytes that the last piece copies bytewise.
  void push(const std::byte* src, std::byte* dst, std::uint64_t row_bytes, const CopyRun& run,
            std::uint32_t tail = 0) {
    if (row_bytes == 0) return;
    DevRun& r = runs_[n_];
    r.src = src;
    r.dst = dst;
    r.rows = run.rows;
    r.row_bytes = row_bytes;
    r.src_pitch = run.rows > 1 ? run.src_pitch : row_bytes;
    r.dst_pitch = run.rows > 1 ? run.dst_pitch : row_bytes;
    r.vec = best_vec(reinterpret_cast<std::uintptr_t>(src), reinterpret_cast<std::uintptr_t>(dst), row_bytes,
                     run.rows, r.src_pitch, r.dst_pitch);
    r.tail = tail;
    std::uint64_t pieces;
    if (run.rows == 1) {  // the common case, without 64-bit divisions (host time is per run)
      r.pieces_per_row = static_cast<std::uint32_t>((row_bytes + kPieceBytes - 1) / kPieceBytes);
      r.rows_per_piece = 1;
      pieces = r.pieces_per_row;
    } else if (row_bytes > kPieceBytes) {
      r.pieces_per_row = static_cast<std::uint32_t>((row_bytes + kPieceBytes - 1) / kPieceBytes);
      r.rows_per_piece = 1;
      pieces = run.rows * r.pieces_per_row;
    } else {
      r.pieces_per_row = 1;
      r.rows_per_piece = static_cast<std::uint32_t>(std::min<std::uint64_t>(run.rows, kPieceBytes / row_bytes));
      pieces = (run.rows + r.rows_per_piece - 1) / r.rows_per_piece;
    }
    first_piece_[n_] = pieces_;
    pieces_ += pieces;
    bytes_ += row_bytes * run.rows + tail;
    ++n_;
  }

  DevRun* runs_;
  std::uint64_t* first_piece_;
  std::uint32_t n_ = 0;
  std::uint64_t pieces_ = 0;
  std::uint64_t bytes_ = 0;
};

// Checks every run; builds a message only for the first bad one (this runs
// once per run on the host path of every copy: keep it cheap).
Status validate(std::span<const CopyRun> runs) {
  if (runs.size() > (1u << 29)) return InvalidArgument("BatchedCopier::copy: too many runs");
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const CopyRun& r = runs[i];
    if (r.rows == 0 || r.row_bytes == 0) continue;
    const bool null_ptr = r.src == nullptr || r.dst == nullptr;
    const bool bad_pitch = r.rows > 1 && (r.src_pitch < r.row_bytes || r.dst_pitch < r.row_bytes);
    // Keeps every descriptor under 2^32 pieces (the kernel's piece math is 32-bit).
    const bool too_big = r.rows > (1ull << 31) || r.row_bytes > (1ull << 46) ||
                         r.rows * ((r.row_bytes + kPieceBytes - 1) / kPieceBytes) >= (1ull << 32);
    if (!(null_ptr || bad_pitch || too_big)) continue;
    const std::string where = "BatchedCopier::copy: run " + std::to_string(i) + " of " + std::to_string(runs.size());
    if (null_ptr) return InvalidArgument(where + ": null src or dst");
    if (bad_pitch) {
      return InvalidArgument(where + ": pitches (src " + std::to_string(r.src_pitch) + ", dst " +
                             std::to_string(r.dst_pitch) + ") must be >= row_bytes " + std::to_string(r.row_bytes) +
                             " for " + std::to_string(r.rows) + " rows");
    }
    return InvalidArgument(where + ": too large (" + std::to_string(r.rows) + " rows of " +
                           std::to_string(r.row_bytes) + " bytes)");
  }
  return Status::Ok();
}

std::uint64_t round_up(std::uint64_t x, std::uint64_t to) { return (x + to - 1) / to * to; }

std::uint64_t count_nonempty(std::span<const CopyRun> runs) {
  std::uint64_t n = 0;
  for (const CopyRun& r : runs) n += (r.rows != 0 && r.row_bytes != 0);
  return n;
}

// Host buffer bytes that build() may need for `nonempty` runs (at most 3 descriptors a run).
std::uint64_t worst_case_bytes(std::uint64_t nonempty) {
  const std::uint64_t max_desc = 3 * nonempty;
  return max_desc * sizeof(DevRun) + (max_desc + 1) * sizeof(std::uint64_t);
}

// What build() wrote: DevRun[n], then first_piece[n + 1], `upload` bytes in all.
struct Built {
  std::uint32_t n = 0;
  std::uint64_t pieces = 0;
  std::uint64_t bytes = 0;
  std::uint64_t upload = 0;
};

// Writes the descriptor table for `runs` into `host` (worst_case_bytes(nonempty) bytes).
Built build(std::span<const CopyRun> runs, std::uint64_t nonempty, std::byte* host) {
  auto* host_runs = reinterpret_cast<DevRun*>(host);
  auto* host_first = reinterpret_cast<std::uint64_t*>(host + 3 * nonempty * sizeof(DevRun));
  DescriptorWriter writer(host_runs, host_first);
  for (const CopyRun& r : runs) {
    if (r.rows != 0 && r.row_bytes != 0) writer.add(r);
  }
  Built b;
  b.n = writer.count();
  b.pieces = writer.pieces();
  b.bytes = writer.bytes();
  // Pack first_piece right after the descriptors actually written (dst <= src: a forward copy is safe).
  auto* packed_first = reinterpret_cast<std::uint64_t*>(host + b.n * sizeof(DevRun));
  std::copy(host_first, host_first + b.n, packed_first);
  packed_first[b.n] = b.pieces;
  b.upload = b.n * sizeof(DevRun) + (b.n + 1) * sizeof(std::uint64_t);
  return b;
}

// One launch over a descriptor table already in device memory (or queued to land there on `s`).
Status launch_kernel(const std::byte* table, const Built& b, int max_blocks, cudaStream_t s,
                     const std::string& where) {
  const std::uint64_t blocks_wanted = (b.pieces * 32 + kThreads - 1) / kThreads;  // a warp per piece
  const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>(blocks_wanted, max_blocks));
  // cuda_check_launch reads cudaGetLastError: drop an error left by an
  // unrelated earlier call (a failed cudaSetDevice, say) so that only this
  // launch's error is reported.
  (void)cudaGetLastError();
  batched_copy_kernel<<<blocks, kThreads, 0, s>>>(reinterpret_cast<const DevRun*>(table),
                                                  reinterpret_cast<const std::uint64_t*>(table + b.n * sizeof(DevRun)),
                                                  b.n, b.pieces);
  return cuda_check_launch(where + ": batched_copy_kernel (" + std::to_string(b.n) + " descriptors, " +
                           std::to_string(b.pieces) + " pieces, " + std::to_string(blocks) + " blocks)");
}

}  // namespace

StatusOr<BatchedCopier> BatchedCopier::Create(int device) {
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("BatchedCopier::Create"));
  int sms = 0, per_sm = 0;
  RETURN_IF_ERROR(cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                             "BatchedCopier::Create: multiprocessor count of device " + std::to_string(device)));
  RETURN_IF_ERROR(cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, batched_copy_kernel, kThreads, 0),
                             "BatchedCopier::Create: occupancy of the copy kernel on device " + std::to_string(device)));
  BatchedCopier c;
  c.device_ = device;
  c.max_blocks_ = std::max(1, sms * std::max(1, per_sm));
  c.slots_.resize(kSlots);
  for (Slot& slot : c.slots_) {
    ASSIGN_OR_RETURN(slot.done, CudaEvent::Create(device));
  }
  return StatusOr<BatchedCopier>(std::move(c));  // nvcc's front end lacks C++20's implicit move here
}

BatchedCopier::~BatchedCopier() {
  // The kernel or the upload may still read a slot's scratch: wait before freeing.
  const Status s = synchronize();
  if (!s.ok()) log(LogLevel::kError, "refit cuda", "~BatchedCopier: " + s.ToString());
}

BatchedCopier::BatchedCopier(BatchedCopier&& o) noexcept
    : device_(std::exchange(o.device_, -1)),
      max_blocks_(o.max_blocks_),
      slots_(std::move(o.slots_)),
      next_slot_(o.next_slot_),
      last_descriptors_(o.last_descriptors_),
      last_pieces_(o.last_pieces_),
      last_bytes_(o.last_bytes_) {
  o.slots_.clear();
}

BatchedCopier& BatchedCopier::operator=(BatchedCopier&& o) noexcept {
  if (this != &o) {
    (void)synchronize();
    device_ = std::exchange(o.device_, -1);
    max_blocks_ = o.max_blocks_;
    slots_ = std::move(o.slots_);
    o.slots_.clear();
    next_slot_ = o.next_slot_;
    last_descriptors_ = o.last_descriptors_;
    last_pieces_ = o.last_pieces_;
    last_bytes_ = o.last_bytes_;
  }
  return *this;
}

Status BatchedCopier::synchronize() {
  Status first;
  for (Slot& slot : slots_) {
    if (!slot.in_flight) continue;
    const Status s = slot.done.synchronize();
    slot.in_flight = false;
    if (!s.ok() && first.ok()) {
      first = s.WithContext("BatchedCopier on device " + std::to_string(device_) + ": a batched copy failed");
    }
  }
  return first;
}

// An idle slot whose scratch already holds `need` bytes; else an idle one
// (grown by the caller); else the oldest, once the launch that read it has
// finished. Reusing idle slots keeps a caller with one copy in flight at a
// time on one slot: each slot's first growth costs a cudaMallocHost and a
// cudaMalloc (milliseconds for a MoE bucket's descriptors).
StatusOr<BatchedCopier::Slot*> BatchedCopier::take_slot(std::uint64_t need, const std::string& where) {
  Slot* idle = nullptr;
  for (Slot& slot : slots_) {
    if (slot.in_flight) {
      ASSIGN_OR_RETURN(bool finished, slot.done.query());
      if (!finished) continue;
      slot.in_flight = false;
    }
    if (slot.host.size() >= need) return &slot;
    if (idle == nullptr) idle = &slot;
  }
  if (idle != nullptr) return idle;
  Slot& oldest = slots_[next_slot_];
  next_slot_ = (next_slot_ + 1) % static_cast<int>(slots_.size());
  RETURN_IF_ERROR(oldest.done.synchronize().WithContext(where + ": waiting for an earlier batched copy"));
  oldest.in_flight = false;
  return &oldest;
}

Status BatchedCopier::copy(std::span<const CopyRun> runs, void* stream) {
  if (slots_.empty()) return FailedPrecondition("BatchedCopier::copy on an empty (moved-from) copier");
  RETURN_IF_ERROR(validate(runs));
  const std::uint64_t nonempty = count_nonempty(runs);
  last_descriptors_ = last_pieces_ = last_bytes_ = 0;
  if (nonempty == 0) return Status::Ok();

  const std::string where = "BatchedCopier::copy on device " + std::to_string(device_);
  ScopedDevice scope(device_);
  RETURN_IF_ERROR(scope.status().WithContext(where));

  const std::uint64_t need = worst_case_bytes(nonempty);
  ASSIGN_OR_RETURN(Slot * taken, take_slot(need, where));
  Slot& slot = *taken;
  if (slot.host.size() < need) {
    const std::uint64_t cap = round_up(std::max<std::uint64_t>(need + need / 2, 64 * 1024), 4096);
    slot.host = PinnedBuffer();
    slot.device = DeviceBuffer();
    ASSIGN_OR_RETURN(slot.host, PinnedBuffer::Allocate(cap));
    ASSIGN_OR_RETURN(slot.device, DeviceBuffer::Allocate(device_, cap));
  }

  const Built b = build(runs, nonempty, slot.host.data());
  auto* s = static_cast<cudaStream_t>(stream);
  RETURN_IF_ERROR(
      cuda_check(cudaMemcpyAsync(slot.device.data(), slot.host.data(), b.upload, cudaMemcpyHostToDevice, s),
                 where + ": uploading " + std::to_string(b.n) + " descriptors"));
  RETURN_IF_ERROR(launch_kernel(slot.device.data(), b, max_blocks_, s, where));
  RETURN_IF_ERROR(slot.done.record(stream).WithContext(where));
  slot.in_flight = true;
  last_descriptors_ = b.n;
  last_pieces_ = b.pieces;
  last_bytes_ = b.bytes;
  return Status::Ok();
}

StatusOr<PreparedCopy> BatchedCopier::prepare(std::span<const CopyRun> runs) const {
  if (device_ < 0) return FailedPrecondition("BatchedCopier::prepare on an empty (moved-from) copier");
  RETURN_IF_ERROR(validate(runs));
  const std::uint64_t nonempty = count_nonempty(runs);
  PreparedCopy plan;
  plan.device_ = device_;
  if (nonempty == 0) return StatusOr<PreparedCopy>(std::move(plan));
  std::vector<std::byte> host(worst_case_bytes(nonempty));
  const Built b = build(runs, nonempty, host.data());
  ASSIGN_OR_RETURN(plan.table_, DeviceBuffer::Allocate(device_, b.upload));
  RETURN_IF_ERROR(copy_host_to_device(plan.table_.data(), {host.data(), static_cast<std::size_t>(b.upload)})
                      .WithContext("BatchedCopier::prepare on device " + std::to_string(device_)));
  plan.descriptors_ = b.n;
  plan.pieces_ = b.pieces;
  plan.bytes_ = b.bytes;
  return StatusOr<PreparedCopy>(std::move(plan));  // nvcc's front end lacks C++20's implicit move here
}

Status BatchedCopier::launch(const PreparedCopy& plan, void* stream) const {
  if (plan.descriptors_ == 0) return Status::Ok();
  if (plan.device_ != device_) {
    return InvalidArgument("BatchedCopier::launch: the plan was prepared for device " + std::to_string(plan.device_) +
                           ", this copier is on device " + std::to_string(device_));
  }
  const std::string where = "BatchedCopier::launch on device " + std::to_string(device_);
  ScopedDevice scope(device_);
  RETURN_IF_ERROR(scope.status().WithContext(where));
  Built b;
  b.n = plan.descriptors_;
  b.pieces = plan.pieces_;
  b.bytes = plan.bytes_;
  return launch_kernel(plan.table_.data(), b, max_blocks_, static_cast<cudaStream_t>(stream), where);
}

}  // namespace refit
