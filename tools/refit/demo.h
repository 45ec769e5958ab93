// `refit demo`: launches a coordinator, trainer ranks and engine ranks as
// separate processes of this binary on this host, runs N refits, has every
// engine rank verify every byte after each refit, and prints a summary (or a
// JSON report). Exit status 0 only when every refit verified.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace refit {

struct DemoOptions {
  std::string model = "tiny";
  int layers = -1;
  int engine_ranks = 3;
  int trainer_ranks = 0;  // 0: as many as engine ranks
  std::string transport = "shm";
  std::string device = "cpu";    // cpu or cuda (trainer weights, pools, engine weights)
  std::string mode = "staged";   // staged or direct
  std::uint64_t bucket_size = 4ull << 20;
  int refits = 5;
  std::uint64_t seed = 1;
  bool json = false;
  int pool_slots = 2;
  std::uint64_t memory_limit = 0;
  bool poison_recycled = false;
  double setup_timeout_s = 60;
  double refit_timeout_s = 300;
  std::string secret_file;  // passed to every process as --secret-file; "": REFIT_SECRET or none
  // Soak (bench/soak.sh): write every process's VmRSS, open descriptors and
  // shared memory at the start and the end of the job to this JSON file.
  std::string soak_report;
};

// Runs the demo and returns its JSON report (see README); "verified" is true
// only when every process succeeded and every refit verified.
nlohmann::json run_demo_report(const DemoOptions& options);

// Runs the demo, prints the table (or the JSON with options.json) and
// returns the process exit status: 0 only when verified.
int run_demo(const DemoOptions& options);

}  // namespace refit
