// Tests of the control protocol (protocol.h) and its frames
// (control_message.h): what a peer sends is size-bounded, parsed, checked
// against its type's schema and decoded into its struct before anything
// uses it. Each test names the mutation it catches.
#include "control/protocol.h"
#include "testing/expect_has.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>

namespace refit {
namespace {

using namespace std::chrono_literals;

Status Validate(const std::string& text) {
  Json j = Json::parse(text);
  return validate_control_message(j);
}

Json GoodJoin() {
  return Json{{"type", "join"},          {"role", "engine"},      {"rank", 1},          {"pid", 42},
              {"bucket_size", 1 << 20},  {"transport", "shm"},    {"mode", "staged"},   {"trainer_ranks", 2},
              {"engine_ranks", 2},       {"pool_slots", 2},       {"memory_limit", 0},  {"plan_digest", "abc"},
              {"supported_dtypes", {"bf16"}}, {"stream_dtypes", {{"bf16", "w"}}}, {"specs", Json::array()}};
}

// Catches: a schema that refuses what the ranks really send.
TEST(ControlSchema, MessagesRefitSendsAreValid) {
  EXPECT_TRUE(validate_control_message(GoodJoin()).ok()) << validate_control_message(GoodJoin()).ToString();
  for (const char* text :
       {R"({"type":"ready","version":3})", R"({"type":"progress","version":3,"bytes":100})",
        R"({"type":"done","version":3,"verified":true,"stats":{"buckets":1}})",
        R"({"type":"failed","version":3,"error":{"code":"aborted","message":"x"}})",
        R"({"type":"setup","seed":1,"feeders":[0,2],"streams":[[]]})",
        R"({"type":"setup","seed":1,"feeder_count":1,"engine_rank":0,"engine_address":"127.0.0.1:5","descriptor":"d"})",
        R"({"type":"linked"})", R"({"type":"some_future_type","anything":[1,{"a":null}]})"}) {
    EXPECT_TRUE(Validate(text).ok()) << text << ": " << Validate(text).ToString();
  }
}

// Each field the coordinator computes with, given the wrong kind or an
// absurd value. Catches: a missing check that would let the coordinator
// throw (nlohmann's value() on a wrong type), overflow (slots * bucket) or
// index out of range (rank).
TEST(ControlSchema, WrongKindsAndAbsurdValuesAreRefusedNamingTheField) {
  struct Case {
    const char* field;
    Json value;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{{"rank", -1, "field 'rank': expected an integer in 0..1048576, got -1"},
                                         {"rank", "0", "field 'rank'"},
                                         {"rank", 1.5, "non-integer number 1.5"},
                                         {"bucket_size", 1ull << 60, "field 'bucket_size'"},
                                         {"pool_slots", 1 << 20, "field 'pool_slots'"},
                                         {"pid", "me", "field 'pid'"},
                                         {"transport", std::string(100, 'x'), "at most 64 bytes"},
                                         {"stream_dtypes", Json::array(), "field 'stream_dtypes'"},
                                         {"stream_dtypes", {{"bf16", 3}}, "member 'bf16'"},
                                         {"supported_dtypes", {1, 2}, "element 0"},
                                         {"specs", "none", "field 'specs'"}}) {
    Json join = GoodJoin();
    join[c.field] = c.value;
    Status s = validate_control_message(join);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_HAS(s.message(), c.says);
    EXPECT_HAS(s.message(), "'join'");
  }
  Json missing = GoodJoin();
  missing.erase("rank");
  EXPECT_HAS(validate_control_message(missing).message(), "'join' has no field 'rank'");
  EXPECT_HAS(Validate(R"({"type":"progress","bytes":-5})").message(), "'progress' field 'bytes'");
  EXPECT_HAS(Validate(R"({"type":"done","verified":"yes"})").message(), "'done' field 'verified'");
  EXPECT_HAS(Validate(R"({"type":"done","stats":[1]})").message(), "'done' field 'stats'");
  EXPECT_HAS(Validate(R"({"type":"committed","version":"7"})").message(), "'committed' field 'version'");
  EXPECT_HAS(Validate(R"({"type":"error"})").message(), "'error' has no field 'error'");
  EXPECT_HAS(Validate(R"({"type":7})").message(), "no string field 'type'");
  EXPECT_HAS(Validate(R"([1,2])").message(), "must be a JSON object");
}

// Catches: a rank read as a signed integer (a number above INT64_MAX
// wrapping to a negative rank), or a version that is not an unsigned integer.
TEST(ControlFields, NumbersThatDoNotFitAreRefusedNamingTheField) {
  Json join = GoodJoin();
  join["rank"] = Json::parse("18446744073709551615");
  EXPECT_HAS(decode_rank_message(join).status().message(), "'join' field 'rank'");
  EXPECT_HAS(decode_rank_message(Json::parse(R"({"type":"ready","version":-3})")).status().message(),
             "'ready' field 'version'");
  EXPECT_HAS(decode_coordinator_message(Json::parse(R"({"type":"commit","version":"1"})")).status().message(),
             "'commit' field 'version'");
}

// Catches: status_from_json throwing (nlohmann value() on a non-string
// message) when a peer sends a malformed error object.
TEST(ControlFields, MalformedStatusesNeverThrow) {
  for (const char* text : {R"(null)", R"([])", R"({"code":5})", R"({"code":"aborted","message":7})",
                           R"({"code":"no_such_code","message":"m"})"}) {
    Status s = status_from_json(Json::parse(text));
    EXPECT_FALSE(s.ok()) << text;
  }
  Status ok = status_from_json(Json::parse(R"({"code":"aborted","message":"lost engine rank 1"})"));
  EXPECT_EQ(ok.code(), StatusCode::kAborted);
  EXPECT_EQ(ok.message(), "lost engine rank 1");
}

// nlohmann parses iteratively but copies, compares and prints
// recursively: a deeply nested message must be refused before parsing.
// Catches: no depth bound (a rank's 64 MiB "[[[[..." would overflow the
// coordinator's stack when it copies the message), a bound that counts
// brackets inside strings, or one that refuses the setup's real depth.
TEST(ControlParse, NestingIsBoundedOutsideStringsOnly) {
  std::string deep = R"({"type":"done","stats":{"a":)" + std::string(100000, '[') + std::string(100000, ']') + "}}";
  auto r = parse_control_message(deep, "rank x");
  EXPECT_HAS(r.status().message(), "nested 100002 levels deep (at most 16)");
  EXPECT_HAS(r.status().message(), "rank x");
  std::string in_string = R"({"type":"x","s":")" + std::string(1000, '[') + R"(\"{{{"})";
  EXPECT_TRUE(parse_control_message(in_string, "rank x").ok()) << parse_control_message(in_string, "rank x").status().ToString();
  std::string setup = R"({"type":"setup","streams":[[["w","bf16",[4,4]]]],"x":[[[[[[[[[[[]]]]]]]]]]]})";
  EXPECT_TRUE(parse_control_message(setup, "c").ok());
  std::string seventeen = R"({"type":"x","a":)" + std::string(16, '[') + std::string(16, ']') + "}";
  EXPECT_FALSE(parse_control_message(seventeen, "c").ok());
}

