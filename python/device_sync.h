// Waits for every stream of a CUDA device: what the binding does where work
// the caller queued with its own framework (torch, cupy) must be finished
// before refit touches the same memory, or after the caller's load_fn read a
// staging slot that refit is about to recycle.
#pragma once

#include "refit/status.h"

namespace refit::python {

// cudaDeviceSynchronize on local device `device`, restoring the caller's
// current device. Without CUDA: kFailedPrecondition.
Status synchronize_device(int device);

}  // namespace refit::python
