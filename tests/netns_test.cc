// Multi-host refits on one machine: the coordinator, every engine rank and
// every trainer rank run in their own network namespace ("host"), each with
// one veth interface (eth0, 10.213.0.<i+1>/24) plugged into a bridge in a hub
// namespace, so every byte of the refit really crosses network interfaces
// (UCX's tcp transport: UCX_TLS=tcp, as namespaces share /dev/shm and UCX
// would otherwise take shared memory between "hosts" of one machine). The
// test makes the namespaces itself (`ip netns add`, `ip link add ... type
// veth`, `ip addr`, `ip link set up`) and removes them afterwards, also when
// it fails (RAII). Names carry the test process's pid and a counter, so
// parallel ctest runs do not collide.
//
// Skips with the reason where namespaces cannot be made (not root, no `ip`,
// no veth/bridge support) or refit was built without UCX.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "job.h"
#include "transport/transport.h"
#include "testing/ucx_test_util.h"

namespace refit {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs argv[0] (found on PATH) to completion; exit code 127: not found.
CommandResult RunCommand(const std::vector<std::string>& argv) {
  testing::RunResult r = testing::run_command(argv, 60);
  return {r.exit_code, r.out + r.err};
}

// Removes the namespaces of test processes that no longer run ("rft<pid>x"
// whose pid is gone: killed before their destructors ran), once per process.
void SweepDeadTestNamespaces() {
  static bool swept = false;
  if (swept) return;
  swept = true;
  std::istringstream list(RunCommand({"ip", "netns", "list"}).output);
  for (std::string line; std::getline(list, line);) {
    const std::string name = line.substr(0, line.find(' '));
    if (name.rfind("rft", 0) != 0) continue;
    const auto x = name.find('x', 3);
    if (x == std::string::npos || x == 3) continue;
    const std::string pid = name.substr(3, x - 3);
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH) RunCommand({"ip", "netns", "del", name});
  }
}

// The namespaces: hosts 0..n-1 plus the hub. ok() false: skip_reason() says
// why they could not be made (everything made so far is removed).
class NetnsTopology {
 public:
  explicit NetnsTopology(int hosts) {
    static int counter = 0;
    prefix_ = "rft" + std::to_string(::getpid()) + "x" + std::to_string(counter++);
    if (::geteuid() != 0) {
      skip_ = "needs root (CAP_NET_ADMIN) to create network namespaces";
      return;
    }
    SweepDeadTestNamespaces();
    if (!Ip({"netns", "add", hub()})) return;
    made_.push_back(hub());
    if (!Ip({"-n", hub(), "link", "add", "br0", "type", "bridge"}) || !Ip({"-n", hub(), "link", "set", "br0", "up"})) {
      return;
    }
    for (int i = 0; i < hosts; ++i) {
      const std::string ns = host(i), port = "p" + std::to_string(i);
      if (!Ip({"netns", "add", ns})) return;
      made_.push_back(ns);
      // eth0 in the host, its peer in the hub's bridge. lo stays down: UCX
      // must not take 127.0.0.1 for a peer's address on a "different host".
      if (!Ip({"link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", hub()}) ||
          !Ip({"-n", hub(), "link", "set", port, "master", "br0"}) || !Ip({"-n", hub(), "link", "set", port, "up"}) ||
          !Ip({"-n", ns, "addr", "add", address(i) + "/24", "dev", "eth0"}) ||
          !Ip({"-n", ns, "link", "set", "eth0", "up"})) {
        return;
      }
    }
    ok_ = true;
  }
  ~NetnsTopology() { Remove(); }
  NetnsTopology(const NetnsTopology&) = delete;
  NetnsTopology& operator=(const NetnsTopology&) = delete;