struct SocketPair {
  SocketPair() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    a = std::make_unique<Link>(sv[0], "rank a");
    b = std::make_unique<Link>(sv[1], "peer b");
  }
  std::unique_ptr<Link> a, b;
};

// Catches: recv_control reading a payload larger than the caller's bound
// (memory for any peer) and accepting other frame types or non-objects.
TEST(RecvControl, BoundsTypeAndShapeAreCheckedBeforeUse) {
  {
    SocketPair p;
    FrameHeader h;
    h.type = FrameType::kControl;
    h.payload_bytes = 5000;
    ASSERT_TRUE(p.a->send(h, {}, Deadline::After(1s)).ok());  // header only
    auto r = recv_control(*p.b, Deadline::After(1s), 4096);
    EXPECT_HAS(r.status().message(), "5000 payload bytes, more than the 4096 accepted");
  }
  {
    SocketPair p;
    FrameHeader h;
    h.type = FrameType::kCredit;
    ASSERT_TRUE(p.a->send(h, {}, Deadline::After(1s)).ok());
    EXPECT_HAS(recv_control(*p.b, Deadline::After(1s)).status().message(), "expected a control frame, got frame type 2");
  }
  for (std::string text : {std::string("[1]"), std::string("{\"type\":")}) {
    SocketPair p;
    FrameHeader h;
    h.type = FrameType::kControl;
    h.payload_bytes = text.size();
    ASSERT_TRUE(p.a->send(h, std::as_bytes(std::span(text.data(), text.size())), Deadline::After(1s)).ok());
    auto r = recv_control(*p.b, Deadline::After(1s));
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_HAS(r.status().message(), "malformed control message from peer b");
  }
  {
    // A frame that parses but breaks its schema: the typed receive refuses it.
    SocketPair p;
    ASSERT_TRUE(send_control(*p.a, Json{{"type", "join"}}, Deadline::After(1s)).ok());
    auto r = recv_rank_message(*p.b, Deadline::After(1s));
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_HAS(r.status().message(), "malformed control message from peer b");
    EXPECT_HAS(r.status().message(), "'join' has no field 'role'");
  }
  {
    SocketPair p;
    ASSERT_TRUE(send_message(*p.a, RankMessage(Ready{2}), Deadline::After(1s)).ok());
    auto r = recv_rank_message(*p.b, Deadline::After(1s));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(std::holds_alternative<Ready>(*r));
    EXPECT_EQ(std::get<Ready>(*r).version, 2u);
  }
}

