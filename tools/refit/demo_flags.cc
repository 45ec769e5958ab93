// The flags `refit demo` and `refit bench` share (demo.h add_demo_flags),
// the demo's fit of an auto bucket to --memory-limit, and the checks of the
// settings before any process starts (check_demo_settings).
#include <algorithm>
#include <cstdint>

#include "demo.h"
#include "flags.h"
#include "refit/coordinator.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "refit/roles.h"
#include "refit/trainer_layout.h"
#include "refit/transfer_defaults.h"

namespace refit::cli {

namespace {

// With --memory-limit and an auto bucket size, the demo (which starts every
// rank, so all agree) picks the auto size or, where the pool's slots of it
// would not fit the limit, the largest whole MiB (at least kMinBucketSize) of
// which they do: a small limit gets small buckets instead of a refusal. The
// slots: --pool-slots as given, or 2 where auto (the fewest auto picks) or
// direct (what the engine joins with).
void fit_auto_bucket_to_limit(DemoOptions& o) {
  if (o.bucket_size != kAutoBucketSize || o.memory_limit == 0) return;
  const bool two = o.mode == "direct" || o.pool_slots == kAutoPoolSlots;
  const std::uint64_t fits = o.memory_limit / (two ? 2 : static_cast<std::uint64_t>(o.pool_slots));
  if (fits >= default_bucket_size(o.transport)) return;
  constexpr std::uint64_t kMiB = 1ull << 20;
  const std::uint64_t rounded = fits >= kMiB ? fits / kMiB * kMiB : fits / kPlanAlignment * kPlanAlignment;
  o.bucket_size = std::max<std::uint64_t>(kMinBucketSize, rounded);
}

}  // namespace

void add_demo_flags(CLI::App& cmd, DemoOptions& o) {
  cmd.add_option("--model", o.model, "Model preset: " + join_names(model_presets()))
      ->check(CLI::IsMember(model_presets()))
      ->capture_default_str();
  cmd.add_option("--layers", o.layers, "Keep the first N decoder layers (-1: all)")->capture_default_str();
  cmd.add_option("--engine-ranks", o.engine_ranks, "Engine ranks (TP size)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd.add_option("--trainer-ranks", o.trainer_ranks, "Trainer ranks (default: as many as engine ranks)")
      ->check(CLI::Range(1, 256));
  add_trainer_layout_flags(cmd, o.trainer_layout, o.trainer_names);
  add_engine_gpus_flag(cmd, o.engine_gpus);
  add_engine_experts_flag(cmd, o.engine_experts);
  add_quantize_flag(cmd, o.quantize);
  add_change_fraction_flag(cmd, o.change_fraction);
  add_delta_flag(cmd, o.delta);
  add_transport_flag(cmd, o.transport);
  add_bucket_size_flag(cmd, o.bucket_size);
  cmd.add_option("--seed", o.seed, "Seed of the synthetic weights")->capture_default_str();
  cmd.add_flag("--json", o.json, "Print a JSON report on stdout instead of the table");
  add_device_flag(cmd, o.device);
  cmd.add_option("--trainer-device", o.trainer_device,
                 "Where the trainers' weights live, if not where --device says: cpu with --device cuda feeds GPU "
                 "engines from host memory (default: as --device)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add_register_host_weights_flag(cmd, o.register_host_weights);
  add_mode_flag(cmd, o.mode);
  add_pool_slots_flag(cmd, o.pool_slots, "Receive pool slots per engine rank", kFewestPoolSlots);
  add_byte_size_option(cmd, "--memory-limit", o.memory_limit, "Receive pool memory limit per engine rank (0: none)");
  cmd.callback([&o] {
    fit_auto_bucket_to_limit(o);
    check_receive_pool(o.pool_slots, o.bucket_size, o.memory_limit, o.mode);
  });
  cmd.add_flag("--poison-recycled", o.poison_recycled, "Debug: poison every recycled staging buffer");
  add_shadow_flags(cmd, o.shadow, o.readers);
  add_release_flag(cmd, o.release_between_refits);
  add_only_flags(cmd, o.only, o.only_from);
  add_engines_flags(cmd, o.engines, o.relay_fanout, o.min_engines, o.max_engines);
  add_timeout_flags(cmd, o.setup_timeout_s, o.refit_timeout_s);
  add_secret_file_flag(cmd, o.secret_file);
}

std::vector<std::string> coordinator_only_args(const DemoOptions& o) {
  if (o.only.empty()) return {};
  std::string globs;
  for (const std::string& g : o.only) globs += (globs.empty() ? "" : ",") + g;
  return {"--only", globs, "--only-from", std::to_string(o.only_from)};
}

// Where the trainers' weights live: --trainer-device, or --device.
const std::string& trainer_device(const DemoOptions& o) {
  return o.trainer_device.empty() ? o.device : o.trainer_device;
}

namespace {

// Settings that no process could run with: refused before any starts.
Status check_settings(const DemoOptions& o, int trainers) {
  RankOptions settings;
  settings.transport = o.transport;
  settings.device = o.device;
  settings.mode = o.mode;
  RETURN_IF_ERROR(validate_rank_settings(settings, /*engine=*/true));
  if (trainer_device(o) == "cuda" && o.device == "cpu") {
    return InvalidArgument(
        "--trainer-device cuda with --device cpu: trainers' device weights cannot feed engines that keep host "
        "memory (give --device cuda, or leave --trainer-device out)");
  }
  settings.device = trainer_device(o);
  RETURN_IF_ERROR(validate_rank_settings(settings, /*engine=*/false));
  RETURN_IF_ERROR(validate_rank_counts(trainers, o.engine_ranks));
  ASSIGN_OR_RETURN(const TrainerLayout layout, parse_trainer_layout(o.trainer_layout, trainers));
  return validate_full_trainer_counts(layout, trainers, o.engine_ranks);
}

}  // namespace

Status check_demo_settings(const DemoOptions& o) {
  RETURN_IF_ERROR(make_model(o.model, o.layers).status());
  return check_settings(o, o.trainer_ranks > 0 ? o.trainer_ranks : o.engine_ranks);
}

void add_demo_hidden_flags(CLI::App& cmd, DemoOptions& o) {
  cmd.add_option("--soak-report", o.soak_report,
                 "Soak: sample every process's memory, descriptors and shared memory into this JSON file")
      ->group("");  // hidden: bench/soak.sh
  cmd.add_flag("--debug-log-processes", o.debug_log_processes,
               "Debug: print every process's pid once started, and keep the coordinator's log (joins, setup)")
      ->group("");  // hidden: tests synchronise on these lines
  cmd.add_option("--debug-engine-flag", o.debug_engine_flags,
                 "Debug: append this argument to every engine rank's command line (repeatable)")
      ->group("");  // hidden: tests make a job fail at setup
  cmd.add_option("--debug-engine-fault", o.debug_engine_faults,
                 "Debug: K:STEP:VERSION:ACTION gives engine K's ranks --debug-fault STEP:VERSION:ACTION (repeatable)")
      ->group("");  // hidden: tests lose one engine of many
}

}  // namespace refit::cli
