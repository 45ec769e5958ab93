// Devices, memory, streams and events: the CUDA runtime behind refit::Status.
// Without CUDA (REFIT_HAVE_CUDA == 0) the GPU functions are stubs that return
// kFailedPrecondition; the pure functions work in both builds.
#include "cuda/device.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#if REFIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#include "refit/log.h"
#endif

namespace refit {

// ---------------------------------------------------------------- pure functions

StatusOr<int> engine_local_device(int base_gpu_id, int tp_rank, int visible_device_count, int gpus) {
  const std::string values = "base_gpu_id " + std::to_string(base_gpu_id) + ", tp_rank " + std::to_string(tp_rank) +
                             (gpus > 0 ? ", " + std::to_string(gpus) + " engine GPU(s)" : "") + ", " +
                             std::to_string(visible_device_count) + " visible device(s)";
  if (base_gpu_id < 0 || tp_rank < 0 || gpus < 0) {
    return FailedPrecondition("engine device: base_gpu_id, tp_rank and the engine GPUs must be >= 0 (" + values + ")");
  }
  const long long local = static_cast<long long>(base_gpu_id) + (gpus > 0 ? tp_rank % gpus : tp_rank);
  if (local >= visible_device_count) {
    return FailedPrecondition(std::string("engine device: base_gpu_id + tp_rank") + (gpus > 0 ? " % engine GPUs" : "") +
                              " = " + std::to_string(local) +
                              " is not a visible device (" + values + "); base_gpu_id is a local index inside "
                              "CUDA_VISIBLE_DEVICES (0.." + std::to_string(visible_device_count - 1) +
                              "), not a physical GPU id");
  }
  return static_cast<int>(local);
}

Status require_cuda_device() {
  StatusOr<int> count = cuda_device_count();
  if (count.ok()) return Status::Ok();
  return FailedPrecondition("no CUDA device (" + count.status().message() + ")");
}

std::vector<std::string> parse_visible_devices(std::string_view env_value) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= env_value.size()) {
    std::size_t comma = env_value.find(',', pos);
    if (comma == std::string_view::npos) comma = env_value.size();
    std::string_view entry = env_value.substr(pos, comma - pos);
    while (!entry.empty() && (entry.front() == ' ' || entry.front() == '\t')) entry.remove_prefix(1);
    while (!entry.empty() && (entry.back() == ' ' || entry.back() == '\t')) entry.remove_suffix(1);
    if (entry.empty()) break;  // the CUDA runtime ignores everything from the first invalid entry
    out.emplace_back(entry);
    pos = comma + 1;
  }
  return out;
}

std::string describe_local_device(int local_device, const char* cuda_visible_devices) {
  std::string out = "local device " + std::to_string(local_device);
  if (cuda_visible_devices == nullptr) {
    return out + " (CUDA_VISIBLE_DEVICES unset: physical GPU " + std::to_string(local_device) + ")";
  }
  const std::vector<std::string> entries = parse_visible_devices(cuda_visible_devices);
  if (local_device < 0 || static_cast<std::size_t>(local_device) >= entries.size()) {
    return out + " (not in CUDA_VISIBLE_DEVICES=\"" + cuda_visible_devices + "\")";
  }
  return out + " (CUDA_VISIBLE_DEVICES entry \"" + entries[local_device] + "\")";
}

bool cuda_built() { return REFIT_HAVE_CUDA != 0; }

#if REFIT_HAVE_CUDA

// ---------------------------------------------------------------- CUDA build

