// kDeviceDirect: device weights (one copy kernel per launch), or host
// weights registered with the device (the copy engines), straight into the
// engine's exposed device weights. Nobody reads the weights before the refit
// ends, so launches queue back to back with no host wait, each covering at
// least kLaunchBytes of packed buckets (a launch per small bucket leaves
// most of the GPU idle; one launch for everything measured slower than
// ~1 GiB launches). finish() launches the rest, waits once, and announces
// every bucket. No credits.
#include "cuda/copy_engine.h"
#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"

namespace refit {
namespace {

constexpr std::uint64_t kLaunchBytes = 1ull << 30;

class DeviceDirectSender final : public BucketSender {
 public:
  DeviceDirectSender(SenderContext c, SharedRegistrations registrations)
      : c_(std::move(c)), registrations_(std::move(registrations)) {}

  Status init(int gpu) {
    if (registrations_->empty()) {  // device weights: the copy kernel
      ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(gpu));
      copier_ = std::make_unique<BatchedCopier>(std::move(copier));
    }
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    return Status::Ok();
  }

  Status send(std::uint64_t, std::uint64_t j, Deadline) override {
    std::byte* arena = c_.target->mapped_slot(0);
    if (arena == nullptr) return Internal(bucket_where(c_, j) + ": the engine's exposed weights are not mapped");
    append_arena_runs(c_, j, arena, &runs_);
    bytes_ += c_.plan->buckets[j].bytes;
    unannounced_.push_back(j);
    if (bytes_ >= kLaunchBytes) RETURN_IF_ERROR(launch(bucket_where(c_, j)));
    return Status::Ok();
  }

  Status finish(std::uint64_t version, Deadline deadline) override {
    if (unannounced_.empty()) return Status::Ok();
    const std::string where = c_.name + ", direct writes of refit " + std::to_string(version);
    RETURN_IF_ERROR(launch(where));
    RETURN_IF_ERROR(stream_.synchronize().WithContext(where));
    for (std::uint64_t j : unannounced_) RETURN_IF_ERROR(c_.protocol->send_landed(version, j, 0, deadline));
    unannounced_.clear();
    return Status::Ok();
  }

  void abandon() override {
    (void)stream_.synchronize();
    unannounced_.clear();
    runs_.clear();
    bytes_ = 0;
  }
  CudaStream* stream() override { return &stream_; }
  SenderKind kind() const override { return SenderKind::kDeviceDirect; }

 private:
  // Launches the runs packed so far.
  Status launch(const std::string& where) {
    RETURN_IF_ERROR((copier_ ? copier_->copy(runs_, stream_.handle()) : copy_runs_with_copy_engine(runs_, stream_.handle()))
                        .WithContext(where));
    runs_.clear();
    bytes_ = 0;
    return Status::Ok();
  }

  SenderContext c_;
  SharedRegistrations registrations_;  // registered host weights; empty for device weights
  std::unique_ptr<BatchedCopier> copier_;        // device weights only
  CudaStream stream_;
  std::vector<CopyRun> runs_;               // packed, not launched yet
  std::uint64_t bytes_ = 0;                 // their bytes
  std::vector<std::uint64_t> unannounced_;  // buckets packed this refit, not yet announced
};

}  // namespace

StatusOr<std::unique_ptr<BucketSender>> make_device_direct_sender(SenderContext c, int gpu,
                                                                  SharedRegistrations registrations) {
  auto sender = std::make_unique<DeviceDirectSender>(std::move(c), std::move(registrations));
  RETURN_IF_ERROR(sender->init(gpu));
  return std::unique_ptr<BucketSender>(std::move(sender));
}

}  // namespace refit