// Every message survives encode and decode with every field it carries.
// Catches: a field one side writes under another name than the other
// reads (a trainer's feeder count, an engine's weights_complete), or one
// that encode forgets.
TEST(Protocol, EveryMessageRoundTrips) {
  Join join;
  join.role = Role::kEngine;
  join.rank = 3;
  join.pid = 77;
  join.device = "cuda";
  join.gpu = "GPU-1";
  join.mode = "direct";
  join.trainer_ranks = 4;
  join.engine_ranks = 4;
  join.bucket_size = 1 << 20;
  join.transport = "tcp";
  join.plan_digest = "abc";
  join.data_address = "127.0.0.1:9";
  join.descriptor = "d";
  join.pool_slots = 3;
  join.memory_limit = 5;
  join.supported_dtypes = {"bf16"};
  join.specs = {TensorSpec{"w", DType::kBFloat16, {2, 3}}};
  auto back = decode_rank_message(encode(RankMessage(join)));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const Join& j = std::get<Join>(*back);
  EXPECT_EQ(j.protocol, kControlProtocolVersion);
  EXPECT_EQ(j.role, Role::kEngine);
  EXPECT_EQ(j.rank, 3);
  EXPECT_EQ(j.pid, 77);
  EXPECT_EQ(j.gpu, "GPU-1");
  EXPECT_EQ(j.mode, "direct");
  EXPECT_EQ(j.bucket_size, 1u << 20);
  EXPECT_EQ(j.pool_slots, 3u);
  EXPECT_EQ(j.memory_limit, 5u);
  EXPECT_EQ(j.supported_dtypes, join.supported_dtypes);
  EXPECT_EQ(j.specs, join.specs);

  refit::Setup setup;
  setup.seed = 9;
  setup.engine_rank = 1;
  setup.engine_address = "h:1";
  setup.descriptor = "x";
  setup.engine_device = "cuda";
  setup.trainer_index = 2;
  setup.feeder_count = 3;
  setup.on_demand = true;
  auto s = decode_coordinator_message(encode(CoordinatorMessage(setup)));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const refit::Setup& t = std::get<refit::Setup>(*s);
  EXPECT_EQ(t.seed, 9u);
  EXPECT_EQ(t.engine_address, "h:1");
  EXPECT_EQ(t.engine_device, "cuda");
  EXPECT_EQ(t.trainer_index, 2u);
  EXPECT_EQ(t.feeder_count, 3u);
  EXPECT_TRUE(t.on_demand);

  auto linked = decode_rank_message(encode(RankMessage(Linked{4, true})));
  ASSERT_TRUE(linked.ok());
  EXPECT_EQ(std::get<Linked>(*linked).version, 4u);
  EXPECT_EQ(std::get<Linked>(*linked).weights_complete, true);
  auto done = decode_rank_message(encode(RankMessage(Done{5, true, Json{{"bytes", 1}}, "host-staged"})));
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(std::get<Done>(*done).verified);
  EXPECT_EQ(std::get<Done>(*done).memory_path, "host-staged");
  auto shutdown = decode_coordinator_message(encode(CoordinatorMessage(Shutdown{Aborted("lost x"), 7})));
  ASSERT_TRUE(shutdown.ok());
  EXPECT_EQ(std::get<Shutdown>(*shutdown).committed_version, 7u);
  EXPECT_EQ(std::get<Shutdown>(*shutdown).error->message(), "lost x");
  auto abort = decode_coordinator_message(encode(CoordinatorMessage(Abort{6, DeadlineExceeded("late")})));
  ASSERT_TRUE(abort.ok());
  EXPECT_EQ(std::get<Abort>(*abort).error.code(), StatusCode::kDeadlineExceeded);
  // A setup failure keeps who failed and why (the coordinator names both).
  auto failed = decode_rank_message(encode(RankMessage(SetupFailed{kControlProtocolVersion, Role::kEngine, 3, 42,
                                                                   NotFound("no model 'x'")})));
  ASSERT_TRUE(failed.ok()) << failed.status().ToString();
  EXPECT_EQ(std::get<SetupFailed>(*failed).role, Role::kEngine);
  EXPECT_EQ(std::get<SetupFailed>(*failed).rank, 3);
  EXPECT_EQ(std::get<SetupFailed>(*failed).pid, 42);
  EXPECT_EQ(std::get<SetupFailed>(*failed).error.code(), StatusCode::kNotFound);
  EXPECT_EQ(std::get<SetupFailed>(*failed).error.message(), "no model 'x'");
  for (const RankMessage& m : {RankMessage(Ready{1}), RankMessage(Progress{1, 2}), RankMessage(Sent{1}),
                               RankMessage(Committed{1}), RankMessage(Failed{1, Internal("x")}),
                               RankMessage(Request{1}), RankMessage(Finish{}), RankMessage(Heartbeat{})}) {
    auto d = decode_rank_message(encode(m));
    ASSERT_TRUE(d.ok()) << message_name(m);
    EXPECT_EQ(d->index(), m.index()) << message_name(m);
  }
  for (const CoordinatorMessage& m : {CoordinatorMessage(Start{1}), CoordinatorMessage(Go{1}),
                                      CoordinatorMessage(Commit{1}), CoordinatorMessage(Relink{1}),
                                      CoordinatorMessage(Refusal{Internal("no")}), CoordinatorMessage(Heartbeat{})}) {
    auto d = decode_coordinator_message(encode(m));
    ASSERT_TRUE(d.ok()) << message_name(m);
    EXPECT_EQ(d->index(), m.index()) << message_name(m);
  }
  for (const AuthMessage& m : {AuthMessage(AuthChallenge{1, "none", ""}), AuthMessage(AuthResponse{"none", "", ""}),
                               AuthMessage(AuthOk{"ab"}), AuthMessage(Refusal{Internal("no")})}) {
    auto d = decode_auth_message(encode(m));
    ASSERT_TRUE(d.ok()) << message_name(m);
    EXPECT_EQ(d->index(), m.index()) << message_name(m);
  }
}

