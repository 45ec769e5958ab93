// Tests of control-message bounds and validation (control_message.h): what a
// peer sends is size-bounded, parsed and checked against its type's schema
// before anything uses it. Each test names the mutation it catches.
#include "control/control_message.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>

namespace refit {
namespace {

using namespace std::chrono_literals;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "expected \"" << (needle) << "\" in: " << (haystack)

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
        R"({"type":"setup","seed":1,"feeders":1,"engine_rank":0,"engine_address":"127.0.0.1:5","descriptor":"d"})",
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

// Catches: json_int wrapping a number above INT64_MAX to a negative rank.
TEST(ControlFields, IntegerAccessorsRefuseWhatDoesNotFit) {
  Json m = Json::parse(R"({"type":"x","big":18446744073709551615,"neg":-3,"s":"1"})");
  EXPECT_FALSE(json_int(m, "big").ok());
  EXPECT_EQ(*json_uint(m, "big"), 18446744073709551615ull);
  EXPECT_EQ(*json_int(m, "neg"), -3);
  EXPECT_FALSE(json_uint(m, "neg").ok());
  EXPECT_FALSE(json_uint(m, "s").ok());
  EXPECT_HAS(json_bool(m, "s").status().message(), "control message 'x' field 's'");
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
  for (std::string text : {std::string("[1]"), std::string("{\"type\":"), std::string("{\"type\":\"join\"}")}) {
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
    SocketPair p;
    ASSERT_TRUE(send_control(*p.a, Json{{"type", "ready"}, {"version", 2}}, Deadline::After(1s)).ok());
    auto r = recv_control(*p.b, Deadline::After(1s));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)["version"], 2);
  }
}

}  // namespace
}  // namespace refit
