// The ucx transport: one UCP context and worker per transport (ucx_worker.h),
// the engine's memory registered as targets (ucx_target.h), and trainers'
// endpoints to them as remotes (ucx_remote.h). This file chooses and
// allocates; the two sides live in their own files.
#include "transport/ucx/ucx_transport.h"

#if REFIT_HAVE_UCX

#include <sys/mman.h>

#include <cerrno>
#include <limits>
#include <mutex>
#include <utility>

#include "cuda/device.h"
#include "transport/pool_layout.h"
#include "transport/ucx/ucx_descriptor.h"
#include "transport/ucx/ucx_device_stager.h"
#include "transport/ucx/ucx_remote.h"
#include "transport/ucx/ucx_requests.h"
#include "transport/ucx/ucx_target.h"
#include "transport/ucx/ucx_worker.h"

namespace refit {
namespace {

// A pool the address space can hold (mmap of size_t bytes, with room to spare).
constexpr std::uint64_t kMaxPoolBytes = std::numeric_limits<std::size_t>::max() / 2;

// ------------------------------------------------------------ the transport

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(UcxOptions options) : options_(std::move(options)) {}

  std::string name() const override { return "ucx"; }

  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.one_sided = false;  // no mapped_slot: the trainer packs into its own buffer
    c.remote_write = true;
    c.cross_host = true;
    c.host_memory = true;
    auto w = worker();
    const bool native = w.ok() && ucx_native_cuda(**w);
    // Device memory: registered where this UCX supports CUDA; otherwise
    // staged through pinned host buffers (needs refit built with CUDA).
    c.device_memory = native || REFIT_HAVE_CUDA;
    c.device_memory_staged = c.device_memory && !native;
    // Direct mode: expose_memory registers the engine's weights (one slot);
    // the trainer submits each packed run at its arena offset.
    c.direct = true;
    return c;
  }

  StatusOr<std::unique_ptr<TargetMemory>> create_target(const PoolOptions& options) override {
    const std::string owner = pool_owner(options);
    ASSIGN_OR_RETURN(auto w, worker());
    ASSIGN_OR_RETURN(const std::uint64_t size, validated_pool_bytes(options, kMaxPoolBytes));
    std::unique_ptr<UcxDeviceStager> stager;
    if (options.memory == MemoryKind::kCuda) {
      ASSIGN_OR_RETURN(stager, make_stager(*w, options.device, owner + "'s receive pool"));
    }
    std::byte* base = nullptr;
    std::uint64_t owned = 0;
    DeviceBuffer device_pool;
    if (options.memory == MemoryKind::kCuda) {
      ASSIGN_OR_RETURN(device_pool, DeviceBuffer::Allocate(options.device, size));
      base = device_pool.data();
    } else {
      // Page-aligned; MAP_POPULATE touches every page now (setup), not mid-refit.
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        if (err == ENOMEM) {
          return ResourceExhausted("no memory for " + owner + "'s receive pool (" + std::to_string(size) + " bytes)");
        }
        return ErrnoStatus("allocating " + owner + "'s receive pool (" + std::to_string(size) + " bytes)", err);
      }
      base = static_cast<std::byte*>(p);
      owned = size;
    }
    std::string descriptor;
    auto reg = ucx_register_memory(w, base, size, options.memory, owner + "'s receive pool", options.slots,
                               options.slot_bytes, &descriptor);
    if (!reg.ok()) {
      if (owned > 0) ::munmap(base, owned);
      return reg.status();
    }
    return make_ucx_target(owner, options.slots, options.slot_bytes, base, owned, std::move(device_pool),
                           options.memory, options.memory == MemoryKind::kCuda ? options.device : -1,
                           std::move(*reg), std::move(descriptor), std::move(stager));
  }

  StatusOr<std::unique_ptr<TargetMemory>> expose_memory(std::byte* base, std::uint64_t bytes, MemoryKind memory,
                                                        int device) override {
    const std::string what = "exposed memory at " + std::to_string(reinterpret_cast<std::uintptr_t>(base)) + " (" +
                             std::to_string(bytes) + " bytes)";
    if (base == nullptr || bytes == 0 || bytes > static_cast<std::uint64_t>(std::numeric_limits<std::uintptr_t>::max() -
                                                                            reinterpret_cast<std::uintptr_t>(base))) {
      return InvalidArgument("ucx cannot expose " + what + ": empty or wrapping range");
    }
    ASSIGN_OR_RETURN(auto w, worker());
    std::unique_ptr<UcxDeviceStager> stager;
    if (memory == MemoryKind::kCuda) {
      ASSIGN_OR_RETURN(stager, make_stager(*w, device, what));
    }
    std::string descriptor;
    ASSIGN_OR_RETURN(auto reg, ucx_register_memory(w, base, bytes, memory, what, 1, bytes, &descriptor));
    return make_ucx_target("exposed memory", 1, bytes, base, 0, DeviceBuffer(), memory,
                           memory == MemoryKind::kCuda ? device : -1, std::move(reg), std::move(descriptor),
                           std::move(stager));
  }

  StatusOr<std::unique_ptr<RemoteTarget>> open_target(const std::string& descriptor, Link* link) override {
    ASSIGN_OR_RETURN(UcxDescriptor d, parse_ucx_descriptor(descriptor));
    const std::string peer = link != nullptr ? link->peer() : std::string("the ucx target");
    ASSIGN_OR_RETURN(auto w, worker());
    return open_ucx_remote(std::move(w), d, peer, options_);
  }

 private:
  // The transport's one context and worker, created on first use.
  StatusOr<std::shared_ptr<UcxWorker>> worker() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!worker_) {
      auto w = UcxWorker::Create(options_);
      if (!w.ok()) return w.status();
      worker_ = std::move(*w);
    }
    return worker_;
  }

  // The stager of device memory on local CUDA index `device`: active-message
  // writes (tcp) reach device memory only through it, whether or not this UCX
  // registers CUDA memory for puts. Says once when nothing else can.
  static StatusOr<std::unique_ptr<UcxDeviceStager>> make_stager(const UcxWorker& w, int device,
                                                                const std::string& what) {
    auto stager = UcxDeviceStager::Create(device, kAmChunkBytes);
    if (!stager.ok()) {
      return stager.status().WithContext("ucx cannot reach " + what + " in CUDA memory on device " +
                                         std::to_string(device) + " (" + w.settings() + ")");
    }
    if (!ucx_native_cuda(w)) ucx_note_host_staging(w.settings());
    return stager;
  }

  UcxOptions options_;
  mutable std::mutex mutex_;
  mutable std::shared_ptr<UcxWorker> worker_;
};

}  // namespace

std::unique_ptr<Transport> make_ucx_transport_with(const UcxOptions& options) {
  return std::make_unique<UcxTransport>(options);
}
std::unique_ptr<Transport> make_ucx_transport() { return make_ucx_transport_with(UcxOptions{}); }

}  // namespace refit

#endif  // REFIT_HAVE_UCX
