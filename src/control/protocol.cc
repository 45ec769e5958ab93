#include "control/protocol.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "control/spec_json.h"
#include "refit/checkpoint.h"

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

const std::vector<Schema>& schemas() {
  static const std::vector<Schema> all = [] {
    const Field version{"version", kUint};
    const Field error{"error", kObj};
    std::vector<Schema> s;
    // Rank -> coordinator.
    s.push_back({"join",
                 {{"protocol", kUint},
                  {"role", kStr, true, kMaxNameBytes},
                  {"rank", kUint, true, kMaxRanks},
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
                  {"specs", kArr},
                  {"rules", kArr, false, 0, kStr}}});  // one per spec: decode_join checks the count and names
    s.push_back({"linked", {{"version", kUint}, {"weights_complete", kBool}}});
    for (const char* t : {"ready", "sent", "committed", "request"}) s.push_back({t, {version}});
    s.push_back({"done", {version, {"verified", kBool}, {"stats", kObj}}});
    s.push_back({"progress", {version, {"bytes", kUint}}});
    s.push_back({"failed", {version, error}});
    s.push_back({"finish", {}});
    s.push_back({"heartbeat", {}});  // both directions
    s.push_back({"setup_failed",
                 {{"protocol", kUint},
                  {"role", kStr, true, kMaxNameBytes},
                  {"rank", kUint, true, kMaxRanks},
                  {"pid", kInt},
                  {"error", kObj, true}}});
    // Coordinator -> rank.
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
                  {"on_demand", kBool}}});
    for (const char* t : {"start", "go", "commit", "relink"}) s.push_back({t, {version}});
    s.push_back({"abort", {version, error}});
    s.push_back({"shutdown", {{"error", kObj}, {"committed_version", kUint}}});
    s.push_back({"error", {{"error", kObj, true}}});
    // Authentication (control/auth.h), both directions.
    s.push_back({"auth_challenge",
                 {{"protocol", kUint, true}, {"auth", kStr, true, kMaxNameBytes}, {"nonce", kStr, false, kMaxHexBytes}}});
    s.push_back({"auth_response",
                 {{"auth", kStr, true, kMaxNameBytes}, {"nonce", kStr, false, kMaxHexBytes},
                  {"mac", kStr, false, kMaxHexBytes}}});
    s.push_back({"auth_ok", {{"mac", kStr, false, kMaxHexBytes}}});
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
  if (kinds & kStr) parts.push_back("a string" + (max ? " of at most " + std::to_string(max) + " bytes" : std::string()));
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

// ---- typed messages --------------------------------------------------------------

