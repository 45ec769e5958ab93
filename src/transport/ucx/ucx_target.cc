// The ucx transport's target side (ucx_target.h): registration of the
// engine's memory with UCX, and the TargetMemory over it.
#include "transport/ucx/ucx_target.h"

#if REFIT_HAVE_UCX

#include <sys/mman.h>

#include <utility>

#include "net/frames.h"
#include "refit/log.h"
#include "transport/ucx/ucx_descriptor.h"
#include "transport/ucx/ucx_requests.h"

namespace refit {

void ucx_note_host_staging(const std::string& settings) {
  static std::once_flag once;
  std::call_once(once, [&] {
    log(LogLevel::kInfo, "refit ucx",
        "this UCX build cannot register CUDA memory (" + settings +
            "): device memory is staged through pinned host buffers (ucx_memory_path host-staged)");
  });
}

StatusOr<std::unique_ptr<UcxRegistration>> ucx_register_memory(const std::shared_ptr<UcxWorker>& worker,
                                                               std::byte* base, std::uint64_t bytes,
                                                               MemoryKind memory, const std::string& what, int slots,
                                                               std::uint64_t slot_bytes, std::string* descriptor) {
  auto reg = std::make_unique<UcxRegistration>();
  reg->worker = worker;
  UcxDescriptor d;
  d.slots = slots;
  d.slot_bytes = slot_bytes;
  d.addr = reinterpret_cast<std::uintptr_t>(base);
  d.worker = worker->address();
  if (memory == MemoryKind::kCuda && !ucx_native_cuda(*worker)) {
    d.memory = UcxMemory::kStaged;
    *descriptor = format_ucx_descriptor(d);
    return reg;
  }
  d.memory = memory == MemoryKind::kCuda ? UcxMemory::kCuda : UcxMemory::kHost;
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = base;
  params.length = bytes;
  params.memory_type = memory == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  std::lock_guard<std::mutex> lock(worker->mutex());
  ucs_status_t s = ucp_mem_map(worker->context(), &params, &reg->memh);
  if (s != UCS_OK) {
    reg->memh = nullptr;
    return ResourceExhausted("registering " + what + " (" + std::to_string(bytes) + " bytes) with UCX (ucp_mem_map, " +
                             worker->settings() + "): " + ucx_status_text(s));
  }
  void* rkey = nullptr;
  std::size_t rkey_bytes = 0;
  s = ucp_rkey_pack(worker->context(), reg->memh, &rkey, &rkey_bytes);
  if (s != UCS_OK) return Internal("packing the remote key of " + what + ": " + ucx_status_text(s));
  const auto* key = static_cast<const unsigned char*>(rkey);
  d.rkey.assign(key, key + rkey_bytes);
  ucp_rkey_buffer_release(rkey);
  *descriptor = format_ucx_descriptor(d);
  return reg;
}

namespace {

class UcxTarget final : public TargetMemory {
 public:
  // `owned_bytes` > 0: `base` is an mmap of that size this target unmaps;
  // `device_pool`: a device allocation it frees; otherwise the caller owns
  // the memory (expose_memory).
  UcxTarget(std::string owner, int slots, std::uint64_t slot_bytes, std::byte* base, std::uint64_t owned_bytes,
            DeviceBuffer device_pool, MemoryKind memory, int device, std::unique_ptr<UcxRegistration> registration,
            std::string descriptor, std::unique_ptr<UcxDeviceStager> stager)
      : owner_(std::move(owner)),
        slots_(slots),
        slot_bytes_(slot_bytes),
        base_(base),
        owned_bytes_(owned_bytes),
        device_pool_(std::move(device_pool)),
        memory_(memory),
        device_(device),
        registration_(std::move(registration)),
        descriptor_(std::move(descriptor)),
        stager_(std::move(stager)),
        progress_(std::make_unique<UcxWorker::ProgressLease>(registration_->worker)) {
    // Active-message writes land on the progress thread: by memcpy into host
    // memory, through the stager into device memory.
    UcxWorker& w = *registration_->worker;
    std::lock_guard<std::mutex> lock(w.mutex());
    w.am().add_range(reinterpret_cast<std::uintptr_t>(base_), static_cast<std::uint64_t>(slots_) * slot_bytes_,
                     stager_.get());
  }

  ~UcxTarget() override {
    {
      UcxWorker& w = *registration_->worker;
      std::lock_guard<std::mutex> lock(w.mutex());
      w.am().remove_range(reinterpret_cast<std::uintptr_t>(base_));  // later writes are refused
    }
    progress_.reset();      // the last target of the worker stops its thread
    registration_.reset();  // ucp_mem_unmap before the memory goes
    if (owned_bytes_ > 0) ::munmap(base_, owned_bytes_);
  }

  std::string descriptor() const override { return descriptor_; }
  int slots() const override { return slots_; }
  std::uint64_t slot_bytes() const override { return slot_bytes_; }
  MemoryKind memory() const override { return memory_; }
  int device() const override { return device_; }
  std::byte* slot(int i) override {
    if (i < 0 || i >= slots_) return nullptr;
    return base_ + static_cast<std::uint64_t>(i) * slot_bytes_;
  }
  Status receive_data(Link& link, const FrameHeader& header, Deadline) override {
    ASSIGN_OR_RETURN(const DataFrame data, decode_data(header, link.peer()));
    return FailedPrecondition("protocol error: kData frame (slot " + std::to_string(data.slot) + ", " +
                              std::to_string(data.payload_bytes) + " bytes) from " + link.peer() + " for " +
                              owner_ + "'s ucx pool: ucx writes by remote memory access and never receives data frames");
  }
  Status seal() override { return Status::Ok(); }  // nothing has a name

 private:
  std::string owner_;
  int slots_;
  std::uint64_t slot_bytes_;
  std::byte* base_;
  std::uint64_t owned_bytes_;
  DeviceBuffer device_pool_;
  MemoryKind memory_;
  int device_;
  std::unique_ptr<UcxRegistration> registration_;
  std::string descriptor_;
  std::unique_ptr<UcxDeviceStager> stager_;  // device memory: how active-message writes reach it
  std::unique_ptr<UcxWorker::ProgressLease> progress_;
};

}  // namespace

std::unique_ptr<TargetMemory> make_ucx_target(std::string owner, int slots, std::uint64_t slot_bytes,
                                              std::byte* base, std::uint64_t owned_bytes, DeviceBuffer device_pool,
                                              MemoryKind memory, int device,
                                              std::unique_ptr<UcxRegistration> registration, std::string descriptor,
                                              std::unique_ptr<UcxDeviceStager> stager) {
  return std::make_unique<UcxTarget>(std::move(owner), slots, slot_bytes, base, owned_bytes, std::move(device_pool),
                                     memory, device, std::move(registration), std::move(descriptor),
                                     std::move(stager));
}

}  // namespace refit

#endif  // REFIT_HAVE_UCX
