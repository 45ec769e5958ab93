#include "transport/cuda_ipc/cuda_ipc_transport.h"

#if REFIT_HAVE_CUDA

#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuMemGetAddressRange (a driver entry point; no libcuda link)
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "net/frames.h"
#include "cuda/cuda_check.h"
#include "cuda/event_pool.h"
#include "cuda/ticket_queue.h"
#include "cuda/device.h"
#include "refit/log.h"
#include "cuda/device.h"
#include "transport/cuda_ipc/cuda_ipc_descriptor.h"
#include "transport/pool_layout.h"

namespace refit {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes, "cudaIpcMemHandle_t changed size");

// Destructors cannot return a Status: report and carry on.
void report_teardown_error(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading) return;
  log(LogLevel::kError, "refit cuda_ipc",
      std::string(what) + " failed: " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

std::string on_device(int device) { return " on device " + std::to_string(device); }

bool in_range(int slot, std::uint64_t offset, std::uint64_t bytes, int slots, std::uint64_t slot_bytes) {
  return slot >= 0 && slot < slots && offset <= slot_bytes && bytes <= slot_bytes - offset;
}

// ------------------------------------------------------------ allocations

struct AddressRange {
  std::byte* base = nullptr;
  std::uint64_t size = 0;
};

// The allocation that contains `p` (cuMemGetAddressRange, reached through
// the runtime's driver entry point so that refit links only cudart).
StatusOr<AddressRange> allocation_of(const void* p, const std::string& what) {
  struct Entry {
    PFN_cuMemGetAddressRange_v3020 fn = nullptr;
    Status status;
  };
  static const Entry entry = [] {
    Entry e;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    e.status =
        cuda_check(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 3020, cudaEnableDefault, &found),
                   "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)");
    if (e.status.ok() && (found != cudaDriverEntryPointSuccess || fn == nullptr)) {
      e.status = FailedPrecondition("the CUDA driver has no cuMemGetAddressRange (entry point query result " +
                                    std::to_string(static_cast<int>(found)) + ")");
    }
    if (e.status.ok()) e.fn = reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn);
    return e;
  }();
  RETURN_IF_ERROR(entry.status.WithContext(what));
  CUdeviceptr base = 0;
  std::size_t size = 0;
  const CUresult r = entry.fn(&base, &size, reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS) {
    return InvalidArgument(what + ": cuMemGetAddressRange(" + pointer_text(p) + ") failed with CUresult " +
                           std::to_string(static_cast<int>(r)) + " (not memory of a CUDA allocation?)");
  }
  return AddressRange{reinterpret_cast<std::byte*>(base), static_cast<std::uint64_t>(size)};
}

// ------------------------------------------------------------ this process's exports
// CUDA cannot open an IPC handle in the process that exported it. The handles
// of this process's live targets are kept here so that open_target can say so
// plainly instead of passing on a driver error.

struct Exports {
  std::mutex mu;
  std::multiset<std::string> handles;  // hex
};

Exports& exports() {
  static Exports* e = new Exports;  // never destroyed: targets may outlive static destruction
  return *e;
}

bool exported_here(const std::string& hex) {
  Exports& e = exports();
  std::lock_guard<std::mutex> lock(e.mu);
  return e.handles.count(hex) != 0;
}

class ExportRecord {
 public:
  explicit ExportRecord(std::string hex) : hex_(std::move(hex)) {
    Exports& e = exports();
    std::lock_guard<std::mutex> lock(e.mu);
    e.handles.insert(hex_);
  }
  ~ExportRecord() {
    Exports& e = exports();
    std::lock_guard<std::mutex> lock(e.mu);
    auto it = e.handles.find(hex_);
    if (it != e.handles.end()) e.handles.erase(it);
  }
  ExportRecord(const ExportRecord&) = delete;
  ExportRecord& operator=(const ExportRecord&) = delete;

 private:
  std::string hex_;
};

// ------------------------------------------------------------ target side

