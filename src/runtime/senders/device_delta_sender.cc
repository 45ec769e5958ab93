// kDeviceDelta (--delta with device weights, issue 22): device weights into
// a device pool, staged, each bucket sent as the smaller of its bytes and
// its words encoding against the version the engine rank holds committed,
// encoded on the trainer's GPU (cuda/word_delta_device.h).
//
// Per bucket: one prepared copy kernel packs it into this refit's buffer of
// the bucket on the device (delta/device_bucket_bases.h: gaps zero); when
// the credit names the base this rank holds, the codec encodes it against
// that base (its choice read back once, after the pack); a words encoding
// smaller than the bucket is copied to the slot's start and announced as
// encoded, otherwise the packed bytes are copied into the slot. What was
// packed becomes the bucket's base when the refit commits. Each bucket so
// costs two device copies where kDeviceKernel makes one (the pack, then the
// slot's bytes): the trade is for links slower than the device, where the
// encoding is a small fraction of the bucket.
#include <map>
#include <tuple>
#include <utility>

#include "cuda/word_delta_device.h"
#include "refit/transfer_defaults.h"
#include "runtime/senders/pack.h"
#include "runtime/senders/senders.h"

namespace refit {
namespace {

class DeviceDeltaSender final : public BucketSender {
 public:
  explicit DeviceDeltaSender(SenderContext c) : c_(std::move(c)) {}

  Status init(int gpu) {
    if (c_.device_delta_bases == nullptr) return Internal(c_.name + ": the device delta sender has no bases");
    ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(gpu));
    copier_ = std::make_unique<BatchedCopier>(std::move(copier));
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    const std::uint64_t slot_bytes = pool_slot_bytes(*c_.plan);
    ASSIGN_OR_RETURN(DeviceDeltaCodec codec, DeviceDeltaCodec::Create(gpu, slot_bytes));
    codec_ = std::make_unique<DeviceDeltaCodec>(std::move(codec));
    ASSIGN_OR_RETURN(scratch_, DeviceBuffer::Allocate(gpu, max_encoded_bytes(slot_bytes)));
    return Status::Ok();
  }

  Status send(std::uint64_t version, std::uint64_t j, Deadline deadline) override {
    const std::string where = bucket_where(c_, j);
    ASSIGN_OR_RETURN(const GrantedSlot credit, c_.protocol->wait_credit_base(version, j, deadline));
    std::byte* dst = c_.target->mapped_slot(static_cast<int>(credit.slot));
    if (dst == nullptr) {
      return Internal(where + ": the device target has no mapped slot " + std::to_string(credit.slot));
    }
    DeviceBucketBases& bases = *c_.device_delta_bases;
    ASSIGN_OR_RETURN(std::byte* now, bases.next(j, version));
    ASSIGN_OR_RETURN(const PreparedCopy* pack, prepared_pack(j, now, where));
    RETURN_IF_ERROR(copier_->launch(*pack, stream_.handle()).WithContext(where));
    const std::uint64_t n = c_.plan->buckets[j].bytes;
    std::uint64_t encoded = 0;
    const std::byte* base = bases.base(j);
    if (credit.base != 0 && credit.base == bases.base_version() && base != nullptr) {
      ASSIGN_OR_RETURN(const EncodedDelta e,
                       codec_->encode(now, base, n, credit.base, scratch_.data(), stream_.handle()));
      if (e.encoding == DeltaEncoding::kWords && e.bytes < n) encoded = e.bytes;
    }
    const std::uint64_t bytes = encoded != 0 ? encoded : n;
    const CopyRun to_slot{encoded != 0 ? scratch_.data() : now, dst, bytes, 1, bytes, bytes};
    RETURN_IF_ERROR(copier_->copy(std::span<const CopyRun>(&to_slot, 1), stream_.handle()).WithContext(where));
    ASSIGN_OR_RETURN(const bool ordered,
                     announce_after_stream(c_, stream_, version, j, credit.slot, deadline, encoded));
    unwaited_ = unwaited_ || ordered;
    return Status::Ok();
  }

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
  SenderKind kind() const override { return SenderKind::kDeviceDelta; }

 private:
  // The pack of bucket j of the plan into `dst` (one of the bucket's two
  // buffers, which alternate at each commit), prepared on first use.
  StatusOr<const PreparedCopy*> prepared_pack(std::uint64_t j, std::byte* dst, const std::string& where) {
    auto key = std::make_tuple(c_.plan->digest, j, dst);
    auto it = packs_.find(key);
    if (it != packs_.end()) return &it->second;
    runs_.clear();
    append_slot_runs(c_, j, dst, &runs_);
    auto prepared = copier_->prepare(runs_);
    if (!prepared.ok()) return prepared.status().WithContext(where + ": preparing its pack");
    return &packs_.emplace(key, std::move(prepared).value()).first->second;
  }

  SenderContext c_;
  std::unique_ptr<BatchedCopier> copier_;
  std::unique_ptr<DeviceDeltaCodec> codec_;
  CudaStream stream_;
  DeviceBuffer scratch_;  // an encoding: at most max_encoded_bytes of the largest bucket
  std::map<std::tuple<std::uint64_t, std::uint64_t, std::byte*>, PreparedCopy> packs_;
  bool unwaited_ = false;
  std::vector<CopyRun> runs_;
};

}  // namespace

StatusOr<std::unique_ptr<BucketSender>> make_device_delta_sender(SenderContext c, int gpu) {
  auto sender = std::make_unique<DeviceDeltaSender>(std::move(c));
  RETURN_IF_ERROR(sender->init(gpu));
  return std::unique_ptr<BucketSender>(std::move(sender));
}

}  // namespace refit
