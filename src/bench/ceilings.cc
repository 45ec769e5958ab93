#include "refit/ceilings.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/device.h"

#if REFIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"
#endif

namespace refit {
namespace {

double gbps(std::uint64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }

// Best of `repeats` runs of `copy` (synchronous), timed on the host clock.
template <typename Copy>
StatusOr<double> best_host_timed(std::uint64_t bytes, int repeats, Copy copy) {
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(copy());
    best = std::max(best, gbps(bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  }
  return best;
}

#if REFIT_HAVE_CUDA
std::string pair_text(int from, int to) { return std::to_string(from) + ":" + std::to_string(to); }

// Lets `self` map `peer`'s memory; already enabled is not an error.
Status enable_peer_access(int self, int peer) {
  ScopedDevice scope(self);
  RETURN_IF_ERROR(scope.status());
  const cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // not an error: leave nothing behind
    return Status::Ok();
  }
  return cuda_check(err, "cudaDeviceEnablePeerAccess from device " + std::to_string(self) + " to device " +
                             std::to_string(peer));
}

// Whether `from` and `to` reach each other's memory; enables it where they do.
StatusOr<bool> set_up_peer_access(int from, int to, bool both_ways) {
  int forward = 0, backward = 0;
  RETURN_IF_ERROR(cuda_check(cudaDeviceCanAccessPeer(&forward, from, to), "cudaDeviceCanAccessPeer " + pair_text(from, to)));
  if (both_ways) {
    RETURN_IF_ERROR(
        cuda_check(cudaDeviceCanAccessPeer(&backward, to, from), "cudaDeviceCanAccessPeer " + pair_text(to, from)));
  }
  const bool access = forward != 0 && (!both_ways || backward != 0);
  if (access) {
    RETURN_IF_ERROR(enable_peer_access(from, to));
    if (both_ways) RETURN_IF_ERROR(enable_peer_access(to, from));
  }
  return access;
}

// One lane of peer copies: `bytes` from a buffer on `from` to one on `to`,
// on a stream of `from`.
struct PeerLane {
  int from = 0, to = 0;
  std::uint64_t bytes = 0;
  DeviceBuffer src, dst;
  CudaStream stream;
  CudaEvent done;

  static StatusOr<PeerLane> Create(int from, int to, std::uint64_t bytes, unsigned char fill) {
    PeerLane l;
    l.from = from;
    l.to = to;
    l.bytes = bytes;
    ASSIGN_OR_RETURN(l.src, DeviceBuffer::Allocate(from, bytes));
    ASSIGN_OR_RETURN(l.dst, DeviceBuffer::Allocate(to, bytes));
    RETURN_IF_ERROR(device_memset(l.src.data(), fill, bytes));
    ASSIGN_OR_RETURN(l.stream, CudaStream::Create(from));
    ASSIGN_OR_RETURN(l.done, CudaEvent::Create(from));
    return l;
  }

  Status enqueue() {
    return cuda_check(cudaMemcpyPeerAsync(dst.data(), to, src.data(), from, bytes,
                                          static_cast<cudaStream_t>(stream.handle())),
                      "cudaMemcpyPeerAsync of " + std::to_string(bytes) + " bytes from device " +
                          std::to_string(from) + " to device " + std::to_string(to));
  }
};

// Best of `repeats` rounds in which every lane copies at once: each lane's
// stream waits for one start event on lanes[0]'s stream, lanes[0]'s stream
// waits for every lane's end, and the round is timed between two events on
// it. One untimed warm-up round first. Every lane's bytes count.
StatusOr<double> best_of_parallel_copies(std::vector<PeerLane>& lanes, int repeats) {
  const int first = lanes[0].from;
  std::uint64_t total = 0;
  for (const PeerLane& l : lanes) total += l.bytes;
  ASSIGN_OR_RETURN(CudaEvent start, CudaEvent::Create(first, /*timing=*/true));
  ASSIGN_OR_RETURN(CudaEvent stop, CudaEvent::Create(first, /*timing=*/true));
  void* const main_stream = lanes[0].stream.handle();
  auto copy_once = [&]() -> StatusOr<float> {
    RETURN_IF_ERROR(start.record(main_stream));
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      PeerLane& l = lanes[i];
      if (i > 0) RETURN_IF_ERROR(start.wait(l.stream.handle()));
      RETURN_IF_ERROR(l.enqueue());
      if (i > 0) {
        RETURN_IF_ERROR(l.done.record(l.stream.handle()));
        RETURN_IF_ERROR(l.done.wait(main_stream));
      }
    }
    RETURN_IF_ERROR(stop.record(main_stream));
    RETURN_IF_ERROR(stop.synchronize());
    return stop.elapsed_ms_since(start);
  };
  RETURN_IF_ERROR(copy_once().status());  // warm-up: first-use costs stay out of the figure
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    ASSIGN_OR_RETURN(float ms, copy_once());
    best = std::max(best, gbps(total, ms / 1e3));
  }
  return best;
}
#endif  // REFIT_HAVE_CUDA

}  // namespace

