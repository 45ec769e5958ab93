// Hostile files and peers (issue 16, items 3, 4, 5 and 7), as separate
// processes over real sockets: a FIFO given where a file is read, a shard
// truncated while a push runs, a coordinator flooded with idle and
// slowloris connections while a job sets up, an idle stranger on a data
// port of a job without a secret, the same flood on a data port, and an
// engine asked to listen on every address without a secret. Each test names the mutation it catches.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "control/auth.h"
#include "control/control_message.h"
#include "control/protocol.h"
#include "job.h"
#include "listening_ports.h"
#include "refit/content.h"
#include "net/link.h"
#include "refit/safetensors.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

using namespace std::chrono_literals;
using testing::JobSpec;
using testing::ProcessGroup;

std::string WriteSecret(const ProcessGroup& group) {
  const std::string path = group.dir() + "/secret";
  std::ofstream(path) << "the-hostile-test-secret-0123456789";
  ::chmod(path.c_str(), 0600);
  return path;
}

// Every process exited 0 and the report says `refits` refits, verified.
void ExpectJobVerified(const ProcessGroup& group, int refits) {
  for (const auto& name : group.names()) EXPECT_EQ(group.exit_code(name), 0) << name << "\n" << group.all_stderr();
  auto report = nlohmann::json::parse(group.report(), nullptr, false);
  ASSERT_TRUE(report.is_object()) << group.report();
  EXPECT_TRUE(report.value("verified", false)) << report.dump();
  EXPECT_EQ(report["refits"].size(), static_cast<std::size_t>(refits)) << report.dump();
}

