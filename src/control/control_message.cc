#include "control/control_message.h"

#include <array>
#include <vector>

namespace refit {

Status send_control(Link& link, const Json& message, Deadline deadline) {
  std::string text = message.dump();
  FrameHeader header;
  header.type = FrameType::kControl;
  header.payload_bytes = text.size();
  return link.send(header, std::as_bytes(std::span(text.data(), text.size())), deadline);
}

StatusOr<Json> recv_control(Link& link, Deadline deadline) {
  ASSIGN_OR_RETURN(FrameHeader header, link.recv_header(deadline, kMaxControlBytes));
  if (header.type != FrameType::kControl) {
    return InvalidArgument("protocol error from " + link.peer() + ": expected a control frame, got frame type " +
                           std::to_string(static_cast<int>(header.type)));
  }
  std::string text(header.payload_bytes, '\0');
  RETURN_IF_ERROR(link.recv_payload(std::as_writable_bytes(std::span(text.data(), text.size())), deadline));
  Json message = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (message.is_discarded() || !message.is_object()) {
    return InvalidArgument("malformed control message from " + link.peer() + ": not a JSON object");
  }
  auto type = message.find("type");
  if (type == message.end() || !type->is_string()) {
    return InvalidArgument("malformed control message from " + link.peer() + ": no string field 'type'");
  }
  return message;
}

namespace {
std::string where(const Json& message, const char* field) {
  std::string type = message.contains("type") && message["type"].is_string() ? message["type"].get<std::string>()
                                                                               : std::string("?");
  return "control message '" + type + "' field '" + field + "'";
}
}  // namespace

StatusOr<std::string> json_string(const Json& message, const char* field) {
  auto it = message.find(field);
  if (it == message.end() || !it->is_string()) return InvalidArgument(where(message, field) + " is missing or not a string");
  return it->get<std::string>();
}

StatusOr<std::int64_t> json_int(const Json& message, const char* field) {
  auto it = message.find(field);
  if (it == message.end() || !it->is_number_integer()) {
    return InvalidArgument(where(message, field) + " is missing or not an integer");
  }
  return it->get<std::int64_t>();
}

StatusOr<std::uint64_t> json_uint(const Json& message, const char* field) {
  auto it = message.find(field);
  if (it == message.end() || !it->is_number_unsigned()) {
    if (it != message.end() && it->is_number_integer() && it->get<std::int64_t>() >= 0) {
      return static_cast<std::uint64_t>(it->get<std::int64_t>());
    }
    return InvalidArgument(where(message, field) + " is missing or not a non-negative integer");
  }
  return it->get<std::uint64_t>();
}

Json status_to_json(const Status& status) {
  return Json{{"code", std::string(status_code_name(status.code()))}, {"message", status.message()}};
}

Status status_from_json(const Json& json) {
  if (!json.is_object() || !json.contains("code") || !json["code"].is_string()) {
    return Internal("malformed status in control message");
  }
  std::string code = json["code"].get<std::string>();
  std::string message = json.value("message", std::string());
  for (int c = 1; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    if (status_code_name(static_cast<StatusCode>(c)) == code) return Status(static_cast<StatusCode>(c), message);
  }
  return Internal(message);
}

}  // namespace refit