namespace {

// Readers of a message that validate_control_message accepted: every field
// present has its schema's kind, so these never throw.
std::uint64_t u64(const Json& m, const char* field, std::uint64_t otherwise = 0) {
  auto it = m.find(field);
  return it == m.end() ? otherwise : it->get<std::uint64_t>();
}
std::string str(const Json& m, const char* field, const std::string& otherwise = std::string()) {
  auto it = m.find(field);
  return it == m.end() ? otherwise : it->get<std::string>();
}
bool boolean(const Json& m, const char* field, bool otherwise = false) {
  auto it = m.find(field);
  return it == m.end() ? otherwise : it->get<bool>();
}
std::optional<Status> status_field(const Json& m, const char* field) {
  auto it = m.find(field);
  if (it == m.end()) return std::nullopt;
  return status_from_json(*it);
}
StatusOr<std::vector<TensorSpec>> specs_field(const Json& m, const std::string& type, const char* field) {
  auto it = m.find(field);
  if (it == m.end()) return std::vector<TensorSpec>();
  return specs_from_json(*it, "'" + type + "' field '" + field + "'");
}

// The "rules" of a join: one shard rule name per spec of `specs`, in stream
// order; absent: none sent.
StatusOr<std::vector<ShardRule>> rules_field(const Json& m, std::size_t specs) {
  std::vector<ShardRule> rules;
  auto it = m.find("rules");
  if (it == m.end()) return rules;
  if (it->size() != specs) {
    return InvalidArgument("'join' field 'rules': expected one shard rule per spec (" + std::to_string(specs) +
                           "), got " + std::to_string(it->size()));
  }
  for (std::size_t i = 0; i < it->size(); ++i) {
    auto rule = parse_shard_rule((*it)[i].get_ref<const std::string&>());
    if (!rule.ok()) {
      return InvalidArgument("'join' field 'rules': element " + std::to_string(i) + ": " + rule.status().message());
    }
    rules.push_back(*rule);
  }
  return rules;
}

Json rules_to_json(const std::vector<ShardRule>& rules) {
  Json names = Json::array();
  for (ShardRule r : rules) names.push_back(std::string(shard_rule_name(r)));
  return names;
}

StatusOr<Role> role_field(const Json& m) {
  const std::string role = str(m, "role");
  if (role == "trainer") return Role::kTrainer;
  if (role == "engine") return Role::kEngine;
  return InvalidArgument("unknown role '" + role + "' (expected trainer or engine)");
}

StatusOr<Join> decode_join(const Json& m) {
  Join j;
  j.protocol = u64(m, "protocol", 0);
  ASSIGN_OR_RETURN(j.role, role_field(m));
  j.rank = static_cast<int>(u64(m, "rank"));
  if (auto pid = m.find("pid"); pid != m.end()) j.pid = pid->get<std::int64_t>();
  j.device = str(m, "device", "cpu");
  j.gpu = str(m, "gpu");
  j.mode = str(m, "mode");
  j.trainer_ranks = u64(m, "trainer_ranks");
  j.engine_ranks = u64(m, "engine_ranks");
  j.bucket_size = u64(m, "bucket_size");
  j.transport = str(m, "transport");
  j.plan_digest = str(m, "plan_digest");
  j.engine_rank = u64(m, "engine_rank");
  if (auto it = m.find("stream_dtypes"); it != m.end()) {
    for (auto e = it->begin(); e != it->end(); ++e) j.stream_dtypes[e.key()] = e.value().get<std::string>();
  }
  j.data_address = str(m, "data_address");
  j.descriptor = str(m, "descriptor");
  j.pool_slots = u64(m, "pool_slots");
  j.memory_limit = u64(m, "memory_limit");
  if (auto it = m.find("supported_dtypes"); it != m.end()) {
    for (const Json& d : *it) j.supported_dtypes.push_back(d.get<std::string>());
  }
  ASSIGN_OR_RETURN(j.specs, specs_field(m, "join", "specs"));
  ASSIGN_OR_RETURN(j.rules, rules_field(m, j.specs.size()));
  return j;
}

Json encode_join(const Join& j) {
  Json m{{"type", "join"},          {"protocol", j.protocol},         {"role", role_name(j.role)},
         {"rank", j.rank},          {"pid", j.pid},                   {"device", j.device},
         {"mode", j.mode},          {"trainer_ranks", j.trainer_ranks}, {"engine_ranks", j.engine_ranks},
         {"bucket_size", j.bucket_size}, {"transport", j.transport},  {"plan_digest", j.plan_digest}};
  if (!j.gpu.empty()) m["gpu"] = j.gpu;
  if (j.role == Role::kTrainer) {
    m["engine_rank"] = j.engine_rank;
    m["stream_dtypes"] = j.stream_dtypes;
    // Its plan of the engine rank's stream: a digest mismatch then names
    // the first tensor that differs (topology.cc).
    if (!j.specs.empty()) m["specs"] = specs_to_json(j.specs);
  } else {
    m["data_address"] = j.data_address;
    m["descriptor"] = j.descriptor;
    m["pool_slots"] = j.pool_slots;
    m["memory_limit"] = j.memory_limit;
    m["supported_dtypes"] = j.supported_dtypes;
    m["specs"] = specs_to_json(j.specs);
  }
  // Either role: the rule beside each spec, when the rank knows its model.
  if (!j.rules.empty()) m["rules"] = rules_to_json(j.rules);
  return m;
}

StatusOr<Setup> decode_setup(const Json& m) {
  Setup s;
  s.seed = u64(m, "seed");
  if (auto it = m.find("feeders"); it != m.end()) {
    for (const Json& f : *it) s.feeders.push_back(f.get<std::uint64_t>());
  }
  if (auto it = m.find("streams"); it != m.end()) {
    for (std::size_t r = 0; r < it->size(); ++r) {
      ASSIGN_OR_RETURN(auto specs, specs_from_json((*it)[r], "'setup' field 'streams': engine rank " +
                                                                 std::to_string(r)));
      s.streams.push_back(std::move(specs));
    }
  }
  s.engine_rank = u64(m, "engine_rank");
  s.engine_address = str(m, "engine_address");
  s.descriptor = str(m, "descriptor");
  s.engine_device = str(m, "engine_device", "cpu");
  s.trainer_index = u64(m, "trainer_index");
  s.feeder_count = u64(m, "feeder_count");
  s.on_demand = boolean(m, "on_demand");
  return s;
}

Json encode_setup(const Setup& s) {
  Json m{{"type", "setup"}, {"seed", s.seed}};
  if (!s.feeders.empty()) m["feeders"] = s.feeders;
  if (!s.streams.empty()) {
    Json streams = Json::array();
    for (const auto& stream : s.streams) streams.push_back(specs_to_json(stream));
    m["streams"] = std::move(streams);
  }
  if (s.feeder_count != 0) {
    m.update(Json{{"engine_rank", s.engine_rank},     {"engine_address", s.engine_address},
                  {"descriptor", s.descriptor},       {"engine_device", s.engine_device},
                  {"trainer_index", s.trainer_index}, {"feeder_count", s.feeder_count},
                  {"on_demand", s.on_demand}});
  }
  return m;
}

template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;

Json typed(const char* type) { return Json{{"type", type}}; }
Json versioned(const char* type, std::uint64_t version) { return Json{{"type", type}, {"version", version}}; }

// The message's schema check, then its type's name (or the error).
StatusOr<std::string> checked_type(const Json& m) {
  RETURN_IF_ERROR(validate_control_message(m));
  return m["type"].get<std::string>();
}

Status unknown(const std::string& type, const char* expected) {
  return InvalidArgument("unexpected control message '" + type + "' (expected " + expected + ")");
}

}  // namespace

