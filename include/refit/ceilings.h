// Copy ceilings: how fast this machine copies bytes, measured now.
//
// A benchmark judges a refit against the copy it cannot beat, measured in
// the same run (`refit bench`, `refit ceiling`, bench/*.sh): one host memcpy
// for CPU refits, one device-to-device copy for GPU refits, pinned host to
// device for pushes into GPU engines, and GPU-to-GPU (peer) copies for jobs
// whose trainers feed another GPU's engine rank.
//
// Every figure is in GB/s (1e9 bytes per second), the best of `repeats`
// timed copies. Each function allocates its own buffers (about twice
// `bytes`), blocks the calling thread until it is done, and leaves nothing
// behind. Without CUDA (or without a device) the device measurements return
// an error saying so. Thread safety: none shared; call from any thread.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "refit/status.h"

namespace refit {

// One host thread's memcpy of `bytes` bytes between buffers touched first
// (page faults stay out of the timing).
// REQUIRES: bytes > 0, repeats > 0.
double measure_memcpy_gbps(std::uint64_t bytes, int repeats);

// cudaMemcpy device to device on local device 0, after one warm-up: the
// one-copy floor of a GPU refit.
StatusOr<double> measure_device_copy_gbps(std::uint64_t bytes, int repeats);

// Pinned host memory to local device 0, after one warm-up: the
// host-to-device ceiling of a push into GPU engines.
StatusOr<double> measure_pinned_h2d_gbps(std::uint64_t bytes, int repeats);

// A GPU-to-GPU figure, and whether the devices reach each other directly
// (peer access); without it the copies went through the host.
struct PeerCeiling {
  double gbps = 0;
  bool peer_access = false;
};

// cudaMemcpyPeerAsync of `bytes` bytes from local device `from` to `to`
// (indices inside CUDA_VISIBLE_DEVICES), timed with CUDA events, after one
// warm-up. With `both_ways`, half the bytes go from -> to and the other half
// to -> from at the same time (what a TP job whose trainers feed the other
// GPU's engine rank moves over the link). Peer access is enabled both ways
// where the devices allow it, as cuda_ipc's mappings do.
// Errors: fewer than two visible devices, a device out of range, from == to,
// bytes < 2.
StatusOr<PeerCeiling> measure_peer_copy_gbps(int from, int to, std::uint64_t bytes, bool both_ways, int repeats);

// Several GPU-to-GPU copies at once: bytes / pairs.size() from each pair's
// first device to its second, each on a stream of its source device,
// started together and timed from that start to the last copy's end (what
// trainers on some GPUs feeding engine ranks on others move at once).
// peer_access is true only when every pair has it.
// REQUIRES: !pairs.empty().
StatusOr<PeerCeiling> measure_peer_pairs_gbps(const std::vector<std::pair<int, int>>& pairs, std::uint64_t bytes,
                                              int repeats);

}  // namespace refit
