// kRemoteDelta (--delta over ucx or nccl, staged; issue 22): host or device
// weights that the transport writes into the engine's slot itself, each
// bucket sent as the smaller of its bytes and its words encoding against
// the version the engine rank holds committed (delta/word_delta.h). These
// are the transports between hosts, where the link is the limit.
//
// Pipelined as kRemoteWrite: bucket j is packed and encoded while bucket
// j-1's write is in flight; then j-1 lands and is announced, j's credit is
// awaited and j's write submitted. So the encoding is made before the
// credit, against the version this rank's bases hold (the version the
// engines last committed), and sent only when the credit names that same
// version as the engine rank's base; otherwise the bucket's bytes go as
// they are (a new, restarted or rolled-back engine gets full bytes).
//
// Host weights: packed on host threads into one of two staging buffers,
// gaps zeroed, encoded on the host; what was sent becomes pending in the
// bases (a copy of the raw bytes made while the write is in flight).
// Device weights: packed with one prepared copy kernel into the bucket's
// buffer of this refit in the device bases (they become its base at the
// commit), encoded on the device into one of two device buffers; the
// transport writes from device memory (nccl, a CUDA-aware UCX), or where
// it cannot register device memory (host-staged), from one of two pinned
// buffers the chosen bytes are copied into before the credit (the raw
// bytes again after it, when the engine names another base).
#include <utility>

#include "cuda/word_delta_device.h"
#include "refit/transfer_defaults.h"
#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"
#include "runtime/senders/write_in_flight.h"

namespace refit {
namespace {

// Bucket j of one refit, packed and (where a base is held) encoded.
struct Prepared {
  const std::byte* raw = nullptr;       // the bucket's bytes, where the transport reads them
  const std::byte* encoding = nullptr;  // its words encoding, where the transport reads it (null: none)
  std::uint64_t encoded = 0;            // the encoding's bytes (0: none, or not smaller than the bucket)
  std::uint64_t base = 0;               // the version it is encoded against
  const std::byte* device_raw = nullptr;  // host-staged device weights: the bytes on the device
};

class RemoteDeltaSender final : public BucketSender {
 public:
  explicit RemoteDeltaSender(SenderContext c) : c_(std::move(c)) {}

  Status init(int gpu, bool host_staged) {
    const std::uint64_t bytes = pool_slot_bytes(*c_.plan);
    if (gpu < 0) {
      if (c_.delta_bases == nullptr) return Internal(c_.name + ": the remote delta sender has no bases");
      for (int b = 0; b < 2; ++b) {
        host_[b].resize(bytes);
        host_encoded_[b].resize(bytes);  // words are sent only when smaller than the bucket
      }
      return Status::Ok();
    }
    if (c_.device_delta_bases == nullptr) return Internal(c_.name + ": the remote delta sender has no device bases");
    ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(gpu));
    copier_ = std::make_unique<BatchedCopier>(std::move(copier));
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    ASSIGN_OR_RETURN(DeviceDeltaCodec codec, DeviceDeltaCodec::Create(gpu, bytes));
    codec_ = std::make_unique<DeviceDeltaCodec>(std::move(codec));
    for (int b = 0; b < 2; ++b) {
      ASSIGN_OR_RETURN(device_encoded_[b], DeviceBuffer::Allocate(gpu, max_encoded_bytes(bytes)));
      if (host_staged) {
        ASSIGN_OR_RETURN(pinned_[b], PinnedBuffer::Allocate(bytes));
      }
    }
    return Status::Ok();
  }

  Status send(std::uint64_t version, std::uint64_t j, Deadline deadline) override {
    const int b = static_cast<int>(sequence_++ % 2);
    const std::string where = bucket_where(c_, j);
    // 1. Pack and encode bucket j (buffer b's last write, of bucket j-2,
    // completed before bucket j-1 was submitted).
    auto prepared = copier_ == nullptr ? prepare_on_host(j, b) : prepare_on_device(version, j, b);
    if (!prepared.ok()) return prepared.status().WithContext(where);
    // 2. Bucket j-1 lands and is announced, before the credit of j.
    RETURN_IF_ERROR(in_flight_.land(c_, deadline));
    // 3. Bucket j's write starts: the encoding when the engine holds its base.
    ASSIGN_OR_RETURN(const GrantedSlot credit, c_.protocol->wait_credit_base(version, j, deadline));
    const bool words = prepared->encoded != 0 && credit.base == prepared->base;
    const std::byte* from = words ? prepared->encoding : prepared->raw;
    if (!words && prepared->encoded != 0 && pinned_[b].data() != nullptr) {  // host-staged: the raw bytes after all
      RETURN_IF_ERROR(stage(prepared->device_raw, b, c_.plan->buckets[j].bytes).WithContext(where));
      from = pinned_[b].data();
    }
    const std::uint64_t bytes = words ? prepared->encoded : c_.plan->buckets[j].bytes;
    in_flight_.start(version, j, credit.slot, words ? bytes : 0);
    auto ticket = c_.target->submit(static_cast<int>(credit.slot), 0, std::span<const std::byte>(from, bytes),
                                    version, deadline);
    if (!ticket.ok()) return ticket.status().WithContext(where);
    in_flight_.add(*ticket);
    return keep_pending(j, b, words ? bytes : 0).WithContext(where);
  }

  Status finish(std::uint64_t, Deadline deadline) override { return in_flight_.land(c_, deadline); }