// The arguments of rank `rank` of `role` in a 2 x 2 job at `address`.
std::vector<std::string> RankArgs(const std::string& role, int rank, const std::string& address,
                                  const std::vector<std::string>& extra) {
  std::vector<std::string> a = {role, "--coordinator", address, "--rank", std::to_string(rank), "--trainer-ranks", "2",
                                "--engine-ranks", "2", "--model", "tiny", "--bucket-size", "1MiB", "--setup-timeout",
                                "30", "--timeout", "30"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// ---- files -----------------------------------------------------------------

// Catches: any command that opens a checkpoint, a shard or a secret file
// before checking that it is a regular file (the open of a FIFO blocks, and
// the command hangs: the 20 s wait fails).
TEST(HostileFiles, AFifoIsRefusedByEveryCommandWithoutHanging) {
  ProcessGroup group;
  const std::string fifo = group.dir() + "/fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  group.spawn("inspect", {"inspect", fifo});
  group.spawn("push", {"push", fifo, "--coordinator", "127.0.0.1:1", "--setup-timeout", "5"});
  group.spawn("engine",
              {"engine", "--coordinator", "127.0.0.1:1", "--rank", "0", "--model", fifo, "--setup-timeout", "5"});
  group.spawn("coordinator", {"coordinator", "--listen", "127.0.0.1:0", "--secret-file", fifo});
  const bool ended = group.wait_all(20);
  if (!ended) {  // let the blocked opens return so the processes can end
    for (int i = 0; i < 4; ++i) {
      const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (w >= 0) ::close(w);
    }
  }
  ASSERT_TRUE(ended) << "a command blocked on the FIFO\n" << group.all_stderr();
  for (const std::string name : {"inspect", "push", "engine", "coordinator"}) {
    EXPECT_NE(group.exit_code(name), 0) << name;
    EXPECT_HAS(group.err(name), fifo);
    EXPECT_HAS(group.err(name), "is a FIFO, not a regular file");
  }
}

// A safetensors file of one replicated tensor of `bytes` bytes.
void WriteCheckpoint(const std::string& path, std::int64_t bytes) {
  const TensorSpec spec{"model.norm.weight", DType::kUInt8, {bytes}};
  std::vector<std::byte> data(static_cast<std::size_t>(bytes));
  fill_content(content_key(5, 1, spec.name), 0, data);
  const SafetensorsWriteTensor t{spec, data};
  ASSERT_TRUE(write_safetensors(path, std::span(&t, 1)).ok());
}

// A push of a 32 MiB shard repeats refits; the engine rank is stopped
// (SIGSTOP) while they run, the shard is truncated to half, and the engine
// resumes. The push fails naming the file (the refit in flight, or the
// next one, whichever the truncation hit), it does not die of SIGBUS, and
// the job ends cleanly. The engine verifies against its own copy.
// Catches: a mapping read without the SIGBUS guard (push dies of signal
// 7), and a trainer that does not check its files before "sent" (the
// zeros the guard maps are committed as weights: the engine's copy then
// differs and verification, not the file, is named; or the refit commits).
TEST(HostileFiles, AShardTruncatedDuringAPushFailsItNamingTheFile) {
  ProcessGroup group;
  const std::string pushed = group.dir() + "/pushed.safetensors";
  const std::string copy = group.dir() + "/engine.safetensors";
  WriteCheckpoint(pushed, 32 << 20);
  std::filesystem::copy_file(pushed, copy);
  const std::string address = group.spawn_coordinator(
      {"--refits", "0", "--trainer-ranks", "1", "--engine-ranks", "1", "--setup-timeout", "30", "--timeout", "30"});
  ASSERT_FALSE(address.empty());
  group.spawn("engine", {"engine", "--coordinator", address, "--rank", "0", "--engine-ranks", "1", "--trainer-ranks",
                         "1", "--model", copy, "--bucket-size", "256KiB", "--setup-timeout", "30", "--timeout", "30"});
  group.spawn("push", {"push", pushed, "--coordinator", address, "--engine-ranks", "1", "--bucket-size", "256KiB",
                       "--repeat", "100000", "--setup-timeout", "30", "--timeout", "30"});
  ASSERT_TRUE(testing::wait_for_setup(group)) << group.all_stderr();
  group.kill("engine", SIGSTOP);
  ASSERT_EQ(::truncate(pushed.c_str(), 16 << 20), 0);
  group.resume("engine");
  ASSERT_TRUE(group.wait_all(90)) << group.all_stderr();
  EXPECT_NE(group.exit_code("push"), 0);
  EXPECT_LT(group.exit_code("push"), 128) << "push died of a signal\n" << group.err("push");
  EXPECT_HAS(group.err("push"), "safetensors file '" + pushed + "'");
  EXPECT_HAS(group.err("push"), "while in use");
  EXPECT_LT(group.exit_code("engine"), 128) << group.err("engine");
  EXPECT_LT(group.exit_code("coordinator"), 128) << group.err("coordinator");
  // Which check saw it, for the record: the guard (the refit read vanished
  // pages) or fstat (the truncation fell between two reads of the file).
  std::cout << "push said: " << group.err("push").substr(0, 600) << "\n";
}

// ---- the coordinator's gate --------------------------------------------------

// A connection that sends one byte every `pace` until `stop`, then closes,
// and starts over: a slowloris loop of `count` connections.
void Slowloris(const std::string& address, int count, std::chrono::milliseconds pace, const std::atomic<bool>& stop,
               std::atomic<int>* opened) {
  while (!stop) {
    std::vector<std::unique_ptr<Link>> links;
    for (int i = 0; i < count && !stop; ++i) {
      auto l = Link::Connect(address, "slowloris", Deadline::After(2s));
      if (!l.ok()) continue;
      links.push_back(std::move(*l));
      ++*opened;
    }
    for (int k = 0; k < 3 && !stop; ++k) {
      for (auto& l : links) (void)::send(l->fd(), "{", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(pace);  // the attack's pace, not synchronisation
    }
  }
}

// 200 idle connections are held open and a slowloris loop of 40
// connections keeps reopening while a 2 x 2 job sets up: the
// job sets up, commits every refit and verifies; the coordinator's log of
// refusals stays short (rate-limited).
// Catches: a gate that refuses newcomers while full (the ranks'
// connections are closed: without a retry they exit, with one they get in
// only once the strangers' handshakes time out, after 5 s), and a line per
// refused connection (hundreds of lines).
// Without a secret, where anyone can answer "none", a connection counts as
// unauthenticated until its join arrived: the same holds.
class Flood : public ::testing::TestWithParam<bool> {};

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

TEST_P(Flood, AJobSetsUpThroughIdleConnectionsAndASlowlorisLoop) {
  ProcessGroup group;
  std::vector<std::string> with_secret;
  if (GetParam()) with_secret = {"--secret-file", WriteSecret(group)};
  std::vector<std::string> coordinator = {"--refits", "3", "--seed", "7", "--trainer-ranks", "2", "--engine-ranks", "2",
                                          "--setup-timeout", "30", "--timeout", "30"};
  coordinator.insert(coordinator.end(), with_secret.begin(), with_secret.end());
  const std::string address = group.spawn_coordinator(coordinator);
  ASSERT_FALSE(address.empty());
  std::vector<std::unique_ptr<Link>> idle;
  for (int i = 0; i < 200; ++i) {
    auto l = Link::Connect(address, "idle", Deadline::After(5s));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    idle.push_back(std::move(*l));
  }
  std::atomic<bool> stop{false};
  std::atomic<int> opened{0};
  std::thread loris([&] { Slowloris(address, 40, 300ms, stop, &opened); });
  for (int r = 0; r < 2; ++r) {
    group.spawn("engine rank " + std::to_string(r), RankArgs("engine", r, address, with_secret));
    group.spawn("trainer rank " + std::to_string(r), RankArgs("trainer", r, address, with_secret));
  }
  const bool set_up = testing::wait_for_setup(group);
  const bool ended = group.wait_all(90);
  stop = true;
  loris.join();
  ASSERT_TRUE(set_up && ended) << group.all_stderr();
  ExpectJobVerified(group, 3);
  EXPECT_GE(opened.load(), 40);
  // The ranks did not wait for the strangers' handshakes to time out (5 s):
  // a gate that refuses while full admits them only then, so the
  // coordinator's first handshake time-out would come before its "setup
  // complete". Checked in the main stage only: under ASan on 2 cores a setup
  // that did not wait took 4.6 s and more (session 9), too close to 5 s.
  if (!kSanitized) {
    const std::string log = group.err("coordinator");
    const std::size_t complete = log.find("setup complete");
    const std::size_t timed_out = log.find("timed out after");
    ASSERT_NE(complete, std::string::npos) << log;
    EXPECT_TRUE(timed_out == std::string::npos || complete < timed_out) << log;
  }
  std::cout << "coordinator's log:\n" << group.err("coordinator");
  const std::string log = group.err("coordinator");
  std::size_t refusal_lines = 0;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) refusal_lines += line.find("refused") != std::string::npos;
  EXPECT_LT(refusal_lines, 60u) << log;
}

INSTANTIATE_TEST_SUITE_P(HostilePeers, Flood, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "with_a_secret" : "without_a_secret"; });

// ---- an engine's data port -----------------------------------------------------

// A job without a secret: a stranger reaches engine rank 0's data port
// before its trainer ranks, answers the challenge with "none" (anyone can)
// and then sends nothing. The engine refuses it within kDataAuthTimeout
// and the job sets up and verifies, well within the 30 s setup deadline.
// Catches: a hello wait bounded by the setup deadline after a "none"
// handshake (the stranger holds the port 30 s and setup fails: 29.4 s
// before the fix).
TEST(HostilePeers, AnIdleStrangerHoldsADataPortWithoutASecretAtMostFiveSeconds) {
  ProcessGroup group;
  const std::string address = group.spawn_coordinator({"--refits", "2", "--seed", "7", "--trainer-ranks", "2",
                                                       "--engine-ranks", "2", "--setup-timeout", "30", "--timeout",
                                                       "30"});
  ASSERT_FALSE(address.empty());
  for (int r = 0; r < 2; ++r) group.spawn("engine rank " + std::to_string(r), RankArgs("engine", r, address, {}));
  const int port = testing::data_port(group, "engine rank 0");
  ASSERT_NE(port, 0) << group.all_stderr();
  auto stranger = Link::Connect("127.0.0.1:" + std::to_string(port), "stranger", Deadline::After(5s));
  ASSERT_TRUE(stranger.ok());
  // The engine serves its data port once every rank joined: the stranger's
  // handshake runs on its own thread while the trainers start.
  std::thread handshake([&] {
    (void)authenticate_as_client(**stranger, Secret(), data_auth_context(0), Deadline::After(60s));
  });
  const auto started = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r) group.spawn("trainer rank " + std::to_string(r), RankArgs("trainer", r, address, {}));
  const bool ended = group.wait_all(90);
  (*stranger)->shutdown();
  handshake.join();
  ASSERT_TRUE(ended) << group.all_stderr();
  ExpectJobVerified(group, 2);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 20s);
  EXPECT_HAS(group.err("engine rank 0"), "refused a data connection from 127.0.0.1:");
}

