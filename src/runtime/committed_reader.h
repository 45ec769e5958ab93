// The reference engine's EngineBinding::read_committed (refit/
// committed_read.h): the served bytes of one rank's stream tensors, read
// into host memory from host weights, or into device memory from device
// weights as ONE batched copy per call (cuda/batched_copy.h) on a stream of
// its own, waited for before it returns: a bucket's thousands of entries
// (a MoE model's) cost one launch and one wait, not one synchronous copy
// each. Used by delta refits (the receiver decodes over the bytes) and by a
// relay parent sending a joining engine the committed version.
#pragma once

#include <vector>

#include "refit/committed_read.h"
#include "refit/reference_engine.h"
#include "refit/tensor.h"

namespace refit {

// Reads rank `rank` of `engine`, whose stream is `stream` (both outlive the
// function); `device` is the weights' local CUDA index, -1 for host weights.
// Errors name the tensor and the range.
ReadCommitted make_committed_reader(const ReferenceEngine* engine, int rank, const std::vector<TensorSpec>* stream,
                                    int device);

}  // namespace refit