  // The writes still in flight are cancelled (the transport lets the next
  // write wait for them); the rank drops what the bases hold pending.
  void abandon() override {
    if (stream_.device() >= 0) (void)stream_.synchronize();
    in_flight_.cancel(c_);
  }
  CudaStream* stream() override { return stream_.device() >= 0 ? &stream_ : nullptr; }
  SenderKind kind() const override { return SenderKind::kRemoteDelta; }

 private:
  // Host weights: packed into host_[b], encoded into host_encoded_[b].
  StatusOr<Prepared> prepare_on_host(std::uint64_t j, int b) {
    runs_.clear();
    append_slot_runs(c_, j, host_[b].data(), &runs_);
    copy_runs_on_host_parallel(runs_);
    const Bucket& bucket = c_.plan->buckets[j];
    zero_bucket_gaps(bucket, host_[b].data());
    Prepared p{host_[b].data(), host_encoded_[b].data(), 0, 0};
    const BucketBases& bases = *c_.delta_bases;
    const std::span<const std::byte> base = bases.base(j);
    if (bases.base_version() == 0 || base.size() != bucket.bytes) return p;
    const std::span<const std::byte> now(host_[b].data(), bucket.bytes);
    ASSIGN_OR_RETURN(const EncodedDelta e, encode_words_below(now, base, bases.base_version(), bucket.bytes,
                                                              std::span<std::byte>(host_encoded_[b])));
    if (e.encoding == DeltaEncoding::kWords) p = Prepared{p.raw, p.encoding, e.bytes, bases.base_version()};
    return p;
  }

  // Device weights: packed into the device bases' buffer of this refit,
  // encoded into device_encoded_[b]; host-staged, the smaller copied into
  // pinned_[b]. Returns once the bytes are where the transport reads them.
  StatusOr<Prepared> prepare_on_device(std::uint64_t version, std::uint64_t j, int b) {
    DeviceBucketBases& bases = *c_.device_delta_bases;
    ASSIGN_OR_RETURN(std::byte* now, bases.next(j, version));
    runs_.clear();
    append_slot_runs(c_, j, now, &runs_);
    RETURN_IF_ERROR(copier_->copy(runs_, stream_.handle()));
    const std::uint64_t n = c_.plan->buckets[j].bytes;
    Prepared p{now, device_encoded_[b].data(), 0, 0};
    const std::byte* base = bases.base(j);
    if (bases.base_version() != 0 && base != nullptr) {
      ASSIGN_OR_RETURN(const EncodedDelta e, codec_->encode(now, base, n, bases.base_version(),
                                                            device_encoded_[b].data(), stream_.handle()));
      if (e.encoding == DeltaEncoding::kWords && e.bytes < n) {
        p = Prepared{now, p.encoding, e.bytes, bases.base_version()};
      }
    }
    if (pinned_[b].data() == nullptr) {
      RETURN_IF_ERROR(stream_.synchronize());
      return p;
    }
    RETURN_IF_ERROR(stage(p.encoded != 0 ? p.encoding : now, b, p.encoded != 0 ? p.encoded : n));
    p.raw = pinned_[b].data();  // (the raw bytes again when the credit says so: send())
    p.encoding = pinned_[b].data();
    p.device_raw = now;
    return p;
  }

  // Host-staged: `bytes` of device memory `from` into pinned_[b], waited for.
  Status stage(const std::byte* from, int b, std::uint64_t bytes) {
    RETURN_IF_ERROR(copy_async(pinned_[b].data(), from, bytes, stream_.handle()));
    return stream_.synchronize();
  }

  // What bucket j's write sent becomes pending in the host bases (the
  // device bases marked it when it was packed): its encoding of `encoded`
  // bytes, or a copy of its bytes, made while the write is in flight.
  Status keep_pending(std::uint64_t j, int b, std::uint64_t encoded) {
    if (copier_ != nullptr) return Status::Ok();
    if (encoded == 0) {
      const std::span<const std::byte> sent(host_[b].data(), c_.plan->buckets[j].bytes);
      return c_.delta_bases->set_pending_raw(j, sent);
    }
    const auto end = host_encoded_[b].begin() + static_cast<std::ptrdiff_t>(encoded);
    return c_.delta_bases->set_pending(j, std::vector<std::byte>(host_encoded_[b].begin(), end));
  }

  SenderContext c_;
  std::unique_ptr<BatchedCopier> copier_;  // device weights only
  std::unique_ptr<DeviceDeltaCodec> codec_;
  CudaStream stream_;
  std::vector<std::byte> host_[2], host_encoded_[2];  // host weights: packed buckets, their encodings
  DeviceBuffer device_encoded_[2];                    // device weights: encodings
  PinnedBuffer pinned_[2];                            // device weights, host-staged: what the transport writes
  std::uint64_t sequence_ = 0;                        // buckets sent: picks the buffers
  WriteInFlight in_flight_;
  std::vector<CopyRun> runs_;
};

}  // namespace

StatusOr<std::unique_ptr<BucketSender>> make_remote_delta_sender(SenderContext c, int gpu, bool host_staged) {
  auto sender = std::make_unique<RemoteDeltaSender>(std::move(c));
  RETURN_IF_ERROR(sender->init(gpu, host_staged));
  return std::unique_ptr<BucketSender>(std::move(sender));
}

}  // namespace refit
