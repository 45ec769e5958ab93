// kHostDelta (--delta, issue 22): host weights into a host pool, staged,
// each bucket sent as the smaller of its bytes and its words encoding
// against the version the engine rank holds committed (delta/word_delta.h).
//
// Per bucket: pack as kHostPack does (into the mapped slot on shm, into a
// local buffer on tcp), with the gaps between entries zeroed (the base
// holds zeros there too, so padding never counts as changed); then, when
// the credit names a base and this rank holds that version of the bucket,
// encode against it. A words encoding smaller than the bucket replaces the
// bytes at the slot's start (shm) or is the one range written (tcp) and is
// announced as encoded; otherwise the bucket goes as it is. Either way
// what was sent becomes pending in the bases, the bucket's base once the
// refit commits (bucket_bases.h).
#include <cstring>
#include <thread>

#include "delta/word_delta.h"
#include "model/shard_copy.h"
#include "refit/transfer_defaults.h"
#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"

namespace refit {
namespace {

class HostDeltaSender final : public BucketSender {
 public:
  HostDeltaSender(SenderContext c, bool one_sided) : c_(std::move(c)) {
    if (!one_sided) staging_.resize(pool_slot_bytes(*c_.plan));
  }

  Status send(std::uint64_t version, std::uint64_t j, Deadline deadline) override {
    ASSIGN_OR_RETURN(const GrantedSlot credit, c_.protocol->wait_credit_base(version, j, deadline));
    const int slot = static_cast<int>(credit.slot);
    ASSIGN_OR_RETURN(const HostPacked packed, pack_on_host(c_, j, slot, staging_, runs_));
    std::byte* dst = packed.bytes;
    const bool in_place = packed.in_slot;
    const std::uint64_t n = c_.plan->buckets[j].bytes;
    zero_bucket_gaps(c_.plan->buckets[j], dst);
    const std::span<const std::byte> now(dst, n);
    ASSIGN_OR_RETURN(const std::uint64_t encoded, encode_against_base(credit.base, j, now));
    if (encoded == 0) {
      // The copy kept as pending runs while the transport writes the same bytes (tcp).
      RETURN_IF_ERROR(write(version, j, slot, in_place ? nullptr : dst, n, deadline, [&] {
        return c_.delta_bases->set_pending_raw(j, now);
      }));
      return c_.protocol->send_landed(version, j, credit.slot, deadline);
    }
    std::vector<std::byte> sent(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(encoded));
    if (in_place) std::memcpy(dst, sent.data(), encoded);
    RETURN_IF_ERROR(write(version, j, slot, in_place ? nullptr : sent.data(), encoded, deadline,
                          [] { return Status::Ok(); }));
    RETURN_IF_ERROR(c_.delta_bases->set_pending(j, std::move(sent)));
    return c_.protocol->send_landed_encoded(version, j, credit.slot, encoded, deadline);
  }

  Status finish(std::uint64_t, Deadline) override { return Status::Ok(); }
  void abandon() override {}
  CudaStream* stream() override { return nullptr; }
  SenderKind kind() const override { return SenderKind::kHostDelta; }

 private:
  // The bytes of bucket j's words encoding in scratch_ when the engine's
  // base is the one held and the encoding is smaller than the bucket; 0:
  // send the bytes as they are.
  StatusOr<std::uint64_t> encode_against_base(std::uint64_t base_version, std::uint64_t j,
                                              std::span<const std::byte> now) {
    const BucketBases& bases = *c_.delta_bases;
    const std::span<const std::byte> base = bases.base(j);
    if (base_version == 0 || base_version != bases.base_version() || base.size() != now.size()) return 0;
    // Words only when smaller than the bucket: the slot holds the bucket's bytes, no more.
    if (scratch_.size() < now.size()) scratch_.resize(now.size());
    ASSIGN_OR_RETURN(const EncodedDelta e, encode_words_below(now, base, base_version, now.size(), scratch_));
    return e.encoding == DeltaEncoding::kWords ? e.bytes : 0;
  }

  // Two-sided transports: `bytes` of `data` at the slot's start, one write
  // (tcp's blocks while the link takes the bytes), with `meanwhile` on a
  // thread of its own during it (it only reads what the write reads);
  // one-sided (data null): the bytes are in the slot already, `meanwhile` alone.
  template <typename Meanwhile>
  Status write(std::uint64_t version, std::uint64_t j, int slot, const std::byte* data, std::uint64_t bytes,
               Deadline deadline, Meanwhile meanwhile) {
    if (data == nullptr) return meanwhile();
    Status kept;
    std::thread keeper([&] { kept = meanwhile(); });
    auto ticket = c_.target->submit(slot, 0, std::span<const std::byte>(data, bytes), version, deadline);
    Status status = ticket.status();
    if (status.ok()) {
      const Ticket written[] = {*ticket};
      status = wait_written(c_, written, j, deadline);
      if (!status.ok()) c_.target->cancel(*ticket);
    }
    keeper.join();
    return status.ok() ? kept : status;
  }

  SenderContext c_;
  std::vector<std::byte> staging_;  // two-sided transports: the packed bucket
  std::vector<std::byte> scratch_;  // a words encoding: fewer bytes than the largest bucket
  std::vector<CopyRun> runs_;
};

}  // namespace

std::unique_ptr<BucketSender> make_host_delta_sender(SenderContext c, bool one_sided) {
  return std::make_unique<HostDeltaSender>(std::move(c), one_sided);
}

}  // namespace refit
