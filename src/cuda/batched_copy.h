// One-launch batched copy: pack or unpack a whole bucket (thousands of small
// tensors and a few huge ones, 1-D or 2-D shard slices) with ONE kernel.
//
// A CopyRun is a 2-D copy: `rows` rows of `row_bytes` bytes, row r read from
// src + r * src_pitch and written to dst + r * dst_pitch (rows == 1 for a 1-D
// copy; pitches are then ignored). Pointers are device pointers of the
// copier's device or peers' memory mapped into it (CUDA IPC, peer access):
// anything the device can address under unified addressing. Destination
// ranges must not overlap each other or any source range.
//
// How it stays near copy bandwidth for any mix: the host splits every run into
// pieces of at most 32 KiB (whole rows, or one segment of a long row), writes a
// prefix sum of piece counts into a descriptor table, and uploads it (pinned
// host -> device, on the caller's stream). In the kernel each warp takes
// pieces in grid-stride order, finds a piece's run by a warp-wide 32-way
// search over that prefix sum, and moves it with 16-byte loads/stores when
// pointers, row_bytes and pitches allow. A run whose src and dst share their
// misalignment is split into an unaligned head, a 16-byte body and a tail (a
// 1-D run's tail is copied bytewise by the body's last piece); other runs fall
// back to 8/4/2/1-byte accesses (a run whose src and dst differ in their
// misalignment mod 2 copies bytewise, several times slower: not measured).
//
// Two ways to use it: copy() builds and uploads the descriptors on every call
// (20-35 ns of host time per run on the H200 machine), prepare() + launch()
// build them once and replay them with no host work (a refit repeats its runs).
//
// Measured on one H200 (bench/batched_copy_bench.cu, 2026-11-29), kernel only
// (prepared) against one cudaMemcpyAsync of the same bytes: one 4 GiB run 93%,
// 10,000 runs of ~300 KB 91%, 2,000 2-D runs of 512 rows 87%, 100,000 runs of
// 64 B-8 KB 79%.
//
// Thread safety: a BatchedCopier is used by one thread at a time ("one per
// stream user"). It owns a small ring of descriptor scratch slots, each reused
// only after the launch that read it has finished (tracked with an event), so
// copy() blocks the host only when more than kSlots launches are in flight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "refit/status.h"

namespace refit {

struct CopyRun {
  const std::byte* src;
  std::byte* dst;
  std::uint64_t row_bytes;
  std::uint64_t rows;       // 1 for a 1-D run; 0 or row_bytes == 0 is an empty run (skipped)
  std::uint64_t src_pitch;  // bytes between row starts in src; >= row_bytes when rows > 1
  std::uint64_t dst_pitch;  // bytes between row starts in dst; >= row_bytes when rows > 1
};

// A 1-D run of `bytes` bytes.
inline CopyRun copy_run_1d(const std::byte* src, std::byte* dst, std::uint64_t bytes) {
  return CopyRun{src, dst, bytes, 1, bytes, bytes};
}

// A descriptor table built and uploaded once by BatchedCopier::prepare() and
// launched any number of times (a refit's copies are the same every refit:
// plan once, replay with no host work and no upload). Move-only; owns device
// memory on the copier's device. REQUIRES: outlives every launch that uses it
// (synchronize the stream before destroying it). The runs' pointers are baked
// in: the memory they name must stay allocated while the plan is used.
class PreparedCopy {
 public:
  PreparedCopy() = default;
  std::uint64_t descriptors() const { return descriptors_; }
  std::uint64_t pieces() const { return pieces_; }
  std::uint64_t bytes() const { return bytes_; }  // bytes one launch copies
  int device() const { return device_; }

 private:
  friend class BatchedCopier;
  DeviceBuffer table_;
  std::uint32_t descriptors_ = 0;
  std::uint64_t pieces_ = 0;
  std::uint64_t bytes_ = 0;
  int device_ = -1;
};

class BatchedCopier {
 public:
  // Descriptor scratch slots (launches that may be in flight before copy()
  // waits on the host for the oldest one). copy() takes an idle slot that is
  // big enough when there is one, so one copy at a time stays on one slot.
  static constexpr int kSlots = 4;

  // Allocates the scratch on `device` (grown later as needed).
  static StatusOr<BatchedCopier> Create(int device);

  BatchedCopier() = default;
  ~BatchedCopier();
  BatchedCopier(BatchedCopier&&) noexcept;
  BatchedCopier& operator=(BatchedCopier&&) noexcept;
  BatchedCopier(const BatchedCopier&) = delete;
  BatchedCopier& operator=(const BatchedCopier&) = delete;

  // Enqueues a copy of every run on `stream` (a cudaStream_t of this device;
  // nullptr is the legacy default stream) in one kernel launch, after one
  // descriptor upload on the same stream, and returns (asynchronous). `runs`
  // may be reused as soon as copy() returns; the bytes land when the stream
  // reaches the launch (synchronize(), or an event recorded on the stream).
  // Errors: kInvalidArgument for a null pointer or a pitch < row_bytes (naming
  // the run index); CUDA errors with context. No runs (or only empty ones)
  // enqueues nothing.
  Status copy(std::span<const CopyRun> runs, void* stream);

  // Builds and uploads (synchronously) the descriptor table of `runs` once.
  // Same validation and errors as copy().
  StatusOr<PreparedCopy> prepare(std::span<const CopyRun> runs) const;

  // Enqueues one launch of a prepared table on `stream` (no host work, no
  // upload, no scratch slot: any number may be in flight). Asynchronous; order
  // it with events like any kernel. synchronize() does not wait for it.
  Status launch(const PreparedCopy& plan, void* stream) const;

  // Blocks until every copy() enqueued by this copier has finished, and
  // returns the first asynchronous error (e.g. an illegal address) with context.
  Status synchronize();

  int device() const { return device_; }
  // Statistics of the last copy(): descriptors after splitting, pieces, bytes.
  std::uint64_t last_descriptors() const { return last_descriptors_; }
  std::uint64_t last_pieces() const { return last_pieces_; }
  std::uint64_t last_bytes() const { return last_bytes_; }

 private:
  struct Slot {
    PinnedBuffer host;    // descriptors written here, then uploaded
    DeviceBuffer device;  // the kernel reads them here
    CudaEvent done;       // recorded after the launch that read this slot
    bool in_flight = false;
  };
  StatusOr<Slot*> take_slot(std::uint64_t need, const std::string& where);

  int device_ = -1;
  int max_blocks_ = 0;  // resident blocks of the kernel on the whole device
  std::vector<Slot> slots_;
  int next_slot_ = 0;
  std::uint64_t last_descriptors_ = 0;
  std::uint64_t last_pieces_ = 0;
  std::uint64_t last_bytes_ = 0;
};

}  // namespace refit
