// The coordinator's job as the report document (refit/coordinator.h wraps
// it in a JobReport): coordinator.cc runs it, job_report.cc reads it.
#pragma once

#include <functional>

#include "control/control_message.h"
#include "refit/coordinator.h"

namespace refit {

Json coordinate_job(const CoordinatorOptions& options, const std::function<void(int port)>& on_listening);

// The report's "error" ("code: message" text) as a Status; OK without one.
Status report_error_status(const Json& report);

}  // namespace refit
