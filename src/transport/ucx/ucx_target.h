// The ucx transport's target side: the engine's memory registered with UCX
// (a receive pool, or exposed weights), described to trainers by a ucx
// descriptor (ucx_descriptor.h) and written by their puts or active-message
// writes. Private to src/transport/ucx; built only with UCX (REFIT_HAVE_UCX).
#pragma once

#if REFIT_HAVE_UCX

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cuda/device.h"
#include "refit/status.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_device_stager.h"
#include "transport/ucx/ucx_worker.h"

namespace refit {


// The registered range: ucp_mem_map'ed once, unmapped in the destructor.
struct UcxRegistration {
  std::shared_ptr<UcxWorker> worker;
  ucp_mem_h memh = nullptr;
  ~UcxRegistration() {
    if (memh == nullptr) return;
    std::lock_guard<std::mutex> lock(worker->mutex());
    ucp_mem_unmap(worker->context(), memh);
  }
};

// Registers [base, base + bytes) of `memory` and describes it as `slots`
// slots of `slot_bytes` bytes into *descriptor. `what` names the memory in
// errors. Device memory that this UCX cannot register is not registered
// (mem=staged: only active-message writes reach it, through a UcxDeviceStager).
StatusOr<std::unique_ptr<UcxRegistration>> ucx_register_memory(const std::shared_ptr<UcxWorker>& worker,
                                                               std::byte* base, std::uint64_t bytes,
                                                               MemoryKind memory, const std::string& what, int slots,
                                                               std::uint64_t slot_bytes, std::string* descriptor);

// Prints once per process that device memory is staged through host memory.
void ucx_note_host_staging(const std::string& settings);

// The target over registered memory at `base`. `owned_bytes` > 0: `base` is
// an mmap of that size the target unmaps; `device_pool`: a device
// allocation it frees; otherwise the caller owns the memory (expose_memory).
// `stager`: device memory, how active-message writes reach it.
std::unique_ptr<TargetMemory> make_ucx_target(std::string owner, int slots, std::uint64_t slot_bytes,
                                              std::byte* base, std::uint64_t owned_bytes, DeviceBuffer device_pool,
                                              MemoryKind memory, int device,
                                              std::unique_ptr<UcxRegistration> registration, std::string descriptor,
                                              std::unique_ptr<UcxDeviceStager> stager);

}  // namespace refit

#endif  // REFIT_HAVE_UCX
