// `refit demo`: launches a coordinator, trainer ranks and engine ranks as
// separate processes of this binary on this host, runs N refits, has every
// engine rank verify every byte after each refit, and prints a summary (or a
// JSON report). Exit status 0 only when every refit verified.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "refit/status.h"
#include "refit/coordinator.h"
#include "refit/roles.h"

namespace refit::cli {

// What the demo runs; the settings every rank shares default to the
// library's (RankOptions, EngineOptions), the rest are the demo's own.
struct DemoOptions {
  std::string model = RankOptions{}.model;
  int layers = RankOptions{}.layers;
  int engine_ranks = 3;   // the demo's own: shows TP out of the box
  int engine_gpus = EngineOptions{}.engine_gpus;  // GPUs the engine ranks share (0: one each)
  int trainer_ranks = 0;  // 0: as many as engine ranks
  int engines = CoordinatorOptions{}.engines;  // engines of engine_ranks ranks each, relayed
  int relay_fanout = CoordinatorOptions{}.relay_fanout;
  int min_engines = CoordinatorOptions{}.min_engines;  // 0: every engine
  int max_engines = CoordinatorOptions{}.max_engines;  // 0: --engines
  std::string trainer_layout = RankOptions{}.trainer_layout;  // trainer_layout.h
  std::string trainer_names = RankOptions{}.trainer_names;    // hf or megatron (roles.h)
  std::string engine_experts = RankOptions{}.engine_experts;  // expert_parallel.h: tp or ep
  double change_fraction = RankOptions{}.change_fraction;
  bool delta = RankOptions{}.delta;  // --delta: every trainer and engine rank
  std::string quantize = RankOptions{}.quantize;              // quantize.h: none or fp8-block128[:GLOB,...]
  std::string transport = RankOptions{}.transport;
  std::string device = RankOptions{}.device;  // cpu or cuda (trainer weights, pools, engine weights)
  // Where the trainers' weights live when not where --device puts them:
  // "cpu" with --device cuda is host weights feeding GPU engines (copied by
  // the trainer's --gpu). "": as --device.
  std::string trainer_device;
  // Host trainer weights into GPU engines: registered with the GPU (its copy
  // engines read them) or, false, packed through pinned buffers.
  bool register_host_weights = RankOptions{}.register_host_weights;
  std::string mode = RankOptions{}.mode;      // staged or direct
  std::uint64_t bucket_size = RankOptions{}.bucket_size;
  int refits = 5;
  std::uint64_t seed = 1;
  bool json = false;
  int pool_slots = EngineOptions{}.pool_slots;
  std::uint64_t memory_limit = EngineOptions{}.memory_limit;
  bool poison_recycled = false;
  bool shadow = EngineOptions{}.shadow;
  int readers = EngineOptions{}.readers;
  bool release_between_refits = CoordinatorOptions{}.release_between_refits;
  std::vector<std::string> only = CoordinatorOptions{}.only;  // partial refits from only_from on
  std::uint64_t only_from = CoordinatorOptions{}.only_from;
  double setup_timeout_s = RankOptions{}.setup_timeout_s;
  double refit_timeout_s = RankOptions{}.refit_timeout_s;
  std::string secret_file;  // passed to every process as --secret-file; "": REFIT_SECRET or none
  // Soak (bench/soak.sh): write every process's VmRSS, open descriptors and
  // shared memory at the start and the end of the job to this JSON file.
  std::string soak_report;
  // Tests: print the processes' pids and keep the coordinator's log.
  bool debug_log_processes = false;
  // Tests: arguments appended to every engine rank's command line (a
  // setting the demo does not offer, to make a job fail at setup).
  std::vector<std::string> debug_engine_flags;
  // "K:STEP:VERSION:ACTION": engine K's ranks get --debug-fault STEP:VERSION:ACTION.
  std::vector<std::string> debug_engine_faults;
};

// The flags `refit demo` and `refit bench` share, bound to `options`
// (everything but --refits, whose range differs, and the hidden ones), and
// the command's callback: the receive pool must fit --memory-limit.
void add_demo_flags(CLI::App& cmd, DemoOptions& options);
// The demo's hidden flags: the soak report and the debug hooks tests use.
void add_demo_hidden_flags(CLI::App& cmd, DemoOptions& options);

// Where the trainers' weights live: --trainer-device, or --device.
const std::string& trainer_device(const DemoOptions& options);
// The coordinator's --only and --only-from (none for full refits).
std::vector<std::string> coordinator_only_args(const DemoOptions& options);

// The checks the demo makes before it starts any process: the model preset
// and layer count, and every rank's settings (validate_rank_settings, which
// refuses --device cuda without a usable GPU). Errors name the setting.
Status check_demo_settings(const DemoOptions& options);

// Runs the demo and returns its JSON report (see README); "verified" is true
// only when every process succeeded and every refit verified.
nlohmann::json run_demo_report(const DemoOptions& options);

}  // namespace refit::cli