class CudaIpcTarget final : public TargetMemory {
 public:
  // `pool` owns the memory (create_target) or is empty (expose_memory: the
  // caller owns it). `base` is slot 0.
  // `whose` names the memory in errors ("engine rank 2's cuda_ipc pool on device 0").
  // `landed`: a pool's interprocess events, one per slot (empty for exposed
  // memory), whose handles are in the descriptor.
  CudaIpcTarget(std::string whose, int device, DeviceBuffer pool, std::byte* base, int slots,
                std::uint64_t slot_bytes, std::vector<CudaEvent> landed, std::string descriptor,
                const std::string& handle_hex)
      : whose_(std::move(whose)),
        device_(device),
        pool_(std::move(pool)),
        base_(base),
        slots_(slots),
        slot_bytes_(slot_bytes),
        landed_(std::move(landed)),
        descriptor_(std::move(descriptor)),
        record_(handle_hex) {}

  std::string descriptor() const override { return descriptor_; }
  int slots() const override { return slots_; }
  std::uint64_t slot_bytes() const override { return slot_bytes_; }
  MemoryKind memory() const override { return MemoryKind::kCuda; }
  int device() const override { return device_; }
  std::byte* slot(int i) override {
    if (i < 0 || i >= slots_) return nullptr;
    return base_ + static_cast<std::uint64_t>(i) * slot_bytes_;
  }
  Status receive_data(Link& link, const FrameHeader& header, Deadline) override {
    ASSIGN_OR_RETURN(const DataFrame data, decode_data(header, link.peer()));
    return FailedPrecondition("protocol error: kData frame (slot " + std::to_string(data.slot) + ", " +
                              std::to_string(data.payload_bytes) + " bytes) from " + link.peer() + " for " +
                              whose_ + ": cuda_ipc is one-sided and never receives data frames");
  }
  Status seal() override { return Status::Ok(); }  // nothing has a name

  // Polls slot i's event: an event never recorded, or recorded by an
  // initiator that waited for its writes itself, is complete at once. A
  // bucket's pack takes milliseconds: yield for the first one, then sleep.
  Status wait_landed(int slot, Deadline deadline, const std::function<Status()>& interrupted) override {
    if (landed_.empty()) return Status::Ok();
    if (slot < 0 || slot >= slots_) {
      return InvalidArgument("wait_landed: slot " + std::to_string(slot) + " of " + whose_ + " (" +
                             std::to_string(slots_) + " slots)");
    }
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    for (;;) {
      auto done = landed_[slot].query();
      if (!done.ok()) {
        return done.status().WithContext("the landing event of slot " + std::to_string(slot) + " of " + whose_);
      }
      if (*done) return Status::Ok();
      RETURN_IF_ERROR(interrupted());
      if (deadline.expired()) {
        return DeadlineExceeded("the writes into slot " + std::to_string(slot) + " of " + whose_ +
                                " were announced but did not finish before the deadline");
      }
      if (std::chrono::steady_clock::now() < spin_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

 private:
  std::string whose_;
  int device_;
  DeviceBuffer pool_;  // freed with its device current, after record_ is gone
  std::byte* base_;
  int slots_;
  std::uint64_t slot_bytes_;
  std::vector<CudaEvent> landed_;  // by slot; empty for exposed memory
  std::string descriptor_;
  ExportRecord record_;
};

// Exports the allocation starting at `alloc_base` and builds the target whose
// slot 0 is alloc_base + offset; `landing_events`: one exported
// interprocess event per slot (a receive pool).
StatusOr<std::unique_ptr<TargetMemory>> export_target(const std::string& whose, int device, DeviceBuffer pool,
                                                      std::byte* alloc_base, std::uint64_t offset, int slots,
                                                      std::uint64_t slot_bytes, bool landing_events) {
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("exporting " + whose));
  cudaIpcMemHandle_t handle{};
  const cudaError_t err = cudaIpcGetMemHandle(&handle, alloc_base);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    Status s = cuda_check(err, "cudaIpcGetMemHandle(" + pointer_text(alloc_base) + ") for " + whose);
    return Status(s.code() == StatusCode::kInternal ? StatusCode::kFailedPrecondition : s.code(),
                  s.message() +
                      "; only memory from cudaMalloc can be exported (not cudaMallocAsync pools, cudaMallocManaged, "
                      "or the virtual memory API, e.g. PyTorch expandable_segments)");
  }
  char bus[32] = {};
  RETURN_IF_ERROR(cuda_check(cudaDeviceGetPCIBusId(bus, sizeof bus, device),
                             "cudaDeviceGetPCIBusId(" + std::to_string(device) + ") for " + whose));
  if (!is_pci_bus_id(bus)) {
    return Internal("cudaDeviceGetPCIBusId(" + std::to_string(device) + ") for " + whose + " gave \"" + bus +
                    "\", which is not a PCI bus id of the form 0000:3B:00.0");
  }
  CudaIpcDescriptor d;
  d.pci_bus_id = bus;
  d.slots = slots;
  d.slot_bytes = slot_bytes;
  d.offset = offset;
  std::memcpy(d.handle.data(), &handle, kCudaIpcHandleBytes);
  std::vector<CudaEvent> landed;
  for (int i = 0; landing_events && i < slots; ++i) {
    auto event = CudaEvent::Create(device, /*timing=*/false, /*interprocess=*/true);
    if (!event.ok()) return event.status().WithContext("the landing event of slot " + std::to_string(i) + " of " + whose);
    auto h = event->ipc_handle();
    if (!h.ok()) return h.status().WithContext("exporting the landing event of slot " + std::to_string(i) + " of " + whose);
    d.events.push_back(*h);
    landed.push_back(std::move(*event));
  }
  std::byte* base = alloc_base + offset;
  return std::unique_ptr<TargetMemory>(new CudaIpcTarget(whose, device, std::move(pool), base, slots, slot_bytes,
                                                         std::move(landed), format_cuda_ipc_descriptor(d),
                                                         cuda_ipc_handle_hex(d.handle)));
}

// ------------------------------------------------------------ initiator side

class CudaIpcRemote final : public RemoteTarget {
 public:
  // `mapped` comes from cudaIpcOpenMemHandle in the context of `device`.
  // `landed`: the target's landing events opened here (one per slot), or
  // empty (the target has none, or its GPU is not `device`).
  CudaIpcRemote(std::string what, int device, void* mapped, std::uint64_t offset, int slots,
                std::uint64_t slot_bytes, CudaStream stream, std::vector<CudaEvent> landed)
      : what_(std::move(what)),
        device_(device),
        mapped_(mapped),
        base_(static_cast<std::byte*>(mapped) + offset),
        slots_(slots),
        slot_bytes_(slot_bytes),
        stream_(std::move(stream)),
        landed_(std::move(landed)),
        events_(device) {}