// Direct mode over shadow weights: an engine's join says shadow and a start
// the arena the trainers write; both absent on the wire mean false and 0,
// and an arena other than 0 or 1 is refused. Catches: either field dropped
// by encode or decode (the trainers would write the served arena).
TEST(Protocol, AShadowEnginesJoinAndAStartsArenaRoundTrip) {
  Join join;
  join.role = Role::kEngine;
  join.shadow = true;
  auto back = decode_rank_message(encode(RankMessage(join)));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(std::get<Join>(*back).shadow);
  join.shadow = false;
  EXPECT_FALSE(encode(RankMessage(join)).contains("shadow"));
  auto start = decode_coordinator_message(encode(CoordinatorMessage(Start{4, 1})));
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(std::get<Start>(*start).arena, 1u);
  EXPECT_FALSE(encode(CoordinatorMessage(Start{4, 0})).contains("arena"));
  Json bad = encode(CoordinatorMessage(Start{4, 1}));
  bad["arena"] = 2;
  EXPECT_FALSE(decode_coordinator_message(bad).ok());
}

// Partial refits (protocol 11): request's and start's globs and ready's
// plan digest round trip, absent when empty; a glob that is not a string is
// refused naming the field. Catches: `only` dropped by encode or decode (a
// partial refit would run full on one side only), the digest dropped (the
// coordinator could not compare the plans).
TEST(Protocol, PartialRefitFieldsRoundTrip) {
  const std::vector<std::string> only{"*.q_proj.weight", "*norm*"};
  auto request = decode_rank_message(encode(RankMessage(Request{3, only})));
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  EXPECT_EQ(std::get<Request>(*request).only, only);
  EXPECT_FALSE(encode(RankMessage(Request{3})).contains("only"));
  Start start{3, 0, only};
  auto started = decode_coordinator_message(encode(CoordinatorMessage(start)));
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  EXPECT_EQ(std::get<Start>(*started).only, only);
  EXPECT_FALSE(encode(CoordinatorMessage(Start{3})).contains("only"));
  auto ready = decode_rank_message(encode(RankMessage(Ready{3, "0123456789abcdef"})));
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_EQ(std::get<Ready>(*ready).plan_digest, "0123456789abcdef");
  EXPECT_FALSE(encode(RankMessage(Ready{3})).contains("plan_digest"));
  Join join;
  join.role = Role::kEngine;
  join.partial = true;
  auto joined = decode_rank_message(encode(RankMessage(join)));
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  EXPECT_TRUE(std::get<Join>(*joined).partial);
  join.partial = false;
  EXPECT_FALSE(encode(RankMessage(join)).contains("partial"));
  Json bad = encode(RankMessage(Request{3, only}));
  bad["only"] = Json::array({"*norm*", 7});
  auto refused = decode_rank_message(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("only"), std::string::npos) << refused.status().ToString();
}

