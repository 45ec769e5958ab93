// A refit JSON report (the coordinator's, the demo's): its human-readable
// table, and its outcome as a Status.
#pragma once

#include <cstdio>

#include <nlohmann/json.hpp>

#include "refit/status.h"

namespace refit::cli {

// Prints nothing for a report whose job failed before its first refit; a
// failed job's table ends with "FAILED after N refits" and leaves its error
// to stderr, where the command prints it once, last.
void print_report_table(const nlohmann::json& report, std::FILE* out);

// OK when the report has no "error"; else that error as a Status. The
// library writes it as Status::ToString() ("aborted: ..."), whose code is
// kept; an error without a known code prefix (the demo's own, e.g.
// "processes failed: ...") becomes kAborted: the job failed as a whole.
Status report_status(const nlohmann::json& report);

}  // namespace refit::cli
