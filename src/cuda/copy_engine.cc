// Copies by the copy engines (include/refit/copy_engine.h).
#include "cuda/copy_engine.h"

#include <string>

#if REFIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#endif

namespace refit {

CopyEngineRuns group_for_copy_engine(std::span<const CopyRun> runs) {
  CopyEngineRuns out;
  for (const CopyRun& r : runs) {
    if (r.rows == 0 || r.row_bytes == 0) continue;
    const bool contiguous = r.rows == 1 || (r.src_pitch == r.row_bytes && r.dst_pitch == r.row_bytes);
    if (!contiguous) {
      out.pitched.push_back(r);
      continue;
    }
    const std::uint64_t bytes = r.row_bytes * r.rows;
    if (!out.flat.empty()) {
      CopyRun& last = out.flat.back();
      if (last.src + last.row_bytes == r.src && last.dst + last.row_bytes == r.dst) {
        last.row_bytes += bytes;
        last.src_pitch = last.dst_pitch = last.row_bytes;
        continue;
      }
    }
    out.flat.push_back(copy_run_1d(r.src, r.dst, bytes));
  }
  return out;
}

#if REFIT_HAVE_CUDA

Status copy_runs_with_copy_engine(std::span<const CopyRun> runs, void* stream) {
  const CopyEngineRuns grouped = group_for_copy_engine(runs);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (!grouped.flat.empty()) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<std::size_t> sizes;
    std::uint64_t total = 0;
    for (const CopyRun& r : grouped.flat) {
      dsts.push_back(r.dst);
      srcs.push_back(r.src);
      sizes.push_back(r.row_bytes);
      total += r.row_bytes;
    }
    // One attribute for every copy: sources are read in stream order (the
    // caller's earlier work on the stream is respected).
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    std::size_t attribute_index = 0;
    RETURN_IF_ERROR(cuda_check(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), sizes.size(), &attributes,
                                                    &attribute_index, 1, s),
                               "cudaMemcpyBatchAsync of " + std::to_string(sizes.size()) + " copies, " +
                                   std::to_string(total) + " bytes"));
  }
  for (const CopyRun& r : grouped.pitched) {
    RETURN_IF_ERROR(cuda_check(cudaMemcpy2DAsync(r.dst, r.dst_pitch, r.src, r.src_pitch, r.row_bytes, r.rows,
                                                 cudaMemcpyDefault, s),
                               "cudaMemcpy2DAsync of " + std::to_string(r.rows) + " rows of " +
                                   std::to_string(r.row_bytes) + " bytes"));
  }
  return Status::Ok();
}

#else  // !REFIT_HAVE_CUDA

Status copy_runs_with_copy_engine(std::span<const CopyRun>, void*) {
  return FailedPrecondition("copy_runs_with_copy_engine: refit was built without CUDA");
}

#endif

}  // namespace refit