namespace {

std::string bytes_text(std::uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%llu bytes (%.3f GiB)", static_cast<unsigned long long>(bytes),
                static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

// Destructors cannot return a Status: report and carry on.
void report_teardown_error(cudaError_t err, const char* what, int device) {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading) return;
  log(LogLevel::kError, "refit cuda",
      std::string(what) + " on device " + std::to_string(device) + " failed: " + cudaGetErrorString(err) + " (" +
          cudaGetErrorName(err) + ")");
}

// The device that owns `p`, or -1 for host memory.
StatusOr<int> device_of(const void* p, std::string_view what) {
  cudaPointerAttributes attr{};
  RETURN_IF_ERROR(cuda_check(cudaPointerGetAttributes(&attr, p), std::string(what) + ": cudaPointerGetAttributes"));
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return attr.device;
  return -1;
}

Status sync_copy(void* dst, const void* src, std::uint64_t bytes, std::string_view what) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr || src == nullptr) return InvalidArgument(std::string(what) + ": null pointer");
  ASSIGN_OR_RETURN(int device, device_of(src, what));
  if (device < 0) {
    ASSIGN_OR_RETURN(device, device_of(dst, what));
  }
  if (device < 0) device = 0;
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status());
  const std::string context = std::string(what) + ": cudaMemcpy of " + bytes_text(bytes) + " (device " +
                              std::to_string(device) + ")";
  RETURN_IF_ERROR(cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), context));
  // From pageable memory cudaMemcpy may return before the DMA lands: wait, so
  // that work on any stream (and other processes) sees the bytes.
  return cuda_check(cudaStreamSynchronize(cudaStreamLegacy), context + ": cudaStreamSynchronize");
}

}  // namespace

StatusOr<int> cuda_device_count() {
  int n = 0;
  RETURN_IF_ERROR(cuda_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount"));
  if (n <= 0) return FailedPrecondition("cudaGetDeviceCount: 0 CUDA devices are visible");
  return n;
}

StatusOr<std::string> cuda_device_uuid(int device) {
  cudaDeviceProp props{};
  RETURN_IF_ERROR(cuda_check(cudaGetDeviceProperties(&props, device),
                             "cudaGetDeviceProperties of device " + std::to_string(device)));
  const auto* b = reinterpret_cast<const unsigned char*>(props.uuid.bytes);
  char text[64];
  std::snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return std::string(text);
}

namespace {

// What cudaMalloc is asked for: a buffer of 2 MiB or more is rounded up to
// a multiple of 2 MiB. Another process that maps an allocation over CUDA IPC
// (cudaIpcOpenMemHandle) reaches it at ~1.57 TB/s instead of ~2.14 TB/s on an
// H200 when its size is not such a multiple (16,061,054,976 bytes: 1.57; 16
// GiB + 1 MiB: 2.00; 16 GiB: 2.14; bench/ipc_write_bench.cu, docs/PERF.md);
// the allocating process itself is not affected.
std::uint64_t allocation_bytes(std::uint64_t bytes) {
  constexpr std::uint64_t kLargePage = 2ull << 20;
  return bytes < kLargePage ? bytes : (bytes + kLargePage - 1) / kLargePage * kLargePage;
}

}  // namespace

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int device, std::uint64_t bytes) {
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("DeviceBuffer::Allocate(" + bytes_text(bytes) + ")"));
  if (bytes == 0) return DeviceBuffer(device, nullptr, 0);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, allocation_bytes(bytes));
  if (err != cudaSuccess) {
    std::string what = "cudaMalloc of " + bytes_text(bytes) + " on device " + std::to_string(device);
    (void)cudaGetLastError();  // clear the (non-sticky) allocation error
    std::size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      what += " (free " + bytes_text(free_b) + " of " + bytes_text(total_b) + ")";
    }
    return cuda_check(err, what);
  }
  return DeviceBuffer(device, static_cast<std::byte*>(p), bytes);
}

void DeviceBuffer::reset() {
  if (data_ != nullptr) {
    ScopedDevice scope(device_);
    report_teardown_error(cudaFree(data_), "cudaFree", device_);
  }
  data_ = nullptr;
  size_ = 0;
  device_ = -1;
}

StatusOr<PinnedBuffer> PinnedBuffer::Allocate(std::uint64_t bytes) {
  if (bytes == 0) return PinnedBuffer(nullptr, 0);
  void* p = nullptr;
  RETURN_IF_ERROR(cuda_check(cudaMallocHost(&p, bytes), "cudaMallocHost of " + bytes_text(bytes)));
  return PinnedBuffer(static_cast<std::byte*>(p), bytes);
}

void PinnedBuffer::reset() {
  if (data_ != nullptr) report_teardown_error(cudaFreeHost(data_), "cudaFreeHost", -1);
  data_ = nullptr;
  size_ = 0;
}