// Release between refits: the setup's flag and the four messages keep
// every field; a descriptor that is not a string is refused. Catches: the
// flag dropped by encode (no rank would release), descriptors lost or
// reordered, a released without its bytes accepted as 0.
TEST(Protocol, ReleaseAndAcquireMessagesRoundTrip) {
  refit::Setup setup;
  setup.release_between_refits = true;
  auto s = decode_coordinator_message(encode(CoordinatorMessage(setup)));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(std::get<refit::Setup>(*s).release_between_refits);
  EXPECT_FALSE(encode(CoordinatorMessage(refit::Setup{})).contains("release_between_refits"));
  auto release = decode_coordinator_message(encode(CoordinatorMessage(Release{3})));
  ASSERT_TRUE(release.ok()) << release.status().ToString();
  EXPECT_EQ(std::get<Release>(*release).version, 3u);
  auto acquire = decode_coordinator_message(encode(CoordinatorMessage(Acquire{4, {"cuda_ipc:b", "cuda_ipc:a"}})));
  ASSERT_TRUE(acquire.ok()) << acquire.status().ToString();
  EXPECT_EQ(std::get<Acquire>(*acquire).descriptors, (std::vector<std::string>{"cuda_ipc:b", "cuda_ipc:a"}));
  auto released = decode_rank_message(encode(RankMessage(Released{3, std::uint64_t{1} << 40})));
  ASSERT_TRUE(released.ok()) << released.status().ToString();
  EXPECT_EQ(std::get<Released>(*released).bytes, std::uint64_t{1} << 40);
  auto acquired = decode_rank_message(encode(RankMessage(Acquired{4, "shm:@pool"})));
  ASSERT_TRUE(acquired.ok()) << acquired.status().ToString();
  EXPECT_EQ(std::get<Acquired>(*acquired).descriptor, "shm:@pool");
  Json bad = encode(CoordinatorMessage(Acquire{4, {"x"}}));
  bad["descriptors"] = Json::array({7});
  EXPECT_FALSE(decode_coordinator_message(bad).ok());
  Json no_bytes = encode(RankMessage(Released{3, 9}));
  no_bytes.erase("bytes");
  EXPECT_FALSE(decode_rank_message(no_bytes).ok());
}

