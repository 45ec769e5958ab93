// CUDA devices, memory, streams and events, behind refit's Status convention.
//
// This header never includes the CUDA headers: streams are passed as `void*`
// (a cudaStream_t; nullptr is the legacy default stream) so that code built
// without CUDA compiles against the same API. When refit is built without CUDA
// (REFIT_HAVE_CUDA == 0) every function that needs a GPU returns
// kFailedPrecondition "refit was built without CUDA"; the pure functions
// (engine_local_device, parse_visible_devices) work in both builds.
//
// Device numbers are always LOCAL indices: index i is the i-th entry of
// CUDA_VISIBLE_DEVICES (or the i-th GPU when it is unset), the number the CUDA
// runtime takes. The library never reads the environment; the CLI or binding
// reads it once and passes values in (DESIGN rule 7).
//
// Thread safety: the free functions may be called from any thread. Each RAII
// object is used by one thread at a time; distinct objects are independent.
// Functions that take a device make it current for the call and restore the
// caller's current device before returning.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "refit/device_memory.h"
#include "refit/status.h"

namespace refit {


// Device memory: cudaMalloc on one device, freed (with that device current) in
// the destructor. Move-only. A default-constructed buffer is empty.
class DeviceBuffer {
 public:
  // Errors name the device, the bytes and the CUDA error text; running out of
  // memory is kResourceExhausted. Zero bytes gives an empty buffer (data()
  // null) on that device.
  static StatusOr<DeviceBuffer> Allocate(int device, std::uint64_t bytes);

  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::byte* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  int device() const { return device_; }  // -1 when empty

 private:
  DeviceBuffer(int device, std::byte* data, std::uint64_t size) : device_(device), data_(data), size_(size) {}
  void reset();

  int device_ = -1;
  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// Page-locked host memory (cudaMallocHost), usable by every device for
// asynchronous copies. Move-only.
class PinnedBuffer {
 public:
  static StatusOr<PinnedBuffer> Allocate(std::uint64_t bytes);

  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  std::byte* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, static_cast<std::size_t>(size_)}; }

 private:
  PinnedBuffer(std::byte* data, std::uint64_t size) : data_(data), size_(size) {}
  void reset();

  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// A stream created non-blocking (it does not synchronize with the legacy
// default stream) on one device. Destroyed with that device current; work
// still queued completes (cudaStreamDestroy semantics). Move-only.
class CudaStream {
 public:
  static StatusOr<CudaStream> Create(int device);

  CudaStream() = default;
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  void* handle() const { return stream_; }  // a cudaStream_t
  int device() const { return device_; }
  // Blocks until all work queued so far on the stream has finished; returns
  // the first asynchronous error (e.g. a faulting kernel) with context.
  Status synchronize() const;

 private:
  CudaStream(int device, void* stream) : device_(device), stream_(stream) {}
  void reset();

  int device_ = -1;
  void* stream_ = nullptr;
};

// An event on one device. Created with cudaEventDisableTiming unless `timing`
// (timing events cost more to record). `interprocess` events can be exported
// with cudaIpcGetEventHandle (they must not time). Move-only.
class CudaEvent {
 public:
  static StatusOr<CudaEvent> Create(int device, bool timing = false, bool interprocess = false);

  CudaEvent() = default;
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void* handle() const { return event_; }  // a cudaEvent_t
  int device() const { return device_; }

  // Captures the work queued on `stream` so far (a stream of this device).
  Status record(void* stream);
  // Makes future work on `stream` wait for the last record() (no host wait).
  Status wait(void* stream) const;
  // Blocks until the work captured by the last record() has finished.
  Status synchronize() const;
  // True when that work has finished (true when never recorded).
  StatusOr<bool> query() const;
  // Milliseconds from `start` to this event; both timing events, both done.
  StatusOr<float> elapsed_ms_since(const CudaEvent& start) const;

  // An interprocess event's handle (cudaIpcGetEventHandle: 64 bytes), for
  // another process to open with OpenIpc. Recording it in either process and
  // querying it in the other orders work across processes on one GPU.
  static constexpr std::size_t kIpcHandleBytes = 64;
  StatusOr<std::array<unsigned char, kIpcHandleBytes>> ipc_handle() const;
  // The event behind `handle`, exported by another process, opened on
  // `device` (cudaIpcOpenEventHandle; destroyed like any event).
  static StatusOr<CudaEvent> OpenIpc(int device, const std::array<unsigned char, kIpcHandleBytes>& handle);

 private:
  CudaEvent(int device, void* event) : device_(device), event_(event) {}
  void reset();

  int device_ = -1;
  void* event_ = nullptr;
};

// Existing host memory [data, data + bytes) page-locked and mapped for the
// device (cudaHostRegister: portable, mapped, and read-only so that read-only
// file mappings qualify), until destroyed: kernels and copies on any device
// then read it at link speed by the same pointer (unified addressing).
// Registration faults in and pins every page, once. Move-only.
class HostRegistration {
 public:
  static StatusOr<HostRegistration> Register(const void* data, std::uint64_t bytes);

  HostRegistration() = default;
  ~HostRegistration();
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

 private:
  explicit HostRegistration(const void* data) : data_(data) {}
  void reset();
  const void* data_ = nullptr;
};


// OK when this process can use a CUDA device: refit was built with CUDA
// and the runtime sees at least one device. Otherwise kFailedPrecondition
// "no CUDA device (<why>)", where why is the CUDA error text (a missing or
// too old driver, no device visible) or "refit was built without CUDA".
// Every run given --device cuda checks it among its settings
// (validate_rank_settings in refit/roles.h; the demo and bench through it),
// before it allocates or measures anything.
Status require_cuda_device();

// The bytes free on `device` as the driver reports them (cudaMemGetInfo):
// what a release returned to the device shows as their growth.
StatusOr<std::uint64_t> device_free_bytes(int device);

// OK while `device`'s CUDA context in this process still works. After a
// sticky error (an illegal address, a failed launch, a hardware exception,
// an uncorrectable ECC error) every later CUDA call of the process fails the
// same way, so no refit can succeed until the process restarts: kAborted,
// naming the error, the device and that the process must restart. Other
// errors (out of memory, invalid arguments) leave the context usable: OK.
// Cheap (one query of the legacy default stream); call it after a failure.
Status cuda_context_health(int device);

// Fault injection for tests (`--debug-cuda-fault-refit`): launches a kernel
// on `stream` that writes to an unmapped device address, which breaks this
// process's context on `device` with a sticky cudaErrorIllegalAddress.
Status inject_illegal_address(int device, void* stream);

// Fault injection for tests (`--debug-die-after-announce`): enqueues on
// `stream` a kernel that spins for `ms` milliseconds, so that what is queued
// after it (a pack, the slot's landing event) is still pending long after
// the host has moved on.
Status inject_gpu_delay(int device, void* stream, std::uint32_t ms);

// Enqueues a copy of `bytes` bytes on `stream` (a cudaStream_t) and returns at
// once; unified addressing decides the direction. For host-to-device copies
// at link speed the host side must be pinned (PinnedBuffer); the bytes land
// when the stream reaches the copy, and `src` must stay valid until then.
Status copy_async(std::byte* dst, const std::byte* src, std::uint64_t bytes, void* stream);

}  // namespace refit