StatusOr<CudaStream> CudaStream::Create(int device) {
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("CudaStream::Create"));
  cudaStream_t s = nullptr;
  RETURN_IF_ERROR(cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags on device " + std::to_string(device)));
  return CudaStream(device, s);
}

void CudaStream::reset() {
  if (stream_ != nullptr) {
    ScopedDevice scope(device_);
    report_teardown_error(cudaStreamDestroy(static_cast<cudaStream_t>(stream_)), "cudaStreamDestroy", device_);
  }
  stream_ = nullptr;
  device_ = -1;
}

Status CudaStream::synchronize() const {
  if (stream_ == nullptr) return FailedPrecondition("CudaStream::synchronize on an empty stream");
  return cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                    "cudaStreamSynchronize on device " + std::to_string(device_));
}

StatusOr<CudaEvent> CudaEvent::Create(int device, bool timing, bool interprocess) {
  if (timing && interprocess) return InvalidArgument("CudaEvent::Create: an interprocess event cannot time");
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("CudaEvent::Create"));
  unsigned flags = timing ? cudaEventDefault : cudaEventDisableTiming;
  if (interprocess) flags |= cudaEventInterprocess;
  cudaEvent_t e = nullptr;
  RETURN_IF_ERROR(
      cuda_check(cudaEventCreateWithFlags(&e, flags), "cudaEventCreateWithFlags on device " + std::to_string(device)));
  return CudaEvent(device, e);
}

void CudaEvent::reset() {
  if (event_ != nullptr) {
    ScopedDevice scope(device_);
    report_teardown_error(cudaEventDestroy(static_cast<cudaEvent_t>(event_)), "cudaEventDestroy", device_);
  }
  event_ = nullptr;
  device_ = -1;
}

Status CudaEvent::record(void* stream) {
  if (event_ == nullptr) return FailedPrecondition("CudaEvent::record on an empty event");
  ScopedDevice scope(device_);
  RETURN_IF_ERROR(scope.status());
  return cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)),
                    "cudaEventRecord on device " + std::to_string(device_));
}

Status CudaEvent::wait(void* stream) const {
  if (event_ == nullptr) return FailedPrecondition("CudaEvent::wait on an empty event");
  return cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event_), 0),
                    "cudaStreamWaitEvent (event of device " + std::to_string(device_) + ")");
}

Status CudaEvent::synchronize() const {
  if (event_ == nullptr) return FailedPrecondition("CudaEvent::synchronize on an empty event");
  return cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)),
                    "cudaEventSynchronize on device " + std::to_string(device_));
}

StatusOr<bool> CudaEvent::query() const {
  if (event_ == nullptr) return FailedPrecondition("CudaEvent::query on an empty event");
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // cudaErrorNotReady is not an error; don't leave it behind
    return false;
  }
  RETURN_IF_ERROR(cuda_check(err, "cudaEventQuery on device " + std::to_string(device_)));
  return true;
}

static_assert(sizeof(cudaIpcEventHandle_t) == CudaEvent::kIpcHandleBytes, "cudaIpcEventHandle_t changed size");

StatusOr<std::array<unsigned char, CudaEvent::kIpcHandleBytes>> CudaEvent::ipc_handle() const {
  if (event_ == nullptr) return FailedPrecondition("CudaEvent::ipc_handle of an empty event");
  ScopedDevice scope(device_);
  RETURN_IF_ERROR(scope.status().WithContext("CudaEvent::ipc_handle"));
  cudaIpcEventHandle_t h{};
  RETURN_IF_ERROR(cuda_check(cudaIpcGetEventHandle(&h, static_cast<cudaEvent_t>(event_)),
                             "cudaIpcGetEventHandle on device " + std::to_string(device_) +
                                 " (the event must be created interprocess)"));
  std::array<unsigned char, kIpcHandleBytes> out{};
  std::memcpy(out.data(), &h, kIpcHandleBytes);
  return out;
}

