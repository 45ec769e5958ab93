// The ucx descriptor: the text an engine rank publishes (through the
// coordinator) so that trainer ranks on any host can write into its memory.
//
//   ucx:slots=<S>:slot_bytes=<B>:addr=<A>:mem=<M>:worker=<hex>:rkey=<hex>
//
// slots       positive, fits an int; slot_bytes positive.
// addr        the target's virtual address of slot 0 (decimal); slot i starts
//             at addr + i * slot_bytes; addr + slots * slot_bytes fits in 64 bits.
// mem         where the range lives and how UCX reaches it: "host" (host
//             memory, registered), "cuda" (device memory registered with a
//             CUDA-capable UCX), "staged" (device memory this UCX cannot
//             register: only active-message writes reach it, which the
//             target copies through pinned host buffers; rkey is empty).
// worker      the target's UCP worker address (ucp_worker_get_address), as
//             lowercase hex.
// rkey        the packed remote key of the registered range
//             (ucp_rkey_pack of the ucp_mem_map handle), as lowercase hex;
//             empty exactly when mem=staged.
//
// Parsing is strict: every field present, in this order, decimal digits only
// (no sign, no hex, no spaces), hex blobs non-empty, of even length and at
// most kMaxUcxBlobBytes bytes (the rkey empty for mem=staged only), nothing after the rkey. Errors are
// kInvalidArgument and quote the whole descriptor.
//
// Pure text: this file needs no UCX header and is built in every build, so
// its tests run where UCX is absent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "refit/status.h"

namespace refit {

// Worker addresses of UCX 1.13 are a few hundred bytes, packed rkeys tens;
// anything near this bound is not a descriptor.
inline constexpr std::size_t kMaxUcxBlobBytes = 1 << 16;

enum class UcxMemory { kHost, kCuda, kStaged };

struct UcxDescriptor {
  int slots = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t addr = 0;                   // of slot 0, in the target process
  UcxMemory memory = UcxMemory::kHost;
  std::vector<unsigned char> worker;        // ucp worker address
  std::vector<unsigned char> rkey;          // packed remote key
};

// REQUIRES: `d` is valid (what parse_ucx_descriptor accepts).
std::string format_ucx_descriptor(const UcxDescriptor& d);

StatusOr<UcxDescriptor> parse_ucx_descriptor(const std::string& text);

// Lowercase hex of `bytes`.
// "host", "cuda", "staged".
const char* ucx_memory_name(UcxMemory memory);

std::string ucx_hex(const unsigned char* bytes, std::size_t size);

}  // namespace refit
