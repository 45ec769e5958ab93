// The schema of every control message (protocol.h validate_control_message):
// the kinds and bounds of each message's fields, checked before any typed
// decode reads them.
#include <string>
#include <vector>

#include "control/protocol.h"

namespace refit {

// ---- schemas: the kinds and bounds of every message's fields ---------------------

namespace {

// JSON kinds a field may take (a bit set).
enum Kind : unsigned {
  kStr = 1,    // string; max: length in bytes
  kUint = 2,   // integer >= 0; max: largest value
  kInt = 4,    // any integer (int64 range)
  kBool = 8,
  kObj = 16,   // object; max: members; elements: kinds of the values
  kArr = 32,   // array; max: elements; elements: kinds of the elements
};

struct Field {
  const char* name;
  unsigned kinds;
  bool required = false;
  std::uint64_t max = 0;  // 0: no bound beyond the message size
  unsigned elements = 0;  // 0: elements of any kind
};

struct Schema {
  const char* type;
  std::vector<Field> fields;
};

constexpr std::uint64_t kMaxTypeBytes = 64;
constexpr std::uint64_t kMaxNameBytes = 64;      // role, device, gpu (UUID), mode, transport, digest
constexpr std::uint64_t kMaxAddressBytes = 512;  // host:port
constexpr std::uint64_t kMaxDescriptorBytes = 4096;
constexpr std::uint64_t kMaxHexBytes = 256;      // auth nonces and MACs

const Field kVersion{"version", kUint};
const Field kError{"error", kObj};
// A partial refit's globs (request, start): at most 256, each a name's length.
const Field kOnly{"only", kArr, false, 256, kStr};

// Rank -> coordinator: the join.
void add_join(std::vector<Schema>& s) {
  s.push_back({"join",
               {{"protocol", kUint},
                {"role", kStr, true, kMaxNameBytes},
                {"rank", kUint, true, kMaxRanks},
                {"engine", kUint, false, kMaxRanks},
                {"pid", kInt},
                {"device", kStr, false, kMaxNameBytes},
                {"gpu", kStr, false, kMaxNameBytes},
                {"mode", kStr, false, kMaxNameBytes},
                {"trainer_ranks", kUint, false, kMaxRanks},
                {"engine_ranks", kUint, false, kMaxRanks},
                {"bucket_size", kUint, false, kMaxBucketSize},
                {"transport", kStr, false, kMaxNameBytes},
                {"engine_rank", kUint, false, kMaxRanks},
                {"plan_digest", kStr, false, kMaxNameBytes},
                {"stream_dtypes", kObj, false, 64, kStr},
                {"data_address", kStr, false, kMaxAddressBytes},
                {"descriptor", kStr, false, kMaxDescriptorBytes},
                {"pool_slots", kUint, false, kMaxPoolSlots},
                {"memory_limit", kUint},
                {"supported_dtypes", kArr, false, 64, kStr},
                {"quantize", kStr, false, kMaxDescriptorBytes},
                {"quantized_tensors", kUint},
                {"shadow", kBool},
                {"partial", kBool},
                {"catch_up", kBool},
                {"change", kUint, false, std::uint64_t{1} << 32},
                {"delta", kBool},
                {"specs", kArr},
                {"rules", kArr, false, 0, kStr},  // one per spec: decode_join checks the count and names
                {"layout", kStr, false, kMaxNameBytes},
                {"transfer_digest", kStr, false, kMaxNameBytes},
                {"feeds", kArr, false, kMaxRanks, kObj}}});  // shard_json.cc checks each
}

// Rank -> coordinator: every message after the join.
void add_rank_messages(std::vector<Schema>& s) {
  s.push_back({"linked", {{"version", kUint}, {"weights_complete", kBool}}});
  for (const char* t : {"sent", "committed"}) s.push_back({t, {kVersion}});
  s.push_back({"ready", {kVersion, {"plan_digest", kStr, false, kMaxNameBytes}}});
  s.push_back({"request", {kVersion, kOnly}});
  s.push_back({"done", {kVersion, {"verified", kBool}, {"stats", kObj}}});
  s.push_back({"progress", {kVersion, {"bytes", kUint}}});
  s.push_back({"failed", {kVersion, kError}});
  s.push_back({"finish", {}});
  s.push_back({"released", {kVersion, {"bytes", kUint, true}}});
  s.push_back({"acquired", {kVersion, {"descriptor", kStr, true, kMaxDescriptorBytes}}});
  s.push_back({"heartbeat", {}});  // both directions
  for (const char* t : {"amax_share", "amax_table"}) {  // the second direction below; protocol.cc checks each entry
    s.push_back({t, {kVersion, {"entries", kArr, false, 0, kArr}}});
  }
  s.push_back({"setup_failed",
               {{"protocol", kUint},
                {"role", kStr, true, kMaxNameBytes},
                {"rank", kUint, true, kMaxRanks},
                {"engine", kUint, false, kMaxRanks},
                {"pid", kInt},
                {"error", kObj, true}}});
}

// Coordinator -> rank.
void add_coordinator_messages(std::vector<Schema>& s) {
  s.push_back({"setup",
               {{"seed", kUint, true},
                {"feeders", kArr, false, kMaxRanks, kUint},
                {"streams", kArr, false, kMaxRanks, kArr},
                {"engine_rank", kUint, false, kMaxRanks},
                {"engine_address", kStr, false, kMaxAddressBytes},
                {"descriptor", kStr, false, kMaxDescriptorBytes},
                {"engine_device", kStr, false, kMaxNameBytes},
                {"trainer_index", kUint, false, kMaxRanks},
                {"feeder_count", kUint, false, kMaxRanks},
                {"on_demand", kBool},
                {"parts", kArr, false, 0, kArr},            // per bucket; shard_json.cc checks each
                {"targets", kArr, false, kMaxRanks, kObj},
                {"release_between_refits", kBool},
                {"engines", kUint, false, kMaxRanks},
                {"engine", kUint, false, kMaxRanks},
                {"relay", kArr, false, kMaxRanks, kObj}}});
  s.push_back({"release", {kVersion}});
  s.push_back({"catch_up", {kVersion, {"engine", kUint, true, kMaxRanks}}});
  s.push_back({"acquire", {kVersion, {"descriptors", kArr, false, kMaxRanks, kStr}}});
  s.push_back({"start", {kVersion, {"arena", kUint, false, 1}, kOnly}});
  for (const char* t : {"go", "commit"}) s.push_back({t, {kVersion}});
  s.push_back({"relink", {kVersion, {"route", kObj}}});  // protocol.cc checks the route's fields
  s.push_back({"abort", {kVersion, kError}});
  s.push_back({"shutdown", {{"error", kObj}, {"committed_version", kUint}}});
  s.push_back({"error", {{"error", kObj, true}}});
}

// Authentication (control/auth.h), both directions.
void add_auth_messages(std::vector<Schema>& s) {
  s.push_back({"auth_challenge",
               {{"protocol", kUint, true}, {"auth", kStr, true, kMaxNameBytes}, {"nonce", kStr, false, kMaxHexBytes}}});
  s.push_back({"auth_response",
               {{"auth", kStr, true, kMaxNameBytes}, {"nonce", kStr, false, kMaxHexBytes},
                {"mac", kStr, false, kMaxHexBytes}}});
  s.push_back({"auth_ok", {{"mac", kStr, false, kMaxHexBytes}}});
}

const std::vector<Schema>& schemas() {
  static const std::vector<Schema> all = [] {
    std::vector<Schema> s;
    add_join(s);
    add_rank_messages(s);
    add_coordinator_messages(s);
    add_auth_messages(s);
    return s;
  }();
  return all;
}

std::string kind_of(const Json& j) {
  if (j.is_string()) return "a string of " + std::to_string(j.get_ref<const std::string&>().size()) + " bytes";
  if (j.is_number_unsigned()) return std::to_string(j.get<std::uint64_t>());
  if (j.is_number_integer()) return std::to_string(j.get<std::int64_t>());
  if (j.is_number_float()) return "the non-integer number " + j.dump();
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  if (j.is_object()) return "an object of " + std::to_string(j.size()) + " members";
  if (j.is_array()) return "an array of " + std::to_string(j.size()) + " elements";
  return "null";
}

// True when `j` is of one of `kinds`, within `max` (kinds' own meaning).
bool fits(const Json& j, unsigned kinds, std::uint64_t max) {
  if ((kinds & kStr) && j.is_string()) return max == 0 || j.get_ref<const std::string&>().size() <= max;
  if ((kinds & kUint) && j.is_number_unsigned()) return max == 0 || j.get<std::uint64_t>() <= max;
  if ((kinds & kUint) && j.is_number_integer()) {
    return j.get<std::int64_t>() >= 0 && (max == 0 || static_cast<std::uint64_t>(j.get<std::int64_t>()) <= max);
  }
  // A number above INT64_MAX parses as unsigned: not an int64.
  if ((kinds & kInt) && j.is_number_integer() && !j.is_number_unsigned()) return true;
  if ((kinds & kInt) && j.is_number_unsigned()) {
    return j.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX);
  }
  if ((kinds & kBool) && j.is_boolean()) return true;
  if ((kinds & kObj) && j.is_object()) return max == 0 || j.size() <= max;
  if ((kinds & kArr) && j.is_array()) return max == 0 || j.size() <= max;
  return false;
}

std::string expected(unsigned kinds, std::uint64_t max) {
  std::vector<std::string> parts;
  std::string bound = max ? " of at most " + std::to_string(max) : std::string();
  if (kinds & kStr) {
    parts.push_back("a string" + (max ? " of at most " + std::to_string(max) + " bytes" : std::string()));
  }
  if (kinds & kUint) parts.push_back("an integer in 0.." + (max ? std::to_string(max) : std::string("2^64-1")));
  if (kinds & kInt) parts.push_back("an integer");
  if (kinds & kBool) parts.push_back("a boolean");
  if (kinds & kObj) parts.push_back("an object" + (max ? bound + " members" : std::string()));
  if (kinds & kArr) parts.push_back("an array" + (max ? bound + " elements" : std::string()));
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i == 0 ? "" : " or ") + parts[i];
  return out;
}