StatusOr<CudaEvent> CudaEvent::OpenIpc(int device, const std::array<unsigned char, kIpcHandleBytes>& handle) {
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("CudaEvent::OpenIpc"));
  cudaIpcEventHandle_t h{};
  std::memcpy(&h, handle.data(), kIpcHandleBytes);
  cudaEvent_t e = nullptr;
  RETURN_IF_ERROR(cuda_check(cudaIpcOpenEventHandle(&e, h),
                             "cudaIpcOpenEventHandle on device " + std::to_string(device) +
                                 " (the exporting process must be alive on this host, and not this process)"));
  return CudaEvent(device, e);
}

StatusOr<float> CudaEvent::elapsed_ms_since(const CudaEvent& start) const {
  if (event_ == nullptr || start.event_ == nullptr) return FailedPrecondition("CudaEvent::elapsed_ms_since: empty event");
  float ms = 0;
  RETURN_IF_ERROR(cuda_check(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_), static_cast<cudaEvent_t>(event_)),
      "cudaEventElapsedTime on device " + std::to_string(device_)));
  return ms;
}

Status copy_device_to_host(std::span<std::byte> dst, const std::byte* device_src) {
  return sync_copy(dst.data(), device_src, dst.size(), "copy_device_to_host");
}

Status copy_host_to_device(std::byte* device_dst, std::span<const std::byte> src) {
  return sync_copy(device_dst, src.data(), src.size(), "copy_host_to_device");
}

Status copy_device_to_device(std::byte* device_dst, const std::byte* device_src, std::uint64_t bytes) {
  return sync_copy(device_dst, device_src, bytes, "copy_device_to_device");
}

StatusOr<HostRegistration> HostRegistration::Register(const void* data, std::uint64_t bytes) {
  if (data == nullptr || bytes == 0) return InvalidArgument("HostRegistration: empty range");
  RETURN_IF_ERROR(cuda_check(cudaHostRegister(const_cast<void*>(data), bytes,
                                              cudaHostRegisterPortable | cudaHostRegisterMapped |
                                                  cudaHostRegisterReadOnly),
                             "cudaHostRegister of " + bytes_text(bytes) + " of host memory"));
  return HostRegistration(data);
}

void HostRegistration::reset() {
  if (data_ != nullptr) (void)cudaHostUnregister(const_cast<void*>(data_));
  data_ = nullptr;
}

Status copy_async(std::byte* dst, const std::byte* src, std::uint64_t bytes, void* stream) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr || src == nullptr) return InvalidArgument("copy_async: null pointer");
  return cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
                    "cudaMemcpyAsync of " + bytes_text(bytes));
}

Status device_memset(std::byte* device_dst, int value, std::uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (device_dst == nullptr) return InvalidArgument("device_memset: null pointer");
  ASSIGN_OR_RETURN(const int device, device_of(device_dst, "device_memset"));
  if (device < 0) return InvalidArgument("device_memset: the pointer is not device memory");
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status());
  RETURN_IF_ERROR(cuda_check(cudaMemset(device_dst, value, bytes),
                             "cudaMemset of " + bytes_text(bytes) + " on device " + std::to_string(device)));
  // cudaMemset may return before the fill lands (device memory, legacy stream).
  return cuda_check(cudaStreamSynchronize(cudaStreamLegacy),
                    "device_memset: cudaStreamSynchronize on device " + std::to_string(device));
}

namespace {
// Errors after which the context is unusable (CUDA's "sticky" errors).
bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}
}  // namespace

