// Process hygiene (docs/RELIABILITY.md): the processes of `refit demo` die
// with it, whatever signal ends it and whenever; nothing of a job is left in
// /dev/shm or /tmp after a kill at any moment, setup included; a lost engine
// ends setup at once, named, and every rank stops with it.
//
// Synchronised on log lines only: the demo's hidden --debug-log-processes
// prints every child's pid and keeps the coordinator's log ("... joined",
// "setup complete").
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "job.h"
#include "process_harness.h"

namespace refit {
namespace {

using testing::ProcessGroup;
using Clock = std::chrono::steady_clock;

// Names in `dir` that start with `prefix`.
std::set<std::string> entries(const std::string& dir, const std::string& prefix) {
  std::set<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.insert(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

// What is in `after` and not in `before`.
std::vector<std::string> added(const std::set<std::string>& before, const std::set<std::string>& after) {
  std::vector<std::string> out;
  for (const auto& e : after) {
    if (!before.contains(e)) out.push_back(e);
  }
  return out;
}

// True while `pid` runs: it exists and is not a zombie.
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  if (text.empty()) return false;
  const auto close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() || text[close + 2] != 'Z';
}

// Waits until `needle` is in `name`'s stderr (at most 60 s, or until it exits).
bool wait_for_line(ProcessGroup& group, const std::string& name, const std::string& needle) {
  for (const auto until = Clock::now() + std::chrono::seconds(60); Clock::now() < until;) {
    if (group.err(name).find(needle) != std::string::npos) return true;
    if (group.wait_one(name, 0)) return group.err(name).find(needle) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

// The pids of the demo's children, from its "refit demo: processes:" line.
std::vector<pid_t> demo_children(const std::string& err) {
  std::vector<pid_t> pids;
  const auto at = err.find("refit demo: processes:");
  if (at == std::string::npos) return pids;
  std::istringstream line(err.substr(at, err.find('\n', at) - at));
  std::string word;
  while (line >> word) {
    if (word == "pid" && line >> word) pids.push_back(static_cast<pid_t>(std::stol(word)));
  }
  return pids;
}

struct DemoKill {
  std::string name;
  int signal;
  std::string moment;  // the log line after which the signal is sent
};

class DemoKillTest : public ::testing::TestWithParam<DemoKill> {};

// Catches (each tried): no PR_SET_PDEATHSIG in the children (kill -9 leaves
// them running); no SIGTERM/SIGINT handler (the demo dies, its children
// run on); a handler that exits without forwarding or reaping; the old
// /tmp/refit-demo-* scratch directory (left after kill -9).
TEST_P(DemoKillTest, NoProcessAndNothingInDevShmOrTmpRemains) {
  const DemoKill& k = GetParam();
  const auto shm_before = entries("/dev/shm", "refit-");
  const auto tmp_before = entries("/tmp", "refit-demo-");
  ProcessGroup group;
  group.spawn("demo", {"demo", "--refits", "1000000", "--engine-ranks", "2", "--json", "--debug-log-processes"});
  ASSERT_TRUE(wait_for_line(group, "demo", k.moment)) << group.err("demo");
  const std::vector<pid_t> children = demo_children(group.err("demo"));
  ASSERT_EQ(children.size(), 5u) << group.err("demo");
  group.kill("demo", k.signal);
  ASSERT_TRUE(group.wait_one("demo", 10)) << "the demo outlived " << k.name;
  EXPECT_EQ(group.exit_code("demo"), 128 + k.signal);
  // Every child ends within 5 s of the demo (they are killed at once; the
  // margin is for a loaded machine).
  for (pid_t pid : children) {
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (alive(pid) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_FALSE(alive(pid)) << "pid " << pid << " outlived the demo (" << k.name << ")\n" << group.err("demo");
  }
  EXPECT_EQ(added(shm_before, entries("/dev/shm", "refit-")), std::vector<std::string>{});
  EXPECT_EQ(added(tmp_before, entries("/tmp", "refit-demo-")), std::vector<std::string>{});
  if (k.signal != SIGKILL) {
    EXPECT_NE(group.err("demo").find("refit demo: stopped by"), std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Signals, DemoKillTest,
    ::testing::Values(DemoKill{"kill9_mid_refit", SIGKILL, "setup complete"},
                      DemoKill{"sigterm_mid_refit", SIGTERM, "setup complete"},
                      DemoKill{"sigint_mid_refit", SIGINT, "setup complete"},
                      DemoKill{"kill9_at_setup", SIGKILL, "engine rank 0 joined"},
                      DemoKill{"sigterm_at_setup", SIGTERM, "engine rank 0 joined"},
                      DemoKill{"sigint_at_setup", SIGINT, "engine rank 0 joined"}),
    [](const auto& info) { return info.param.name; });

// An engine rank killed during setup, after it created its shm pool and
// joined but before any trainer joined: nothing is left in /dev/shm, the
// coordinator names the lost engine at once (not at the setup deadline, not
// only once the trainers join), and every process ends within 2 s though
// the setup deadline is 30 s.
// Catches: a named /dev/shm segment (the kill leaves /dev/shm/refit-<pid>-0);
// a coordinator that does not watch joined ranks during setup (it waits for
// the trainers, then the whole deadline); trainers that keep retrying the
// dead engine after the abort.
TEST(EngineKilledAtSetup, NothingLeftAndEveryProcessStopsNamingIt) {
  const auto shm_before = entries("/dev/shm", "refit-");
  ProcessGroup group;
  testing::JobSpec spec;
  spec.setup_timeout_s = 30;
  spec.skip = {"trainer rank 0", "trainer rank 1"};
  ASSERT_TRUE(testing::start_job(group, spec));
  ASSERT_TRUE(wait_for_line(group, "coordinator", "engine rank 1 joined")) << group.all_stderr();
  ASSERT_TRUE(wait_for_line(group, "coordinator", "engine rank 0 joined")) << group.all_stderr();
  group.kill("engine rank 0", SIGKILL);
  const auto killed = Clock::now();
  ASSERT_TRUE(group.wait_all(10)) << group.all_stderr();
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(2)) << group.all_stderr();
  for (const std::string name : {"coordinator", "engine rank 1"}) {
    EXPECT_NE(group.exit_code(name), 0) << name;
    EXPECT_NE(group.err(name).find("lost engine rank 0"), std::string::npos) << name << ":\n" << group.err(name);
  }
  EXPECT_EQ(added(shm_before, entries("/dev/shm", "refit-")), std::vector<std::string>{});
}

}  // namespace
}  // namespace refit
