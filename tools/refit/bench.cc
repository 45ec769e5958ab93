#include "refit/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "refit/device.h"
#include "refit/plan.h"
#include "refit/report_table.h"

namespace refit {
namespace {

using Json = nlohmann::json;

// Best of `repeats` single-threaded memcpy's of `bytes` bytes, in GB/s
// (bytes copied per second). The buffers are touched first so page faults
// stay out of the timing.
double memcpy_gbps(std::uint64_t bytes, int repeats) {
  std::vector<unsigned char> src(bytes), dst(bytes);
  std::memset(src.data(), 0x5a, bytes);
  std::memset(dst.data(), 0, bytes);
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    auto t1 = std::chrono::steady_clock::now();
    double s = std::chrono::duration<double>(t1 - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(bytes) / s / 1e9);
    src[i % bytes] ^= dst[(i * 7919) % bytes];  // keep the copies observable
  }
  return best;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Best of `repeats` device-to-device copies of `bytes` bytes on local device
// 0, in GB/s (bytes copied per second): the one-copy floor of a GPU refit.
StatusOr<double> device_copy_gbps(std::uint64_t bytes, int repeats) {
  ASSIGN_OR_RETURN(DeviceBuffer src, DeviceBuffer::Allocate(0, bytes));
  ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Allocate(0, bytes));
  RETURN_IF_ERROR(device_memset(src.data(), 0x5a, bytes));
  RETURN_IF_ERROR(copy_device_to_device(dst.data(), src.data(), bytes));  // warm-up
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(copy_device_to_device(dst.data(), src.data(), bytes));  // synchronous
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

// Best of `repeats` copies of `bytes` bytes from pinned host memory to local
// device 0, in GB/s: the host-to-device ceiling of a push into GPU engines.
StatusOr<double> pinned_h2d_gbps(std::uint64_t bytes, int repeats) {
  ASSIGN_OR_RETURN(PinnedBuffer src, PinnedBuffer::Allocate(bytes));
  ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Allocate(0, bytes));
  std::memset(src.data(), 0x5a, bytes);
  RETURN_IF_ERROR(copy_host_to_device(dst.data(), src.span()));  // warm-up
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(copy_host_to_device(dst.data(), src.span()));  // synchronous
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

}  // namespace

int run_ceiling(const std::string& kind, std::uint64_t bytes) {
  double gbps = 0;
  if (kind == "memcpy") {
    gbps = std::max(memcpy_gbps(bytes, 5), memcpy_gbps(bytes, 5));
  } else {
    auto measured = kind == "h2d" ? pinned_h2d_gbps(bytes, 5) : device_copy_gbps(bytes, 5);
    if (!measured.ok()) {
      std::fprintf(stderr, "refit ceiling: error: %s\n", measured.status().ToString().c_str());
      return 1;
    }
    gbps = *measured;
  }
  std::printf("%s\n", Json{{"ceiling", kind}, {"bytes", bytes}, {"gbps", gbps}}.dump().c_str());
  return 0;
}

int run_bench(const DemoOptions& options) {
  DemoOptions o = options;
  const bool json = o.json;
  o.json = true;  // no table from the demo itself
  Json report = run_demo_report(o);
  std::uint64_t bytes = report.value("bytes_per_refit", 0ull);
  if (bytes == 0) bytes = 64ull << 20;
  // The ceiling, measured in the same run once the demo's processes have
  // exited: memcpy on CPU, a device-to-device copy of the same bytes on GPU
  // (the one-copy floor). The better of two rounds.
  double ceiling = 0;
  std::string ceiling_name = "memcpy";
  if (o.device == "cuda") {
    ceiling_name = "device copy (cudaMemcpy D2D)";
    auto gbps = device_copy_gbps(bytes, 5);
    if (gbps.ok()) {
      ceiling = *gbps;
    } else {
      report["error"] = "measuring the device copy ceiling: " + gbps.status().ToString();
      report["verified"] = false;
    }
  } else {
    ceiling = std::max(memcpy_gbps(bytes, 5), memcpy_gbps(bytes, 5));
  }
  std::vector<double> rates;
  for (const Json& r : report.value("refits", Json::array())) rates.push_back(r.value("gbps", 0.0));
  // The first refit pays page faults on fresh weights; report the median of the rest too.
  std::vector<double> steady(rates.size() > 1 ? rates.begin() + 1 : rates.begin(), rates.end());
  double med = median(steady);
  report["bench"] = Json{{"ceiling", ceiling_name},
                         {"ceiling_gbps", ceiling},
                         {"median_gbps", med},
                         {"ratio_to_ceiling", ceiling > 0 ? med / ceiling : 0.0},
                         {"floor_ratio", med > 0 ? ceiling / med : 0.0},
                         {"refit_gbps", rates}};
  if (json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    print_report_table(report, stdout);
    std::printf("\nceiling: %s %.2f GB/s over %s (same run)\n", ceiling_name.c_str(), ceiling,
                format_bytes(bytes).c_str());
    std::printf("refit: median %.2f GB/s over refits 2..%zu = %.2fx of the ceiling (%.2fx the ceiling's time)\n", med,
                rates.size(), ceiling > 0 ? med / ceiling : 0.0, med > 0 ? ceiling / med : 0.0);
  }
  if (report.contains("error")) std::fprintf(stderr, "refit bench: error: %s\n", report["error"].get<std::string>().c_str());
  return report.value("verified", false) ? 0 : 1;
}

}  // namespace refit
