// kDeviceKernel: device weights into a device pool, staged. One copy-kernel
// launch per bucket into the granted slot, replayed from a descriptor table
// prepared the first time that bucket went to that slot (no host work per
// tensor). Where the transport orders the pack with the engine (cuda_ipc on
// one GPU: the slot's landing event) kLanded goes out at once and the stream
// is waited for once, in finish(); otherwise once per bucket before kLanded.
#include <map>
#include <tuple>
#include <utility>

#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"

namespace refit {
namespace {

class DeviceKernelSender final : public BucketSender {
 public:
  explicit DeviceKernelSender(SenderContext c) : c_(std::move(c)) {}

  Status init(int gpu) {
    ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(gpu));
    copier_ = std::make_unique<BatchedCopier>(std::move(copier));
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    return Status::Ok();
  }

  Status send(std::uint64_t version, std::uint64_t j, Deadline deadline) override {
    const std::string where = bucket_where(c_, j);
    ASSIGN_OR_RETURN(const std::uint64_t slot, c_.protocol->wait_credit(version, j, deadline));
    std::byte* dst = c_.target->mapped_slot(static_cast<int>(slot));
    if (dst == nullptr) return Internal(where + ": the device target has no mapped slot " + std::to_string(slot));
    ASSIGN_OR_RETURN(const PreparedCopy* pack, prepared_pack(j, slot, dst, where));
    RETURN_IF_ERROR(copier_->launch(*pack, stream_.handle()).WithContext(where));
    ASSIGN_OR_RETURN(const bool ordered, announce_after_stream(c_, stream_, version, j, slot, deadline));
    unwaited_ = unwaited_ || ordered;
    return Status::Ok();
  }

  // Packs announced before they finished end before the rank says "sent"
  // (and before the caller may change its weights).
  Status finish(std::uint64_t version, Deadline) override {
    if (!unwaited_) return Status::Ok();
    unwaited_ = false;
    return stream_.synchronize().WithContext(c_.name + ", the packs of refit " + std::to_string(version));
  }

  void abandon() override {
    (void)stream_.synchronize();
    unwaited_ = false;
  }
  CudaStream* stream() override { return &stream_; }
  SenderKind kind() const override { return SenderKind::kDeviceKernel; }

 private:
  struct PreparedPack {
    std::byte* dst = nullptr;  // the slot it writes into; null until prepared
    PreparedCopy copy;
  };

  // The pack of bucket j of the plan into slot `slot` (mapped at `dst`),
  // prepared on its first use and kept: the weights and the mapped slots do
  // not move while this rank runs; a slot mapped elsewhere (after a relink)
  // is prepared again. Keyed by the plan's digest too: a partial refit's
  // plan (refit/partial.h) has other buckets under the same numbers.
  StatusOr<const PreparedCopy*> prepared_pack(std::uint64_t j, std::uint64_t slot, std::byte* dst,
                                              const std::string& where) {
    PreparedPack& p = packs_[{c_.plan->digest, j, slot}];
    if (p.dst != dst) {
      runs_.clear();
      append_slot_runs(c_, j, dst, &runs_);
      p.dst = nullptr;
      auto prepared = copier_->prepare(runs_);
      if (!prepared.ok()) return prepared.status().WithContext(where + ": preparing its pack");
      p.copy = std::move(prepared).value();
      p.dst = dst;
    }
    return &p.copy;
  }

  SenderContext c_;
  std::unique_ptr<BatchedCopier> copier_;
  CudaStream stream_;
  std::map<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>, PreparedPack> packs_;  // by (plan, bucket, slot)
  bool unwaited_ = false;  // packs announced with a landing event, not yet waited for
  std::vector<CopyRun> runs_;
};

}  // namespace

StatusOr<std::unique_ptr<BucketSender>> make_device_kernel_sender(SenderContext c, int gpu) {
  auto sender = std::make_unique<DeviceKernelSender>(std::move(c));
  RETURN_IF_ERROR(sender->init(gpu));
  return std::unique_ptr<BucketSender>(std::move(sender));
}

}  // namespace refit