Status check_field(const std::string& type, const Field& f, const Json& value) {
  const std::string where = "'" + type + "' field '" + f.name + "'";
  if (!fits(value, f.kinds, f.max)) {
    return InvalidArgument(where + ": expected " + expected(f.kinds, f.max) + ", got " + kind_of(value));
  }
  if (f.elements != 0 && (value.is_array() || value.is_object())) {
    std::size_t i = 0;
    for (auto it = value.begin(); it != value.end(); ++it, ++i) {
      if (!fits(*it, f.elements, 0)) {
        std::string at = value.is_object() ? "member '" + it.key() + "'" : "element " + std::to_string(i);
        return InvalidArgument(where + ": " + at + " must be " + expected(f.elements, 0) + ", got " + kind_of(*it));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status validate_control_message(const Json& message) {
  if (!message.is_object()) return InvalidArgument("a control message must be a JSON object, got " + kind_of(message));
  auto type_it = message.find("type");
  if (type_it == message.end() || !type_it->is_string()) return InvalidArgument("no string field 'type'");
  const std::string& type = type_it->get_ref<const std::string&>();
  if (type.size() > kMaxTypeBytes) {
    return InvalidArgument("field 'type' is " + std::to_string(type.size()) + " bytes long (at most " +
                           std::to_string(kMaxTypeBytes) + ")");
  }
  for (const Schema& schema : schemas()) {
    if (type != schema.type) continue;
    for (const Field& f : schema.fields) {
      auto it = message.find(f.name);
      if (it == message.end()) {
        if (f.required) return InvalidArgument("'" + type + "' has no field '" + f.name + "'");
        continue;
      }
      RETURN_IF_ERROR(check_field(type, f, *it));
    }
    break;
  }
  return Status::Ok();
}

}  // namespace refit
