// Fuzz target: transport descriptors, the text an engine rank publishes and
// trainer ranks receive through the coordinator (src/transport/pool_layout.*,
// src/transport/cuda_ipc/cuda_ipc_descriptor.*, and the shm and tcp
// descriptors parsed by their transports' open_target).
//
// Input: byte 0 picks the parser (0: cuda_ipc, 1: tcp, 2: shm, 3: the
// pool_layout helpers); the rest is the descriptor text.
#include <string>

#include "fuzz_util.h"
#include "refit/transport.h"
#include "transport/cuda_ipc/cuda_ipc_descriptor.h"
#include "transport/pool_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > 8192) return 0;
  const std::string text(refit::fuzz::as_text(data + 1, size - 1));
  switch (data[0] & 3) {
    case 0: {
      auto d = refit::parse_cuda_ipc_descriptor(text);
      if (d.ok()) {
        // What parses is valid: it formats, and parses back to itself.
        const std::string again = refit::format_cuda_ipc_descriptor(*d);
        auto d2 = refit::parse_cuda_ipc_descriptor(again);
        if (!d2.ok() || d2->pci_bus_id != d->pci_bus_id || d2->slots != d->slots ||
            d2->slot_bytes != d->slot_bytes || d2->offset != d->offset || d2->handle != d->handle) {
          __builtin_trap();
        }
      }
      break;
    }
    case 1: {
      // Without a link, a valid descriptor stops at "needs the data-plane link".
      static auto tcp = refit::make_transport("tcp");
      if (tcp.ok()) (void)(*tcp)->open_target(text, nullptr);
      break;
    }
    case 2: {
      // A well-formed one names a segment that does not exist (ENOENT), or,
      // rarely, one of another process: mapped and unmapped, never written.
      static auto shm = refit::make_transport("shm");
      if (shm.ok()) (void)(*shm)->open_target(text, nullptr);
      break;
    }
    case 3: {
      std::uint64_t v = 0;
      std::string_view s = text;
      const bool parsed = refit::parse_u64(s, &v);
      if (parsed && std::to_string(v).size() > s.size()) __builtin_trap();
      if (refit::consume_prefix(&s, "slots=") && s.size() + 6 != text.size()) __builtin_trap();
      std::uint64_t a = 0, b = 0;
      const std::size_t colon = text.find(':');
      if (colon != std::string::npos && refit::parse_u64(std::string_view(text).substr(0, colon), &a) &&
          refit::parse_u64(std::string_view(text).substr(colon + 1), &b)) {
        auto bytes = refit::checked_pool_size(a, b, UINT64_MAX);
        if (bytes && (*bytes / b != a)) __builtin_trap();
      }
      break;
    }
  }
  return 0;
}
