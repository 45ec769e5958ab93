// `refit bench`: runs the demo's multi-process refit and, in the same run,
// measures the ceiling it is judged against (refit/ceilings.h: this
// machine's memcpy over the same number of bytes as one refit, or a device
// copy on GPU), then reports each refit's throughput and its ratio to that
// ceiling. OK only when every refit verified.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "demo.h"
#include "flags.h"
#include "refit/ceilings.h"
#include "refit/device_memory.h"
#include "refit/expert_parallel.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "report_table.h"

namespace refit::cli {
namespace {

using Json = nlohmann::json;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The ceiling, measured once the demo's processes have exited: memcpy on
// CPU (the better of two rounds), a device-to-device copy of the same bytes
// on GPU (the one-copy floor). Adds "error" to the report when it cannot be
// measured.
double measure_ceiling(const DemoOptions& o, std::uint64_t bytes, Json& report) {
  if (o.device != "cuda") return std::max(measure_memcpy_gbps(bytes, 5), measure_memcpy_gbps(bytes, 5));
  auto gbps = measure_device_copy_gbps(bytes, 5);
  if (gbps.ok()) return *gbps;
  report["error"] = "measuring the device copy ceiling: " + gbps.status().ToString();
  report["verified"] = false;
  return 0;
}

// The bytes the ceiling copies and each refit's rate is counted over: one
// refit's (bytes_per_refit), or under --quantize the bf16 (or fp32) bytes
// the engines' weights are converted from, so that a quantizing refit is
// judged against the one-copy floor of what it converts (issue 20). With
// --only, a partial refit's bytes (the last refit's: every refit from
// --only-from on moves the same), each refit's rate over its own bytes.
StatusOr<std::uint64_t> ceiling_bytes(const DemoOptions& o, const Json& report) {
  std::uint64_t bytes = report.value("bytes_per_refit", 0ull);
  if (!o.only.empty() && !report.value("refits", Json::array()).empty()) {
    bytes = report["refits"].back().value("bytes", bytes);
  }
  if (bytes == 0) bytes = 64ull << 20;
  if (report.value("quantize", std::string("none")) == "none") return bytes;
  ASSIGN_OR_RETURN(Model model, make_model(o.model, o.layers));
  ASSIGN_OR_RETURN(const EngineExperts experts, parse_engine_experts(o.engine_experts));
  ASSIGN_OR_RETURN(model, engine_expert_model(std::move(model), experts, o.engine_ranks));
  bytes = 0;
  for (int r = 0; r < o.engine_ranks; ++r) {
    for (const TensorSpec& s : engine_stream(model, r, o.engine_ranks)) bytes += s.nbytes();
  }
  return bytes;
}

Status run_bench(const DemoOptions& options) {
  RETURN_IF_ERROR(resolve_secret(options.secret_file).status());
  // Refused settings (--device cuda without a GPU) end here: no ceiling is
  // measured and no figures are printed.
  RETURN_IF_ERROR(check_demo_settings(options));
  DemoOptions o = options;
  o.json = true;  // no table from the demo itself
  Json report = run_demo_report(o);
  if (report.contains("error")) {
    // The job failed: no ceiling and no figures, only what it measured
    // (demo.cc prints the cause once, last, on stderr).
    if (options.json) {
      std::printf("%s\n", report.dump(2).c_str());
    } else {
      print_report_table(report, stdout);
    }
    return report_status(report);
  }
  ASSIGN_OR_RETURN(const std::uint64_t bytes, ceiling_bytes(o, report));
  const std::string ceiling_name = o.device == "cuda" ? "device copy (cudaMemcpy D2D)" : "memcpy";
  const double ceiling = measure_ceiling(o, bytes, report);
  std::vector<double> rates;  // GB/s of `bytes`: a refit's time against the ceiling's
  for (const Json& r : report.value("refits", Json::array())) {
    const double seconds = r.value("seconds", 0.0);
    const std::uint64_t moved = o.only.empty() ? bytes : r.value("bytes", bytes);
    rates.push_back(seconds > 0 ? static_cast<double>(moved) / seconds / 1e9 : 0.0);
  }
  // The first refit pays page faults on fresh weights; report the median of the rest too.
  std::vector<double> steady(rates.size() > 1 ? rates.begin() + 1 : rates.begin(), rates.end());
  const double med = median(steady);
  report["bench"] = Json{{"ceiling", ceiling_name},
                         {"ceiling_bytes", bytes},
                         {"ceiling_gbps", ceiling},
                         {"median_gbps", med},
                         {"ratio_to_ceiling", ceiling > 0 ? med / ceiling : 0.0},
                         {"floor_ratio", med > 0 ? ceiling / med : 0.0},
                         {"refit_gbps", rates}};
  if (options.json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    print_report_table(report, stdout);
    std::printf("\nceiling: %s %.2f GB/s over %s (same run)\n", ceiling_name.c_str(), ceiling,
                format_bytes(bytes).c_str());
    std::printf("refit: median %.2f GB/s over refits 2..%zu = %.2fx of the ceiling (%.2fx the ceiling's time)\n", med,
                rates.size(), ceiling > 0 ? med / ceiling : 0.0, med > 0 ? ceiling / med : 0.0);
  }
  RETURN_IF_ERROR(report_status(report));
  if (!report.value("verified", false)) return DataLoss("not every refit verified");
  return Status::Ok();
}

}  // namespace

void add_bench_command(CLI::App& app, CommandTable& table) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* cmd =
      app.add_subcommand("bench", "Run the demo and report GB/s against memcpy measured in the same run");
  add_demo_flags(*cmd, *o);
  cmd->add_option("--refits", o->refits, "Number of refits (the first is left out of the median)")
      ->check(CLI::Range(2, 1000000))
      ->capture_default_str();
  table.push_back({cmd, [o] { return run_bench(*o); }});
}

}  // namespace refit::cli