  ~CudaIpcRemote() override {
    // Copies still queued write into the mapping: let them finish first.
    if (Status s = stream_.synchronize(); !s.ok()) {
      log(LogLevel::kError, "refit cuda_ipc", "closing " + what_ + ": " + s.ToString());
    }
    pending_.retire_all([](CudaEvent&&) {});
    events_.clear();
    ScopedDevice scope(device_);
    report_teardown_error(cudaIpcCloseMemHandle(mapped_), "cudaIpcCloseMemHandle of " + what_ + on_device(device_));
  }

  std::byte* mapped_slot(int slot) override {
    if (slot < 0 || slot >= slots_) return nullptr;
    return base_ + static_cast<std::uint64_t>(slot) * slot_bytes_;
  }

  StatusOr<Ticket> submit(int slot, std::uint64_t offset, std::span<const std::byte> bytes, std::uint64_t,
                          Deadline) override {
    if (!in_range(slot, offset, bytes.size(), slots_, slot_bytes_)) {
      return InvalidArgument("write of " + std::to_string(bytes.size()) + " bytes at offset " +
                             std::to_string(offset) + " into slot " + std::to_string(slot) + " of " + what_ +
                             " is out of range (slots=" + std::to_string(slots_) +
                             ", slot_bytes=" + std::to_string(slot_bytes_) + ")");
    }
    const std::string where = "slot " + std::to_string(slot) + " of " + what_ + on_device(device_);
    ScopedDevice scope(device_);
    RETURN_IF_ERROR(scope.status().WithContext("writing into " + where));
    std::byte* dst = mapped_slot(slot) + offset;
    // Packing in place (bytes already at dst) needs no copy.
    if (!bytes.empty() && bytes.data() != dst) {
      RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(dst, bytes.data(), bytes.size(), cudaMemcpyDefault,
                                                 static_cast<cudaStream_t>(stream_.handle())),
                                 "cudaMemcpyAsync of " + std::to_string(bytes.size()) + " bytes from " +
                                     pointer_text(bytes.data()) + " into " + where));
    }
    ASSIGN_OR_RETURN(CudaEvent event, events_.take());
    RETURN_IF_ERROR(event.record(stream_.handle()).WithContext("completion event of a write into " + where));
    return pending_.push(std::move(event));
  }

  StatusOr<bool> poll(Ticket ticket) override {
    return pending_.poll(
        ticket, what_,
        [&](CudaEvent& event) -> StatusOr<bool> {
          auto done = event.query();
          if (!done.ok()) {
            return done.status().WithContext("write " + std::to_string(ticket) + " into " + what_ +
                                             on_device(device_));
          }
          return *done;
        },
        [&](CudaEvent&& event) { events_.give_back(std::move(event)); });
  }

  // A queued copy cannot be withdrawn; it completes (poll sees it) or the
  // destructor waits for it.
  void cancel(Ticket) override {}

  StatusOr<bool> record_landed(int slot, void* stream) override {
    if (landed_.empty()) return false;
    if (slot < 0 || slot >= slots_) {
      return InvalidArgument("record_landed: slot " + std::to_string(slot) + " of " + what_ + " (" +
                             std::to_string(slots_) + " slots)");
    }
    RETURN_IF_ERROR(landed_[slot].record(stream).WithContext("the landing event of slot " + std::to_string(slot) +
                                                             " of " + what_));
    return true;
  }

 private:
  std::string what_;
  int device_;
  void* mapped_;
  std::byte* base_;
  int slots_;
  std::uint64_t slot_bytes_;
  CudaStream stream_;
  std::vector<CudaEvent> landed_;        // the target's, by slot; may be empty
  TicketQueue<CudaEvent> pending_;       // one completion event per write, in stream order
  EventPool events_;                     // recorded and completed: reusable
};