double measure_memcpy_gbps(std::uint64_t bytes, int repeats) {
  std::vector<unsigned char> src(bytes), dst(bytes);
  std::memset(src.data(), 0x5a, bytes);
  std::memset(dst.data(), 0, bytes);
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    auto t1 = std::chrono::steady_clock::now();
    best = std::max(best, gbps(bytes, std::chrono::duration<double>(t1 - t0).count()));
    src[i % bytes] ^= dst[(i * 7919) % bytes];  // keep the copies observable
  }
  return best;
}

StatusOr<double> measure_device_copy_gbps(std::uint64_t bytes, int repeats) {
  ASSIGN_OR_RETURN(DeviceBuffer src, DeviceBuffer::Allocate(0, bytes));
  ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Allocate(0, bytes));
  RETURN_IF_ERROR(device_memset(src.data(), 0x5a, bytes));
  RETURN_IF_ERROR(copy_device_to_device(dst.data(), src.data(), bytes));  // warm-up
  return best_host_timed(bytes, repeats, [&] { return copy_device_to_device(dst.data(), src.data(), bytes); });
}

StatusOr<double> measure_pinned_h2d_gbps(std::uint64_t bytes, int repeats) {
  ASSIGN_OR_RETURN(PinnedBuffer src, PinnedBuffer::Allocate(bytes));
  ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Allocate(0, bytes));
  std::memset(src.data(), 0x5a, bytes);
  RETURN_IF_ERROR(copy_host_to_device(dst.data(), src.span()));  // warm-up
  return best_host_timed(bytes, repeats, [&] { return copy_host_to_device(dst.data(), src.span()); });
}

StatusOr<PeerCeiling> measure_peer_copy_gbps(int from, int to, std::uint64_t bytes, bool both_ways, int repeats) {
#if !REFIT_HAVE_CUDA
  (void)from, (void)to, (void)bytes, (void)both_ways, (void)repeats;
  return FailedPrecondition("a peer copy needs CUDA; refit was built without CUDA");
#else
  ASSIGN_OR_RETURN(const int visible, cuda_device_count());
  if (visible < 2) {
    return FailedPrecondition("a peer copy needs two visible CUDA devices; " + std::to_string(visible) + " visible");
  }
  for (int d : {from, to}) {
    if (d < 0 || d >= visible) {
      return InvalidArgument("peer copy from device " + std::to_string(from) + " to device " + std::to_string(to) +
                             ": device " + std::to_string(d) + " is not a visible device (0.." +
                             std::to_string(visible - 1) + ")");
    }
  }
  if (from == to) {
    return InvalidArgument("peer copy: from and to are both device " + std::to_string(from) +
                           "; a copy within one device is the device copy ceiling");
  }
  if (bytes < 2) return InvalidArgument("peer copy: " + std::to_string(bytes) + " bytes is below 2");
  PeerCeiling out;
  ASSIGN_OR_RETURN(out.peer_access, set_up_peer_access(from, to, /*both_ways=*/true));
  // Forward: `forward` bytes from -> to; backward (both_ways): the rest, to -> from.
  const std::uint64_t forward = both_ways ? bytes / 2 : bytes;
  std::vector<PeerLane> lanes;
  ASSIGN_OR_RETURN(PeerLane a, PeerLane::Create(from, to, forward, 0x5a));
  lanes.push_back(std::move(a));
  if (both_ways) {
    ASSIGN_OR_RETURN(PeerLane b, PeerLane::Create(to, from, bytes - forward, 0x3c));
    lanes.push_back(std::move(b));
  }
  ASSIGN_OR_RETURN(out.gbps, best_of_parallel_copies(lanes, repeats));
  return out;
#endif
}

StatusOr<PeerCeiling> measure_peer_pairs_gbps(const std::vector<std::pair<int, int>>& pairs, std::uint64_t bytes,
                                              int repeats) {
#if !REFIT_HAVE_CUDA
  (void)pairs, (void)bytes, (void)repeats;
  return FailedPrecondition("peer copies need CUDA; refit was built without CUDA");
#else
  if (pairs.empty()) return InvalidArgument("peer copies over device pairs: no pairs given");
  ASSIGN_OR_RETURN(const int visible, cuda_device_count());
  const std::uint64_t each = bytes / pairs.size();
  if (each == 0) return InvalidArgument("peer copies over device pairs: below one byte per pair");
  PeerCeiling out;
  out.peer_access = true;
  std::vector<PeerLane> lanes;
  for (const auto& [from, to] : pairs) {
    if (from < 0 || to < 0 || from >= visible || to >= visible || from == to) {
      return InvalidArgument("peer copies over device pairs: pair " + pair_text(from, to) +
                             " needs two different visible devices (0.." + std::to_string(visible - 1) + ")");
    }
    ASSIGN_OR_RETURN(bool access, set_up_peer_access(from, to, /*both_ways=*/false));
    out.peer_access = out.peer_access && access;
    ASSIGN_OR_RETURN(PeerLane lane, PeerLane::Create(from, to, each, 0x5a));
    lanes.push_back(std::move(lane));
  }
  ASSIGN_OR_RETURN(out.gbps, best_of_parallel_copies(lanes, repeats));
  return out;
#endif
}

}  // namespace refit
