// The `refit` command: demo, coordinator, trainer, engine.
//
// Configuration is parsed here, once, at the edge; the library below takes
// options structs and reads no environment variables.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "control/auth.h"
#include "control/coordinator.h"
#include "refit/bench.h"
#include "refit/checkpoint.h"
#include "refit/demo.h"
#include "refit/inspect.h"
#include "refit/dtype.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "refit/make_checkpoint.h"
#include "refit/push.h"
#include "transport/transport.h"
#include "refit/roles.h"

namespace {

using refit::Status;

// CLI11 validator for byte sizes ("4MiB", "1GiB", "4096").
struct ByteSize : CLI::Validator {
  ByteSize() {
    name_ = "SIZE";
    func_ = [](const std::string& text) {
      auto parsed = refit::parse_byte_size(text);
      return parsed.ok() ? std::string() : parsed.status().message();
    };
  }
};

// CLI11 validator for shard-rule rows ("*.qkv_proj.weight=column").
struct ShardRuleRow : CLI::Validator {
  ShardRuleRow() {
    name_ = "GLOB=RULE";
    func_ = [](const std::string& text) {
      auto parsed = refit::parse_shard_rule_pattern(text);
      return parsed.ok() ? std::string() : parsed.status().message();
    };
  }
};

std::uint64_t bytes_of(const std::string& text) { return *refit::parse_byte_size(text); }

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

void add_rank_flags(CLI::App* cmd, refit::RankOptions& o, std::string& bucket) {
  cmd->add_option("--coordinator", o.coordinator, "Coordinator address host:port")->required();
  cmd->add_option("--rank", o.rank, "This process's rank")->required()->check(CLI::NonNegativeNumber);
  cmd->add_option("--trainer-ranks", o.trainer_ranks, "Number of trainer ranks")->check(CLI::PositiveNumber);
  cmd->add_option("--engine-ranks", o.engine_ranks, "Number of engine ranks (TP size)")->check(CLI::PositiveNumber);
  cmd->add_option("--model", o.model,
                  "Model preset (" + join_names(refit::model_presets()) + ") or safetensors checkpoint path");
  cmd->add_option("--layers", o.layers, "Keep the first N decoder layers (-1: all)");
  cmd->add_option("--rule", o.shard_rules,
                  "Checkpoints: a TP shard rule GLOB=RULE (replicated, column, row, vocab) ahead of the defaults");
  cmd->add_option("--bucket-size", bucket, "Transport bucket size, e.g. 4MiB, 1GiB")->check(ByteSize());
  cmd->add_option("--transport", o.transport, "Transport: " + join_names(refit::transport_names()))
      ->check(CLI::IsMember(refit::transport_names()));
  cmd->add_option("--setup-timeout", o.setup_timeout_s, "Seconds allowed for setup")->check(CLI::PositiveNumber);
  cmd->add_option("--timeout", o.refit_timeout_s, "Seconds allowed for one refit")->check(CLI::PositiveNumber);
  cmd->add_option("--bucket-timeout", o.bucket_timeout_s,
                  "Seconds a rank waits for the next bucket before it declares its peer stalled")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--device", o.device, "Where weights and buffers live: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--mode", o.mode, "staged (receive pool) or direct (into the engine's weights)")
      ->check(CLI::IsMember({"staged", "direct"}));
}

// --device and --mode for demo and bench.
void add_demo_device_flags(CLI::App* cmd, refit::DemoOptions& o) {
  cmd->add_option("--device", o.device, "Where weights and buffers live: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--mode", o.mode, "staged (receive pool) or direct (trainers write into the engine's weights)")
      ->check(CLI::IsMember({"staged", "direct"}));
}

constexpr const char* kSecretFileHelp =
    "File holding the shared secret of the control and data planes (default: the environment variable REFIT_SECRET; "
    "neither: no authentication, loopback only)";

// --secret-file if given, else REFIT_SECRET: read here, at the edge.
refit::StatusOr<refit::Secret> resolve_secret(const std::string& file) {
  return refit::Secret::Resolve(file, std::getenv("REFIT_SECRET"));
}

int report_status(const char* who, const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "refit %s: error: %s\n", who, status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"refit: move model weights from trainer ranks into inference engine ranks"};
  app.require_subcommand(1);

  // demo
  refit::DemoOptions demo;
  std::string demo_bucket = "4MiB", demo_memory_limit = "0";
  auto* demo_cmd = app.add_subcommand("demo", "Run a coordinator, trainer and engine ranks as processes and refit N times");
  demo_cmd->add_option("--model", demo.model, "Model preset: " + join_names(refit::model_presets()))
      ->check(CLI::IsMember(refit::model_presets()));
  demo_cmd->add_option("--layers", demo.layers, "Keep the first N decoder layers (-1: all)");
  demo_cmd->add_option("--engine-ranks", demo.engine_ranks, "Engine ranks (TP size)")->check(CLI::Range(1, 64));
  demo_cmd->add_option("--trainer-ranks", demo.trainer_ranks, "Trainer ranks (default: as many as engine ranks)")
      ->check(CLI::Range(1, 256));
  demo_cmd->add_option("--transport", demo.transport, "Transport: " + join_names(refit::transport_names()))
      ->check(CLI::IsMember(refit::transport_names()));
  demo_cmd->add_option("--bucket-size", demo_bucket, "Transport bucket size, e.g. 4MiB, 1GiB")->check(ByteSize());
  demo_cmd->add_option("--refits", demo.refits, "Number of refits")->check(CLI::Range(1, 1000000));
  demo_cmd->add_option("--seed", demo.seed, "Seed of the synthetic weights");
  demo_cmd->add_flag("--json", demo.json, "Print a JSON report on stdout instead of the table");
  add_demo_device_flags(demo_cmd, demo);
  demo_cmd->add_option("--pool-slots", demo.pool_slots, "Receive pool slots per engine rank")->check(CLI::Range(1, 64));
  demo_cmd->add_option("--memory-limit", demo_memory_limit, "Receive pool memory limit per engine rank (0: none)")
      ->check(ByteSize());
  demo_cmd->add_flag("--poison-recycled", demo.poison_recycled, "Debug: poison every recycled staging buffer");
  demo_cmd->add_option("--setup-timeout", demo.setup_timeout_s, "Seconds allowed for setup")->check(CLI::PositiveNumber);
  demo_cmd->add_option("--timeout", demo.refit_timeout_s, "Seconds allowed for one refit")->check(CLI::PositiveNumber);
  demo_cmd->add_option("--secret-file", demo.secret_file, kSecretFileHelp);
  demo_cmd->add_option("--soak-report", demo.soak_report,
                       "Soak: sample every process's memory, descriptors and shared memory into this JSON file")
      ->group("");  // hidden: bench/soak.sh

  // bench: the demo's flags, plus the ceiling measured in the same run.
  auto* bench_cmd = app.add_subcommand("bench", "Run the demo and report GB/s against memcpy measured in the same run");
  bench_cmd->add_option("--model", demo.model, "Model preset")->check(CLI::IsMember(refit::model_presets()));
  bench_cmd->add_option("--layers", demo.layers, "Keep the first N decoder layers (-1: all)");
  bench_cmd->add_option("--engine-ranks", demo.engine_ranks, "Engine ranks")->check(CLI::Range(1, 64));
  bench_cmd->add_option("--trainer-ranks", demo.trainer_ranks, "Trainer ranks")->check(CLI::Range(1, 256));
  bench_cmd->add_option("--transport", demo.transport, "Transport")->check(CLI::IsMember(refit::transport_names()));
  bench_cmd->add_option("--bucket-size", demo_bucket, "Transport bucket size")->check(ByteSize());
  bench_cmd->add_option("--refits", demo.refits, "Number of refits")->check(CLI::Range(2, 1000000));
  bench_cmd->add_option("--pool-slots", demo.pool_slots, "Receive pool slots")->check(CLI::Range(1, 64));
  bench_cmd->add_flag("--json", demo.json, "Print a JSON report");
  bench_cmd->add_option("--seed", demo.seed, "Seed of the synthetic weights");
  bench_cmd->add_flag("--poison-recycled", demo.poison_recycled, "Debug: poison every recycled staging buffer");
  bench_cmd->add_option("--timeout", demo.refit_timeout_s, "Seconds allowed for one refit")->check(CLI::PositiveNumber);
  bench_cmd->add_option("--secret-file", demo.secret_file, kSecretFileHelp);
  add_demo_device_flags(bench_cmd, demo);

  // coordinator
  refit::CoordinatorOptions coord;
  std::string port_file, report_file;
  auto* coord_cmd = app.add_subcommand("coordinator", "Run the control plane of a refit job");
  coord_cmd->add_option("--listen", coord.listen, "host:port to listen on (default loopback, any port)");
  coord_cmd->add_option("--trainer-ranks", coord.trainer_ranks, "Trainer ranks expected")->check(CLI::PositiveNumber);
  coord_cmd->add_option("--engine-ranks", coord.engine_ranks, "Engine ranks expected")->check(CLI::PositiveNumber);
  coord_cmd->add_option("--refits", coord.refits, "Number of refits to run; 0: on demand, as the trainer ranks ask")
      ->check(CLI::NonNegativeNumber);
  coord_cmd->add_option("--seed", coord.seed, "Seed of the synthetic weights");
  coord_cmd->add_option("--setup-timeout", coord.setup_timeout_s, "Seconds allowed for setup")->check(CLI::PositiveNumber);
  coord_cmd->add_option("--timeout", coord.refit_timeout_s, "Seconds allowed for one refit")->check(CLI::PositiveNumber);
  coord_cmd->add_option("--port-file", port_file, "Write the listening port to this file");
  coord_cmd->add_option("--report", report_file, "Write the JSON report to this file (default: stdout)");
  coord_cmd->add_flag("--progress", coord.progress, "Draw a progress bar on stderr");
  coord_cmd->add_flag("!--quiet", coord.log_joins, "Do not log each rank that joins");
  std::string coord_secret_file;
  coord_cmd->add_option("--secret-file", coord_secret_file, kSecretFileHelp);

  // trainer
  refit::RankOptions trainer;
  std::string trainer_bucket = "4MiB";
  auto* trainer_cmd = app.add_subcommand("trainer", "Run one trainer rank");
  add_rank_flags(trainer_cmd, trainer, trainer_bucket);
  std::string trainer_secret_file;
  trainer_cmd->add_option("--secret-file", trainer_secret_file, kSecretFileHelp);
  trainer_cmd->add_option("--debug-pack-rank", trainer.debug_pack_rank,
                          "Fault injection for tests: pack another engine rank's shards")
      ->group("");  // hidden
  trainer_cmd->add_option("--debug-fail-refit", trainer.debug_fail_refit,
                          "Fault injection for tests: fail refit N after its first bucket")
      ->group("");  // hidden
  trainer_cmd->add_option("--debug-cuda-fault-refit", trainer.debug_cuda_fault_refit,
                          "Fault injection for tests: break the trainer's CUDA context in refit N")
      ->group("");  // hidden
  trainer_cmd->add_option("--debug-die-after-announce", trainer.debug_die_after_announce,
                          "Fault injection for tests: in refit N, send a bucket behind a GPU delay, then SIGKILL")
      ->group("");  // hidden
  std::string trainer_debug_data_secret_file;
  trainer_cmd->add_option("--debug-data-secret-file", trainer_debug_data_secret_file,
                          "Fault injection for tests: authenticate the data link with this secret instead")
      ->group("");  // hidden
  trainer_cmd->add_option("--gpu", trainer.gpu, "Local CUDA device of this trainer rank (inside CUDA_VISIBLE_DEVICES)")
      ->check(CLI::NonNegativeNumber);

  // engine, and save (an engine rank that writes its shards after each refit)
  refit::EngineOptions engine;
  std::string engine_bucket = "4MiB", engine_memory_limit = "0", engine_secret_file;
  auto add_engine_flags = [&](CLI::App* cmd) {
    add_rank_flags(cmd, engine, engine_bucket);
    cmd->add_option("--secret-file", engine_secret_file, kSecretFileHelp);
    cmd->add_option("--pool-slots", engine.pool_slots, "Receive pool slots")->check(CLI::Range(1, 64));
    cmd->add_option("--memory-limit", engine_memory_limit, "Receive pool memory limit (0: none)")->check(ByteSize());
    cmd->add_option("--listen-host", engine.listen_host, "Address trainers connect to for data");
    cmd->add_flag("--poison-recycled", engine.poison_recycled, "Debug: poison every recycled staging buffer");
    cmd->add_flag("!--no-verify", engine.verify,
                  "Skip verifying every byte after each refit (against the synthetic content, or the checkpoint file)");
    cmd->add_option("--dtypes", engine.supported_dtypes, "Dtypes this engine supports (default: all)");
    cmd->add_option("--base-gpu-id", engine.base_gpu_id,
                    "Engine rank r uses local CUDA device base-gpu-id + r (an index inside CUDA_VISIBLE_DEVICES)")
        ->check(CLI::NonNegativeNumber);
  };
  auto* engine_cmd = app.add_subcommand("engine", "Run one engine rank (receiver + reference engine)");
  add_engine_flags(engine_cmd);
  engine_cmd->add_option("--save", engine.save_path, "After each refit, write this rank's shards to this safetensors file");
  engine_cmd->add_option("--debug-die-at-commit", engine.debug_die_at_commit,
                         "Debug: in refit N, die by SIGKILL on receiving the commit, before applying it");
  engine_cmd->add_option("--debug-stop-at-commit", engine.debug_stop_at_commit,
                         "Debug: in refit N, stop (SIGSTOP) on receiving the commit, before applying it");
  auto* save_cmd = app.add_subcommand(
      "save", "Run one engine rank and write what it holds (its shards) as safetensors after each refit");
  add_engine_flags(save_cmd);
  save_cmd->add_option("--out", engine.save_path, "The safetensors file to write")->required();

  // push
  refit::PushOptions push;
  std::string push_bucket = "4MiB", push_secret_file;
  auto* push_cmd = app.add_subcommand("push", "Refit running engine ranks from a safetensors checkpoint (the trainer side)");
  push_cmd->add_option("path", push.rank.model, "Checkpoint: a .safetensors file, or a directory with an index")
      ->required();
  push_cmd->add_option("--coordinator", push.rank.coordinator, "Coordinator address host:port")->required();
  push_cmd->add_option("--engine-ranks", push.rank.engine_ranks, "Engine ranks (TP size)")->check(CLI::PositiveNumber);
  push_cmd->add_option("--trainer-ranks", push.rank.trainer_ranks,
                       "Trainer ranks of the job (default: as many as engine ranks)")
      ->check(CLI::PositiveNumber);
  push_cmd->add_option("--first-rank", push.first_rank, "First trainer rank this process runs")
      ->check(CLI::NonNegativeNumber);
  push_cmd->add_option("--ranks", push.ranks, "Trainer ranks this process runs (default: the rest)")
      ->check(CLI::PositiveNumber);
  push_cmd->add_option("--version", push.version, "Weight version to commit (on-demand coordinators)")
      ->check(CLI::PositiveNumber);
  push_cmd->add_option("--repeat", push.repeat, "On-demand: push the file this many times, as consecutive versions")
      ->check(CLI::PositiveNumber);
  push_cmd->add_option("--rule", push.rank.shard_rules, "A TP shard rule GLOB=RULE ahead of the defaults");
  push_cmd->add_option("--bucket-size", push_bucket, "Transport bucket size")->check(ByteSize());
  push_cmd->add_option("--transport", push.rank.transport, "Transport: " + join_names(refit::transport_names()))
      ->check(CLI::IsMember(refit::transport_names()));
  push_cmd->add_option("--mode", push.rank.mode, "staged or direct")->check(CLI::IsMember({"staged", "direct"}));
  push_cmd->add_option("--gpu", push.rank.gpu, "Local CUDA device for the copies into device engines")
      ->check(CLI::NonNegativeNumber);
  push_cmd->add_option("--setup-timeout", push.rank.setup_timeout_s, "Seconds allowed for setup")
      ->check(CLI::PositiveNumber);
  push_cmd->add_option("--timeout", push.rank.refit_timeout_s, "Seconds allowed for one refit")
      ->check(CLI::PositiveNumber);
  push_cmd->add_option("--secret-file", push_secret_file, kSecretFileHelp);
  push_cmd->add_option("--register-host-weights", push.rank.register_host_weights,
                       "GPU engines: register the mapped checkpoint with the GPU so its copy engines read it "
                       "directly (false: pack through pinned buffers)")
      ->capture_default_str();

  // inspect
  refit::InspectOptions inspect;
  std::string inspect_bucket = "4MiB";
  auto* inspect_cmd = app.add_subcommand("inspect", "Print a checkpoint's tensors, totals and bucket plan per engine rank");
  inspect_cmd->add_option("path", inspect.path, "Checkpoint: a .safetensors file, or a directory with an index")
      ->required();
  inspect_cmd->add_option("--engine-ranks", inspect.engine_ranks, "Engine ranks (TP size) to plan for")
      ->check(CLI::Range(1, 4096));
  inspect_cmd->add_option("--bucket-size", inspect_bucket, "Transport bucket size, e.g. 4MiB, 1GiB")->check(ByteSize());
  inspect_cmd->add_option("--rule", inspect.shard_rules, "A TP shard rule GLOB=RULE ahead of the defaults")
      ->check(ShardRuleRow());
  inspect_cmd->add_flag("--json", inspect.json, "Print a JSON report instead of the tables");
  inspect_cmd->add_flag("--buckets", inspect.buckets, "List every bucket of every engine rank");

  // make-checkpoint and ceiling: helpers of the benchmarks (hidden)
  refit::MakeCheckpointOptions make;
  auto* make_cmd = app.add_subcommand("make-checkpoint", "Write a preset's synthetic weights as a sharded checkpoint");
  make_cmd->group("");
  make_cmd->add_option("--model", make.model, "Model preset")->check(CLI::IsMember(refit::model_presets()));
  make_cmd->add_option("--layers", make.layers, "Keep the first N decoder layers (-1: all)");
  make_cmd->add_option("--seed", make.seed, "Seed of the synthetic weights");
  make_cmd->add_option("--files", make.files, "Number of safetensors files")->check(CLI::PositiveNumber);
  make_cmd->add_option("--out", make.out, "Output directory")->required();
  refit::CeilingOptions ceiling;
  std::string ceiling_bytes = "1GiB";
  auto* ceiling_cmd = app.add_subcommand("ceiling", "Measure a copy ceiling now (memcpy, h2d, d2d, peer) as JSON");
  ceiling_cmd->group("");
  ceiling_cmd->add_option("--kind", ceiling.kind, "memcpy, h2d, d2d or peer (device --from to device --to)")
      ->check(CLI::IsMember({"memcpy", "h2d", "d2d", "peer"}));
  ceiling_cmd->add_option("--bytes", ceiling_bytes, "Bytes per copy")->check(ByteSize());
  ceiling_cmd->add_option("--from", ceiling.from, "peer: local CUDA device copied from")->check(CLI::NonNegativeNumber);
  ceiling_cmd->add_option("--to", ceiling.to, "peer: local CUDA device copied to")->check(CLI::NonNegativeNumber);
  ceiling_cmd->add_flag("--both-ways", ceiling.both_ways, "peer: half the bytes each way at the same time");
  std::string ceiling_pairs;
  ceiling_cmd->add_option("--pairs", ceiling_pairs,
                          "peer: copies over several device pairs at once, bytes / pairs each (\"0:2,1:3\")");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the usage error
    return 2;
  }

