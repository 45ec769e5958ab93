// kPinned: host weights into a device pool, staged, pipelined over two
// pinned buffers: bucket j is packed (by several threads) while bucket j-1
// is copied to the device; j-1 is announced before the credit of j is
// awaited (the engine frees a slot only after it read the bucket before),
// then j's copy starts and is announced with bucket j+1 (or by finish).
#include "refit/transfer_defaults.h"
#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"

namespace refit {
namespace {

class PinnedSender final : public BucketSender {
 public:
  explicit PinnedSender(SenderContext c) : c_(std::move(c)) {}

  Status init(int gpu) {
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    for (int b = 0; b < 2; ++b) {
      ASSIGN_OR_RETURN(pinned_[b], PinnedBuffer::Allocate(pool_slot_bytes(*c_.plan)));
      ASSIGN_OR_RETURN(copied_[b], CudaEvent::Create(gpu));
    }
    return Status::Ok();
  }

  Status send(std::uint64_t version, std::uint64_t j, Deadline deadline) override {
    const std::string where = bucket_where(c_, j);
    const int b = static_cast<int>(sequence_++ % 2);
    RETURN_IF_ERROR(announce(b, deadline));  // the buffer's previous copy (normally announced already)
    std::byte* pinned = pinned_[b].data();
    runs_.clear();
    append_slot_runs(c_, j, pinned, &runs_);
    copy_runs_on_host_parallel(runs_);
    RETURN_IF_ERROR(announce(1 - b, deadline));  // bucket j-1, before the credit of j
    ASSIGN_OR_RETURN(const std::uint64_t slot, c_.protocol->wait_credit(version, j, deadline));
    std::byte* dst = c_.target->mapped_slot(static_cast<int>(slot));
    if (dst == nullptr) return Internal(where + ": the device target has no mapped slot " + std::to_string(slot));
    // Only this rank's ranges: with a feed, other trainer ranks write the rest of the slot.
    for (const auto& [begin, end] : slot_ranges(c_, j)) {
      RETURN_IF_ERROR(copy_async(dst + begin, pinned + begin, end - begin, stream_.handle()).WithContext(where));
    }
    RETURN_IF_ERROR(copied_[b].record(stream_.handle()).WithContext(where));
    pending_[b] = Pending{true, version, j, slot};
    return Status::Ok();
  }

  // Announces every bucket still copying, oldest first.
  Status finish(std::uint64_t, Deadline deadline) override {
    for (std::uint64_t k = 0; k < 2; ++k) RETURN_IF_ERROR(announce(static_cast<int>((sequence_ + k) % 2), deadline));
    return Status::Ok();
  }

  void abandon() override {
    (void)stream_.synchronize();
    pending_[0].active = pending_[1].active = false;
  }
  CudaStream* stream() override { return &stream_; }
  SenderKind kind() const override { return SenderKind::kPinned; }

 private:
  struct Pending {
    bool active = false;
    std::uint64_t version = 0, bucket = 0, slot = 0;
  };

  // Waits for the copy from pinned buffer b, then announces its bucket.
  // No-op when nothing is pending there.
  Status announce(int b, Deadline deadline) {
    Pending& p = pending_[b];
    if (!p.active) return Status::Ok();
    p.active = false;
    RETURN_IF_ERROR(copied_[b].synchronize().WithContext(bucket_where(c_, p.bucket)));
    return c_.protocol->send_landed(p.version, p.bucket, p.slot, deadline);
  }

  SenderContext c_;
  CudaStream stream_;
  PinnedBuffer pinned_[2];
  CudaEvent copied_[2];  // the copy from pinned_[b] finished
  Pending pending_[2];   // the bucket copying from pinned_[b]
  std::uint64_t sequence_ = 0;  // buckets sent: picks the pinned buffer
  std::vector<CopyRun> runs_;
};

}  // namespace

StatusOr<std::unique_ptr<BucketSender>> make_pinned_sender(SenderContext c, int gpu) {
  auto sender = std::make_unique<PinnedSender>(std::move(c));
  RETURN_IF_ERROR(sender->init(gpu));
  return std::unique_ptr<BucketSender>(std::move(sender));
}

}  // namespace refit
