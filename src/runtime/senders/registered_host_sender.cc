// kRegisteredHost: host weights that never move (a mapped checkpoint),
// registered with the device once (cudaHostRegister), into a device pool,
// staged: the copy engines read each bucket's runs straight out of the
// registered mapping into the granted slot, with no host-side copy.
//
// Each bucket is announced right after its copies are queued (with the
// slot's landing event where the transport orders it: cuda_ipc on the
// pool's GPU; otherwise after waiting for them), before the next credit is
// awaited. The earlier version announced bucket j-1 only after the credit of
// j arrived, which with a two-slot pool waited forever (issue 16): the
// engine grants j's slot only once it has read j-1.
#include "cuda/copy_engine.h"
#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"

namespace refit {
namespace {

class RegisteredHostSender final : public BucketSender {
 public:
  RegisteredHostSender(SenderContext c, SharedRegistrations registrations)
      : c_(std::move(c)), registrations_(std::move(registrations)) {}

  Status init(int gpu) {
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    return Status::Ok();
  }

  Status send(std::uint64_t version, std::uint64_t j, Deadline deadline) override {
    const std::string where = bucket_where(c_, j);
    ASSIGN_OR_RETURN(const std::uint64_t slot, c_.protocol->wait_credit(version, j, deadline));
    std::byte* dst = c_.target->mapped_slot(static_cast<int>(slot));
    if (dst == nullptr) return Internal(where + ": the device target has no mapped slot " + std::to_string(slot));
    runs_.clear();
    append_slot_runs(c_, j, dst, &runs_);
    RETURN_IF_ERROR(copy_runs_with_copy_engine(runs_, stream_.handle()).WithContext(where));
    ASSIGN_OR_RETURN(const bool ordered, announce_after_stream(c_, stream_, version, j, slot, deadline));
    unwaited_ = unwaited_ || ordered;
    return Status::Ok();
  }

  // Copies announced before they finished end before the rank says "sent".
  Status finish(std::uint64_t version, Deadline) override {
    if (!unwaited_) return Status::Ok();
    unwaited_ = false;
    return stream_.synchronize().WithContext(c_.name + ", the copies of refit " + std::to_string(version));
  }

  void abandon() override {
    (void)stream_.synchronize();
    unwaited_ = false;
  }
  CudaStream* stream() override { return &stream_; }
  SenderKind kind() const override { return SenderKind::kRegisteredHost; }

 private:
  SenderContext c_;
  SharedRegistrations registrations_;  // of the source's stable host ranges; outlive the stream
  CudaStream stream_;
  bool unwaited_ = false;  // copies announced with a landing event, not yet waited for
  std::vector<CopyRun> runs_;
};

}  // namespace

StatusOr<std::unique_ptr<BucketSender>> make_registered_host_sender(SenderContext c, int gpu,
                                                                   SharedRegistrations registrations) {
  auto sender = std::make_unique<RegisteredHostSender>(std::move(c), std::move(registrations));
  RETURN_IF_ERROR(sender->init(gpu));
  return std::unique_ptr<BucketSender>(std::move(sender));
}

}  // namespace refit
