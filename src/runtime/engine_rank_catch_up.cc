// An engine joining the running job (many engines, issue 18; control/
// refit_phase_joins.cc): this engine rank is the joiner's parent in the
// relay tree and sends it the committed version the coordinator names,
// read back from the weights it serves (EngineBinding::read_committed),
// bucket by bucket through its relay to that child only, exactly as it
// relays a refit's buckets (the child's credit, the bytes, kLanded). The
// joiner runs it as a refit: it applies and verifies every byte.
#include <chrono>

#include "refit/transfer_defaults.h"
#include "runtime/engine_rank_impl.h"

namespace refit {

// Says sent, or failed: the coordinator then refuses the joiner, and this
// rank goes on serving (only a lost coordinator ends the wait).
Status EngineRank::Impl::catch_up(const CatchUp& catch_up) {
  const auto began = std::chrono::steady_clock::now();
  const std::string what = "refit " + std::to_string(catch_up.version) + " to engine " +
                           std::to_string(catch_up.engine) + " (joining the job)";
  Status status = send_committed(catch_up);
  if (!status.ok()) {
    status = status.WithContext(name() + ", sending " + what);
    log(LogLevel::kWarning, name(), status.message());
    return client_->send(Failed{catch_up.version, status});
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  log(LogLevel::kInfo, name(), "sent " + what + ": " + format_bytes(relay_->forwarded_bytes()) + " in " +
                                   format_seconds(seconds));
  return client_->send(Sent{catch_up.version});
}

Status EngineRank::Impl::send_committed(const CatchUp& catch_up) {
  if (!relay_) return FailedPrecondition("it relays to no engine (its route did not name the joiner)");
  if (!binding_.read_committed) return FailedPrecondition("it cannot read its committed weights back");
  if (engine_->weight_version() != catch_up.version || !engine_->weights_complete()) {
    return FailedPrecondition("it serves refit " + std::to_string(engine_->weight_version()) +
                              (engine_->weights_complete() ? "" : " (incomplete)"));
  }
  const Deadline deadline = Deadline::AfterSeconds(options_.refit_timeout_s);
  RETURN_IF_ERROR(relay_->begin_for(catch_up.version, catch_up.engine, deadline));
  // Two buffers in the weights' memory (the relay copies from there as from
  // its receive pool): bucket j is packed while bucket j - 1 goes out.
  std::vector<std::vector<std::byte>> host;
  std::vector<DeviceBuffer> device;
  std::byte* buffers[2] = {nullptr, nullptr};
  for (int b = 0; b < 2; ++b) {
    if (on_device_) {
      ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(device_, pool_slot_bytes(plan_)));
      device.push_back(std::move(buffer));
      buffers[b] = device.back().data();
    } else {
      host.emplace_back(pool_slot_bytes(plan_));
      buffers[b] = host.back().data();
    }
  }
  std::vector<CommittedRead> reads;  // a whole bucket in one call (device weights: one batched copy)
  for (std::size_t j = 0; j < plan_.buckets.size(); ++j) {
    if (j >= 2) RETURN_IF_ERROR(relay_->wait_forwarded(j - 2, deadline));
    std::byte* buffer = buffers[j % 2];
    const Bucket& bucket = plan_.buckets[j];
    reads.clear();
    for (const PlanEntry& e : bucket.entries) {
      reads.push_back({e.tensor, e.tensor_offset, std::span<std::byte>(buffer + e.bucket_offset, e.bytes)});
    }
    RETURN_IF_ERROR(binding_.read_committed(reads));
    TappedBucket tapped;
    tapped.version = catch_up.version;
    tapped.bucket = j;
    tapped.bytes = buffer;
    tapped.n = bucket.bytes;
    RETURN_IF_ERROR(relay_->landed(tapped));
  }
  return relay_->finish(deadline);
}

}  // namespace refit
