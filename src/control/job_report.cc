// run_coordinator (refit/coordinator.h): the job's report document, and the
// typed fields read from it.
#include <string>

#include "control/coordinate.h"
#include "core/atomic_file.h"

namespace refit {

Status report_error_status(const Json& report) {
  if (!report.contains("error")) return Status::Ok();
  return status_from_text(report["error"].is_string() ? report["error"].get<std::string>() : report["error"].dump());
}

JobReport run_coordinator(const CoordinatorOptions& options, const std::function<void(int port)>& on_listening) {
  const Json report = coordinate_job(options, on_listening);
  JobReport out;
  out.status = report_error_status(report);
  out.verified = report.value("verified", false);
  out.committed_version = report.value("committed_version", std::uint64_t{0});
  out.json = report.dump(2);
  if (!options.report_path.empty()) {
    // Replaces the file the coordinator kept while the job ran.
    Status written = write_file_atomically(options.report_path, out.json + "\n");
    if (!written.ok() && out.status.ok()) out.status = written.WithContext("--report " + options.report_path);
  }
  return out;
}

}  // namespace refit
