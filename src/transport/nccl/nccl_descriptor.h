// The nccl descriptor: the text an engine rank publishes (through the
// coordinator, which forwards it to the trainer rank that feeds it) so that
// the trainer can join the engine rank's NCCL communicator.
//
//   nccl:version=<V>:slots=<S>:slot_bytes=<B>:id=<hex>
//
// version     NCCL_VERSION_CODE of the library the engine runs (ncclGetVersion,
//             e.g. 22809 for 2.28.9); both ranks of a communicator must run
//             the same NCCL, so the trainer refuses any other version at
//             open_target, naming both.
// slots       positive; slot_bytes positive; slots * slot_bytes fits in 64 bits.
// id          the 128 bytes of the ncclUniqueId the engine made for this
//             target, as 256 lowercase hex digits (the id holds the address
//             of the engine's bootstrap socket: whoever reads it can join).
//
// Parsing is strict: every field present, in this order, decimal digits only
// (no sign, no hex, no spaces), nothing after the id. Errors are
// kInvalidArgument, quote the whole descriptor and name the field.
//
// Pure text: no NCCL header, built in every build, so its tests run on
// machines without CUDA or NCCL.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "refit/status.h"

namespace refit {

// NCCL_UNIQUE_ID_BYTES; checked against nccl.h where it is used.
inline constexpr std::size_t kNcclUniqueIdBytes = 128;

struct NcclDescriptor {
  int version = 0;                  // NCCL_VERSION_CODE of the engine's NCCL
  int slots = 0;
  std::uint64_t slot_bytes = 0;
  std::array<unsigned char, kNcclUniqueIdBytes> id{};
};

// REQUIRES: `d` is valid (what parse_nccl_descriptor accepts).
std::string format_nccl_descriptor(const NcclDescriptor& d);

StatusOr<NcclDescriptor> parse_nccl_descriptor(const std::string& text);

}  // namespace refit
