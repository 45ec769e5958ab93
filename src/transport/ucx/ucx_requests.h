// Helpers the ucx target, remote and transport share: what a UCP request
// pointer says, its release, and a bounded wait for it. Private to
// src/transport/ucx; built only with UCX (REFIT_HAVE_UCX).
#pragma once

#if REFIT_HAVE_UCX

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>

#include "transport/ucx/ucx_worker.h"

namespace refit {

// How long a destructor waits for UCX to finish a flush or an endpoint close.
inline constexpr std::chrono::seconds kUcxTeardownWait{5};

// True when this UCX build registers and moves CUDA memory itself.
inline bool ucx_native_cuda(const UcxWorker& w) {
  return (w.memory_types() & (std::uint64_t{1} << static_cast<unsigned>(UCS_MEMORY_TYPE_CUDA))) != 0;
}

// Status of a request pointer returned by a UCP *_nbx call, without waiting:
// UCS_OK, UCS_INPROGRESS, or the error. REQUIRES: the worker's mutex is held.
inline ucs_status_t ucx_request_status(void* request) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  return ucp_request_check_status(request);
}

inline void ucx_release_request(void* request) {
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) ucp_request_free(request);
}

// Progresses `worker` until `request` completed or `wait` passed; returns its
// status (UCS_INPROGRESS when it did not finish) and releases it when done.
// REQUIRES: the worker's mutex is held by the caller (`lock`).
inline ucs_status_t ucx_wait_request(UcxWorker& worker, void* request, std::chrono::milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  ucs_status_t s = ucx_request_status(request);
  while (s == UCS_INPROGRESS && std::chrono::steady_clock::now() < until) {
    ucp_worker_progress(worker.worker());
    s = ucx_request_status(request);
  }
  if (s != UCS_INPROGRESS) ucx_release_request(request);
  return s;
}

}  // namespace refit

#endif  // REFIT_HAVE_UCX