// ------------------------------------------------------------ the transport

class CudaIpcTransport final : public Transport {
 public:
  std::string name() const override { return "cuda_ipc"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.one_sided = true;
    c.cross_host = false;
    c.host_memory = false;
    c.device_memory = true;
    c.direct = true;
    return c;
  }

  StatusOr<std::unique_ptr<TargetMemory>> create_target(const PoolOptions& options) override {
    const std::string owner = pool_owner(options);
    if (options.memory != MemoryKind::kCuda) {
      return FailedPrecondition("cuda_ipc moves device memory; " + owner + "'s pool is host memory");
    }
    ASSIGN_OR_RETURN(const std::uint64_t size,
                     validated_pool_bytes(options, std::numeric_limits<std::uint64_t>::max()));
    RETURN_IF_ERROR(check_device(options.device, owner + "'s cuda_ipc pool"));
    auto pool = DeviceBuffer::Allocate(options.device, size);
    if (!pool.ok()) return pool.status().WithContext("allocating " + owner + "'s cuda_ipc pool");
    std::byte* base = pool->data();
    return export_target(owner + "'s cuda_ipc pool" + on_device(options.device), options.device, std::move(*pool),
                         base, 0, options.slots, options.slot_bytes, /*landing_events=*/true);
  }

  StatusOr<std::unique_ptr<TargetMemory>> expose_memory(std::byte* base, std::uint64_t bytes, MemoryKind memory,
                                                        int device) override {
    const std::string what = "memory exposed at " + pointer_text(base) + " (" + std::to_string(bytes) +
                             " bytes)" + on_device(device);
    if (memory != MemoryKind::kCuda) {
      return FailedPrecondition("cuda_ipc moves device memory; the " + what + " is host memory");
    }
    if (base == nullptr || bytes == 0) {
      return InvalidArgument("cuda_ipc cannot expose " + what + ": base must be non-null and bytes positive");
    }
    RETURN_IF_ERROR(check_device(device, what));
    cudaPointerAttributes attr{};
    RETURN_IF_ERROR(cuda_check(cudaPointerGetAttributes(&attr, base), "cudaPointerGetAttributes for " + what));
    if (attr.type != cudaMemoryTypeDevice) {
      return FailedPrecondition("cuda_ipc cannot expose " + what + ": it is not device memory from cudaMalloc " +
                                "(cudaPointerGetAttributes type " + std::to_string(static_cast<int>(attr.type)) +
                                ")");
    }
    if (attr.device != device) {
      return FailedPrecondition("cuda_ipc cannot expose " + what + ": the memory is on device " +
                                std::to_string(attr.device));
    }
    ScopedDevice scope(device);
    RETURN_IF_ERROR(scope.status().WithContext("exposing " + what));
    ASSIGN_OR_RETURN(const AddressRange alloc, allocation_of(base, "finding the allocation of " + what));
    const std::uint64_t offset = static_cast<std::uint64_t>(base - alloc.base);
    if (offset > alloc.size || bytes > alloc.size - offset) {
      return InvalidArgument("cuda_ipc cannot expose " + what + ": it runs past the end of its allocation (" +
                             std::to_string(alloc.size) + " bytes at " + pointer_text(alloc.base) + ", the range "
                             "starts at offset " + std::to_string(offset) + ")");
    }
    constexpr std::uint64_t kLargePage = 2ull << 20;
    if (alloc.size >= kLargePage && alloc.size % kLargePage != 0) {
      // Not an error: the bytes land right, only slower (DeviceBuffer::Allocate rounds up for this reason).
      log(LogLevel::kWarning, "refit cuda_ipc",
          "the allocation holding the " + what + " is " + std::to_string(alloc.size) +
              " bytes, not a multiple of 2 MiB: another process's writes into such a mapping measured ~27% slower "
              "on an H200; allocate it rounded up to 2 MiB");
    }
    return export_target("cuda_ipc " + what, device, DeviceBuffer(), alloc.base, offset, 1, bytes,
                         /*landing_events=*/false);
  }

