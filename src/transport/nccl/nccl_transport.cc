// The nccl transport: device memory moved by ncclSend/ncclRecv over one
// 2-rank communicator per target (nccl_communicator.h); the engine's side is
// nccl_target.h, the trainer's nccl_remote.h. This file checks devices and
// versions and allocates pools.
#include "transport/nccl/nccl_transport.h"

#if REFIT_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "transport/nccl/nccl_communicator.h"
#include "transport/nccl/nccl_descriptor.h"
#include "transport/nccl/nccl_remote.h"
#include "transport/nccl/nccl_target.h"
#include "transport/pool_layout.h"

namespace refit {
namespace nccl_internal {
namespace {

Status check_device(int device, const std::string& what) {
  if (device < 0) {
    return FailedPrecondition(what + " needs a CUDA device (device=" + std::to_string(device) +
                              "; a local index inside CUDA_VISIBLE_DEVICES)");
  }
  auto count = cuda_device_count();
  if (!count.ok()) return count.status().WithContext(what);
  if (device >= *count) {
    return FailedPrecondition(what + ": device " + std::to_string(device) + " is not visible; this process sees " +
                              std::to_string(*count) + " CUDA device(s)");
  }
  return Status::Ok();
}

// ------------------------------------------------------------ the transport

class NcclTransport final : public Transport {
 public:
  std::string name() const override { return "nccl"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.one_sided = false;
    // submit moves the bytes itself (ncclSend), never as a kData payload: the
    // trainer takes its remote-write path (packs into its own device buffers,
    // submits each bucket, or in direct mode each run at its arena offset).
    // Unlike ucx, a payload-less kData frame announces each write, which the
    // target's receive_data turns into the matching ncclRecv.
    c.remote_write = true;
    c.cross_host = true;
    c.host_memory = false;
    c.device_memory = true;
    c.direct = true;
    c.one_initiator = true;  // one 2-rank communicator per target (nccl_transport.h)
    return c;
  }

  StatusOr<std::unique_ptr<TargetMemory>> create_target(const PoolOptions& options) override {
    const std::string owner = pool_owner(options);
    if (options.memory != MemoryKind::kCuda) {
      return FailedPrecondition("nccl moves device memory; " + owner + "'s pool is host memory (use --device cuda)");
    }
    ASSIGN_OR_RETURN(const std::uint64_t size,
                     validated_pool_bytes(options, std::numeric_limits<std::uint64_t>::max()));
    const std::string whose = owner + "'s nccl pool on device " + std::to_string(options.device);
    RETURN_IF_ERROR(check_device(options.device, whose));
    auto pool = DeviceBuffer::Allocate(options.device, size);
    if (!pool.ok()) return pool.status().WithContext("allocating " + whose);
    std::byte* base = pool->data();
    return make_nccl_target(whose, options.device, std::move(*pool), base, options.slots, options.slot_bytes);
  }

  StatusOr<std::unique_ptr<TargetMemory>> expose_memory(std::byte* base, std::uint64_t bytes, MemoryKind memory,
                                                        int device) override {
    const std::string what = "memory exposed at " + pointer_text(base) + " (" + std::to_string(bytes) +
                             " bytes) on device " + std::to_string(device);
    if (memory != MemoryKind::kCuda) {
      return FailedPrecondition("nccl moves device memory; the " + what + " is host memory");
    }
    if (base == nullptr || bytes == 0) {
      return InvalidArgument("nccl cannot expose " + what + ": base must be non-null and bytes positive");
    }
    RETURN_IF_ERROR(check_device(device, what));
    cudaPointerAttributes attr{};
    RETURN_IF_ERROR(cuda_check(cudaPointerGetAttributes(&attr, base), "cudaPointerGetAttributes for " + what));
    if (attr.type != cudaMemoryTypeDevice || attr.device != device) {
      return FailedPrecondition("nccl cannot expose " + what + ": it is not device memory of device " +
                                std::to_string(device) + " (cudaPointerGetAttributes: type " +
                                std::to_string(static_cast<int>(attr.type)) + ", device " +
                                std::to_string(attr.device) + ")");
    }
    return make_nccl_target("nccl " + what, device, DeviceBuffer(), base, 1, bytes);
  }

  // Without a device: the calling thread's current one.
  StatusOr<std::unique_ptr<RemoteTarget>> open_target(const std::string& descriptor, Link* link) override {
    int device = -1;
    RETURN_IF_ERROR(cuda_check(cudaGetDevice(&device), "cudaGetDevice opening the nccl target of " +
                                                           (link != nullptr ? link->peer() : std::string("?"))));
    return open_target_on(descriptor, link, device);
  }

  StatusOr<std::unique_ptr<RemoteTarget>> open_target_on(const std::string& descriptor, Link* link,
                                                         int device) override {
    ASSIGN_OR_RETURN(const NcclDescriptor d, parse_nccl_descriptor(descriptor));
    if (link == nullptr) {
      return InvalidArgument("nccl target \"" + descriptor.substr(0, 40) + "...\" needs the data-plane link (got none)");
    }
    int local_version = 0;
    const ncclResult_t vr = ncclGetVersion(&local_version);
    if (vr != ncclSuccess) return Internal("ncclGetVersion failed: " + std::string(ncclGetErrorString(vr)));
    if (local_version != d.version) {
      return FailedPrecondition("cannot open the nccl target of " + link->peer() + ": it runs NCCL version code " +
                                std::to_string(d.version) + ", this process " + std::to_string(local_version) +
                                " (both ranks of a communicator must load the same libnccl)");
    }
    const std::string what = "nccl target of " + link->peer() + " (from device " + std::to_string(device) + ")";
    RETURN_IF_ERROR(check_device(device, "the trainer side of the " + what +
                                             " (nccl sends from device memory; -1 is host memory)"));
    return open_nccl_remote(d, link, device, what);
  }
};

}  // namespace
}  // namespace nccl_internal

std::unique_ptr<Transport> make_nccl_transport() {
  // NVLink SHARP (multicast) serves collectives, never these 2-rank
  // point-to-point communicators, and the GPU machines' notes require it off:
  // set NCCL_NVLS_ENABLE=0 unless the user chose otherwise, before any
  // communicator exists (NCCL reads it at initialization).
  static const bool nvls_off = [] { return ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0) == 0; }();
  (void)nvls_off;
  return std::make_unique<nccl_internal::NcclTransport>();
}

}  // namespace refit

#endif  // REFIT_HAVE_NCCL
