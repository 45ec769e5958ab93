// UcxDeviceStager: how active-message writes land in device memory that this
// UCX build cannot register (Debian's UCX has no CUDA support). Private to
// src/transport/ucx; built only with UCX (REFIT_HAVE_UCX).
//
// The engine's progress thread receives each write chunk in UCX's host
// receive buffer; the stager copies it into one of kRing pinned buffers and
// enqueues a host-to-device copy of that buffer into the target address on
// its own stream, so the copy of chunk k overlaps the arrival of chunk k+1.
// A buffer is reused once its previous copy finished (an event per buffer).
// finish() waits for every copy enqueued so far: the write's last chunk is
// acknowledged only after it, so the initiator's poll (and the kLanded it
// sends next) never overtakes the bytes on the device.
//
// Thread safety: one thread at a time (the worker's mutex: the handlers run
// inside ucp_worker_progress with it held).
#pragma once

#if REFIT_HAVE_UCX

#include <cstdint>
#include <memory>

#include "cuda/device.h"
#include "refit/status.h"

namespace refit {

class UcxDeviceStager {
 public:
  static constexpr int kRing = 8;
  // Pinned buffers of `chunk_bytes` each and a stream on local CUDA index
  // `device`.
  static StatusOr<std::unique_ptr<UcxDeviceStager>> Create(int device, std::uint64_t chunk_bytes);

  // Enqueues the copy of [data, data + bytes) to device address `dst`.
  // REQUIRES: bytes <= chunk_bytes.
  Status write(std::byte* dst, const void* data, std::uint64_t bytes);
  // Waits until every enqueued copy finished.
  Status finish();

  // Bytes staged so far (tests).
  std::uint64_t staged_bytes() const { return staged_bytes_; }

 private:
  UcxDeviceStager() = default;
  int device_ = -1;
  std::uint64_t chunk_bytes_ = 0;
  CudaStream stream_;
  PinnedBuffer buffers_[kRing];
  CudaEvent done_[kRing];
  bool used_[kRing] = {};
  int next_ = 0;
  std::uint64_t staged_bytes_ = 0;
};

}  // namespace refit

#endif  // REFIT_HAVE_UCX