  // `device`: the initiator's local device, whose kernels write into the
  // target (the trainer's pack). When the target's memory is on another GPU
  // that this process sees, peer access from `device` to it is enabled here,
  // once (a kernel cannot write into a peer's memory without it; copies can,
  // which is why a test that only submits copies does not notice). When the
  // target's GPU is hidden from this process, or on another GPU, the mapping
  // is opened in `device`'s context (with lazy peer access), where the
  // kernels that write into it run: a mapping opened in the owning GPU's
  // context faulted when a kernel on another GPU wrote into it, peer access
  // or not (2-GPU H200 machine, 2026-11-29).
  StatusOr<std::unique_ptr<RemoteTarget>> open_target_on(const std::string& descriptor, Link* link,
                                                         int device) override {
    if (device < 0) return open_target(descriptor, link);
    ScopedDevice scope(device);
    RETURN_IF_ERROR(scope.status().WithContext("opening a cuda_ipc target from device " + std::to_string(device)));
    ASSIGN_OR_RETURN(const CudaIpcDescriptor d, parse_cuda_ipc_descriptor(descriptor));
    int owner = -1;
    if (cudaDeviceGetByPCIBusId(&owner, d.pci_bus_id.c_str()) != cudaSuccess) {
      (void)cudaGetLastError();
      owner = -1;  // hidden: open_target maps it in this (the initiator's) context
    }
    if (owner >= 0 && owner != device) {
      int can = 0;
      RETURN_IF_ERROR(cuda_check(cudaDeviceCanAccessPeer(&can, device, owner),
                                 "cudaDeviceCanAccessPeer(" + std::to_string(device) + ", " + std::to_string(owner) + ")"));
      if (!can) {
        return FailedPrecondition("device " + std::to_string(device) + " cannot write into device " +
                                  std::to_string(owner) + " (" + d.pci_bus_id +
                                  ", the target's GPU) by peer access; place the trainer rank on a GPU with peer "
                                  "access to its engine rank's GPU");
      }
      const cudaError_t enabled = cudaDeviceEnablePeerAccess(owner, 0);
      if (enabled == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else if (enabled != cudaSuccess) {
        return cuda_check(enabled, "cudaDeviceEnablePeerAccess from device " + std::to_string(device) +
                                       " to device " + std::to_string(owner));
      }
    }
    return open_in(descriptor, link, device);
  }

  StatusOr<std::unique_ptr<RemoteTarget>> open_target(const std::string& descriptor, Link* link) override {
    return open_in(descriptor, link, -1);
  }

 private:
  // Maps the target in the context of `map_device`, or (-1) in that of the
  // GPU holding it when this process sees that GPU, else the current one.
  StatusOr<std::unique_ptr<RemoteTarget>> open_in(const std::string& descriptor, Link* link, int map_device) {
    ASSIGN_OR_RETURN(const CudaIpcDescriptor d, parse_cuda_ipc_descriptor(descriptor));
    const std::string what =
        "cuda_ipc pool \"" + descriptor + "\"" + (link != nullptr ? " of " + link->peer() : std::string());
    if (exported_here(cuda_ipc_handle_hex(d.handle))) {
      return FailedPrecondition("cannot open " + what + ": it was exported by this same process (pid " +
                                std::to_string(::getpid()) + "), and CUDA opens IPC handles only in other "
                                "processes; run the initiator in another process or use the memory directly");
    }
    // Map it in the context of the GPU that holds it when this process sees
    // that GPU; else in the current device's context, as a peer.
    int device = map_device;
    const cudaError_t by_bus =
        map_device >= 0 ? cudaSuccess : cudaDeviceGetByPCIBusId(&device, d.pci_bus_id.c_str());
    if (by_bus != cudaSuccess) {
      (void)cudaGetLastError();
      if (by_bus != cudaErrorInvalidDevice && by_bus != cudaErrorInvalidValue) {
        return cuda_check(by_bus, "cudaDeviceGetByPCIBusId(" + d.pci_bus_id + ") opening " + what);
      }
      RETURN_IF_ERROR(cuda_check(cudaGetDevice(&device), "cudaGetDevice opening " + what + " (its GPU " +
                                                             d.pci_bus_id + " is not visible to this process)"));
    }
    ScopedDevice scope(device);
    RETURN_IF_ERROR(scope.status().WithContext("opening " + what));
    cudaIpcMemHandle_t handle{};
    std::memcpy(&handle, d.handle.data(), kCudaIpcHandleBytes);
    void* mapped = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      Status s = cuda_check(err, "cudaIpcOpenMemHandle" + on_device(device) + " opening " + what);
      return Status(s.code(), s.message() + "; the exporting process must be alive on this host and still hold "
                                            "the memory, and must not be this process");
    }
    auto close = [&](Status s) {
      report_teardown_error(cudaIpcCloseMemHandle(mapped), "cudaIpcCloseMemHandle of " + what + on_device(device));
      return s;
    };
    // The descriptor's shape must fit in what was mapped.
    auto range = allocation_of(mapped, "sizing the mapping of " + what);
    if (!range.ok()) return close(range.status());
    const std::uint64_t need = d.offset + static_cast<std::uint64_t>(d.slots) * d.slot_bytes;
    if (need > range->size) {
      return close(FailedPrecondition("the allocation behind " + what + " is " + std::to_string(range->size) +
                                      " bytes, but the descriptor needs " + std::to_string(need)));
    }
    auto stream = CudaStream::Create(device);
    if (!stream.ok()) return close(stream.status().WithContext("opening " + what));
    // The landing events, when the writes come from the GPU that holds the
    // target (an event is recorded on a stream of its own device); across
    // GPUs the initiator waits for its writes itself.
    std::vector<CudaEvent> landed;
    int owner = -1;
    if (cudaDeviceGetByPCIBusId(&owner, d.pci_bus_id.c_str()) != cudaSuccess) {
      (void)cudaGetLastError();
      owner = -1;
    }
    for (std::size_t i = 0; owner == device && i < d.events.size(); ++i) {
      auto event = CudaEvent::OpenIpc(device, d.events[i]);
      if (!event.ok()) {
        return close(event.status().WithContext("opening the landing event of slot " + std::to_string(i) + " of " +
                                                what));
      }
      landed.push_back(std::move(*event));
    }
    return std::unique_ptr<RemoteTarget>(new CudaIpcRemote(what, device, mapped, d.offset, d.slots, d.slot_bytes,
                                                           std::move(*stream), std::move(landed)));
  }

  // `device` must be a visible local CUDA index.
  static Status check_device(int device, const std::string& what) {
    if (device < 0) {
      return FailedPrecondition(what + " needs a CUDA device (device=" + std::to_string(device) +
                                "; a local index inside CUDA_VISIBLE_DEVICES)");
    }
    auto count = cuda_device_count();
    if (!count.ok()) return count.status().WithContext(what);
    if (device >= *count) {
      return FailedPrecondition(what + ": device " + std::to_string(device) + " is not visible; this process sees " +
                                std::to_string(*count) + " CUDA device(s) (local indices 0.." +
                                std::to_string(*count - 1) + ")");
    }
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Transport> make_cuda_ipc_transport() { return std::make_unique<CudaIpcTransport>(); }

}  // namespace refit

#endif  // REFIT_HAVE_CUDA
