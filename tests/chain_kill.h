// A chain of three engines with one of them killed mid relay (many engines,
// issue 18 item 3; issue 23 item 1 on the GPU): shared by the process tests
// over shm and tcp and the GPU tests over cuda_ipc and nccl.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "job.h"
#include "process_harness.h"

namespace refit::testing {

// A chain of three engines of one rank fed by one trainer rank, whose
// trainer stops itself (SIGSTOP) after its first bucket of refit 2, so that
// a fault lands mid-relay (job.h stop_mid_refit).
inline JobSpec chain_stopped_in_refit_2(int refits, std::vector<std::string> coordinator_args) {
  JobSpec spec;
  spec.engines = 3;
  spec.engine_ranks = 1;
  spec.trainer_ranks = 1;
  spec.refits = refits;
  spec.coordinator_args = std::move(coordinator_args);
  stop_mid_refit(spec, "trainer rank 0", 2);
  return spec;
}

// kill -9 of engine `victim` of `spec` (chain_stopped_in_refit_2(4,
// {"--min-engines", "2"}) with the caller's transport and flags) during
// refit 2: every other process exits 0; the report is verified, version 4
// committed with no failure recorded, the victim holds only version 1 and
// is named lost during refit 2, the other two hold every version, and the
// trainer's link carried one stream per refit. Returns the report (null on
// a fatal failure) and the trainer's stderr.
inline std::pair<nlohmann::json, std::string> kill_one_of_a_chain_mid_relay(const JobSpec& spec, int victim,
                                                                             double seconds = 90) {
  using nlohmann::json;
  ProcessGroup group;
  const std::string name = "engine " + std::to_string(victim) + " rank 0";
  EXPECT_TRUE(start_job(group, spec)) << group.all_stderr();
  EXPECT_TRUE(wait_for_refit_under_way(group, "trainer rank 0", 2)) << group.all_stderr();
  group.kill(name, SIGKILL);
  group.resume("trainer rank 0");
  EXPECT_TRUE(group.wait_all(seconds)) << group.all_stderr();
  for (const auto& other : group.names()) {
    if (other == name) continue;
    EXPECT_EQ(group.exit_code(other), 0) << other << "\n" << group.all_stderr();
  }
  const json report = json::parse(group.report(), nullptr, false);
  if (report.is_discarded()) return {json(), group.err("trainer rank 0")};
  EXPECT_TRUE(report["verified"].get<bool>()) << report.dump(2);
  EXPECT_EQ(report["committed_version"], 4u);
  EXPECT_TRUE(report["failures"].empty()) << report.dump(2);
  for (int k = 0; k < 3; ++k) {
    const json& engine = report["engines"][static_cast<std::size_t>(k)];
    EXPECT_EQ(engine["versions"], k == victim ? json::array({1}) : json::array({1, 2, 3, 4})) << engine.dump();
  }
  const json& lost = report["engines"][static_cast<std::size_t>(victim)];
  EXPECT_NE(lost["lost"].get<std::string>().find("lost " + name + " during refit 2"), std::string::npos) << lost.dump();
  EXPECT_EQ(lost["lost_at"], 2u);
  for (const json& refit : report["refits"]) EXPECT_EQ(refit["trainer_link_bytes"], refit["bytes"]) << refit.dump();
  return {report, group.err("trainer rank 0")};
}

}  // namespace refit::testing
