#include "control/control_message.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <span>
#include <vector>

namespace refit {

Status send_control(Link& link, const Json& message, Deadline deadline) {
  std::string text = message.dump();
  FrameHeader header;
  header.type = FrameType::kControl;
  header.payload_bytes = text.size();
  return link.send(header, std::as_bytes(std::span(text.data(), text.size())), deadline);
}

StatusOr<Json> recv_control(Link& link, Deadline deadline, std::uint64_t max_bytes) {
  ASSIGN_OR_RETURN(FrameHeader header, link.recv_header(deadline, max_bytes));
  if (header.type != FrameType::kControl) {
    return InvalidArgument("protocol error from " + link.peer() + ": expected a control frame, got frame type " +
                           std::to_string(static_cast<int>(header.type)));
  }
  // Grow the buffer as bytes arrive: a peer that announces a large message
  // and sends nothing gets no large allocation.
  constexpr std::uint64_t kChunk = 1 << 20;
  std::string text;
  while (text.size() < header.payload_bytes) {
    const std::size_t at = text.size();
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, header.payload_bytes - at));
    text.resize(at + n);
    RETURN_IF_ERROR(link.recv_payload(std::as_writable_bytes(std::span(text.data() + at, n)), deadline));
  }
  return parse_control_message(text, link.peer());
}

namespace {

// Deepest nesting of arrays and objects in `text` (JSON strings skipped).
// nlohmann parses iteratively but copies, compares and prints recursively:
// a deeply nested message must be refused before it is parsed.
std::size_t nesting_depth(std::string_view text) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

StatusOr<Json> parse_control_message(std::string_view text, const std::string& peer) {
  if (std::size_t depth = nesting_depth(text); depth > kMaxControlDepth) {
    return InvalidArgument("malformed control message from " + peer + ": nested " + std::to_string(depth) +
                           " levels deep (at most " + std::to_string(kMaxControlDepth) + ")");
  }
  Json message = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (message.is_discarded() || !message.is_object()) {
    return InvalidArgument("malformed control message from " + peer + ": not a JSON object (" +
                           std::to_string(text.size()) + " bytes)");
  }
  return message;
}

}  // namespace refit
