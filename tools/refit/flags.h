// Flags that more than one `refit` subcommand takes, declared once here.
//
// Every option is bound straight to a field of the options struct the
// command runs with (RankOptions, EngineOptions, CoordinatorOptions,
// DemoOptions, ...): the default a user gets is the field's initial value,
// and --help shows that value, so the struct is the one place a default
// lives. Register flags on a default-constructed struct.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "refit/secret.h"
#include "refit/status.h"
#include "refit/roles.h"

namespace refit::cli {

// A rank command (`refit trainer|engine|save|push`) whose command line
// `cmd` refused with `error` (exit 2): when --coordinator and --rank (push:
// --first-rank, 0 when not given) were read, its coordinator hears why
// (report_rank_setup_failure, with the --secret-file or REFIT_SECRET given),
// within a second; other commands, or a rank that cannot be read, nothing.
void report_refused_command_line(const CLI::App& cmd, const std::string& error);

// "4MiB" for 4 << 20, "1GiB", "512KiB", "4097": the shortest text that
// parse_byte_size reads back as exactly `bytes` (what --help shows).
std::string byte_size_text(std::uint64_t bytes);

// A byte-size option ("4MiB", "1GiB", "64MB", "4096") bound to `bytes`;
// --help shows its value now as byte_size_text. A text parse_byte_size
// refuses is a usage error naming it.
CLI::Option* add_byte_size_option(CLI::App& cmd, const std::string& name, std::uint64_t& bytes,
                                  const std::string& help);

// The largest --bucket-size: the control protocol's bound on a join's
// bucket size (kMaxBucketSize of src/control/control_message.h, which
// tools do not include; cli_text_test checks the two agree).
inline constexpr std::uint64_t kLargestBucketSize = 1ull << 48;

// --bucket-size, bound to `bytes` (RankOptions::bucket_size's default):
// "auto" (kAutoBucketSize) or a size make_plan takes (at least
// kMinBucketSize, a multiple of kPlanAlignment) and at most
// kLargestBucketSize, else a usage error.
CLI::Option* add_bucket_size_flag(CLI::App& cmd, std::uint64_t& bytes);

// --pool-slots, bound to `slots`: "auto" (kAutoPoolSlots) or `fewest` to
// kMostPoolSlots, else a usage error. `refit demo` takes kFewestPoolSlots
// (the rotating receive pool, DESIGN.md rule 3); `refit engine` takes 1 and
// leaves the refusal to the coordinator, which says it to every rank.
inline constexpr int kFewestPoolSlots = 2;
inline constexpr int kMostPoolSlots = 64;
CLI::Option* add_pool_slots_flag(CLI::App& cmd, int& slots, const std::string& help, int fewest);

// The receive pool (pool_slots x bucket_size; 2 slots in direct mode, as
// the engine joins with) must fit a nonzero memory_limit: throws a
// CLI::ValidationError naming the three flags and their values otherwise.
// Auto sizes pass (the engine rank fits them to the limit, or the
// coordinator names it). For a command's callback, once every flag parsed
// (exit 2).
void check_receive_pool(int pool_slots, std::uint64_t bucket_size, std::uint64_t memory_limit,
                        const std::string& mode);

// --setup-timeout and --timeout (seconds, positive).
void add_timeout_flags(CLI::App& cmd, double& setup_timeout_s, double& refit_timeout_s);

// --bucket-timeout (seconds, positive): RankOptions::bucket_timeout_s, the
// longest wait for the next bucket (every role that runs ranks).
CLI::Option* add_bucket_timeout_flag(CLI::App& cmd, double& seconds);

// --heartbeat-interval and --heartbeat-timeout (seconds, positive): the
// liveness of the coordinator and the ranks (docs/RELIABILITY.md).
void add_heartbeat_flags(CLI::App& cmd, double& interval_s, double& timeout_s);

// --trainer-ranks and --engine-ranks, with the help texts given (each
// command says what the count means to it) and positive counts.
void add_rank_count_flags(CLI::App& cmd, int& trainer_ranks, const std::string& trainer_help, int& engine_ranks,
                          const std::string& engine_help);

// --transport: one of transport_names().
CLI::Option* add_transport_flag(CLI::App& cmd, std::string& transport);
// --device: cpu or cuda.
CLI::Option* add_device_flag(CLI::App& cmd, std::string& device);
// --register-host-weights (trainer, push, demo, bench): host weights that
// feed GPU engines are registered with the GPU, or packed through pinned
// buffers (false).
CLI::Option* add_register_host_weights_flag(CLI::App& cmd, bool& register_host_weights);
// --mode: staged or direct.
CLI::Option* add_mode_flag(CLI::App& cmd, std::string& mode);

// --debug-fault STEP:VERSION:ACTION (refit/fault_hook.h), for tests: kill
// or stop the process at one protocol step of one refit. A text
// parse_fault_hook refuses is a usage error naming the wrong part.
CLI::Option* add_fault_hook_flag(CLI::App& cmd, FaultHook& hook);

// --secret-file: the file holding the job's shared secret. Resolve it with
// resolve_secret once the command line parsed.
CLI::Option* add_secret_file_flag(CLI::App& cmd, std::string& path);

// The secret of `path` if given, else of the environment variable
// REFIT_SECRET, else none: read here, at the edge.
StatusOr<Secret> resolve_secret(const std::string& path);

// The flags of one rank process (`refit trainer|engine|save`): coordinator,
// rank, counts, model, layers, shard rules, bucket size, transport,
// timeouts, device and mode.
void add_rank_flags(CLI::App& cmd, RankOptions& options);
// --trainer-layout and --trainer-names (trainer, demo, bench): how the
// trainer ranks hold the weights and how they name them.
void add_trainer_layout_flags(CLI::App& cmd, std::string& layout, std::string& names);
// --engine-experts (trainer, engine, demo, bench): tp or ep (expert_parallel.h).
// --shadow and --readers (EngineOptions::shadow, readers; issue 21).
void add_shadow_flags(CLI::App& cmd, bool& shadow, int& readers);
// --release-between-refits (coordinator, demo, bench): CoordinatorOptions::release_between_refits.
void add_release_flag(CLI::App& cmd, bool& release);
// --only and --only-from (coordinator, demo, bench): CoordinatorOptions::only, only_from (partial refits).
void add_only_flags(CLI::App& cmd, std::vector<std::string>& only, std::uint64_t& only_from);
// --engines, --relay-fanout, --min-engines and --max-engines (coordinator,
// demo, bench): CoordinatorOptions::engines, relay_fanout, min_engines,
// max_engines.
void add_engines_flags(CLI::App& cmd, int& engines, int& relay_fanout, int& min_engines, int& max_engines);

void add_engine_experts_flag(CLI::App& cmd, std::string& experts);
// --change-fraction (trainer, engine, demo, bench): RankOptions::change_fraction.
void add_change_fraction_flag(CLI::App& cmd, double& fraction);
// --delta (trainer, engine, demo, bench): RankOptions::delta.
void add_delta_flag(CLI::App& cmd, bool& delta);
// --quantize (trainer, engine, demo, bench): none or fp8-block128[:GLOB,...] (quantize.h).
void add_quantize_flag(CLI::App& cmd, std::string& quantize);
// --engine-gpus (engine, demo, bench): GPUs the engine ranks share round-robin.
void add_engine_gpus_flag(CLI::App& cmd, int& gpus);

// What `refit engine` and `refit save` share: the rank flags, the secret
// file and the receive pool, verification, dtypes and device settings.
void add_engine_flags(CLI::App& cmd, EngineOptions& options, std::string& secret_file);

// Validates dtype names of --dtypes and resolves the secret into `options`:
// what an engine rank needs before it runs.
Status finish_engine_options(EngineOptions& options, const std::string& secret_file);

// "a, b, c".
std::string join_names(const std::vector<std::string>& names);

// CLI11 check of a whole number in [min, max] whose refusal names what the
// number is: "--version: 0 is not a version (versions start at 1)", in
// place of CLI11's "Value 0 not in range 0.000000 to 1797693...".
// `noun` with its article ("a version"), `plural` ("versions").
struct WholeNumber : CLI::Validator {
  WholeNumber(std::uint64_t min, std::uint64_t max, const std::string& noun, const std::string& plural);
};

// The same for an int option: max is INT_MAX.
WholeNumber WholeInt(int min, const std::string& noun, const std::string& plural);

// CLI11 check of a positive count of seconds (--timeout 0: "0 is not a
// duration (seconds, more than 0)").
struct PositiveSeconds : CLI::Validator {
  PositiveSeconds();
};

// CLI11 check of a shard-rule row ("*.qkv_proj.weight=column").
struct ShardRuleRow : CLI::Validator {
  ShardRuleRow();
};

}  // namespace refit::cli