// The amax exchange's messages keep every entry exactly (bits included:
// 0x7F7FFFFF is FLT_MAX); an entry that is not [tensor, block, bits] of
// integers >= 0, or bits above a finite amax, is refused naming the entry.
// Catches: entries dropped or reordered by encode, bits read as a float
// (FLT_MAX's bits would not survive a float's JSON text), and a NaN's bits
// (0x7FC00000) let through into the combination.
TEST(Protocol, AmaxSharesAndTablesRoundTripAndMalformedEntriesAreRefused) {
  const std::vector<AmaxEntry> entries = {{3, 0, 0x7F7FFFFF}, {0, 12, 0}, {1, std::uint64_t{1} << 40, 0x3F800000}};
  auto share = decode_rank_message(encode(RankMessage(AmaxShare{4, entries})));
  ASSERT_TRUE(share.ok()) << share.status().ToString();
  EXPECT_EQ(std::get<AmaxShare>(*share).version, 4u);
  EXPECT_EQ(std::get<AmaxShare>(*share).entries, entries);
  auto table = decode_coordinator_message(encode(CoordinatorMessage(AmaxTable{4, entries})));
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ(std::get<AmaxTable>(*table).entries, entries);
  for (const Json& bad : {Json::array({1, 2}), Json::array({1, -2, 3}), Json::array({1, 2, 0x7FC00000}),
                          Json::array({1, 2, "3"})}) {
    Json m = {{"type", "amax_share"}, {"version", 1}, {"entries", Json::array({Json::array({0, 0, 0}), bad})}};
    EXPECT_HAS(decode_rank_message(m).status().message(), "'amax_share' entry 1: expected [tensor, block, bits]")
        << bad.dump();
  }
  Json not_list = {{"type", "amax_table"}, {"version", 1}, {"entries", 7}};
  EXPECT_HAS(decode_coordinator_message(not_list).status().message(), "entries");
  Json not_entries = {{"type", "amax_table"}, {"version", 1}, {"entries", Json::array({5})}};
  EXPECT_HAS(decode_coordinator_message(not_entries).status().message(), "entries");
}

// A sharded trainer's join says whether it quantizes (the coordinator runs
// the amax exchange on it). Catches: encode_join dropping a trainer's
// "quantize" (tried once: the Python sharded FP8 test's coordinator then
// refused the shares as "this job exchanges no amax", and this test fails).
TEST(Protocol, AShardedTrainersJoinCarriesItsQuantize) {
  Join join;
  join.role = Role::kTrainer;
  join.layout = "fsdp:3";
  join.quantize = "fp8-block128";
  auto back = decode_rank_message(encode(RankMessage(join)));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(std::get<Join>(*back).quantize, "fp8-block128");
}

// A join's shard rules (one per spec, stream order) survive encode and
// decode for either role; a join without them is accepted with none.
// Catches: encode_join dropping "rules" (mutation: its
// `m["rules"] = rules_to_json(j.rules)` line removed, so the rules come
// back empty), or a schema that makes them required.
TEST(Protocol, JoinRulesRoundTripForEitherRoleAndAreOptional) {
  for (Role role : {Role::kTrainer, Role::kEngine}) {
    SCOPED_TRACE(role_name(role));
    Join join;
    join.role = role;
    join.specs = {TensorSpec{"embed", DType::kBFloat16, {4, 2}}, TensorSpec{"norm", DType::kFloat32, {2}},
                  TensorSpec{"o_proj", DType::kBFloat16, {2, 1}}};
    join.rules = {ShardRule::kVocab, ShardRule::kReplicated, ShardRule::kRow};
    const Json wire = encode(RankMessage(join));
    EXPECT_EQ(wire.at("rules"), Json({"vocab", "replicated", "row"}));
    auto back = decode_rank_message(wire);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(std::get<Join>(*back).rules, join.rules);
  }
  Join without;  // a rank that knows no rules (or predates them)
  without.role = Role::kEngine;
  without.specs = {TensorSpec{"w", DType::kBFloat16, {2}}};
  const Json wire = encode(RankMessage(without));
  EXPECT_FALSE(wire.contains("rules"));
  auto back = decode_rank_message(wire);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(std::get<Join>(*back).specs, without.specs);
  EXPECT_TRUE(std::get<Join>(*back).rules.empty());
}

