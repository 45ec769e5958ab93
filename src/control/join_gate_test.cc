// Tests of the coordinator's JoinGate (join_gate.h) over real loopback
// sockets: authentication and the join are read off the coordinator's
// thread, one handshake per connection, so no peer can block another.
#include "control/join_gate.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "control/control_client.h"

namespace refit {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const Secret kSecret("0123456789abcdef-the-shared-secret");

struct Gate {
  explicit Gate(JoinGate::Options options = {}) {
    auto l = Listener::Listen("127.0.0.1", 0);
    EXPECT_TRUE(l.ok());
    address = (*l)->address();
    if (options.secret.empty()) options.secret = kSecret;
    options.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(line);
    };
    auto g = JoinGate::Start(std::move(*l), std::move(options));
    EXPECT_TRUE(g.ok());
    gate = std::move(*g);
  }
  // Waits for the next candidate (polls fd() as the coordinator does).
  std::optional<JoinGate::Candidate> Next(std::chrono::milliseconds within) {
    auto until = Clock::now() + within;
    while (Clock::now() < until) {
      pollfd p{gate->fd(), POLLIN, 0};
      ::poll(&p, 1, 20);
      if (auto c = gate->take()) return c;
    }
    return std::nullopt;
  }
  std::string Log() {
    std::lock_guard<std::mutex> lock(mu);
    std::string all;
    for (auto& l : lines) all += l + "\n";
    return all;
  }
  std::string address;
  std::mutex mu;
  std::vector<std::string> lines;
  std::unique_ptr<JoinGate> gate;
};

// An engine rank's join (only what the gate reads).
RankMessage EngineJoin(int rank) {
  refit::Join join;
  join.role = Role::kEngine;
  join.rank = rank;
  return join;
}

// A rank that authenticates and joins; returns its client (kept open).
std::unique_ptr<ControlClient> Join(const std::string& address, const Secret& secret, int rank) {
  auto c = ControlClient::Connect(address, secret, Deadline::After(5s));
  if (!c.ok()) return nullptr;
  // Not join(): it waits for the coordinator's reply, and the gate only
  // queues the join.
  if (!(*c)->send(EngineJoin(rank)).ok()) return nullptr;
  return std::move(*c);
}

// Catches: handshakes done one after the other on one thread (a silent
// peer would then hold every other rank for the whole auth timeout).
TEST(JoinGate, SilentConnectionsDoNotDelayAGoodRank) {
  Gate g;
  std::vector<std::unique_ptr<Link>> silent;
  for (int i = 0; i < 3; ++i) {
    auto l = Link::Connect(g.address, "silent", Deadline::After(5s));
    ASSERT_TRUE(l.ok());
    silent.push_back(std::move(*l));
  }
  auto start = Clock::now();
  auto rank = Join(g.address, kSecret, 1);
  ASSERT_NE(rank, nullptr);
  auto c = g.Next(3s);
  ASSERT_TRUE(c.has_value());
  EXPECT_LT(Clock::now() - start, 2s);  // the auth timeout is 5 s
  EXPECT_EQ(c->join["rank"], 1);
  EXPECT_EQ(c->join["role"], "engine");
}

// Catches: a gate that queues a peer with the wrong secret, or refuses it
// without logging who and why.
TEST(JoinGate, WrongSecretIsRefusedAndLogged) {
  Gate g;
  auto c = ControlClient::Connect(g.address, Secret("fedcba9876543210-another-secret!!"), Deadline::After(5s));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("wrong secret"), std::string::npos) << c.status().ToString();
  EXPECT_FALSE(g.Next(300ms).has_value());
  EXPECT_EQ(g.gate->refused(), 1);
  EXPECT_NE(g.Log().find("refused a connection from 127.0.0.1:"), std::string::npos) << g.Log();
  EXPECT_NE(g.Log().find("wrong secret"), std::string::npos) << g.Log();
}

// Catches: an unbounded number of concurrent handshakes (threads and
// sockets for anyone who connects), and an over-limit connection left open.
TEST(JoinGate, ConnectionsBeyondTheHandshakeLimitAreClosedAtOnce) {
  JoinGate::Options o;
  o.max_handshakes = 2;
  Gate g(o);
  std::vector<std::unique_ptr<Link>> silent;
  for (int i = 0; i < 2; ++i) silent.push_back(Link::Connect(g.address, "silent", Deadline::After(5s)).value());
  std::this_thread::sleep_for(300ms);  // both are in a handshake now
  auto extra = Link::Connect(g.address, "extra", Deadline::After(5s));
  ASSERT_TRUE(extra.ok());
  auto h = (*extra)->recv_header(Deadline::After(3s));  // closed without a challenge
  EXPECT_EQ(h.status().code(), StatusCode::kUnavailable) << h.status().ToString();
  EXPECT_NE(g.Log().find("already authenticating (at most 2)"), std::string::npos) << g.Log();
}

// Catches: a join that is not a valid control message reaching the
// coordinator, and a gate whose destructor waits for handshakes in flight.
TEST(JoinGate, MalformedJoinIsRefusedAndTheGateStopsPromptly) {
  Gate g;
  auto c = ControlClient::Connect(g.address, kSecret, Deadline::After(5s));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->send(EngineJoin(-4)).ok());
  EXPECT_FALSE(g.Next(500ms).has_value());
  EXPECT_NE(g.Log().find("field 'rank'"), std::string::npos) << g.Log();
  // A handshake in flight (silent peer) does not hold the destructor.
  auto silent = Link::Connect(g.address, "silent", Deadline::After(5s));
  std::this_thread::sleep_for(100ms);
  auto start = Clock::now();
  g.gate.reset();
  EXPECT_LT(Clock::now() - start, 1s);
}

}  // namespace
}  // namespace refit