  // Deletes every namespace (their veth ends go with them). Idempotent.
  void Remove() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) RunCommand({"ip", "netns", "del", *it});
    made_.clear();
  }

  bool ok() const { return ok_; }
  const std::string& skip_reason() const { return skip_; }
  const std::string& prefix() const { return prefix_; }
  std::string host(int i) const { return prefix_ + "h" + std::to_string(i); }
  std::string hub() const { return prefix_ + "hub"; }
  static std::string address(int i) { return "10.213.0." + std::to_string(i + 1); }

  // Bytes received (sent) on host i's eth0 (its veth), or -1.
  long long RxBytes(int i) const { return LinkBytes(i, "rx"); }
  long long TxBytes(int i) const { return LinkBytes(i, "tx"); }

 private:
  long long LinkBytes(int i, const char* direction) const {
    CommandResult r = RunCommand({"ip", "-n", host(i), "-s", "-j", "link", "show", "eth0"});
    json j = json::parse(r.output, nullptr, false);
    if (r.exit_code != 0 || j.is_discarded() || !j.is_array() || j.empty()) return -1;
    return j[0]["stats64"][direction]["bytes"].get<long long>();
  }

 public:

 private:
  bool Ip(std::vector<std::string> args) {
    args.insert(args.begin(), "ip");
    CommandResult r = RunCommand(args);
    if (r.exit_code == 0) return true;
    std::string cmd;
    for (const auto& a : args) cmd += (cmd.empty() ? "" : " ") + a;
    skip_ = r.exit_code == 127 ? "no `ip` command (install iproute2)"
                               : "cannot make network namespaces here: `" + cmd + "` failed: " + r.output;
    Remove();
    return false;
  }

  std::string prefix_, skip_;
  std::vector<std::string> made_;
  bool ok_ = false;
};

// The job's processes, each `ip netns exec <host> refit ...` (which execs,
// so the pid is refit's), with UCX_TLS=tcp; output captured in files. The
// destructor kills (by pid) whatever still runs.
class NetnsJob {
 public:
  explicit NetnsJob(const NetnsTopology& net) : net_(net) {
    secret_ = "netns-test-" + net.prefix() + "-" + std::to_string(Clock::now().time_since_epoch().count());
  }

  void Spawn(const std::string& name, int host, std::vector<std::string> args) {
    args.insert(args.begin(), {"ip", "netns", "exec", net_.host(host), testing::ProcessGroup::refit_binary()});
    // The coordinator listens on a non-loopback address: ranks authenticate.
    group_.spawn_command(name, args, {{"UCX_TLS", "tcp"}, {"REFIT_SECRET", secret_}});
  }

