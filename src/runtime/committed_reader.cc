// The reference engine's committed-bytes reader (committed_reader.h).
#include "runtime/committed_reader.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "cuda/batched_copy.h"
#include "cuda/device.h"

namespace refit {
namespace {

// The device path's copier and stream, made at the first read (a job that
// never reads makes none); one call at a time.
struct DeviceCopy {
  std::mutex mu;
  std::optional<BatchedCopier> copier;
  CudaStream stream;
  std::vector<CopyRun> runs;
};

}  // namespace

ReadCommitted make_committed_reader(const ReferenceEngine* engine, int rank, const std::vector<TensorSpec>* stream,
                                    int device) {
  auto copy = std::make_shared<DeviceCopy>();
  return [engine, rank, stream, device, copy](std::span<const CommittedRead> reads) -> Status {
    std::unique_lock<std::mutex> lock(copy->mu);
    copy->runs.clear();
    for (const CommittedRead& r : reads) {
      if (r.out.empty()) continue;
      const TensorSpec* spec = r.tensor < stream->size() ? &(*stream)[r.tensor] : nullptr;
      const std::byte* served = spec != nullptr ? engine->weight(rank, spec->name) : nullptr;
      if (served == nullptr || r.offset + r.out.size() > spec->nbytes()) {
        return Internal("no committed bytes [" + std::to_string(r.offset) + ", +" + std::to_string(r.out.size()) +
                        ") of " + (spec != nullptr ? spec->name : "tensor " + std::to_string(r.tensor)));
      }
      if (device < 0) {
        std::memcpy(r.out.data(), served + r.offset, r.out.size());
      } else {
        copy->runs.push_back(copy_run_1d(served + r.offset, r.out.data(), r.out.size()));
      }
    }
    if (copy->runs.empty()) return Status::Ok();
    if (!copy->copier) {
      ASSIGN_OR_RETURN(CudaStream s, CudaStream::Create(device));
      ASSIGN_OR_RETURN(BatchedCopier c, BatchedCopier::Create(device));
      copy->stream = std::move(s);
      copy->copier = std::move(c);
    }
    RETURN_IF_ERROR(copy->copier->copy(copy->runs, copy->stream.handle())
                        .WithContext("reading " + std::to_string(copy->runs.size()) + " committed ranges"));
    return copy->stream.synchronize().WithContext("reading " + std::to_string(copy->runs.size()) +
                                                  " committed ranges");
  };
}

}  // namespace refit
