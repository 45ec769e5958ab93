#include "refit/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "cuda/device.h"
#include "refit/plan.h"
#include "refit/report_table.h"

#if REFIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#endif

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

// The GPU-to-GPU ceiling: best of `repeats` cudaMemcpyPeerAsync's of
// o.bytes from local device o.from to o.to (with o.both_ways: half of them
// each way at once, on a stream of each device), timed with CUDA events on
// o.from's stream, after one untimed warm-up. Peer access is enabled both
// ways where the devices allow it (as cuda_ipc's mappings do); where they do
// not, the copy still runs (through the host) and "peer_access" says false.
// Adds "gbps", "peer_access" to `out`.
Status measure_peer_copy(const CeilingOptions& o, int repeats, Json& out) {
#if !REFIT_HAVE_CUDA
  (void)o;
  (void)repeats;
  (void)out;
  return FailedPrecondition("refit was built without CUDA");
#else
  const char* visible_env = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string visible_text =
      visible_env == nullptr ? "CUDA_VISIBLE_DEVICES unset" : "CUDA_VISIBLE_DEVICES=\"" + std::string(visible_env) + "\"";
  auto visible = cuda_device_count();
  if (!visible.ok()) {
    return visible.status().WithContext("--kind peer needs two visible CUDA devices (" + visible_text + ")");
  }
  if (*visible < 2) {
    return FailedPrecondition("--kind peer needs two visible CUDA devices; " + std::to_string(*visible) +
                              " visible (" + visible_text + ")");
  }
  for (int d : {o.from, o.to}) {
    if (d < 0 || d >= *visible) {
      return InvalidArgument("--kind peer: --from " + std::to_string(o.from) + " --to " + std::to_string(o.to) +
                             ": device " + std::to_string(d) + " is not a visible device (0.." +
                             std::to_string(*visible - 1) + ", " + visible_text + ")");
    }
  }
  if (o.from == o.to) {
    return InvalidArgument("--kind peer: --from and --to are both device " + std::to_string(o.from) +
                           "; use --kind d2d for a copy within one device");
  }
  if (o.bytes < 2) return InvalidArgument("--kind peer: --bytes " + std::to_string(o.bytes) + " is below 2");
  int access_ab = 0, access_ba = 0;
  RETURN_IF_ERROR(cuda_check(cudaDeviceCanAccessPeer(&access_ab, o.from, o.to), "cudaDeviceCanAccessPeer"));
  RETURN_IF_ERROR(cuda_check(cudaDeviceCanAccessPeer(&access_ba, o.to, o.from), "cudaDeviceCanAccessPeer"));
  const bool peer_access = access_ab != 0 && access_ba != 0;
  if (peer_access) {
    for (auto [self, peer] : {std::pair{o.from, o.to}, std::pair{o.to, o.from}}) {
      ScopedDevice scope(self);
      RETURN_IF_ERROR(scope.status());
      const cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // not an error: leave nothing behind
      } else {
        RETURN_IF_ERROR(cuda_check(err, "cudaDeviceEnablePeerAccess from device " + std::to_string(self) +
                                            " to device " + std::to_string(peer)));
      }
    }
  }
  // Forward: `forward` bytes from -> to; backward (both_ways): the rest, to -> from.
  const std::uint64_t forward = o.both_ways ? o.bytes / 2 : o.bytes;
  const std::uint64_t backward = o.bytes - forward;
  ASSIGN_OR_RETURN(DeviceBuffer src_a, DeviceBuffer::Allocate(o.from, forward));
  ASSIGN_OR_RETURN(DeviceBuffer dst_a, DeviceBuffer::Allocate(o.to, forward));
  DeviceBuffer src_b, dst_b;
  if (o.both_ways) {
    ASSIGN_OR_RETURN(src_b, DeviceBuffer::Allocate(o.to, backward));
    ASSIGN_OR_RETURN(dst_b, DeviceBuffer::Allocate(o.from, backward));
    RETURN_IF_ERROR(device_memset(src_b.data(), 0x3c, backward));
  }
  RETURN_IF_ERROR(device_memset(src_a.data(), 0x5a, forward));
  ASSIGN_OR_RETURN(CudaStream stream_a, CudaStream::Create(o.from));
  ASSIGN_OR_RETURN(CudaStream stream_b, CudaStream::Create(o.to));
  ASSIGN_OR_RETURN(CudaEvent start, CudaEvent::Create(o.from, /*timing=*/true));
  ASSIGN_OR_RETURN(CudaEvent stop, CudaEvent::Create(o.from, /*timing=*/true));
  ASSIGN_OR_RETURN(CudaEvent backward_done, CudaEvent::Create(o.to));
  auto copy_once = [&]() -> StatusOr<float> {
    RETURN_IF_ERROR(start.record(stream_a.handle()));
    RETURN_IF_ERROR(cuda_check(cudaMemcpyPeerAsync(dst_a.data(), o.to, src_a.data(), o.from, forward,
                                                   static_cast<cudaStream_t>(stream_a.handle())),
                               "cudaMemcpyPeerAsync of " + std::to_string(forward) + " bytes from device " +
                                   std::to_string(o.from) + " to device " + std::to_string(o.to)));
    if (o.both_ways) {
      RETURN_IF_ERROR(start.wait(stream_b.handle()));
      RETURN_IF_ERROR(cuda_check(cudaMemcpyPeerAsync(dst_b.data(), o.from, src_b.data(), o.to, backward,
                                                     static_cast<cudaStream_t>(stream_b.handle())),
                                 "cudaMemcpyPeerAsync of " + std::to_string(backward) + " bytes from device " +
                                     std::to_string(o.to) + " to device " + std::to_string(o.from)));
      RETURN_IF_ERROR(backward_done.record(stream_b.handle()));
      RETURN_IF_ERROR(backward_done.wait(stream_a.handle()));
    }
    RETURN_IF_ERROR(stop.record(stream_a.handle()));
    RETURN_IF_ERROR(stop.synchronize());
    return stop.elapsed_ms_since(start);
  };
  RETURN_IF_ERROR(copy_once().status());  // warm-up: first-use costs stay out of the figure
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    ASSIGN_OR_RETURN(float ms, copy_once());
    if (ms > 0) best = std::max(best, static_cast<double>(o.bytes) / (ms / 1e3) / 1e9);
  }
  out["gbps"] = best;
  out["peer_access"] = peer_access;
  return Status::Ok();
