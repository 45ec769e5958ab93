// Fuzz target: control messages as the coordinator and the ranks receive
// them: kControl frames on a link (size bound, frame checks) and their JSON
// (parse, nesting bound, schema), then every read the coordinator makes of
// a validated message (control_message.h promises no exception).
//
// Input: byte 0 picks the mode; the rest is
//   bit 0 set:   one message's JSON text (parse_control_message)
//   bit 0 clear: a byte stream of frames, read with recv_control until an
//                error (bit 1: with the authentication bound, 4096 bytes)
#include <chrono>

#include "control/auth.h"
#include "control/control_message.h"
#include "control/spec_json.h"
#include "fuzz_util.h"

namespace {

using refit::Json;

// The coordinator's (and ranks') reads of a validated message.
void use(const Json& m) {
  const std::string& type = m["type"].get_ref<const std::string&>();
  if (type == "join") {
    (void)refit::json_string(m, "role");
    (void)refit::json_int(m, "rank");
    (void)m.value("pid", 0);
    std::uint64_t slots = m.value("pool_slots", 0ull), bucket = m.value("bucket_size", 0ull);
    // Bounded so that this product (the coordinator's pool size) fits.
    if (slots != 0 && bucket > UINT64_MAX / slots) __builtin_trap();
    (void)m.value("memory_limit", 0ull);
    (void)m.value("plan_digest", std::string());
    (void)m.value("data_address", std::string());
    (void)m.value("descriptor", std::string());
    (void)m.value("device", std::string("cpu"));
    const Json supported = m.value("supported_dtypes", Json::array());
    const Json examples = m.value("stream_dtypes", Json::object());
    for (auto it = examples.begin(); it != examples.end(); ++it) {
      bool ok = false;
      for (const Json& s : supported) ok = ok || s == it.key();
      (void)it.value().get<std::string>();
    }
    (void)refit::specs_from_json(m.value("specs", Json()), "fuzz");
    for (const char* field : {"bucket_size", "transport", "mode", "trainer_ranks", "engine_ranks"}) {
      if (m.contains(field)) (void)m[field].dump();
    }
  } else if (type == "done") {
    (void)m.value("verified", false);
    Json stats = m.value("stats", Json::object());
    stats["rank"] = 1;
  } else if (type == "progress") {
    (void)m.value("bytes", 0ull);
  } else if (type == "committed" || type == "ready" || type == "sent" || type == "start") {
    (void)m.value("version", 0ull);
    (void)m.value("version", Json()).dump();
  } else if (type == "failed" || type == "abort" || type == "error") {
    (void)refit::status_from_json(m.value("error", Json()));
  } else if (type == "setup") {
    (void)refit::json_uint(m, "seed");
    (void)refit::json_uint(m, "trainer_index");
    (void)m.value("engine_address", std::string());
    if (auto streams = m.find("streams"); streams != m.end()) {
      for (const Json& s : *streams) (void)refit::specs_from_json(s, "fuzz stream");
    }
  }
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
