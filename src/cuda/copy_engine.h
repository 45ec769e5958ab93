// Copies by the GPU's copy engines (DMA) instead of a kernel: how bytes leave
// registered host memory (a checkpoint's file mapping registered with
// HostRegistration) at the speed of the host-to-device link, with no host
// copy in between.
//
// Why not BatchedCopier: a kernel that reads host memory does so over PCIe,
// one load at a time; the copy engine streams it (55 GB/s on the H200 machine
// from a registered file mapping, the same as from pinned memory:
// bench/host_register_probe.cu, 2026-11-29).
//
// copy_runs_with_copy_engine enqueues every run on `stream` and returns
// without waiting: 1-D runs (and 2-D runs whose rows are back to back in both
// src and dst) are merged where they continue each other and go to the
// driver in one cudaMemcpyBatchAsync call; other 2-D runs are one
// cudaMemcpy2DAsync each. Sources must stay unchanged until the stream has
// passed the copies (record an event after the call). Pointers: anything the
// driver can address under unified addressing (registered or pinned host
// memory, device memory, CUDA IPC mappings).
//
// Thread safety: free functions; the stream's usual rules apply.
#pragma once

#include <span>
#include <vector>

#include "cuda/batched_copy.h"
#include "refit/status.h"

namespace refit {

// The runs as the copy engine gets them: `flat` 1-D copies (adjacent ones
// merged: run k+1 starting where run k ends in both src and dst), `pitched`
// 2-D copies that cannot be flattened. Empty runs are dropped. Pure host code.
struct CopyEngineRuns {
  std::vector<CopyRun> flat;
  std::vector<CopyRun> pitched;
};
CopyEngineRuns group_for_copy_engine(std::span<const CopyRun> runs);

// Enqueues `runs` on `stream` (a cudaStream_t) for the copy engines.
// Errors name the failing call and the number of bytes. Without CUDA:
// kFailedPrecondition.
Status copy_runs_with_copy_engine(std::span<const CopyRun> runs, void* stream);

}  // namespace refit
