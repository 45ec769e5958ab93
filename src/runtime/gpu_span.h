// GpuSpan: a trainer rank's refit as its GPU saw it, from 'go' reaching the
// sender's copy stream to the end of its last copy (device weights only;
// close to the send time when the copies, not the host, set the pace): two
// timing events on that stream, read after "sent", outside the timing.
//
// Thread safety: one thread (the trainer rank's refit thread).
#pragma once

#include <utility>

#include "control/control_message.h"
#include "cuda/device.h"
#include "refit/status.h"

namespace refit {

class GpuSpan {
 public:
  static StatusOr<GpuSpan> Create(int device) {
    ASSIGN_OR_RETURN(CudaEvent first, CudaEvent::Create(device, /*timing=*/true));
    ASSIGN_OR_RETURN(CudaEvent second, CudaEvent::Create(device, /*timing=*/true));
    return GpuSpan(std::move(first), std::move(second));
  }
  Status begin(CudaStream& stream) { return first_.record(stream.handle()); }
  Status end(CudaStream& stream) { return second_.record(stream.handle()); }
  // Adds `gpu_span_ms` to a rank's done stats; waits for the end event.
  Status add_to(Json& stats) {
    RETURN_IF_ERROR(second_.synchronize());
    ASSIGN_OR_RETURN(float ms, second_.elapsed_ms_since(first_));
    stats["gpu_span_ms"] = ms;
    return Status::Ok();
  }

 private:
  GpuSpan(CudaEvent first, CudaEvent second) : first_(std::move(first)), second_(std::move(second)) {}
  CudaEvent first_, second_;
};

}  // namespace refit
