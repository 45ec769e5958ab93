#include "flags.h"

#include "refit/content.h"

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "refit/checkpoint.h"
#include "refit/dtype.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "refit/quantize.h"
#include "refit/transports.h"

namespace refit::cli {
namespace {

constexpr const char* kSecretFileHelp =
    "File holding the shared secret of the control and data planes (default: the environment variable REFIT_SECRET; "
    "neither: no authentication, loopback only)";

// CLI11 transform of a byte size ("4MiB") into its count of bytes ("4194304"),
// which CLI11 then stores in the bound integer.
struct ByteSize : CLI::Validator {
  ByteSize() {
    name_ = "SIZE";
    func_ = [](std::string& text) {
      auto parsed = parse_byte_size(text);
      if (!parsed.ok()) return parsed.status().message();
      text = std::to_string(*parsed);
      return std::string();
    };
  }
};

// CLI11 transform of a bucket size ("64MiB", or "auto") into its count of
// bytes (auto: kAutoBucketSize), which CLI11 then stores in the bound
// integer. A size make_plan refuses (plan.h: at least kMinBucketSize, a
// multiple of kPlanAlignment) or above kLargestBucketSize is a usage error of
// the command line instead of a refusal of every rank at setup; so is "0",
// which is not a size (auto is spelt out).
struct BucketSize : CLI::Validator {
  BucketSize() {
    name_ = "BUCKET SIZE";
    func_ = [](std::string& text) {
      if (text == "auto") {
        text = std::to_string(kAutoBucketSize);
        return std::string();
      }
      auto parsed = parse_byte_size(text);
      if (!parsed.ok()) return parsed.status().message();
      const std::uint64_t bytes = *parsed;
      if (bytes < kMinBucketSize || bytes % kPlanAlignment != 0 || bytes > kLargestBucketSize) {
        return byte_size_text(bytes) + " is not a bucket size (at least " + byte_size_text(kMinBucketSize) +
               ", a multiple of " + std::to_string(kPlanAlignment) + " bytes, at most " +
               byte_size_text(kLargestBucketSize) + "; or auto)";
      }
      text = std::to_string(bytes);
      return std::string();
    };
  }
};

// CLI11 transform of a pool slot count ("3", or "auto": kAutoPoolSlots)
// from `fewest` to kMostPoolSlots.
struct PoolSlots : CLI::Validator {
  explicit PoolSlots(int fewest) {
    name_ = "POOL SLOTS";
    func_ = [fewest](std::string& text) {
      if (text == "auto") {
        text = std::to_string(kAutoPoolSlots);
        return std::string();
      }
      return WholeNumber(static_cast<std::uint64_t>(fewest), static_cast<std::uint64_t>(kMostPoolSlots),
                         "a count of pool slots", "pool slot counts")(text);
    };
  }
};

// The one text `cmd` read for option `name`, as given (before its checks
// ran or after they passed); "" when `cmd` has no such option, or it was
// not given once.
std::string given_text(const CLI::App& cmd, const std::string& name) {
  const CLI::Option* option = cmd.get_option_no_throw(name);
  if (option == nullptr || option->results().size() != 1) return "";
  return option->results()[0];
}

}  // namespace

void report_refused_command_line(const CLI::App& cmd, const std::string& error) {
  const std::string command = cmd.get_name();
  const bool engine = command == "engine" || command == "save";
  if (!engine && command != "trainer" && command != "push") return;
  RankOptions options;
  options.coordinator = given_text(cmd, "--coordinator");
  std::string rank = given_text(cmd, command == "push" ? "--first-rank" : "--rank");
  if (rank.empty() && command == "push") rank = "0";  // push runs from trainer rank 0 by default
  const auto [end, ec] = std::from_chars(rank.data(), rank.data() + rank.size(), options.rank);
  if (options.coordinator.empty() || rank.empty() || ec != std::errc() || end != rank.data() + rank.size() ||
      options.rank < 0) {
    return;
  }
  auto secret = resolve_secret(given_text(cmd, "--secret-file"));
  if (!secret.ok()) return;  // the coordinator would refuse it unauthenticated
  options.secret = secret->bytes();
  // The coordinator is normally listening already: a second is plenty, and
  // a mistyped command line never waits long for a coordinator that is not.
  options.setup_timeout_s = 1;
  int engine_index = 0;  // --engine, when given and a number
  const std::string given = given_text(cmd, "--engine");
  std::from_chars(given.data(), given.data() + given.size(), engine_index);
  report_rank_setup_failure(options, engine, InvalidArgument("refit " + command + " refused its command line: " + error),
                            engine_index);
}

std::string byte_size_text(std::uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  std::string text = std::to_string(bytes);
  std::uint64_t scale = 1024;
  for (const char* unit : kUnits) {
    if (bytes == 0 || bytes % scale != 0) break;
    text = std::to_string(bytes / scale) + unit;
    scale *= 1024;
  }
  return text;
}

CLI::Option* add_byte_size_option(CLI::App& cmd, const std::string& name, std::uint64_t& bytes,
                                  const std::string& help) {
  return cmd.add_option(name, bytes, help)->transform(ByteSize())->type_name("SIZE")->default_str(byte_size_text(bytes));
}

CLI::Option* add_bucket_size_flag(CLI::App& cmd, std::uint64_t& bytes) {
  return cmd
      .add_option("--bucket-size", bytes,
                  "Transport bucket size, e.g. 64MiB, 1GiB; auto: 1GiB over cuda_ipc and nccl, 64MiB over shm, tcp and ucx")
      ->transform(BucketSize())
      ->type_name("SIZE|auto")
      ->default_str(bytes == kAutoBucketSize ? "auto" : byte_size_text(bytes));
}

CLI::Option* add_pool_slots_flag(CLI::App& cmd, int& slots, const std::string& help, int fewest) {
  return cmd
      .add_option("--pool-slots", slots,
                  help + " (" + std::to_string(fewest) + " to " + std::to_string(kMostPoolSlots) +
                      "; auto: 3, or 2 where --memory-limit holds fewer)")
      ->transform(PoolSlots(fewest))
      ->type_name("INT|auto")
      ->default_str(slots == kAutoPoolSlots ? "auto" : std::to_string(slots));
}

void check_receive_pool(int pool_slots, std::uint64_t bucket_size, std::uint64_t memory_limit,
                        const std::string& mode) {
  // Auto settings are resolved (and fitted to the limit) by the engine rank
  // against its plan, which the command line does not know.
  if (bucket_size == kAutoBucketSize || (pool_slots == kAutoPoolSlots && mode != "direct")) return;
  // Direct mode has no pool of its own, but the coordinator counts one of
  // 2 slots against the limit all the same (the engine joins with 2).
  const std::uint64_t slots = mode == "direct" ? 2 : static_cast<std::uint64_t>(pool_slots);
  const std::uint64_t pool = slots * bucket_size;  // <= 64 x kLargestBucketSize: no overflow
  if (memory_limit == 0 || pool <= memory_limit) return;
  throw CLI::ValidationError(
      "--memory-limit", byte_size_text(memory_limit) + " cannot hold the receive pool: " +
                            (mode == "direct" ? "2 slots (direct mode)" : "--pool-slots " + std::to_string(slots)) +
                            " x --bucket-size " + byte_size_text(bucket_size) + " = " + byte_size_text(pool) +
                            " (raise --memory-limit, 0 for none, or lower the others)");
}

CLI::Option* add_fault_hook_flag(CLI::App& cmd, FaultHook& hook) {
  return cmd
      .add_option_function<std::string>(
          "--debug-fault",
          [&hook](const std::string& text) {
            auto parsed = parse_fault_hook(text);
            if (!parsed.ok()) throw CLI::ValidationError("--debug-fault", parsed.status().message());
            hook = *parsed;
          },
          "Fault injection for tests: at STEP of refit VERSION, ACTION this process "
          "(STEP:VERSION:ACTION; steps start, ready, go, sent, done, commit, committed; actions kill, stop; "
          "default: none)")
      ->type_name("STEP:VERSION:ACTION");
}

void add_timeout_flags(CLI::App& cmd, double& setup_timeout_s, double& refit_timeout_s) {
  cmd.add_option("--setup-timeout", setup_timeout_s, "Seconds allowed for setup")
      ->check(PositiveSeconds())
      ->capture_default_str();
  cmd.add_option("--timeout", refit_timeout_s, "Seconds allowed for one refit")
      ->check(PositiveSeconds())
      ->capture_default_str();
}

CLI::Option* add_bucket_timeout_flag(CLI::App& cmd, double& seconds) {
  return cmd
      .add_option("--bucket-timeout", seconds,
                  "Seconds a rank waits for the next bucket before it declares its peer stalled")
      ->check(PositiveSeconds())
      ->capture_default_str();
}

void add_heartbeat_flags(CLI::App& cmd, double& interval_s, double& timeout_s) {
  cmd.add_option("--heartbeat-interval", interval_s, "Seconds between heartbeats to the peer(s)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--heartbeat-timeout", timeout_s,
                 "Seconds of silence (no heartbeat, no message) after which a peer counts as lost, idle or not")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

void add_rank_count_flags(CLI::App& cmd, int& trainer_ranks, const std::string& trainer_help, int& engine_ranks,
                          const std::string& engine_help) {
  cmd.add_option("--trainer-ranks", trainer_ranks, trainer_help)
      ->check(WholeInt(1, "a count of trainer ranks", "counts"))->capture_default_str();
  cmd.add_option("--engine-ranks", engine_ranks, engine_help)
      ->check(WholeInt(1, "a count of engine ranks", "counts"))->capture_default_str();
}

CLI::Option* add_transport_flag(CLI::App& cmd, std::string& transport) {
  return cmd.add_option("--transport", transport, "Transport: " + join_names(transport_names()))
      ->check(CLI::IsMember(transport_names()))
      ->capture_default_str();
}

CLI::Option* add_device_flag(CLI::App& cmd, std::string& device) {
  return cmd.add_option("--device", device, "Where weights and buffers live: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
}

CLI::Option* add_register_host_weights_flag(CLI::App& cmd, bool& register_host_weights) {
  return cmd
      .add_option("--register-host-weights", register_host_weights,
                  "GPU engines fed from host weights: register the weights with the GPU so its copy engines read "
                  "them directly (false: pack through pinned buffers)")
      ->capture_default_str();
}

CLI::Option* add_mode_flag(CLI::App& cmd, std::string& mode) {
  return cmd.add_option("--mode", mode, "staged (receive pool) or direct (trainers write into the engine's weights)")
      ->check(CLI::IsMember({"staged", "direct"}))
      ->capture_default_str();
}

CLI::Option* add_secret_file_flag(CLI::App& cmd, std::string& path) {
  return cmd.add_option("--secret-file", path, kSecretFileHelp);
}

StatusOr<Secret> resolve_secret(const std::string& path) { return Secret::Resolve(path, std::getenv("REFIT_SECRET")); }

void add_rank_flags(CLI::App& cmd, RankOptions& o) {
  cmd.add_option("--coordinator", o.coordinator, "Coordinator address host:port")->required();
  cmd.add_option("--rank", o.rank, "This process's rank")->required()->check(WholeInt(0, "a rank", "ranks"));
  add_rank_count_flags(cmd, o.trainer_ranks, "Number of trainer ranks", o.engine_ranks,
                       "Number of engine ranks (TP size)");
  cmd.add_option("--model", o.model,
                 "Model preset (" + join_names(model_presets()) + ") or safetensors checkpoint path")
      ->capture_default_str();
  cmd.add_option("--layers", o.layers, "Keep the first N decoder layers (-1: all)")->capture_default_str();
  cmd.add_option("--rule", o.shard_rules,
                 "Checkpoints: a TP shard rule GLOB=RULE (replicated, column, row, vocab) ahead of the default "
                 "rules (repeatable; default: none)");
  add_engine_experts_flag(cmd, o.engine_experts);
  add_quantize_flag(cmd, o.quantize);
  add_change_fraction_flag(cmd, o.change_fraction);
  add_delta_flag(cmd, o.delta);
  add_bucket_size_flag(cmd, o.bucket_size);
  add_transport_flag(cmd, o.transport);
  add_timeout_flags(cmd, o.setup_timeout_s, o.refit_timeout_s);
  add_heartbeat_flags(cmd, o.heartbeat_interval_s, o.heartbeat_timeout_s);
  add_bucket_timeout_flag(cmd, o.bucket_timeout_s);
  add_device_flag(cmd, o.device);
  add_mode_flag(cmd, o.mode);
}

void add_trainer_layout_flags(CLI::App& cmd, std::string& layout, std::string& names) {
  cmd.add_option("--trainer-layout", layout,
                 "How the trainer ranks hold the weights: full (every rank all of them), fsdp (FSDP2 dim-0 chunks "
                 "over all ranks), tp (Megatron TP by each weight's shard rule), tp:X,fsdp:Y (both, X*Y ranks); "
                 "sharded layouts feed every engine rank their shards reach")
      ->capture_default_str();
  cmd.add_option("--trainer-names", names,
                 "How the trainer names the weights: hf (as the engine does) or megatron (Megatron-Core's fused "
                 "linear_qkv and linear_fc1 and stacked experts, with --trainer-layout fsdp; each sub-slice moves "
                 "straight into the engine's Hugging Face tensors)")
      ->check(CLI::IsMember({"hf", "megatron"}))
      ->capture_default_str();
}

void add_engine_flags(CLI::App& cmd, EngineOptions& o, std::string& secret_file) {
  add_rank_flags(cmd, o);
  add_secret_file_flag(cmd, secret_file);
  // A lone rank's pool is checked by the coordinator, which refuses the job
  // naming the rank to every process at once (tests/setup_rejection_test);
  // refused here, the rank would exit before joining and leave the rest of
  // the job waiting for --setup-timeout. `refit demo` refuses at parse.
  add_pool_slots_flag(cmd, o.pool_slots, "Receive pool slots", 1);
  add_byte_size_option(cmd, "--memory-limit", o.memory_limit, "Receive pool memory limit (0: none)");
  cmd.add_option("--engine", o.engine, "The engine this rank belongs to (the coordinator's --engines)")
      ->check(CLI::Range(0, 1023))
      ->capture_default_str();
  cmd.add_option("--listen-host", o.listen_host, "Address trainers connect to for data")->capture_default_str();
  cmd.add_flag("--poison-recycled", o.poison_recycled, "Debug: poison every recycled staging buffer");
  add_shadow_flags(cmd, o.shadow, o.readers);
  cmd.add_flag("!--no-verify", o.verify,
               "Skip verifying every byte after each refit (against the synthetic content, or the checkpoint file)");
  cmd.add_option("--dtypes", o.supported_dtypes, "Dtypes this engine supports (default: all)");
  cmd.add_option("--base-gpu-id", o.base_gpu_id,
                 "Engine rank r uses local CUDA device base-gpu-id + r (an index inside CUDA_VISIBLE_DEVICES)")
      ->check(WholeInt(0, "a device index", "device indices"))
      ->capture_default_str();
  add_engine_gpus_flag(cmd, o.engine_gpus);
}

void add_shadow_flags(CLI::App& cmd, bool& shadow, int& readers) {
  cmd.add_flag("--shadow", shadow,
               "Shadow weights: a refit lands in a second weight arena and the commit flips it into service between "
               "two reads, so readers never see a mixture of versions (twice the weight memory; staged or direct "
               "mode)");
  cmd.add_option("--readers", readers,
                 "Reader threads per engine rank standing in for a server's forward passes: each checks served "
                 "tensors against the committed version; the report counts reads and torn_reads")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
}

void add_engines_flags(CLI::App& cmd, int& engines, int& relay_fanout, int& min_engines, int& max_engines) {
  cmd.add_option("--engines", engines,
                 "Engines (replicas of --engine-ranks ranks each): engine 0 is fed by the trainers, every other by "
                 "the engine before it in the relay tree, so the trainers' links carry each byte once")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd.add_option("--relay-fanout", relay_fanout,
                 "Engines each engine relays to (1: a chain, every link carries each byte once)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd.add_option("--min-engines", min_engines,
                 "The fewest engines the job goes on with: an engine that dies, stalls or misses a deadline is dropped "
                 "while this many stay (a refit in flight runs again on the others); when engine 0 goes, the trainers "
                 "feed the next live engine "
                 "(default: --engines, a lost engine ends the job)")
      ->check(CLI::Range(1, 1024));
  cmd.add_option("--max-engines", max_engines,
                 "Engine slots: engines --engines..N-1 may join the running job (`refit engine --engine k`); each is "
                 "admitted at the next refit boundary, first receives the last committed version from its parent in "
                 "the relay tree, and then counts as live (default: --engines, none joins)")
      ->check(CLI::Range(1, 1024));
}

void add_release_flag(CLI::App& cmd, bool& release) {
  cmd.add_flag("--release-between-refits", release,
               "Colocated jobs: after each commit the trainers close their mappings and free their staging, then the "
               "engines free their receive pools; both take them again before the next refit (the report gives "
               "the bytes each engine rank returned)");
}

void add_only_flags(CLI::App& cmd, std::vector<std::string>& only, std::uint64_t& only_from) {
  cmd.add_option("--only", only,
                 "Partial refits: from --only-from on, each refit moves only the tensors these whole-name globs "
                 "select ('*' only, comma-separated, e.g. '*.q_proj.weight,*norm*'); the version applies to the "
                 "whole engine (default: none, every refit moves every tensor)")
      ->delimiter(',');
  cmd.add_option("--only-from", only_from, "The first refit that is partial (with --only; the first is full)")
      ->check(CLI::Range(std::uint64_t{2}, std::uint64_t{1} << 62))
      ->capture_default_str();
}

void add_engine_experts_flag(CLI::App& cmd, std::string& experts) {
  cmd.add_option("--engine-experts", experts,
                 "How engine ranks hold MoE experts: tp (each rank a TP slice of every expert) or ep (expert "
                 "parallel: whole experts, about E/N per rank)")
      ->check(CLI::IsMember({"tp", "ep"}))
      ->capture_default_str();
}

void add_change_fraction_flag(CLI::App& cmd, double& fraction) {
  cmd.add_option("--change-fraction", fraction,
                 "Synthetic weights: the fraction of each tensor's elements that changes from one version to the "
                 "next, like an optimizer step (1: every element)")
      ->check([](const std::string& text) {
        double f = 0;
        try {
          f = std::stod(text);
        } catch (const std::exception&) {
          return std::string("not a number");
        }
        return change_parts(f).ok() ? std::string() : std::string("not a fraction of the elements in (0, 1]");
      })
      ->capture_default_str();
}

void add_delta_flag(CLI::App& cmd, bool& delta) {
  cmd.add_flag("--delta", delta,
               "Delta refits: each bucket goes as the smaller of its bytes and its changed 8-byte words against the "
               "version the engine holds (host weights into host pools, staged, shm or tcp; every rank must agree)");
}

void add_quantize_flag(CLI::App& cmd, std::string& quantize) {
  cmd.add_option("--quantize", quantize,
                 "Weights the engine holds as FP8: none, fp8-block128 (every bf16/fp32 linear weight but embeddings, "
                 "lm_head, norms and the router, as e4m3fn codes with 128x128 block scales in <prefix>."
                 "weight_scale_inv, quantized on the trainer's side) or fp8-block128:GLOB[,GLOB...] (exactly the "
                 "2-D or 3-D weights the globs match)")
      ->check([](const std::string& text) {
        auto spec = parse_quantize(text);
        return spec.ok() ? std::string() : std::string(spec.status().message());
      })
      ->capture_default_str();
}

void add_engine_gpus_flag(CLI::App& cmd, int& gpus) {
  cmd.add_option("--engine-gpus", gpus,
                 "GPUs the engine ranks share round-robin: rank r uses base-gpu-id + r % N (0: one GPU per rank; "
                 "1: every rank on one GPU, for tests and benchmarks)")
      ->check(WholeInt(0, "a count of GPUs", "counts"))
      ->capture_default_str();
}

Status finish_engine_options(EngineOptions& options, const std::string& secret_file) {
  ASSIGN_OR_RETURN(Secret secret, resolve_secret(secret_file));
  options.secret = secret.bytes();
  for (const std::string& d : options.supported_dtypes) RETURN_IF_ERROR(parse_dtype(d).status());
  return Status::Ok();
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

WholeNumber::WholeNumber(std::uint64_t min, std::uint64_t max, const std::string& noun, const std::string& plural) {
  name_ = "WHOLE";
  // --help: "--version UINT:POSITIVE=1", as CLI11's own checks showed.
  description(min == 0 ? "NONNEGATIVE" : min == 1 ? "POSITIVE" : "AT LEAST " + std::to_string(min));
  func_ = [=](std::string& text) {
    const std::string refused = text + " is not " + noun + " (";
    std::string_view digits = text;
    if (digits.starts_with('+')) digits.remove_prefix(1);
    if (digits.size() > 1 && digits[0] == '-' && digits.find_first_not_of("0123456789", 1) == std::string_view::npos) {
      return refused + plural + " start at " + std::to_string(min) + ")";  // a negative whole number
    }
    std::uint64_t value = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec == std::errc::result_out_of_range) return refused + "the largest is " + std::to_string(max) + ")";
    if (ec != std::errc() || end != digits.data() + digits.size()) {
      return refused + plural + " are whole numbers from " + std::to_string(min) + ")";
    }
    if (value < min) return refused + plural + " start at " + std::to_string(min) + ")";
    if (value > max) return refused + "the largest is " + std::to_string(max) + ")";
    return std::string();
  };
}

WholeNumber WholeInt(int min, const std::string& noun, const std::string& plural) {
  return WholeNumber(static_cast<std::uint64_t>(min), INT_MAX, noun, plural);
}

PositiveSeconds::PositiveSeconds() {
  name_ = "SECONDS";
  description("POSITIVE");
  func_ = [](std::string& text) {
    double value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) || value <= 0) {
      return text + " is not a duration (seconds, more than 0)";
    }
    return std::string();
  };
}

ShardRuleRow::ShardRuleRow() {
  name_ = "GLOB=RULE";
  func_ = [](std::string& text) {
    auto parsed = parse_shard_rule_pattern(text);
    return parsed.ok() ? std::string() : parsed.status().message();
  };
}

}  // namespace refit::cli