StatusOr<HeartbeatTiming> heartbeat_timing(double interval_s, double timeout_s, const std::string& who) {
  auto text = [](double s) {
    char out[32];
    std::snprintf(out, sizeof out, "%g s", s);
    return std::string(out);
  };
  // Whole milliseconds; the bounds keep the conversions finite.
  if (!(interval_s >= 0.001 && interval_s <= 3600)) {
    return InvalidArgument(who + ": --heartbeat-interval " + text(interval_s) + " is outside 0.001..3600 s");
  }
  if (!(timeout_s > interval_s && timeout_s <= 86400)) {
    return InvalidArgument(who + ": --heartbeat-timeout " + text(timeout_s) + " must be above the heartbeat interval (" +
                           text(interval_s) + ") and at most 86400 s");
  }
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000 + 0.5)); };
  return HeartbeatTiming{ms(interval_s), ms(timeout_s)};
}

const char* role_name(Role role) { return role == Role::kTrainer ? "trainer" : "engine"; }

Json encode(const RankMessage& message) {
  return std::visit(
      Overload{[](const Join& j) { return encode_join(j); },
               [](const Linked& l) {
                 Json m = typed("linked");
                 if (l.version) m["version"] = *l.version;
                 if (l.weights_complete) m["weights_complete"] = *l.weights_complete;
                 return m;
               },
               [](const Ready& r) { return versioned("ready", r.version); },
               [](const Progress& p) {
                 Json m = versioned("progress", p.version);
                 m["bytes"] = p.bytes;
                 return m;
               },
               [](const Sent& s) { return versioned("sent", s.version); },
               [](const Done& d) {
                 Json m = versioned("done", d.version);
                 m["verified"] = d.verified;
                 m["stats"] = d.stats;
                 if (!d.memory_path.empty()) m["stats"]["memory_path"] = d.memory_path;
                 return m;
               },
               [](const Committed& c) { return versioned("committed", c.version); },
               [](const Failed& f) {
                 Json m = versioned("failed", f.version);
                 m["error"] = status_to_json(f.error);
                 return m;
               },
               [](const Request& r) { return versioned("request", r.version); },
               [](const Finish&) { return typed("finish"); },
               [](const Heartbeat&) { return typed("heartbeat"); },
               [](const SetupFailed& f) {
                 Json m = typed("setup_failed");
                 m["protocol"] = f.protocol;
                 m["role"] = role_name(f.role);
                 m["rank"] = f.rank;
                 m["pid"] = f.pid;
                 m["error"] = status_to_json(f.error);
                 return m;
               }},
      message);
}

