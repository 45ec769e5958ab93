// kPinnedDirect: host weights into the engine's exposed device weights: pack
// on the host into pinned memory, copy it to a device bucket, scatter that
// into the weights with one launch, wait, announce. One device bucket: its
// scatter must finish before the next copy overwrites it.
#include "refit/transfer_defaults.h"
#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"

namespace refit {
namespace {

class PinnedDirectSender final : public BucketSender {
 public:
  explicit PinnedDirectSender(SenderContext c) : c_(std::move(c)) {}

  Status init(int gpu) {
    ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(gpu));
    copier_ = std::make_unique<BatchedCopier>(std::move(copier));
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    ASSIGN_OR_RETURN(pinned_, PinnedBuffer::Allocate(pool_slot_bytes(*c_.plan)));
    ASSIGN_OR_RETURN(device_bucket_, DeviceBuffer::Allocate(gpu, pool_slot_bytes(*c_.plan)));
    return Status::Ok();
  }

  Status send(std::uint64_t version, std::uint64_t j, Deadline deadline) override {
    const std::string where = bucket_where(c_, j);
    std::byte* arena = landing_arena(c_);
    if (arena == nullptr) return Internal(where + ": the device target has no mapped slot");
    runs_.clear();
    append_slot_runs(c_, j, pinned_.data(), &runs_);
    copy_runs_on_host_parallel(runs_);
    for (const auto& [begin, end] : slot_ranges(c_, j)) {
      RETURN_IF_ERROR(copy_async(device_bucket_.data() + begin, pinned_.data() + begin, end - begin, stream_.handle())
                          .WithContext(where));
    }
    runs_.clear();
    append_scatter_runs(j, arena);
    RETURN_IF_ERROR(copier_->copy(runs_, stream_.handle()).WithContext(where));
    RETURN_IF_ERROR(stream_.synchronize().WithContext(where));
    return c_.protocol->send_landed(version, j, 0, deadline);
  }

  Status finish(std::uint64_t, Deadline) override { return Status::Ok(); }

  // The device bucket's bytes into the weights: every entry, or with a feed
  // (other trainer ranks write the rest of these tensors) this rank's runs.
  void append_scatter_runs(std::uint64_t j, std::byte* arena) {
    std::byte* bucket = device_bucket_.data();
    if (c_.feed != nullptr) {
      const BucketShare* share = c_.feed->share(j, c_.feed_rank);
      if (share == nullptr) return;
      for (const FeedRun& r : share->runs) {
        std::byte* dst = arena + c_.arena_offsets[r.tensor] + r.tensor_offset;
        runs_.push_back(r.count == 1 ? copy_run_1d(bucket + r.bucket_offset, dst, r.bytes)
                                     : CopyRun{bucket + r.bucket_offset, dst, r.bytes, r.count, r.dst_stride,
                                               r.dst_stride});
      }
      return;
    }
    for (const PlanEntry& e : c_.plan->buckets[j].entries) {
      runs_.push_back(copy_run_1d(bucket + e.bucket_offset, arena + c_.arena_offsets[e.tensor] + e.tensor_offset,
                                  e.bytes));
    }
  }
  void abandon() override { (void)stream_.synchronize(); }
  CudaStream* stream() override { return &stream_; }
  SenderKind kind() const override { return SenderKind::kPinnedDirect; }

 private:
  SenderContext c_;
  std::unique_ptr<BatchedCopier> copier_;
  CudaStream stream_;
  PinnedBuffer pinned_;
  DeviceBuffer device_bucket_;
  std::vector<CopyRun> runs_;
};

}  // namespace

StatusOr<std::unique_ptr<BucketSender>> make_pinned_direct_sender(SenderContext c, int gpu) {
  auto sender = std::make_unique<PinnedDirectSender>(std::move(c));
  RETURN_IF_ERROR(sender->init(gpu));
  return std::unique_ptr<BucketSender>(std::move(sender));
}

}  // namespace refit
