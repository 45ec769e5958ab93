// kRemoteWrite: transports that write into the engine's registered memory
// themselves (ucx puts or active messages, nccl sends), staged or direct.
// Two staging buffers: bucket j is packed into one while bucket j-1's write
// from the other is in flight (the transport moves it meanwhile); then j-1
// is polled to completion and announced, the credit of j awaited, and j's
// write submitted. Staged mode writes the bucket at offset 0 of the granted
// slot (a sharded trainer rank only the ranges of its part: others write
// the rest); direct mode writes each packed entry (a sharded rank: the
// parts of the entries its ranges cover) at its arena offset, pieces
// adjacent in both the bucket and the arena merged into one write.
//
// Staging buffers: host memory for host weights; for device weights device
// memory, or pinned host memory behind a device bucket when the transport
// cannot register device memory ("host-staged"). The engine pool's side is
// the transport's business.
#include <algorithm>

#include "refit/transfer_defaults.h"
#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"
#include "runtime/senders/write_in_flight.h"

namespace refit {
namespace {

class RemoteWriteSender final : public BucketSender {
 public:
  explicit RemoteWriteSender(SenderContext c) : c_(std::move(c)) {}

  Status init(int gpu, bool host_staged) {
    const std::uint64_t bytes = pool_slot_bytes(*c_.plan);
    if (gpu < 0) {
      for (auto& b : host_) b.resize(bytes);
      return Status::Ok();
    }
    ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(gpu));
    copier_ = std::make_unique<BatchedCopier>(std::move(copier));
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    for (int b = 0; b < 2; ++b) {
      if (host_staged) {
        ASSIGN_OR_RETURN(pinned_[b], PinnedBuffer::Allocate(bytes));
      } else {
        ASSIGN_OR_RETURN(device_[b], DeviceBuffer::Allocate(gpu, bytes));
      }
    }
    if (host_staged) {
      ASSIGN_OR_RETURN(device_bucket_, DeviceBuffer::Allocate(gpu, bytes));
    }
    return Status::Ok();
  }

  Status send(std::uint64_t version, std::uint64_t j, Deadline deadline) override {
    const int b = static_cast<int>(sequence_++ % 2);
    // 1. Pack bucket j (buffer b's last write, of bucket j-2, completed
    // before bucket j-1 was submitted).
    RETURN_IF_ERROR(pack(j, b));
    // 2. Bucket j-1 lands and is announced, before the credit of j.
    RETURN_IF_ERROR(in_flight_.land(c_, deadline));
    // 3. Bucket j's write starts.
    std::uint64_t slot = 0;
    if (c_.arena_offsets.empty()) {
      ASSIGN_OR_RETURN(slot, c_.protocol->wait_credit(version, j, deadline));
    }
    in_flight_.start(version, j, slot);
    return submit(j, staging(b), deadline).WithContext(bucket_where(c_, j));
  }

  Status finish(std::uint64_t, Deadline deadline) override { return in_flight_.land(c_, deadline); }

  // The writes still in flight are cancelled (the transport lets the next
  // write wait for them).
  void abandon() override {
    if (stream_.device() >= 0) (void)stream_.synchronize();
    in_flight_.cancel(c_);
  }
  CudaStream* stream() override { return stream_.device() >= 0 ? &stream_ : nullptr; }
  SenderKind kind() const override { return SenderKind::kRemoteWrite; }

 private:
  std::byte* staging(int b) {
    if (copier_ == nullptr) return host_[b].data();
    return device_bucket_.data() != nullptr ? pinned_[b].data() : device_[b].data();
  }

  Status pack(std::uint64_t j, int b) {
    const std::string where = bucket_where(c_, j);
    std::byte* to = device_bucket_.data() != nullptr ? device_bucket_.data() : staging(b);
    runs_.clear();
    append_slot_runs(c_, j, to, &runs_);
    if (copier_ == nullptr) {
      copy_runs_on_host_parallel(runs_);
      return Status::Ok();
    }
    RETURN_IF_ERROR(copier_->copy(runs_, stream_.handle()).WithContext(where));
    if (device_bucket_.data() != nullptr) {
      RETURN_IF_ERROR(copy_async(staging(b), to, c_.plan->buckets[j].bytes, stream_.handle()).WithContext(where));
    }
    return stream_.synchronize().WithContext(where);
  }

  // Submits bucket j from `from`: at offset 0 of the granted slot (staged;
  // with a feed only this rank's ranges, slot_ranges), or each run at its
  // arena offset (direct).
  Status submit(std::uint64_t j, const std::byte* from, Deadline deadline) {
    auto write = [&](std::uint64_t at, std::uint64_t offset, std::uint64_t n) -> Status {
      ASSIGN_OR_RETURN(Ticket t, c_.target->submit(static_cast<int>(in_flight_.slot()), at,
                                                   std::span<const std::byte>(from + offset, n), in_flight_.version(),
                                                   deadline));
      in_flight_.add(t);
      return Status::Ok();
    };
    const std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges = slot_ranges(c_, j);
    if (c_.arena_offsets.empty()) {
      for (const auto& [begin, end] : ranges) RETURN_IF_ERROR(write(begin, begin, end - begin));
      return Status::Ok();
    }
    // Direct: the parts of the bucket's entries that this rank's ranges
    // cover (the whole entries without a feed), each at its arena offset.
    std::uint64_t at = 0, offset = 0, n = 0;
    std::size_t k = 0;  // the first range that ends after the entry's start
    for (const PlanEntry& e : c_.plan->buckets[j].entries) {
      const std::uint64_t e_end = e.bucket_offset + e.bytes;
      while (k < ranges.size() && ranges[k].second <= e.bucket_offset) ++k;
      for (std::size_t i = k; i < ranges.size() && ranges[i].first < e_end; ++i) {
        const std::uint64_t lo = std::max(ranges[i].first, e.bucket_offset), hi = std::min(ranges[i].second, e_end);
        const std::uint64_t to =
            landing_offset(c_) + c_.arena_offsets[e.tensor] + e.tensor_offset + (lo - e.bucket_offset);
        if (n > 0 && to == at + n && lo == offset + n) {  // continues the last write on both sides
          n += hi - lo;
          continue;
        }
        if (n > 0) RETURN_IF_ERROR(write(at, offset, n));
        at = to;
        offset = lo;
        n = hi - lo;
      }
    }
    return n > 0 ? write(at, offset, n) : Status::Ok();
  }

  SenderContext c_;
  std::unique_ptr<BatchedCopier> copier_;  // device weights only
  CudaStream stream_;
  std::vector<std::byte> host_[2];  // host weights
  DeviceBuffer device_[2];          // device weights, device memory the transport registers
  PinnedBuffer pinned_[2];          // device weights, host-staged ...
  DeviceBuffer device_bucket_;      // ... packed here first
  std::uint64_t sequence_ = 0;      // buckets sent: picks the staging buffer
  WriteInFlight in_flight_;
  std::vector<CopyRun> runs_;
};

}  // namespace

StatusOr<std::unique_ptr<BucketSender>> make_remote_write_sender(SenderContext c, int gpu, bool host_staged) {
  auto sender = std::make_unique<RemoteWriteSender>(std::move(c));
  RETURN_IF_ERROR(sender->init(gpu, host_staged));
  return std::unique_ptr<BucketSender>(std::move(sender));
}

}  // namespace refit
