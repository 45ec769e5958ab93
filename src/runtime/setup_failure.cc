#include "runtime/setup_failure.h"

#include <unistd.h>

#include <algorithm>

#include "control/control_client.h"

namespace refit {

void report_setup_failure(const RankOptions& options, Role role, const Status& error, int engine) {
  if (options.coordinator.empty() || error.ok()) return;
  SetupFailed failure;
  failure.role = role;
  failure.rank = options.rank;
  failure.engine = static_cast<std::uint64_t>(std::max(engine, 0));
  failure.pid = ::getpid();
  failure.error = error;
  const double seconds = std::min(options.setup_timeout_s, 3.0);
  ControlClient::ReportSetupFailure(options.coordinator, Secret(options.secret), failure,
                                    Deadline::AfterSeconds(seconds));
}

void report_rank_setup_failure(const RankOptions& options, bool engine, const Status& error, int engine_index) {
  report_setup_failure(options, engine ? Role::kEngine : Role::kTrainer, error, engine_index);
}

}  // namespace refit
