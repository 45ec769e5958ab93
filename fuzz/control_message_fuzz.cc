// Fuzz target: control messages as the coordinator and the ranks receive
// them: kControl frames on a link (size bound, frame checks) and their JSON
// (parse, nesting bound), then their typed decode (schema, fields) in every
// direction (protocol.h promises an error, never an exception).
//
// Input: byte 0 picks the mode; the rest is
//   bit 0 set:   one message's JSON text (parse_control_message)
//   bit 0 clear: a byte stream of frames, read with recv_control until an
//                error (bit 1: with the authentication bound, 4096 bytes)
#include <chrono>

#include "control/auth.h"
#include "control/control_message.h"
#include "control/protocol.h"
#include "control/spec_json.h"
#include "fuzz_util.h"

namespace {

using refit::Json;

// The coordinator's (and ranks') reads of a message: its typed decode in
// every direction (protocol.h promises an error, never an exception), and
// the arithmetic the coordinator does with a decoded join.
void use(const Json& m) {
  if (auto rank = refit::decode_rank_message(m); rank.ok()) {
    if (const auto* join = std::get_if<refit::Join>(&*rank)) {
      // Bounded so that this product (the coordinator's pool size) fits.
      if (join->pool_slots != 0 && join->bucket_size > UINT64_MAX / join->pool_slots) __builtin_trap();
    }
    (void)refit::encode(*rank).dump();
  }
  if (auto coordinator = refit::decode_coordinator_message(m); coordinator.ok()) {
    (void)refit::encode(*coordinator).dump();
  }
  if (auto auth = refit::decode_auth_message(m); auth.ok()) (void)refit::encode(*auth).dump();
  (void)m.dump();
  Json copy = m;
  (void)(copy == m);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > refit::fuzz::kMaxFedBytes) return 0;
  const std::uint8_t mode = data[0];
  std::string_view rest = refit::fuzz::as_text(data + 1, size - 1);
  if (mode & 1) {
    auto m = refit::parse_control_message(rest, "the fuzz peer");
    if (m.ok()) use(*m);
    return 0;
  }
  refit::fuzz::FedLink fed(rest);
  const std::uint64_t bound = (mode & 2) ? refit::kMaxAuthMessageBytes : refit::kMaxControlBytes;
  for (int i = 0; i < 64; ++i) {
    auto m = refit::recv_control(fed.link(), refit::Deadline::After(std::chrono::seconds(5)), bound);
    if (!m.ok()) break;
    use(*m);
  }
  return 0;
}