#endif
}

// The ceiling of several GPU-to-GPU copies at once: o.bytes / pairs from
// each pair's first device to its second, each on a stream of its source
// device, started together (every stream waits for one start event) and
// timed from that start to the last copy's end; best of `repeats` after a
// warm-up. Peer access is enabled for each pair where the devices allow it.
// Adds "gbps" (all bytes over the time), "peer_access" to `out`.
Status measure_peer_pairs(const CeilingOptions& o, int repeats, Json& out) {
#if !REFIT_HAVE_CUDA
  (void)o;
  (void)repeats;
  (void)out;
  return FailedPrecondition("refit was built without CUDA");
#else
  ASSIGN_OR_RETURN(const int visible, cuda_device_count());
  const std::uint64_t each = o.bytes / o.pairs.size();
  if (each == 0) return InvalidArgument("--kind peer --pairs: --bytes is below one byte per pair");
  bool peer_access = true;
  struct Lane {
    DeviceBuffer src, dst;
    CudaStream stream;
    CudaEvent done;
  };
  std::vector<Lane> lanes(o.pairs.size());
  for (std::size_t i = 0; i < o.pairs.size(); ++i) {
    const auto [from, to] = o.pairs[i];
    const std::string pair = std::to_string(from) + ":" + std::to_string(to);
    if (from < 0 || to < 0 || from >= visible || to >= visible || from == to) {
      return InvalidArgument("--kind peer --pairs: pair " + pair + " needs two different visible devices (0.." +
                             std::to_string(visible - 1) + ")");
    }
    int can = 0;
    RETURN_IF_ERROR(cuda_check(cudaDeviceCanAccessPeer(&can, from, to), "cudaDeviceCanAccessPeer " + pair));
    if (can) {
      ScopedDevice scope(from);
      RETURN_IF_ERROR(scope.status());
      const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        RETURN_IF_ERROR(cuda_check(err, "cudaDeviceEnablePeerAccess " + pair));
      }
    }
    peer_access = peer_access && can != 0;
    Lane& l = lanes[i];
    ASSIGN_OR_RETURN(l.src, DeviceBuffer::Allocate(from, each));
    ASSIGN_OR_RETURN(l.dst, DeviceBuffer::Allocate(to, each));
    RETURN_IF_ERROR(device_memset(l.src.data(), 0x5a, each));
    ASSIGN_OR_RETURN(l.stream, CudaStream::Create(from));
    ASSIGN_OR_RETURN(l.done, CudaEvent::Create(from));
  }
  const int first = o.pairs[0].first;
  ASSIGN_OR_RETURN(CudaEvent start, CudaEvent::Create(first, /*timing=*/true));
  ASSIGN_OR_RETURN(CudaEvent stop, CudaEvent::Create(first, /*timing=*/true));
  auto copy_once = [&]() -> StatusOr<float> {
    RETURN_IF_ERROR(start.record(lanes[0].stream.handle()));
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      Lane& l = lanes[i];
      if (i > 0) RETURN_IF_ERROR(start.wait(l.stream.handle()));
      RETURN_IF_ERROR(cuda_check(cudaMemcpyPeerAsync(l.dst.data(), o.pairs[i].second, l.src.data(), o.pairs[i].first,
                                                     each, static_cast<cudaStream_t>(l.stream.handle())),
                                 "cudaMemcpyPeerAsync of " + std::to_string(each) + " bytes over pair " +
                                     std::to_string(o.pairs[i].first) + ":" + std::to_string(o.pairs[i].second)));
      RETURN_IF_ERROR(l.done.record(l.stream.handle()));
      if (i > 0) RETURN_IF_ERROR(l.done.wait(lanes[0].stream.handle()));
    }
    RETURN_IF_ERROR(stop.record(lanes[0].stream.handle()));
    RETURN_IF_ERROR(stop.synchronize());
    return stop.elapsed_ms_since(start);
  };
  RETURN_IF_ERROR(copy_once().status());  // warm-up
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    ASSIGN_OR_RETURN(float ms, copy_once());
    if (ms > 0) best = std::max(best, static_cast<double>(each * lanes.size()) / (ms / 1e3) / 1e9);
  }
  out["gbps"] = best;
  out["peer_access"] = peer_access;
  return Status::Ok();
#endif
}

}  // namespace

int run_ceiling(const CeilingOptions& o) {
  Json out{{"ceiling", o.kind}, {"bytes", o.bytes}};
  Status status = Status::Ok();
  if (o.kind == "memcpy") {
    out["gbps"] = std::max(memcpy_gbps(o.bytes, 5), memcpy_gbps(o.bytes, 5));
  } else if (o.kind == "peer") {
    if (o.pairs.empty()) {
      out["from"] = o.from;
      out["to"] = o.to;
      out["both_ways"] = o.both_ways;
      status = measure_peer_copy(o, 5, out);
    } else {
      Json pairs = Json::array();
      for (const auto& [from, to] : o.pairs) pairs.push_back(Json::array({from, to}));
      out["pairs"] = pairs;
      status = measure_peer_pairs(o, 5, out);
    }
  } else {
    auto measured = o.kind == "h2d" ? pinned_h2d_gbps(o.bytes, 5) : device_copy_gbps(o.bytes, 5);
    if (measured.ok()) {
      out["gbps"] = *measured;
    } else {
      status = measured.status();
    }
  }
  if (!status.ok()) {
    std::fprintf(stderr, "refit ceiling: error: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", out.dump().c_str());
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
