// kHostDirect: host weights straight into the engine's exposed host weights
// (shm, --mode direct): every entry copied to its place in the weight arena,
// one copy per byte, then announced. No credits.
#include "model/shard_copy.h"
#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"

namespace refit {
namespace {

class HostDirectSender final : public BucketSender {
 public:
  explicit HostDirectSender(SenderContext c) : c_(std::move(c)) {}

  Status send(std::uint64_t version, std::uint64_t j, Deadline deadline) override {
    std::byte* arena = landing_arena(c_);
    if (arena == nullptr) return Internal(bucket_where(c_, j) + ": the engine's exposed weights are not mapped");
    runs_.clear();
    append_arena_runs(c_, j, arena, &runs_);
    copy_runs_on_host(runs_);
    return c_.protocol->send_landed(version, j, 0, deadline);
  }

  Status finish(std::uint64_t, Deadline) override { return Status::Ok(); }
  void abandon() override {}
  CudaStream* stream() override { return nullptr; }
  SenderKind kind() const override { return SenderKind::kHostDirect; }

 private:
  SenderContext c_;
  std::vector<CopyRun> runs_;
};

}  // namespace

std::unique_ptr<BucketSender> make_host_direct_sender(SenderContext c) {
  return std::make_unique<HostDirectSender>(std::move(c));
}

}  // namespace refit
