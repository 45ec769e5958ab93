// Fuzz target: data-plane and control-plane frame headers (src/net/link.cc)
// as a receiver reads them: recv_header with a bound, then the payload read
// or skipped, until the stream ends or a frame is refused.
//
// Input: byte 0 picks the payload bound (0: 0 bytes, 1: 64, 2: 4096, 3:
// kMaxFramePayload) and whether payloads are read or skipped (bit 2); the
// rest is the byte stream a peer sent.
#include <chrono>
#include <vector>

#include "fuzz_util.h"
#include "net/link.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > refit::fuzz::kMaxFedBytes) return 0;
  static constexpr std::uint64_t kBounds[4] = {0, 64, 4096, refit::kMaxFramePayload};
  const std::uint64_t bound = kBounds[data[0] & 3];
  const bool skip = (data[0] & 4) != 0;
  refit::fuzz::FedLink fed(refit::fuzz::as_text(data + 1, size - 1));
  const auto deadline = refit::Deadline::After(std::chrono::seconds(5));
  std::vector<std::byte> buffer;
  for (int i = 0; i < 1024; ++i) {
    auto h = fed.link().recv_header(deadline, bound);
    if (!h.ok()) break;
    // The header's promises, as receivers rely on them.
    if (h->magic != refit::kFrameMagic || h->payload_bytes > bound) __builtin_trap();
    const auto type = static_cast<std::uint16_t>(h->type);
    if (type < 1 || type > 6) __builtin_trap();
    if (skip || h->payload_bytes > refit::fuzz::kMaxFedBytes) {
      // A receiver never allocates what a header announces before reading.
      if (!fed.link().skip_payload(h->payload_bytes, deadline).ok()) break;
    } else {
      buffer.resize(h->payload_bytes);
      if (!fed.link().recv_payload(buffer, deadline).ok()) break;
    }
  }
  return 0;
}
