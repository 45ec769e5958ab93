// Device memory, as a server or a binding sees it: which CUDA devices this
// process sees, how engine ranks map onto them (DESIGN.md rule 7), and
// synchronous copies. Every function works in a build without CUDA too and
// then fails with an error that says so. The streams, events, pinned and
// registered buffers and kernels behind the transports are internal
// (src/cuda/).
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit {

// True when refit was compiled with CUDA support (REFIT_HAVE_CUDA).
bool cuda_built();

// Number of visible CUDA devices. Zero devices, a missing or too old driver, or
// a build without CUDA are errors whose message says why, e.g.
// "cudaGetDeviceCount: no CUDA-capable device is detected (cudaErrorNoDevice)".
StatusOr<int> cuda_device_count();

// The UUID of local CUDA device `device`, as nvidia-smi -L prints it
// ("GPU-4c2a46b8-d994-7be1-2bd6-c7b4991ff3ca"): the same for every process
// that sees that physical GPU, whatever its CUDA_VISIBLE_DEVICES.
StatusOr<std::string> cuda_device_uuid(int device);

// DESIGN rule 7: the device of engine TP rank `tp_rank` is the LOCAL index
// base_gpu_id + tp_rank inside CUDA_VISIBLE_DEVICES, never a physical GPU id.
// `visible_device_count` is cuda_device_count() of the engine's process.
// With `gpus` > 0 the engine's ranks share that many GPUs, round-robin:
// base_gpu_id + tp_rank % gpus (a test or benchmark of several engine ranks
// on one GPU: gpus 1); 0: one GPU per rank.
// Errors (kFailedPrecondition, naming every value): a negative base_gpu_id,
// tp_rank or gpus, or a local index >= visible_device_count.
StatusOr<int> engine_local_device(int base_gpu_id, int tp_rank, int visible_device_count, int gpus = 0);

// The entries of a CUDA_VISIBLE_DEVICES value, for reporting which physical GPU
// (or GPU-/MIG- UUID) a local index names: "4, 5,GPU-ab" -> {"4", "5", "GPU-ab"}.
// Entries are trimmed of spaces; like the CUDA runtime, the list ends at the
// first empty entry. An empty value gives an empty list (no visible device).
std::vector<std::string> parse_visible_devices(std::string_view env_value);

// "local device 1 (CUDA_VISIBLE_DEVICES entry \"5\")", or
// "local device 1 (CUDA_VISIBLE_DEVICES unset: physical GPU 1)" when
// `cuda_visible_devices` is null. For logs and error messages.
std::string describe_local_device(int local_device, const char* cuda_visible_devices);

// Waits until every piece of work queued on local device `device` (by any
// stream of this process) finished: what a caller does before handing refit
// tensors it wrote on the device.
Status synchronize_device(int device);

// Synchronous copies and fill for tests and verification (slow path: each one
// waits for the device). Pointers may be device, pinned or pageable host
// memory (unified addressing decides the direction).
Status copy_device_to_host(std::span<std::byte> dst, const std::byte* device_src);
Status copy_host_to_device(std::byte* device_dst, std::span<const std::byte> src);
Status copy_device_to_device(std::byte* device_dst, const std::byte* device_src, std::uint64_t bytes);
// Sets `bytes` bytes at device_dst to `value` (0..255), on the pointer's device.
Status device_memset(std::byte* device_dst, int value, std::uint64_t bytes);

}  // namespace refit