// A stranger that answers an engine's data-port challenge with "auth_ok"
// instead of a response: the engine's handshake refuses it and tells it why
// ("refused <address>: authentication required first ..."), the form whose
// address a log line must not repeat.
void AnswerTheChallengeWrongly(const std::string& address) {
  auto link = Link::Connect(address, "rude stranger", Deadline::After(5s));
  if (!link.ok()) return;
  if (!recv_auth_message(**link, Deadline::After(60s), kMaxAuthMessageBytes).ok()) return;
  if (!send_message(**link, AuthMessage(AuthOk{}), Deadline::After(5s)).ok()) return;
  (void)recv_auth_message(**link, Deadline::After(60s), kMaxAuthMessageBytes);  // the refusal
}

// A job without a secret: 50 idle connections are held open on engine rank
// 0's data port and a slowloris loop of 30 keeps reopening there while the
// job sets up (50 + 30 is more than kMaxUnauthenticatedDataLinks, so the
// oldest are evicted), and one stranger answers the challenge wrongly. The
// trainer ranks link through them: the job sets up well within its 30 s
// setup deadline and verifies. The engine's refusals are rate-limited
// (a few lines, one with a count), and each names the peer once.
// Catches: handshakes one at a time (50 idle strangers x kDataAuthTimeout:
// setup fails at 30 s, as before the fix), a bound that refuses newcomers
// instead of evicting the oldest (the trainers' connections are closed and
// they fail setup), a refusal logged per connection (over 50 lines), and a
// refusal logged with the handshake's own "refused <address>: " (the
// address twice in the line).
TEST(HostilePeers, AJobSetsUpThroughIdleConnectionsAndASlowlorisLoopOnADataPort) {
  ProcessGroup group;
  const std::string address = group.spawn_coordinator({"--refits", "2", "--seed", "7", "--trainer-ranks", "2",
                                                       "--engine-ranks", "2", "--setup-timeout", "30", "--timeout",
                                                       "30"});
  ASSERT_FALSE(address.empty());
  for (int r = 0; r < 2; ++r) group.spawn("engine rank " + std::to_string(r), RankArgs("engine", r, address, {}));
  const int port = testing::data_port(group, "engine rank 0");
  ASSERT_NE(port, 0) << group.all_stderr();
  const std::string data = "127.0.0.1:" + std::to_string(port);
  // Connected (queued in the listen backlog) before the engine serves its
  // data port, which it does once every rank joined.
  std::vector<std::unique_ptr<Link>> idle;
  for (int i = 0; i < 50; ++i) {
    auto l = Link::Connect(data, "idle", Deadline::After(5s));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    idle.push_back(std::move(*l));
  }
  std::atomic<bool> stop{false};
  std::atomic<int> opened{0};
  std::thread loris([&] { Slowloris(data, 30, 300ms, stop, &opened); });
  std::thread rude([&] { AnswerTheChallengeWrongly(data); });
  const auto started = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r) group.spawn("trainer rank " + std::to_string(r), RankArgs("trainer", r, address, {}));
  const bool set_up = testing::wait_for_setup(group);
  const auto setup_took = std::chrono::steady_clock::now() - started;
  const bool ended = group.wait_all(90);
  stop = true;
  loris.join();
  rude.join();  // its link was refused, or closed when the engine exited
  ASSERT_TRUE(set_up && ended) << group.all_stderr();
  ExpectJobVerified(group, 2);
  EXPECT_GE(opened.load(), 30);
  EXPECT_LT(setup_took, 20s) << group.err("engine rank 0");
  const std::string log = group.err("engine rank 0");
  std::cout << "engine rank 0's log:\n" << log;
  // The trainers did not wait for the idle strangers' handshakes to time out
  // (5 s after their accept): the strangers were evicted or dropped first.
  // Checked in unsanitized builds only (a setup under ASan on 2 cores can
  // take over 4.6 s: see Flood).
  if (!kSanitized) {
    EXPECT_EQ(log.find("timed out after"), std::string::npos) << log;
  }
  std::size_t refusal_lines = 0;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("refused") == std::string::npos) continue;
    ++refusal_lines;
    EXPECT_EQ(line.find("refused 127.0.0.1:"), std::string::npos) << "the peer named twice: " << line;
  }
  EXPECT_LT(refusal_lines, 20u) << log;
  EXPECT_HAS(log, "engine rank 0: refused a data connection from 127.0.0.1:");
  EXPECT_HAS(log, "more data connections in the last");  // a count: rate-limited
  EXPECT_HAS(log, "authentication required first: expected 'auth_response', got 'auth_ok'");
}

// Catches: an engine that listens for data on every address without a
// secret (any host could feed it weights), and one whose refusal does not
// say what to do.
TEST(HostilePeers, AnEngineRefusesANonLoopbackListenHostWithoutASecret) {
  auto r = testing::run_refit({"engine", "--coordinator", "127.0.0.1:1", "--rank", "0", "--listen-host", "0.0.0.0",
                               "--model", "tiny", "--setup-timeout", "5"},
                              30);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128);
  EXPECT_HAS(r.err, "refusing to listen on --listen-host 0.0.0.0 for engine rank 0's data port without a secret");
  EXPECT_HAS(r.err, "--secret-file (or REFIT_SECRET), or listen on a loopback address");
}

}  // namespace
}  // namespace refit
