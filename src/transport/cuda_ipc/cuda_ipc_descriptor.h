// The cuda_ipc descriptor: the text an engine rank publishes so that trainer
// ranks on the same host can open its device memory.
//
//   cuda_ipc:dev=<pci bus id>:slots=<S>:slot_bytes=<B>:offset=<O>:handle=<hex>[:events=<hex>]
//
// dev        the PCI bus id of the device holding the memory, as
//            cudaDeviceGetPCIBusId writes it ("0000:3B:00.0"); it names the
//            GPU independently of each process's CUDA_VISIBLE_DEVICES.
// slots      positive; slot_bytes positive; slots * slot_bytes + offset fits
//            in 64 bits.
// offset     where slot 0 starts inside the exported allocation (0 for a pool
//            the transport allocated; the position of the exposed range for
//            direct mode).
// handle     the 64 bytes of the cudaIpcMemHandle_t of the allocation, as 128
//            lowercase hex digits.
// events     optional (a receive pool has them, exposed weights do not): one
//            cudaIpcEventHandle_t per slot, S x 128 lowercase hex digits, slot
//            0 first. The initiator records slot i's event after its writes
//            into slot i; the target reads the slot once the event completed.
//
// Parsing is strict: every field present but events, in this order, decimal
// digits only (no sign, no hex, no spaces), nothing after the handle or the
// events. Errors are kInvalidArgument and quote the whole descriptor.
//
// Pure text: this file needs no CUDA header and is built in every build, so
// its tests run on machines without CUDA.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit {

// sizeof(cudaIpcMemHandle_t) and sizeof(cudaIpcEventHandle_t); checked
// against the CUDA header where they are used.
inline constexpr std::size_t kCudaIpcHandleBytes = 64;

struct CudaIpcDescriptor {
  std::string pci_bus_id;           // "0000:3B:00.0"
  int slots = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t offset = 0;         // of slot 0 inside the exported allocation
  std::array<unsigned char, kCudaIpcHandleBytes> handle{};
  // Empty, or one event handle per slot.
  std::vector<std::array<unsigned char, kCudaIpcHandleBytes>> events;
};

// REQUIRES: `d` is valid (what parse_cuda_ipc_descriptor accepts).
std::string format_cuda_ipc_descriptor(const CudaIpcDescriptor& d);

StatusOr<CudaIpcDescriptor> parse_cuda_ipc_descriptor(const std::string& text);

// "<domain>:<bus>:<device>.<function>": 4 to 8, 2, 2 and 1 hex digits.
bool is_pci_bus_id(std::string_view s);

// 128 lowercase hex digits.
std::string cuda_ipc_handle_hex(const std::array<unsigned char, kCudaIpcHandleBytes>& handle);

}  // namespace refit