Json encode(const CoordinatorMessage& message) {
  return std::visit(Overload{[](const Setup& s) { return encode_setup(s); },
                             [](const Start& s) { return versioned("start", s.version); },
                             [](const Go& g) { return versioned("go", g.version); },
                             [](const Commit& c) { return versioned("commit", c.version); },
                             [](const Abort& a) {
                               Json m = versioned("abort", a.version);
                               m["error"] = status_to_json(a.error);
                               return m;
                             },
                             [](const Relink& r) { return versioned("relink", r.version); },
                             [](const Shutdown& s) {
                               Json m = typed("shutdown");
                               m["committed_version"] = s.committed_version;
                               if (s.error) m["error"] = status_to_json(*s.error);
                               return m;
                             },
                             [](const Refusal& r) { return Json{{"type", "error"}, {"error", status_to_json(r.error)}}; },
                             [](const Heartbeat&) { return typed("heartbeat"); }},
                    message);
}

Json encode(const AuthMessage& message) {
  return std::visit(Overload{[](const AuthChallenge& c) {
                               Json m{{"type", "auth_challenge"}, {"protocol", c.protocol}, {"auth", c.auth}};
                               if (!c.nonce.empty()) m["nonce"] = c.nonce;
                               return m;
                             },
                             [](const AuthResponse& r) {
                               Json m{{"type", "auth_response"}, {"auth", r.auth}};
                               if (!r.nonce.empty()) m["nonce"] = r.nonce;
                               if (!r.mac.empty()) m["mac"] = r.mac;
                               return m;
                             },
                             [](const AuthOk& o) {
                               Json m = typed("auth_ok");
                               if (!o.mac.empty()) m["mac"] = o.mac;
                               return m;
                             },
                             [](const Refusal& r) { return Json{{"type", "error"}, {"error", status_to_json(r.error)}}; }},
                    message);
}

StatusOr<RankMessage> decode_rank_message(const Json& m) {
  ASSIGN_OR_RETURN(std::string type, checked_type(m));
  if (type == "join") {
    ASSIGN_OR_RETURN(Join join, decode_join(m));
    return RankMessage(std::move(join));
  }
  if (type == "linked") {
    Linked l;
    if (m.contains("version")) l.version = u64(m, "version");
    if (m.contains("weights_complete")) l.weights_complete = boolean(m, "weights_complete");
    return RankMessage(l);
  }
  if (type == "ready") return RankMessage(Ready{u64(m, "version")});
  if (type == "progress") return RankMessage(Progress{u64(m, "version"), u64(m, "bytes")});
  if (type == "sent") return RankMessage(Sent{u64(m, "version")});
  if (type == "done") {
    Done d{u64(m, "version"), boolean(m, "verified"), m.value("stats", Json::object()), std::string()};
    if (auto path = d.stats.find("memory_path"); path != d.stats.end() && path->is_string()) {
      d.memory_path = path->get<std::string>();
    }
    return RankMessage(std::move(d));
  }
  if (type == "committed") return RankMessage(Committed{u64(m, "version")});
  if (type == "failed") {
    return RankMessage(Failed{u64(m, "version"), status_field(m, "error").value_or(Internal("no error given"))});
  }
  if (type == "request") return RankMessage(Request{u64(m, "version")});
  if (type == "finish") return RankMessage(Finish{});
  if (type == "heartbeat") return RankMessage(Heartbeat{});
  if (type == "setup_failed") {
    SetupFailed f;
    f.protocol = m.contains("protocol") ? u64(m, "protocol") : 0;
    ASSIGN_OR_RETURN(f.role, role_field(m));
    f.rank = static_cast<int>(u64(m, "rank"));
    f.pid = m.contains("pid") ? m["pid"].get<std::int64_t>() : 0;
    f.error = status_field(m, "error").value_or(Internal("no error given"));
    return RankMessage(std::move(f));
  }
  return unknown(type, "a rank's message");
}

