// kHostPack: host weights into a host pool, staged. One-sided transports
// (shm) map the granted slot: the bucket is packed straight into it, one
// copy from the weights into the engine's pool. Two-sided ones (tcp) get a
// bucket packed into a local buffer and written by the transport.
#include "refit/transfer_defaults.h"
#include "model/shard_copy.h"
#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"

namespace refit {
namespace {

class HostPackSender final : public BucketSender {
 public:
  HostPackSender(SenderContext c, bool one_sided) : c_(std::move(c)) {
    if (!one_sided) staging_.resize(pool_slot_bytes(*c_.plan));
  }

  Status send(std::uint64_t version, std::uint64_t j, Deadline deadline) override {
    ASSIGN_OR_RETURN(const std::uint64_t slot, c_.protocol->wait_credit(version, j, deadline));
    ASSIGN_OR_RETURN(const HostPacked packed, pack_on_host(c_, j, static_cast<int>(slot), staging_, runs_));
    if (!packed.in_slot) RETURN_IF_ERROR(submit_packed(version, j, static_cast<int>(slot), packed.bytes, deadline));
    return c_.protocol->send_landed(version, j, slot, deadline);
  }

  // Two-sided: the packed bucket, or with a feed only this rank's ranges
  // (slot_ranges).
  Status submit_packed(std::uint64_t version, std::uint64_t j, int slot, const std::byte* packed, Deadline deadline) {
    std::vector<Ticket> tickets;
    Status status;
    for (const auto& [begin, end] : slot_ranges(c_, j)) {
      auto ticket = c_.target->submit(slot, begin, std::span<const std::byte>(packed + begin, end - begin), version,
                                      deadline);
      if (!ticket.ok()) {
        status = ticket.status();
        break;
      }
      tickets.push_back(*ticket);
    }
    if (status.ok()) status = wait_written(c_, tickets, j, deadline);
    if (!status.ok()) {
      for (const Ticket& t : tickets) c_.target->cancel(t);
    }
    return status;
  }

  Status finish(std::uint64_t, Deadline) override { return Status::Ok(); }
  void abandon() override {}
  CudaStream* stream() override { return nullptr; }
  SenderKind kind() const override { return SenderKind::kHostPack; }

 private:
  SenderContext c_;
  std::vector<std::byte> staging_;  // two-sided transports: the packed bucket
  std::vector<CopyRun> runs_;
};

}  // namespace

std::unique_ptr<BucketSender> make_host_pack_sender(SenderContext c, bool one_sided) {
  return std::make_unique<HostPackSender>(std::move(c), one_sided);
}

}  // namespace refit