// Catches: a join whose rules do not match its specs one to one accepted
// (mutation: rules_field's count check removed, so one rule for two specs
// decodes and a digest mismatch could show another tensor's rule), an
// unknown rule name accepted or refused without the field's name (mutation:
// rules_field's `if (!rule.ok())` return dropped), and a rule of the wrong
// JSON kind passing the schema.
TEST(Protocol, JoinRulesOfAnotherCountOrUnknownNameAreRefusedNamingTheField) {
  Join join;
  join.role = Role::kEngine;
  join.specs = {TensorSpec{"a", DType::kBFloat16, {2}}, TensorSpec{"b", DType::kBFloat16, {2}}};
  join.rules = {ShardRule::kColumn, ShardRule::kRow};
  const Json good = encode(RankMessage(join));
  ASSERT_TRUE(decode_rank_message(good).ok());

  Json fewer = good;
  fewer["rules"] = Json::array({"column"});
  Status s = decode_rank_message(fewer).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "'join' field 'rules': expected one shard rule per spec (2), got 1");
  Json without_specs = good;
  without_specs.erase("specs");
  EXPECT_HAS(decode_rank_message(without_specs).status().message(),
             "'join' field 'rules': expected one shard rule per spec (0), got 2");

  Json unknown = good;
  unknown["rules"][1] = "diagonal";
  s = decode_rank_message(unknown).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "'join' field 'rules': element 1: unknown shard rule 'diagonal'");

  Json wrong_kind = good;
  wrong_kind["rules"][0] = 3;
  EXPECT_HAS(decode_rank_message(wrong_kind).status().message(), "'join' field 'rules': element 0 must be a string");
  wrong_kind["rules"] = "column";
  EXPECT_HAS(decode_rank_message(wrong_kind).status().message(), "'join' field 'rules': expected an array");
}

// Catches: a decoder that accepts a message meant for the other direction
// (a rank taking a join for a coordinator's message) or an unknown type.
TEST(Protocol, UnknownAndMisdirectedTypesAreRefusedNamingThem) {
  auto unknown = decode_rank_message(Json::parse(R"({"type":"some_future_type"})"));
  EXPECT_HAS(unknown.status().message(), "unexpected control message 'some_future_type'");
  auto misdirected = decode_coordinator_message(encode(RankMessage(Ready{1})));
  EXPECT_HAS(misdirected.status().message(), "unexpected control message 'ready'");
  auto role = decode_rank_message(Json::parse(R"({"type":"join","role":"spy","rank":0})"));
  EXPECT_HAS(role.status().message(), "unknown role 'spy'");
}

// Catches: heartbeat settings that let a peer be lost before it could
// have sent one (a timeout not above the interval), or a zero interval (a
// busy loop).
TEST(Protocol, HeartbeatTimingNeedsATimeoutAboveThePositiveInterval) {
  auto ok = heartbeat_timing(1, 10, "coordinator");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->interval, std::chrono::milliseconds(1000));
  EXPECT_EQ(ok->timeout, std::chrono::milliseconds(10000));
  EXPECT_HAS(heartbeat_timing(0, 10, "engine rank 1").status().message(), "engine rank 1: --heartbeat-interval 0 s");
  EXPECT_HAS(heartbeat_timing(5, 5, "coordinator").status().message(),
             "--heartbeat-timeout 5 s must be above the heartbeat interval (5 s)");
}

}  // namespace
}  // namespace refit

namespace refit {
namespace {

// Engines joining and a root that moves (protocol 10): a join's catch_up,
// catch_up(v, engine), and a relink's route with a trainer's new target
// round-trip; catch_up without its engine is refused. Catches: any of them
// dropped by encode or decode (a joiner's parent never found able to send;
// the parent told to feed engine 0; a trainer relinked to the dropped root).
TEST(Protocol, JoiningEnginesAndARootThatMovesRoundTrip) {
  Join join;
  join.role = Role::kEngine;
  join.catch_up = true;
  auto back = decode_rank_message(encode(RankMessage(join)));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(std::get<Join>(*back).catch_up);
  auto catch_up = decode_coordinator_message(encode(CoordinatorMessage(CatchUp{3, 2})));
  ASSERT_TRUE(catch_up.ok()) << catch_up.status().ToString();
  EXPECT_EQ(std::get<CatchUp>(*catch_up).version, 3u);
  EXPECT_EQ(std::get<CatchUp>(*catch_up).engine, 2u);
  EXPECT_FALSE(validate_control_message(Json{{"type", "catch_up"}, {"version", 3}}).ok());
  EngineTarget root;
  root.engine = 1;
  root.engine_rank = 0;
  root.address = "10.0.0.2:4000";
  root.descriptor = "shm:/refit-1";
  Relink relink{2, Route{{}, {}, {root}, {{Part{0, 4096}, Part{1, 100}}, {Part{1, 512}}}}};
  auto relinked = decode_coordinator_message(encode(CoordinatorMessage(relink)));
  ASSERT_TRUE(relinked.ok()) << relinked.status().ToString();
  ASSERT_TRUE(std::get<Relink>(*relinked).route.has_value());
  EXPECT_EQ(*std::get<Relink>(*relinked).route, *relink.route);
}

}  // namespace
}  // namespace refit
