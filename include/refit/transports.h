// The transports this build has, by the names --transport takes, and which
// of them can run on this machine.
#pragma once

#include <string>
#include <vector>

#include "refit/status.h"

namespace refit {

// Names of the transports built into this binary ("shm", "tcp", ...).
std::vector<std::string> transport_names();

// Whether one transport can run here, and if not why.
struct TransportAvailability {
  std::string name;        // as --transport takes it
  bool available = false;  // built into this binary, and what it needs is present
  // Why it cannot run (empty when available): "built without NCCL",
  // "no CUDA device (cudaGetDeviceCount: ...)".
  std::string reason;
};

// Every transport refit knows (shm, tcp, cuda_ipc, ucx, nccl), built in or
// not, in that order. cuda_ipc and nccl need a CUDA device: this asks the
// CUDA runtime once (require_cuda_device), so it may take a moment on the
// first call of a process. Thread safety: may be called from any thread.
std::vector<TransportAvailability> transport_availability();

// The same from given facts: `built`, the names built in (transport_names());
// `cuda_device`, OK when this process has a CUDA device, else why not (its
// message becomes the reason of the transports that need one). Pure.
std::vector<TransportAvailability> transport_availability(const std::vector<std::string>& built,
                                                          const Status& cuda_device);

}  // namespace refit