  if (*demo_cmd || *bench_cmd) {
    // Fail before starting any process; the children read the same file or
    // inherit REFIT_SECRET.
    if (auto secret = resolve_secret(demo.secret_file); !secret.ok()) {
      return report_status(*demo_cmd ? "demo" : "bench", secret.status());
    }
  }
  if (*demo_cmd) {
    demo.bucket_size = bytes_of(demo_bucket);
    demo.memory_limit = bytes_of(demo_memory_limit);
    return refit::run_demo(demo);
  }
  if (*bench_cmd) {
    demo.bucket_size = bytes_of(demo_bucket);
    demo.memory_limit = bytes_of(demo_memory_limit);
    return refit::run_bench(demo);
  }
  if (*coord_cmd) {
    auto secret = resolve_secret(coord_secret_file);
    if (!secret.ok()) return report_status("coordinator", secret.status());
    coord.secret = std::move(*secret);
    refit::Json report = refit::run_coordinator(coord, [&](int port) {
      if (!port_file.empty()) {
        std::string tmp = port_file + ".tmp";
        { std::ofstream(tmp) << port << "\n"; }
        std::rename(tmp.c_str(), port_file.c_str());
      } else {
        std::fprintf(stderr, "refit coordinator: listening on port %d\n", port);
      }
    });
    if (report_file.empty()) {
      std::printf("%s\n", report.dump(2).c_str());
    } else {
      std::ofstream(report_file) << report.dump(2) << "\n";
    }
    if (report.contains("error")) {
      std::fprintf(stderr, "refit coordinator: error: %s\n", report["error"].get<std::string>().c_str());
      return 1;
    }
    return 0;
  }
  if (*trainer_cmd) {
    auto secret = resolve_secret(trainer_secret_file);
    if (!secret.ok()) return report_status("trainer", secret.status());
    trainer.secret = secret->bytes();
    if (!trainer_debug_data_secret_file.empty()) {
      auto data_secret = refit::Secret::FromFile(trainer_debug_data_secret_file);
      if (!data_secret.ok()) return report_status("trainer", data_secret.status());
      trainer.debug_data_secret = data_secret->bytes();
    }
    trainer.bucket_size = bytes_of(trainer_bucket);
    return report_status("trainer", refit::run_trainer(trainer));
  }
  if (*inspect_cmd) {
    inspect.bucket_size = bytes_of(inspect_bucket);
    return refit::run_inspect(inspect);
  }
  if (*make_cmd) return report_status("make-checkpoint", refit::make_checkpoint(make));
  if (*ceiling_cmd) {
    ceiling.bytes = bytes_of(ceiling_bytes);
    // "0:2,1:3": device pairs, from:to.
    std::stringstream list(ceiling_pairs);
    for (std::string item; std::getline(list, item, ',');) {
      int from = -1, to = -1;
      char colon = 0, extra = 0;
      std::stringstream one(item);
      if (!(one >> from >> colon >> to) || colon != ':' || (one >> extra)) {
        std::fprintf(stderr, "refit ceiling: error: --pairs \"%s\": \"%s\" is not FROM:TO\n", ceiling_pairs.c_str(),
                     item.c_str());
        return 1;
      }
      ceiling.pairs.emplace_back(from, to);
    }
    return refit::run_ceiling(ceiling);
  }
  if (*push_cmd) {
    auto secret = resolve_secret(push_secret_file);
    if (!secret.ok()) return report_status("push", secret.status());
    push.rank.secret = secret->bytes();
    push.rank.bucket_size = bytes_of(push_bucket);
    if (push.rank.trainer_ranks < push.rank.engine_ranks) push.rank.trainer_ranks = push.rank.engine_ranks;
    return refit::run_push(push);
  }
  if (*engine_cmd || *save_cmd) {
    auto secret = resolve_secret(engine_secret_file);
    if (!secret.ok()) return report_status("engine", secret.status());
    engine.secret = secret->bytes();
    engine.bucket_size = bytes_of(engine_bucket);
    engine.memory_limit = bytes_of(engine_memory_limit);
    for (const auto& d : engine.supported_dtypes) {
      if (auto parsed = refit::parse_dtype(d); !parsed.ok()) return report_status("engine", parsed.status());
    }
    return report_status(*save_cmd ? "save" : "engine", refit::run_engine(engine));
  }
  return 2;
}
