#include "control/protocol.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "control/route_json.h"
#include "control/shard_json.h"
#include "control/spec_json.h"
#include "refit/checkpoint.h"

namespace refit {

// The schemas and validate_control_message: protocol_schema.cc.

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
// A partial refit's globs (the schema checked they are strings); absent: none.
std::vector<std::string> globs(const Json& m) {
  std::vector<std::string> out;
  if (auto it = m.find("only"); it != m.end()) {
    for (const Json& g : *it) out.push_back(g.get<std::string>());
  }
  return out;
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
  j.engine = u64(m, "engine");
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
  j.quantize = str(m, "quantize", "none");
  j.quantized_tensors = u64(m, "quantized_tensors");
  if (auto it = m.find("shadow"); it != m.end()) j.shadow = it->get<bool>();
  if (auto it = m.find("partial"); it != m.end()) j.partial = it->get<bool>();
  if (auto it = m.find("catch_up"); it != m.end()) j.catch_up = it->get<bool>();
  if (auto it = m.find("change"); it != m.end()) j.change = it->get<std::uint64_t>();
  if (auto it = m.find("delta"); it != m.end()) j.delta = it->get<bool>();
  ASSIGN_OR_RETURN(j.specs, specs_field(m, "join", "specs"));
  ASSIGN_OR_RETURN(j.rules, rules_field(m, j.specs.size()));
  j.layout = str(m, "layout", "full");
  j.transfer_digest = str(m, "transfer_digest");
  if (auto it = m.find("feeds"); it != m.end()) {
    ASSIGN_OR_RETURN(j.feeds, feeds_from_json(*it, "'join' field 'feeds'"));
  }
  return j;
}

Json encode_join(const Join& j) {
  Json m{{"type", "join"},          {"protocol", j.protocol},         {"role", role_name(j.role)},
         {"rank", j.rank},          {"pid", j.pid},                   {"device", j.device},
         {"mode", j.mode},          {"trainer_ranks", j.trainer_ranks}, {"engine_ranks", j.engine_ranks},
         {"bucket_size", j.bucket_size}, {"transport", j.transport},  {"plan_digest", j.plan_digest}};
  if (!j.gpu.empty()) m["gpu"] = j.gpu;
  if (j.change != (std::uint64_t{1} << 32)) m["change"] = j.change;
  if (j.delta) m["delta"] = true;
  if (j.engine != 0) m["engine"] = j.engine;
  if (j.role == Role::kTrainer) {
    m["engine_rank"] = j.engine_rank;
    m["stream_dtypes"] = j.stream_dtypes;
    // Its plan of the engine rank's stream: a digest mismatch then names
    // the first tensor that differs (topology.cc).
    if (!j.specs.empty()) m["specs"] = specs_to_json(j.specs);
    if (j.layout != "full") {
      m["layout"] = j.layout;
      m["transfer_digest"] = j.transfer_digest;
      m["feeds"] = feeds_to_json(j.feeds);
      if (j.quantize != "none") m["quantize"] = j.quantize;  // the amax exchange (amax_exchange.h)
    }
  } else {
    m["data_address"] = j.data_address;
    m["descriptor"] = j.descriptor;
    m["pool_slots"] = j.pool_slots;
    m["memory_limit"] = j.memory_limit;
    m["supported_dtypes"] = j.supported_dtypes;
    if (j.shadow) m["shadow"] = true;
    if (j.partial) m["partial"] = true;
    if (j.catch_up) m["catch_up"] = true;
    if (j.quantize != "none") {
      m["quantize"] = j.quantize;
      m["quantized_tensors"] = j.quantized_tensors;
    }
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
  if (auto it = m.find("parts"); it != m.end()) {
    ASSIGN_OR_RETURN(s.parts, bucket_parts_from_json(*it, "'setup' field 'parts'"));
  }
  if (auto it = m.find("targets"); it != m.end()) {
    ASSIGN_OR_RETURN(s.targets, targets_from_json(*it, "'setup' field 'targets'"));
    s.on_demand = boolean(m, "on_demand");
  }
  s.release_between_refits = boolean(m, "release_between_refits");
  s.engines = u64(m, "engines", 1);
  s.engine = u64(m, "engine");
  if (auto it = m.find("relay"); it != m.end()) {
    ASSIGN_OR_RETURN(s.relay, targets_from_json(*it, "'setup' field 'relay'"));
  }
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
  if (!s.parts.empty()) m["parts"] = bucket_parts_to_json(s.parts);
  if (!s.targets.empty()) {
    m["targets"] = targets_to_json(s.targets);
    m["on_demand"] = s.on_demand;
  }
  if (s.release_between_refits) m["release_between_refits"] = true;
  if (s.engines != 1) m["engines"] = s.engines;
  if (s.engine != 0) m["engine"] = s.engine;
  if (!s.relay.empty()) m["relay"] = targets_to_json(s.relay);
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

Json amax_message(const char* type, std::uint64_t version, const std::vector<AmaxEntry>& entries) {
  Json m = versioned(type, version);
  Json list = Json::array();
  for (const AmaxEntry& e : entries) list.push_back(Json::array({e.tensor, e.block, e.bits}));
  m["entries"] = std::move(list);
  return m;
}

// "entries": [[tensor, block, bits], ...]; each an array of three integers
// >= 0, bits a finite amax >= 0 (at most kMaxAmaxBits).
StatusOr<std::vector<AmaxEntry>> amax_entries(const Json& m, const std::string& type) {
  std::vector<AmaxEntry> out;
  if (!m.contains("entries")) return out;
  for (std::size_t i = 0; i < m["entries"].size(); ++i) {
    const Json& e = m["entries"][i];
    // An integer >= 0 (parsed text gives unsigned; a Json built in memory, signed).
    auto natural = [](const Json& v) {
      return v.is_number_integer() && (v.is_number_unsigned() || v.get<std::int64_t>() >= 0);
    };
    const bool whole = e.is_array() && e.size() == 3 && natural(e[0]) && natural(e[1]) && natural(e[2]);
    if (!whole || e[2].get<std::uint64_t>() > kMaxAmaxBits) {
      return InvalidArgument("'" + type + "' entry " + std::to_string(i) +
                             ": expected [tensor, block, bits], integers >= 0 and bits of a finite amax >= 0 (at "
                             "most " + std::to_string(kMaxAmaxBits) + ")");
    }
    out.push_back({e[0].get<std::uint64_t>(), e[1].get<std::uint64_t>(), e[2].get<std::uint32_t>()});
  }
  return out;
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

std::string feeder_name(std::uint64_t feeder) {
  if (is_relay_feeder(feeder)) return "engine " + std::to_string(feeder - kRelayFeederBase) + " (relay)";
  return "trainer rank " + std::to_string(feeder);
}

Json encode(const RankMessage& message) {
  return std::visit(
      Overload{[](const Join& j) { return encode_join(j); },
               [](const Linked& l) {
                 Json m = typed("linked");
                 if (l.version) m["version"] = *l.version;
                 if (l.weights_complete) m["weights_complete"] = *l.weights_complete;
                 return m;
               },
               [](const Ready& r) {
                 Json m = versioned("ready", r.version);
                 if (!r.plan_digest.empty()) m["plan_digest"] = r.plan_digest;
                 return m;
               },
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
               [](const Request& r) {
                 Json m = versioned("request", r.version);
                 if (!r.only.empty()) m["only"] = r.only;
                 return m;
               },
               [](const Finish&) { return typed("finish"); },
               [](const Heartbeat&) { return typed("heartbeat"); },
               [](const SetupFailed& f) {
                 Json m = typed("setup_failed");
                 m["protocol"] = f.protocol;
                 m["role"] = role_name(f.role);
                 m["rank"] = f.rank;
                 if (f.engine != 0) m["engine"] = f.engine;
                 m["pid"] = f.pid;
                 m["error"] = status_to_json(f.error);
                 return m;
               },
               [](const AmaxShare& a) { return amax_message("amax_share", a.version, a.entries); },
               [](const Released& r) {
                 Json m = versioned("released", r.version);
                 m["bytes"] = r.bytes;
                 return m;
               },
               [](const Acquired& a) {
                 Json m = versioned("acquired", a.version);
                 m["descriptor"] = a.descriptor;
                 return m;
               }},
      message);
}

Json encode(const CoordinatorMessage& message) {
  return std::visit(Overload{[](const Setup& s) { return encode_setup(s); },
                             [](const Start& s) {
                               Json m = versioned("start", s.version);
                               if (s.arena != 0) m["arena"] = s.arena;
                               if (!s.only.empty()) m["only"] = s.only;
                               return m;
                             },
                             [](const Go& g) { return versioned("go", g.version); },
                             [](const Commit& c) { return versioned("commit", c.version); },
                             [](const Abort& a) {
                               Json m = versioned("abort", a.version);
                               m["error"] = status_to_json(a.error);
                               return m;
                             },
                             [](const Relink& r) {
                               Json m = versioned("relink", r.version);
                               if (r.route) m["route"] = route_to_json(*r.route);
                               return m;
                             },
                             [](const Shutdown& s) {
                               Json m = typed("shutdown");
                               m["committed_version"] = s.committed_version;
                               if (s.error) m["error"] = status_to_json(*s.error);
                               return m;
                             },
                             [](const Refusal& r) { return Json{{"type", "error"}, {"error", status_to_json(r.error)}}; },
                             [](const Heartbeat&) { return typed("heartbeat"); },
                             [](const AmaxTable& a) { return amax_message("amax_table", a.version, a.entries); },
                             [](const Release& r) { return versioned("release", r.version); },
                             [](const Acquire& a) {
                               Json m = versioned("acquire", a.version);
                               if (!a.descriptors.empty()) m["descriptors"] = a.descriptors;
                               return m;
                             },
                             [](const CatchUp& c) {
                               Json m = versioned("catch_up", c.version);
                               m["engine"] = c.engine;
                               return m;
                             }},
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
  if (type == "ready") return RankMessage(Ready{u64(m, "version"), m.value("plan_digest", std::string())});
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
  if (type == "request") return RankMessage(Request{u64(m, "version"), globs(m)});
  if (type == "finish") return RankMessage(Finish{});
  if (type == "heartbeat") return RankMessage(Heartbeat{});
  if (type == "setup_failed") {
    SetupFailed f;
    f.protocol = m.contains("protocol") ? u64(m, "protocol") : 0;
    ASSIGN_OR_RETURN(f.role, role_field(m));
    f.rank = static_cast<int>(u64(m, "rank"));
    f.engine = u64(m, "engine");
    f.pid = m.contains("pid") ? m["pid"].get<std::int64_t>() : 0;
    f.error = status_field(m, "error").value_or(Internal("no error given"));
    return RankMessage(std::move(f));
  }
  if (type == "amax_share") {
    ASSIGN_OR_RETURN(std::vector<AmaxEntry> entries, amax_entries(m, type));
    return RankMessage(AmaxShare{u64(m, "version"), std::move(entries)});
  }
  if (type == "released") return RankMessage(Released{u64(m, "version"), u64(m, "bytes")});
  if (type == "acquired") return RankMessage(Acquired{u64(m, "version"), str(m, "descriptor")});
  return unknown(type, "a rank's message");
}

StatusOr<CoordinatorMessage> decode_coordinator_message(const Json& m) {
  ASSIGN_OR_RETURN(std::string type, checked_type(m));
  if (type == "setup") {
    ASSIGN_OR_RETURN(Setup setup, decode_setup(m));
    return CoordinatorMessage(std::move(setup));
  }
  if (type == "start") return CoordinatorMessage(Start{u64(m, "version"), u64(m, "arena"), globs(m)});
  if (type == "go") return CoordinatorMessage(Go{u64(m, "version")});
  if (type == "commit") return CoordinatorMessage(Commit{u64(m, "version")});
  if (type == "abort") {
    return CoordinatorMessage(Abort{u64(m, "version"), status_field(m, "error").value_or(Internal("no error given"))});
  }
  if (type == "relink") {
    Relink relink{u64(m, "version"), std::nullopt};
    if (auto it = m.find("route"); it != m.end()) {
      ASSIGN_OR_RETURN(relink.route, route_from_json(*it, "'relink' field 'route'"));
    }
    return CoordinatorMessage(std::move(relink));
  }
  if (type == "shutdown") return CoordinatorMessage(Shutdown{status_field(m, "error"), u64(m, "committed_version")});
  if (type == "error") return CoordinatorMessage(Refusal{*status_field(m, "error")});
  if (type == "heartbeat") return CoordinatorMessage(Heartbeat{});
  if (type == "amax_table") {
    ASSIGN_OR_RETURN(std::vector<AmaxEntry> entries, amax_entries(m, type));
    return CoordinatorMessage(AmaxTable{u64(m, "version"), std::move(entries)});
  }
  if (type == "release") return CoordinatorMessage(Release{u64(m, "version")});
  if (type == "catch_up") return CoordinatorMessage(CatchUp{u64(m, "version"), u64(m, "engine")});
  if (type == "acquire") {
    Acquire a{u64(m, "version"), {}};
    if (auto it = m.find("descriptors"); it != m.end()) {
      for (const Json& d : *it) a.descriptors.push_back(d.get<std::string>());
    }
    return CoordinatorMessage(std::move(a));
  }
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
