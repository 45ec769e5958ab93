// The tests' per-bucket fault injections: see bucket_faults.h.
#include "runtime/bucket_faults.h"

#include <signal.h>

#include <atomic>

#include "refit/log.h"

namespace refit {

StatusOr<bool> before_bucket_faults(const RankOptions& options, std::uint64_t version, CudaStream* stream) {
  const bool die = version == options.debug_die_after_announce && stream != nullptr;
  if (die) RETURN_IF_ERROR(inject_gpu_delay(stream->device(), stream->handle(), 30000));
  return die;
}

Status after_bucket_faults(const RankOptions& options, const std::string& name, std::uint64_t version,
                           const std::string& what, bool die, bool stop_here, CudaStream* stream) {
  if (die) {
    log(LogLevel::kInfo, name, what + " sent behind a 30 s GPU delay; dying by SIGKILL (--debug-die-after-announce)");
    ::raise(SIGKILL);
  }
  static std::atomic<bool> stopped{false};  // once per process: a refit run again goes on
  if (version == options.debug_stop_after_bucket && stop_here && !stopped.exchange(true)) {
    log(LogLevel::kWarning, name, "stopping by SIGSTOP after sending " + what + " (--debug-stop-after-bucket)");
    ::raise(SIGSTOP);
  }
  if (version == options.debug_fail_refit) {
    return Internal(name + ": injected fault in refit " + std::to_string(version) + " (--debug-fail-refit)");
  }
  if (version == options.debug_cuda_fault_refit && stream != nullptr) {
    RETURN_IF_ERROR(inject_illegal_address(stream->device(), stream->handle()));
    RETURN_IF_ERROR(
        stream->synchronize().WithContext(name + ", refit " + std::to_string(version) + " (--debug-cuda-fault-refit)"));
  }
  return Status::Ok();
}

}  // namespace refit
