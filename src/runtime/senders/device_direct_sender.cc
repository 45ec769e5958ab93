// kDeviceDirect: device weights (one copy kernel per launch), or host
// weights registered with the device (the copy engines), straight into the
// engine's exposed device weights. Nobody reads the weights before the refit
// ends, so launches queue back to back with no host wait, each covering at
// least kLaunchBytes of packed buckets (a launch per small bucket leaves
// most of the GPU idle; one launch for everything measured slower than
// ~1 GiB launches). finish() launches the rest, waits once, and announces
// every bucket. No credits.
//
// Under --quantize (device weights), the sender quantizes straight into the
// engine's weights: every FP8 tensor whose codes begin in a bucket it sent
// is one job of one batched kernel launch (cuda/fp8_block.h Fp8DeviceBatch,
// prepared once) that reads the rank's shard of the trainer's bf16 tensor
// and writes the codes and scales where the engine holds them
// (take_quantization: the view's derive() then computes nothing), launched
// in finish() after the copies. Every job's NaN report is read there,
// before any bucket is announced: a NaN or Inf fails the refit naming the
// tensor, and the engine, told of no bucket, commits nothing of it.
#include "cuda/copy_engine.h"
#include "cuda/fp8_block.h"
#include "model/shard_copy.h"
#include "quant/fp8_shard.h"
#include "refit/device_memory.h"
#include "runtime/quantized_source.h"
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
      if (c_.feed == nullptr) quant_ = take_quantization(*c_.source);
    }
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    if (quant_) {
      ASSIGN_OR_RETURN(reports_, DeviceBuffer::Allocate(gpu, 8 * c_.plan->specs.size()));
      RETURN_IF_ERROR(device_memset(reports_.data(), 0xFF, reports_.size()));
    }
    return Status::Ok();
  }

  Status send(std::uint64_t, std::uint64_t j, Deadline) override {
    std::byte* arena = landing_arena(c_);
    if (arena == nullptr) return Internal(bucket_where(c_, j) + ": the engine's exposed weights are not mapped");
    if (quant_) {
      append_copied_entries(j, arena);
    } else {
      append_arena_runs(c_, j, arena, &runs_);
    }
    bytes_ += c_.plan->buckets[j].bytes;
    unannounced_.push_back(j);
    if (bytes_ >= kLaunchBytes) RETURN_IF_ERROR(launch(bucket_where(c_, j)));
    return Status::Ok();
  }

  Status finish(std::uint64_t version, Deadline deadline) override {
    if (unannounced_.empty()) return Status::Ok();
    const std::string where = c_.name + ", direct writes of refit " + std::to_string(version);
    RETURN_IF_ERROR(launch(where));
    if (quant_) RETURN_IF_ERROR(launch_quantization().WithContext(where));
    RETURN_IF_ERROR(stream_.synchronize().WithContext(where));
    RETURN_IF_ERROR(check_reports(version));
    for (std::uint64_t j : unannounced_) RETURN_IF_ERROR(c_.protocol->send_landed(version, j, 0, deadline));
    unannounced_.clear();
    return Status::Ok();
  }

  void abandon() override {
    (void)stream_.synchronize();
    unannounced_.clear();
    runs_.clear();
    quantized_.clear();
    bytes_ = 0;
    if (quant_) (void)device_memset(reports_.data(), 0xFF, reports_.size());
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

  // Bucket j's copied entries as runs; the FP8 tensors whose codes begin in
  // it join this refit's batch (trainer ranks that share an engine rank
  // send every other bucket: each quantizes the tensors its buckets begin).
  void append_copied_entries(std::uint64_t j, std::byte* arena) {
    for (const PlanEntry& e : c_.plan->buckets[j].entries) {
      const QuantPart part = quant_->quantized->sources[e.tensor].part;
      if (part == QuantPart::kCodes && e.tensor_offset == 0) quantized_.push_back(e.tensor);
      if (part != QuantPart::kCopy) continue;
      append_shard_copy_runs(c_.source->model().weights[e.tensor], c_.pack_rank, c_.engine_ranks,
                             c_.source->data(e.tensor), e.tensor_offset, e.bytes,
                             arena + c_.arena_offsets[e.tensor] + e.tensor_offset, &runs_);
    }
  }

  // This refit's FP8 tensors, from the fed rank's shard of the bf16 source
  // into the engine's weights: one job each (its codes' index names its
  // report; the scales follow the codes in the stream, quantize_model),
  // prepared again only when the arena's mapping moved (after a relink) or
  // the tensors differ.
  Status launch_quantization() {
    std::byte* arena = landing_arena(c_);
    if (arena != batch_arena_ || quantized_ != batch_tensors_) {
      std::vector<Fp8DeviceJob> jobs;
      for (const std::size_t codes : quantized_) {
        const QuantSource& q = quant_->quantized->sources[codes];
        const Weight& source = quant_->unquantized->model().weights[q.source];
        ASSIGN_OR_RETURN(const Fp8Box box, quantized_shard_box(source, c_.pack_rank, c_.engine_ranks));
        jobs.push_back({full_fp8_source(source.spec, quant_->unquantized->data(q.source)), box,
                        {reinterpret_cast<std::uint8_t*>(arena + c_.arena_offsets[codes]),
                         reinterpret_cast<float*>(arena + c_.arena_offsets[codes + 1]),
                         reinterpret_cast<std::uint64_t*>(reports_.data()) + codes}});
      }
      ASSIGN_OR_RETURN(batch_, Fp8DeviceBatch::Prepare(jobs, stream_.device()));
      batch_arena_ = arena;
      batch_tensors_ = quantized_;
    }
    quantized_.clear();
    return batch_.launch(stream_.handle());
  }

  // After the stream finished: OK when no kernel saw a NaN or Inf; else the
  // first such tensor's refusal. Resets the reports for the next refit.
  Status check_reports(std::uint64_t version) {
    if (!quant_) return Status::Ok();
    std::vector<std::uint64_t> reports(c_.plan->specs.size());
    RETURN_IF_ERROR(copy_device_to_host({reinterpret_cast<std::byte*>(reports.data()), reports_.size()},
                                        reports_.data()));
    RETURN_IF_ERROR(device_memset(reports_.data(), 0xFF, reports_.size()));
    for (std::size_t i = 0; i < reports.size(); ++i) {
      if (reports[i] == kFp8AllFinite) continue;
      const Weight& source = quant_->unquantized->model().weights[quant_->quantized->sources[i].source];
      ASSIGN_OR_RETURN(const Fp8Box box, quantized_shard_box(source, c_.pack_rank, c_.engine_ranks));
      return fp8_nonfinite_status(full_fp8_source(source.spec, nullptr), box, reports[i], source.spec.name, version)
          .WithContext(c_.name);
    }
    return Status::Ok();
  }

  SenderContext c_;
  SharedRegistrations registrations_;  // registered host weights; empty for device weights
  std::unique_ptr<BatchedCopier> copier_;        // device weights only
  CudaStream stream_;
  std::vector<CopyRun> runs_;               // packed, not launched yet
  std::uint64_t bytes_ = 0;                 // their bytes
  std::vector<std::uint64_t> unannounced_;  // buckets packed this refit, not yet announced
  // --quantize, device weights: the view's parts, the batch of its FP8
  // tensors and the arena mapping it writes into, one NaN report per
  // engine tensor (device memory, all bits set when finite).
  std::optional<QuantizedOrigin> quant_;
  std::vector<std::size_t> quantized_;  // this refit's FP8 tensors so far (their codes' index)
  Fp8DeviceBatch batch_;
  std::byte* batch_arena_ = nullptr;
  std::vector<std::size_t> batch_tensors_;  // quantized_ when batch_ was prepared
  DeviceBuffer reports_;
};

}  // namespace

StatusOr<std::unique_ptr<BucketSender>> make_device_direct_sender(SenderContext c, int gpu,
                                                                  SharedRegistrations registrations) {
  auto sender = std::make_unique<DeviceDirectSender>(std::move(c), std::move(registrations));
  RETURN_IF_ERROR(sender->init(gpu));
  return std::unique_ptr<BucketSender>(std::move(sender));
}

}  // namespace refit