StatusOr<std::uint64_t> device_free_bytes(int device) {
  ScopedDevice scope(device);
  RETURN_IF_ERROR(scope.status().WithContext("device_free_bytes"));
  std::size_t free_b = 0, total_b = 0;
  RETURN_IF_ERROR(cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo on device " + std::to_string(device)));
  return static_cast<std::uint64_t>(free_b);
}

Status cuda_context_health(int device) {
  // A sticky error is returned by every call, whichever is asked first: the
  // device switch, or the query of the default stream (which reports the
  // error of any work, not only its own).
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamQuery(nullptr);
  if (!is_sticky(e)) {
    (void)cudaGetLastError();  // a non-sticky error (or cudaErrorNotReady) is not this function's to report
    return Status::Ok();
  }
  return Aborted(std::string("the CUDA context on device ") + std::to_string(device) + " is broken by " +
                 cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                 "): a sticky error, every later CUDA call in this process fails; restart the process");
}

#else  // !REFIT_HAVE_CUDA

// ---------------------------------------------------------------- stubs

namespace {
Status no_cuda(std::string_view what) {
  return FailedPrecondition(std::string(what) + ": refit was built without CUDA");
}
}  // namespace

StatusOr<int> cuda_device_count() { return no_cuda("cuda_device_count"); }
StatusOr<std::string> cuda_device_uuid(int) { return no_cuda("cuda_device_uuid"); }
StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int, std::uint64_t) { return no_cuda("DeviceBuffer::Allocate"); }
void DeviceBuffer::reset() {}
StatusOr<PinnedBuffer> PinnedBuffer::Allocate(std::uint64_t) { return no_cuda("PinnedBuffer::Allocate"); }
void PinnedBuffer::reset() {}
StatusOr<CudaStream> CudaStream::Create(int) { return no_cuda("CudaStream::Create"); }
void CudaStream::reset() {}
Status CudaStream::synchronize() const { return no_cuda("CudaStream::synchronize"); }
StatusOr<CudaEvent> CudaEvent::Create(int, bool, bool) { return no_cuda("CudaEvent::Create"); }
void CudaEvent::reset() {}
Status CudaEvent::record(void*) { return no_cuda("CudaEvent::record"); }
Status CudaEvent::wait(void*) const { return no_cuda("CudaEvent::wait"); }
Status CudaEvent::synchronize() const { return no_cuda("CudaEvent::synchronize"); }
StatusOr<bool> CudaEvent::query() const { return no_cuda("CudaEvent::query"); }
StatusOr<float> CudaEvent::elapsed_ms_since(const CudaEvent&) const { return no_cuda("CudaEvent::elapsed_ms_since"); }
StatusOr<std::array<unsigned char, CudaEvent::kIpcHandleBytes>> CudaEvent::ipc_handle() const {
  return no_cuda("CudaEvent::ipc_handle");
}
StatusOr<CudaEvent> CudaEvent::OpenIpc(int, const std::array<unsigned char, kIpcHandleBytes>&) {
  return no_cuda("CudaEvent::OpenIpc");
}
Status copy_device_to_host(std::span<std::byte>, const std::byte*) { return no_cuda("copy_device_to_host"); }
Status copy_host_to_device(std::byte*, std::span<const std::byte>) { return no_cuda("copy_host_to_device"); }
Status copy_device_to_device(std::byte*, const std::byte*, std::uint64_t) { return no_cuda("copy_device_to_device"); }
Status device_memset(std::byte*, int, std::uint64_t) { return no_cuda("device_memset"); }
Status copy_async(std::byte*, const std::byte*, std::uint64_t, void*) { return no_cuda("copy_async"); }
StatusOr<std::uint64_t> device_free_bytes(int) { return no_cuda("device_free_bytes"); }
Status cuda_context_health(int) { return Status::Ok(); }  // no CUDA context to break
StatusOr<HostRegistration> HostRegistration::Register(const void*, std::uint64_t) {
  return no_cuda("HostRegistration::Register");
}
void HostRegistration::reset() { data_ = nullptr; }

#endif  // REFIT_HAVE_CUDA

// ---------------------------------------------------------------- RAII plumbing (both builds)

HostRegistration::~HostRegistration() { reset(); }
HostRegistration::HostRegistration(HostRegistration&& other) noexcept : data_(other.data_) { other.data_ = nullptr; }
HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    other.data_ = nullptr;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : device_(std::exchange(o.device_, -1)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = std::exchange(o.device_, -1);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() { reset(); }
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

CudaStream::~CudaStream() { reset(); }
CudaStream::CudaStream(CudaStream&& o) noexcept
    : device_(std::exchange(o.device_, -1)), stream_(std::exchange(o.stream_, nullptr)) {}
CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = std::exchange(o.device_, -1);
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}

CudaEvent::~CudaEvent() { reset(); }
CudaEvent::CudaEvent(CudaEvent&& o) noexcept
    : device_(std::exchange(o.device_, -1)), event_(std::exchange(o.event_, nullptr)) {}
CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = std::exchange(o.device_, -1);
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}

}  // namespace refit