StatusOr<CoordinatorMessage> decode_coordinator_message(const Json& m) {
  ASSIGN_OR_RETURN(std::string type, checked_type(m));
  if (type == "setup") {
    ASSIGN_OR_RETURN(Setup setup, decode_setup(m));
    return CoordinatorMessage(std::move(setup));
  }
  if (type == "start") return CoordinatorMessage(Start{u64(m, "version")});
  if (type == "go") return CoordinatorMessage(Go{u64(m, "version")});
  if (type == "commit") return CoordinatorMessage(Commit{u64(m, "version")});
  if (type == "abort") {
    return CoordinatorMessage(Abort{u64(m, "version"), status_field(m, "error").value_or(Internal("no error given"))});
  }
  if (type == "relink") return CoordinatorMessage(Relink{u64(m, "version")});
  if (type == "shutdown") return CoordinatorMessage(Shutdown{status_field(m, "error"), u64(m, "committed_version")});
  if (type == "error") return CoordinatorMessage(Refusal{*status_field(m, "error")});
  if (type == "heartbeat") return CoordinatorMessage(Heartbeat{});
  return unknown(type, "a coordinator's message");
}

StatusOr<AuthMessage> decode_auth_message(const Json& m) {
  ASSIGN_OR_RETURN(std::string type, checked_type(m));
  if (type == "auth_challenge") {
    return AuthMessage(AuthChallenge{u64(m, "protocol"), str(m, "auth"), str(m, "nonce")});
  }
  if (type == "auth_response") return AuthMessage(AuthResponse{str(m, "auth"), str(m, "nonce"), str(m, "mac")});
  if (type == "auth_ok") return AuthMessage(AuthOk{str(m, "mac")});
  if (type == "error") return AuthMessage(Refusal{*status_field(m, "error")});
  // The caller names what it expected; the type says what came.
  return InvalidArgument("got '" + type + "', not an authentication message");
}

std::string message_name(const RankMessage& message) { return encode(message)["type"].get<std::string>(); }
std::string message_name(const CoordinatorMessage& message) { return encode(message)["type"].get<std::string>(); }
std::string message_name(const AuthMessage& message) { return encode(message)["type"].get<std::string>(); }

Status send_message(Link& link, const RankMessage& message, Deadline deadline) {
  return send_control(link, encode(message), deadline);
}
Status send_message(Link& link, const CoordinatorMessage& message, Deadline deadline) {
  return send_control(link, encode(message), deadline);
}
Status send_message(Link& link, const AuthMessage& message, Deadline deadline) {
  return send_control(link, encode(message), deadline);
}

namespace {
template <class T>
StatusOr<T> named(StatusOr<T> decoded, const Link& link) {
  if (decoded.ok()) return decoded;
  return InvalidArgument("malformed control message from " + link.peer() + ": " + decoded.status().message());
}
}  // namespace

StatusOr<RankMessage> recv_rank_message(Link& link, Deadline deadline) {
  ASSIGN_OR_RETURN(Json m, recv_control(link, deadline));
  return named(decode_rank_message(m), link);
}
StatusOr<CoordinatorMessage> recv_coordinator_message(Link& link, Deadline deadline) {
  ASSIGN_OR_RETURN(Json m, recv_control(link, deadline));
  return named(decode_coordinator_message(m), link);
}
StatusOr<AuthMessage> recv_auth_message(Link& link, Deadline deadline, std::uint64_t max_bytes) {
  ASSIGN_OR_RETURN(Json m, recv_control(link, deadline, max_bytes));
  return named(decode_auth_message(m), link);
}

Json status_to_json(const Status& status) {
  return Json{{"code", std::string(status_code_name(status.code()))}, {"message", status.message()}};
}

Status status_from_json(const Json& json) {
  if (!json.is_object()) return Internal("malformed status in control message: not an object");
  auto code_it = json.find("code");
  auto message_it = json.find("message");
  if (code_it == json.end() || !code_it->is_string()) return Internal("malformed status in control message: no string 'code'");
  std::string message;
  if (message_it != json.end()) {
    if (!message_it->is_string()) return Internal("malformed status in control message: 'message' is not a string");
    message = message_it->get<std::string>();
  }
  const std::string& code = code_it->get_ref<const std::string&>();
  for (int c = 1; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    if (status_code_name(static_cast<StatusCode>(c)) == code) return Status(static_cast<StatusCode>(c), message);
  }
  return Internal(message);
}

}  // namespace refit
