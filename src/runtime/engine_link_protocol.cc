// A full-weight trainer rank's protocol on its engine link: see engine_link_protocol.h.
#include "runtime/engine_link_protocol.h"

#include <chrono>

#include "net/frames.h"
#include "runtime/shard_channel.h"

namespace refit {

void add_delta_fields(Json& stats, const LinkTally& tally, std::uint64_t base_bytes) {
  stats["wire_bytes"] = tally.wire_bytes;
  stats["encodings"] = Json{{"full", tally.full_buckets}, {"words", tally.words_buckets}};
  stats["delta_base_bytes"] = base_bytes;
}

StatusOr<GrantedSlot> EngineLinkProtocol::wait_credit_base(std::uint64_t version, std::uint64_t j,
                                                           Deadline deadline) {
  if (link_ == nullptr) return Internal(name_ + ": no engine link for the credit of bucket " + std::to_string(j));
  const auto waiting = std::chrono::steady_clock::now();
  auto credit = receive_credit(*link_, name_, bucket_timeout_s_, version, j, deadline);
  tally_.credit_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting).count();
  if (!credit.ok()) return credit.status();
  if (tally_.credits++ == 0) tally_.credit_base = credit->base;
  tally_.credit_bases_differ = tally_.credit_bases_differ || credit->base != tally_.credit_base;
  return GrantedSlot{credit->slot, credit->base};
}

StatusOr<std::uint64_t> EngineLinkProtocol::wait_credit(std::uint64_t version, std::uint64_t j, Deadline deadline) {
  ASSIGN_OR_RETURN(const GrantedSlot credit, wait_credit_base(version, j, deadline));
  return credit.slot;
}

Status EngineLinkProtocol::send_landed(std::uint64_t version, std::uint64_t j, std::uint64_t slot,
                                       Deadline deadline) {
  if (link_ == nullptr) return Internal(name_ + ": no engine link to announce bucket " + std::to_string(j));
  const std::uint64_t bytes = plan_->buckets[j].bytes;
  RETURN_IF_ERROR(link_->send(encode(LandedFrame{version, j, slot, bytes}), {}, deadline));
  tally_.wire_bytes += bytes;
  ++tally_.full_buckets;
  return Status::Ok();
}

Status EngineLinkProtocol::send_landed_encoded(std::uint64_t version, std::uint64_t j, std::uint64_t slot,
                                               std::uint64_t encoded_bytes, Deadline deadline) {
  if (link_ == nullptr) return Internal(name_ + ": no engine link to announce bucket " + std::to_string(j));
  RETURN_IF_ERROR(link_->send(encode(LandedFrame{version, j, slot, encoded_bytes, true}), {}, deadline));
  tally_.wire_bytes += encoded_bytes;
  ++tally_.words_buckets;
  return Status::Ok();
}

}  // namespace refit
