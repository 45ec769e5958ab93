// Launches one refit job as separate processes (coordinator, engine ranks,
// trainer ranks) with per-process extra flags, for setup and failure tests.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "process_harness.h"
#include "testing/scoped_env.h"

namespace refit::testing {

struct JobSpec {
  int engines = 1;  // --engines: engine k's rank r is "engine k rank r" when more than one
  int engine_ranks = 2;
  int trainer_ranks = 2;
  int refits = 2;
  std::string transport = "shm";
  std::string model = "tiny";
  std::string bucket_size = "1MiB";
  double setup_timeout_s = 20;
  double refit_timeout_s = 20;
  std::vector<std::string> rank_args;         // appended to every rank's flags ("--device", "cuda")
  std::vector<std::string> coordinator_args;
  std::map<std::string, std::vector<std::string>> extra;  // by process name: "engine rank 1", "engine 2 rank 0"
  std::vector<std::string> skip;                          // process names not to start
  // By process name: variables set in its environment (nccl on one GPU:
  // each rank its own NCCL_HOSTID, nccl_env.h).
  std::map<std::string, std::map<std::string, std::string>> env;
};

// The process name of rank `rank` of `role` (of engine `engine`).
inline std::string job_rank_name(const JobSpec& spec, const std::string& role, int rank, int engine = 0) {
  if (role == "engine" && spec.engines > 1) return "engine " + std::to_string(engine) + " rank " + std::to_string(rank);
  return role + " rank " + std::to_string(rank);
}

// The flags of rank `rank` of `role` ("trainer", "engine"; of engine
// `engine`) in the job, with its coordinator at `address`: the base flags,
// then `spec.extra` for its name (an extra "--flag value" replaces the
// flag's base value; other flags are appended).
inline std::vector<std::string> job_rank_args(const JobSpec& spec, const std::string& address,
                                              const std::string& role, int rank, int engine = 0) {
  std::vector<std::string> a = {role, "--coordinator", address, "--rank", std::to_string(rank), "--model",
                                spec.model, "--transport", spec.transport, "--bucket-size", spec.bucket_size,
                                "--trainer-ranks", std::to_string(spec.trainer_ranks), "--engine-ranks",
                                std::to_string(spec.engine_ranks), "--setup-timeout",
                                std::to_string(spec.setup_timeout_s), "--timeout",
                                std::to_string(spec.refit_timeout_s)};
  if (engine != 0) a.insert(a.end(), {"--engine", std::to_string(engine)});
  a.insert(a.end(), spec.rank_args.begin(), spec.rank_args.end());
  if (auto it = spec.extra.find(job_rank_name(spec, role, rank, engine)); it != spec.extra.end()) {
    const auto& x = it->second;
    for (std::size_t i = 0; i < x.size(); ++i) {
      bool has_value = i + 1 < x.size() && x[i + 1].rfind("--", 0) != 0;
      auto base = std::find(a.begin(), a.end(), x[i]);
      if (has_value && base != a.end() && base + 1 != a.end()) {
        *(base + 1) = x[i + 1];
      } else {
        a.push_back(x[i]);
        if (has_value) a.push_back(x[i + 1]);
      }
      if (has_value) ++i;
    }
  }
  return a;
}

// The address of the group's coordinator (its port file), once it listens.
inline std::string job_coordinator_address(const ProcessGroup& group) {
  std::string port = read_file(group.dir() + "/port");
  port.erase(port.find_last_not_of("\n") + 1);
  return "127.0.0.1:" + port;
}

// Starts process `name` of the job with `args`, in its spec.env.
inline void spawn_job_rank(ProcessGroup& group, const JobSpec& spec, const std::string& name,
                           const std::vector<std::string>& args) {
  const auto it = spec.env.find(name);
  ScopedEnv env(it == spec.env.end() ? std::map<std::string, std::string>{} : it->second);
  group.spawn(name, args);
}

// Starts every process of the job in `group` but those in spec.skip (a
// test may start one of them later with job_rank_args); returns false if
// the coordinator did not listen.
inline bool start_job(ProcessGroup& group, const JobSpec& spec) {
  std::vector<std::string> coord = {"--refits", std::to_string(spec.refits), "--seed", "7", "--trainer-ranks",
                                    std::to_string(spec.trainer_ranks), "--engine-ranks",
                                    std::to_string(spec.engine_ranks), "--setup-timeout",
                                    std::to_string(spec.setup_timeout_s), "--timeout",
                                    std::to_string(spec.refit_timeout_s)};
  if (spec.engines > 1) coord.insert(coord.end(), {"--engines", std::to_string(spec.engines)});
  coord.insert(coord.end(), spec.coordinator_args.begin(), spec.coordinator_args.end());
  std::string address = group.spawn_coordinator(coord);
  if (address.empty()) return false;
  auto skipped = [&](const std::string& name) {
    return std::find(spec.skip.begin(), spec.skip.end(), name) != spec.skip.end();
  };
  for (int k = 0; k < spec.engines; ++k) {
    for (int r = 0; r < spec.engine_ranks; ++r) {
      const std::string name = job_rank_name(spec, "engine", r, k);
      if (!skipped(name)) spawn_job_rank(group, spec, name, job_rank_args(spec, address, "engine", r, k));
    }
  }
  for (int r = 0; r < spec.trainer_ranks; ++r) {
    const std::string name = job_rank_name(spec, "trainer", r);
    if (!skipped(name)) spawn_job_rank(group, spec, name, job_rank_args(spec, address, "trainer", r));
  }
  return true;
}

// Waits (at most `seconds`) until process `name` wrote `text` to its stderr:
// polls the captured output for that event, never a fixed sleep. False when
// the process exited without writing it, or time ran out.
inline bool wait_for_text(ProcessGroup& group, const std::string& name, const std::string& text,
                          double seconds = 60) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const bool exited = group.wait_one(name, 0);
    if (group.err(name).find(text) != std::string::npos) return true;
    if (exited || std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Waits (at most 60 s) until the coordinator logged that setup completed,
// so a fault injected after it lands while refits run.
inline bool wait_for_setup(ProcessGroup& group) { return wait_for_text(group, "coordinator", "setup complete"); }

// Makes `trainer` (a process name) stop itself by SIGSTOP right after sending
// its first bucket of refit `version` (--debug-stop-after-bucket), and its
// line the proof, for wait_for_refit_under_way, that this refit is in flight.
inline void stop_mid_refit(JobSpec& spec, const std::string& trainer, std::uint64_t version) {
  auto& extra = spec.extra[trainer];
  extra.push_back("--debug-stop-after-bucket");
  extra.push_back(std::to_string(version));
}

// Waits until the trainer given to stop_mid_refit stopped inside its refit.
inline bool wait_for_refit_under_way(ProcessGroup& group, const std::string& trainer, std::uint64_t version,
                                     double seconds = 60) {
  return wait_for_text(group, trainer, "of refit " + std::to_string(version) + " (--debug-stop-after-bucket)",
                       seconds);
}

}  // namespace refit::testing