  // Starts the coordinator on host 0, engine ranks on hosts 1..E and trainer
  // ranks on hosts E+1..E+T; `extra` adds flags by process name ("trainer
  // rank 0"); false if the coordinator did not listen. `replicas` > 1: that
  // many engines of E ranks each (--engines), engine k's rank e on host
  // 1 + k * E + e, the trainers after them.
  bool Start(int engines, int trainers, int refits, double refit_timeout_s,
             const std::map<std::string, std::vector<std::string>>& extra = {}, int replicas = 1) {
    const std::vector<std::string> counts = {"--trainer-ranks", std::to_string(trainers), "--engine-ranks",
                                             std::to_string(engines), "--setup-timeout", "30", "--timeout",
                                             std::to_string(refit_timeout_s)};
    std::vector<std::string> coord = {"coordinator", "--listen", NetnsTopology::address(0) + ":0", "--port-file",
                                      group_.dir() + "/port", "--report", group_.dir() + "/report.json", "--refits",
                                      std::to_string(refits), "--seed", "7"};
    coord.insert(coord.end(), counts.begin(), counts.end());
    if (replicas > 1) coord.insert(coord.end(), {"--engines", std::to_string(replicas)});
    Spawn("coordinator", 0, coord);
    std::string port;
    for (int i = 0; i < 1000 && port.empty(); ++i) {
      std::ifstream(group_.dir() + "/port") >> port;
      if (port.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (port.empty()) return false;
    auto rank = [&](const std::string& role, int r) {
      std::vector<std::string> a = {role, "--coordinator", NetnsTopology::address(0) + ":" + port, "--rank",
                                    std::to_string(r), "--model", "tiny", "--transport", "ucx", "--bucket-size",
                                    "1MiB"};
      a.insert(a.end(), counts.begin(), counts.end());
      if (auto it = extra.find(role + " rank " + std::to_string(r)); it != extra.end()) {
        a.insert(a.end(), it->second.begin(), it->second.end());
      }
      return a;
    };
    for (int k = 0; k < replicas; ++k) {
      for (int e = 0; e < engines; ++e) {
        const int host = 1 + k * engines + e;
        auto a = rank("engine", e);
        a.insert(a.end(), {"--listen-host", NetnsTopology::address(host), "--poison-recycled"});
        if (replicas > 1) a.insert(a.end(), {"--engine", std::to_string(k)});
        Spawn(replicas > 1 ? "engine " + std::to_string(k) + " rank " + std::to_string(e)
                           : "engine rank " + std::to_string(e),
              host, a);
      }
    }
    for (int t = 0; t < trainers; ++t) {
      Spawn("trainer rank " + std::to_string(t), 1 + replicas * engines + t, rank("trainer", t));
    }
    return true;
  }

  bool WaitAll(double seconds) { return group_.wait_all(seconds); }
  void Kill(const std::string& name) { group_.kill(name, SIGKILL); }
  // Continues a process that stopped itself (ProcessGroup::resume).
  void Resume(const std::string& name) { group_.resume(name); }
  // Waits until `name` wrote `text` to its stderr (testing::wait_for_text).
  bool WaitForText(const std::string& name, const std::string& text) {
    return testing::wait_for_text(group_, name, text);
  }
  int ExitCode(const std::string& name) const { return group_.exit_code(name); }
  // What the process wrote, stderr then stdout.
  std::string Err(const std::string& name) const { return group_.err(name) + group_.out(name); }
  std::string Report() const { return group_.report(); }
  std::vector<std::string> Names() const { return group_.names(); }
  std::string AllStderr() const { return group_.all_stderr(); }

 private:
  const NetnsTopology& net_;
  std::string secret_;
  testing::ProcessGroup group_;
};

#define SKIP_UNLESS_NETNS(net)                                                                          \
  do {                                                                                                  \
    REFIT_SKIP_WITHOUT_UCX();                                                                         \
    if (!(net).ok()) GTEST_SKIP() << (net).skip_reason();                                              \
  } while (0)

bool NamespacesLeft(const std::string& prefix) {
  return RunCommand({"ip", "netns", "list"}).output.find(prefix) != std::string::npos;
}

// DESIGN.md rule 2 across hosts: 2 engine ranks and 2 trainer ranks, each
// in its own namespace, refit 3 times over UCX's tcp transport through the
// veth links; every engine rank verifies every byte; the bytes crossed each
// engine's interface (its rx counter grew by at least its shards of every
// refit); nothing of the topology is left afterwards.
// Catches: a transport that only works on one host (a descriptor carrying
// a loopback or local-only address, a worker address not reachable from
// another namespace), data taking a shortcut around the network (shared
// memory), and namespaces left behind.
TEST(Netns, RefitAcrossNamespacesOverUcxTcpIsBitExact) {
  constexpr int kEngines = 2, kTrainers = 2, kRefits = 3;
  auto net = std::make_unique<NetnsTopology>(1 + kEngines + kTrainers);
  SKIP_UNLESS_NETNS(*net);
  const std::string prefix = net->prefix();
  std::vector<long long> rx_before;
  for (int e = 0; e < kEngines; ++e) rx_before.push_back(net->RxBytes(1 + e));
  {
    NetnsJob job(*net);
    ASSERT_TRUE(job.Start(kEngines, kTrainers, kRefits, 60)) << job.AllStderr();
    ASSERT_TRUE(job.WaitAll(180)) << "the job hung:\n" << job.AllStderr();
    for (const auto& name : job.Names()) EXPECT_EQ(job.ExitCode(name), 0) << name << ":\n" << job.Err(name);
    json report = json::parse(job.Report(), nullptr, false);
    ASSERT_FALSE(report.is_discarded()) << job.AllStderr();
    EXPECT_TRUE(report.value("verified", false)) << report.dump();
    ASSERT_EQ(report["refits"].size(), static_cast<std::size_t>(kRefits)) << report.dump();
    for (int i = 0; i < kRefits; ++i) EXPECT_EQ(report["refits"][i]["version"], i + 1);
    ASSERT_EQ(report["ranks"].size(), static_cast<std::size_t>(kEngines));
    for (const auto& rank : report["ranks"]) {
      const int e = rank["rank"].get<int>();
      const long long shard = rank["bytes"].get<long long>();
      const long long received = net->RxBytes(1 + e) - rx_before[static_cast<std::size_t>(e)];
      EXPECT_GE(received, kRefits * shard) << "engine rank " << e << " received " << received
                                           << " bytes on its veth for " << kRefits << " refits of " << shard;
    }
  }
  net->Remove();
  EXPECT_FALSE(NamespacesLeft(prefix)) << "namespaces " << prefix << "* left behind";
}

// Many engines across hosts (issue 18 item 2): three engines of one rank,
// each in its own namespace, and one trainer rank, over UCX's tcp
// transport: engine 0 is fed by the trainer, engine 1 by engine 0, engine 2
// by engine 1, every byte verified. Each engine's veth received at least
// its stream of every refit, and the trainer's sent less than two engines'
// worth per refit: the trainer's link carries each byte once, the relays
// the rest. Catches: a relay that only works within one host (a child's
// pool descriptor or address local to its parent's host), a relay that
// feeds the children from the trainer (the trainer's veth would carry three
// streams per refit).
TEST(Netns, ManyEnginesRelayAcrossNamespacesOverUcx) {
  constexpr int kReplicas = 3, kRefits = 3;
  auto net = std::make_unique<NetnsTopology>(1 + kReplicas + 1);
  SKIP_UNLESS_NETNS(*net);
  std::vector<long long> rx_before;
  for (int k = 0; k < kReplicas; ++k) rx_before.push_back(net->RxBytes(1 + k));
  const long long trainer_tx_before = net->TxBytes(1 + kReplicas);
  {
    NetnsJob job(*net);
    ASSERT_TRUE(job.Start(1, 1, kRefits, 60, {}, kReplicas)) << job.AllStderr();
    ASSERT_TRUE(job.WaitAll(180)) << "the job hung:\n" << job.AllStderr();
    for (const auto& name : job.Names()) EXPECT_EQ(job.ExitCode(name), 0) << name << ":\n" << job.Err(name);
    json report = json::parse(job.Report(), nullptr, false);
    ASSERT_FALSE(report.is_discarded()) << job.AllStderr();
    EXPECT_TRUE(report.value("verified", false)) << report.dump();
    ASSERT_EQ(report["engines"].size(), static_cast<std::size_t>(kReplicas)) << report.dump();
    for (const json& engine : report["engines"]) EXPECT_EQ(engine["versions"], json::array({1, 2, 3}));
    const long long stream = report["refits"][0]["bytes"].get<long long>();
    for (int k = 0; k < kReplicas; ++k) {
      const long long received = net->RxBytes(1 + k) - rx_before[static_cast<std::size_t>(k)];
      EXPECT_GE(received, kRefits * stream) << "engine " << k << " received " << received << " bytes";
    }
    const long long sent = net->TxBytes(1 + kReplicas) - trainer_tx_before;
    EXPECT_GE(sent, kRefits * stream);
    EXPECT_LT(sent, 2 * kRefits * stream) << "the trainer's link carried more than one engine's bytes";
  }
  net->Remove();
}

struct NetnsKillCase {
  std::string victim;
  int refit;  // the refit the kill lands in (1: the first)
};

class NetnsKill : public ::testing::TestWithParam<NetnsKillCase> {};

// A rank killed (SIGKILL) mid-job on its own "host": every survivor, on
// the others, exits non-zero within the refit deadline, naming the victim,
// without dying of a signal itself; no refit past the failure is committed;
// the namespaces are removed. The kill lands inside refit c.refit: a
// trainer (the victim, or trainer rank 0) stops itself right after
// submitting its first bucket of that refit (--debug-stop-after-bucket),
// the test waits for its line, kills the victim and resumes the stopped
// trainer; so exactly refits 1..c.refit-1 are committed.
// Catches: a survivor that waits forever for a peer behind a dead network
// endpoint (no peer error handling, no deadline), an engine aborted by UCX
// when its trainer dies mid-write, errors that do not name the lost rank.
TEST_P(NetnsKill, EverySurvivorFailsNamingTheLostRank) {
  const NetnsKillCase& c = GetParam();
  constexpr int kEngines = 2, kTrainers = 2;
  constexpr double kRefitTimeout = 10;
  auto net = std::make_unique<NetnsTopology>(1 + kEngines + kTrainers);
  SKIP_UNLESS_NETNS(*net);
  const std::string prefix = net->prefix();
  {
    NetnsJob job(*net);
    const std::string stopped = c.victim.rfind("trainer", 0) == 0 ? c.victim : "trainer rank 0";
    const std::string refit = std::to_string(c.refit);
    ASSERT_TRUE(job.Start(kEngines, kTrainers, 1000, kRefitTimeout, {{stopped, {"--debug-stop-after-bucket", refit}}}))
        << job.AllStderr();
    ASSERT_TRUE(job.WaitForText(stopped, "of refit " + refit + " (--debug-stop-after-bucket)")) << job.AllStderr();
    job.Kill(c.victim);
    if (stopped != c.victim) job.Resume(stopped);
    ASSERT_TRUE(job.WaitAll(kRefitTimeout + 15)) << "a survivor hung:\n" << job.AllStderr();
    for (const auto& name : job.Names()) {
      if (name == c.victim) continue;
      EXPECT_NE(job.ExitCode(name), 0) << name << " exited 0 after " << c.victim << " died\n" << job.AllStderr();
      EXPECT_LT(job.ExitCode(name), 128) << name << " died of a signal:\n" << job.Err(name);
      EXPECT_NE(job.Err(name).find(c.victim), std::string::npos) << name << ":\n" << job.Err(name);
    }
    json report = json::parse(job.Report(), nullptr, false);
    ASSERT_FALSE(report.is_discarded()) << job.AllStderr();
    EXPECT_FALSE(report.value("verified", true));
    EXPECT_EQ(report["refits"].size(), static_cast<std::size_t>(c.refit - 1)) << report.dump();
    for (std::size_t i = 0; i < report["refits"].size(); ++i) EXPECT_EQ(report["refits"][i]["version"], i + 1);
  }
  net->Remove();
  EXPECT_FALSE(NamespacesLeft(prefix)) << "namespaces " << prefix << "* left behind";
}

INSTANTIATE_TEST_SUITE_P(Roles, NetnsKill,
                         ::testing::Values(NetnsKillCase{"engine rank 1", 3}, NetnsKillCase{"trainer rank 0", 3},
                                           NetnsKillCase{"trainer rank 1", 1}),
                         [](const auto& info) {
                           std::string v = info.param.victim;
                           for (char& ch : v) {
                             if (ch == ' ') ch = '_';
                           }
                           return v + "_refit" + std::to_string(info.param.refit);
                         });

}  // namespace
}  // namespace refit
