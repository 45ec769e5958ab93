// `refit push PATH`: the trainer side of a refit whose weights come from a
// safetensors checkpoint on disk (checkpoint.h).
//
// One process runs every trainer rank of the job (one thread each, ranks
// first_rank .. first_rank + ranks - 1), each a TrainerRank over the mapped
// checkpoint: it cuts each tensor into the shard of the engine rank it feeds
// by the shard-rules table and sends it. With an on-demand coordinator
// (--refits 0) the push asks for refit `version` and then finishes; with a
// scheduled one it takes part in every refit the coordinator runs.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "command.h"
#include "flags.h"
#include "refit/roles.h"
#include "refit/trainer_rank.h"
#include "refit/transports.h"

namespace refit::cli {
namespace {

struct PushOptions {
  RankOptions rank;           // shared settings; rank.rank is ignored
  int first_rank = 0;
  int ranks = -1;             // -1: every trainer rank from first_rank on
  std::uint64_t version = 1;  // on-demand coordinators: the version to ask for
  int repeat = 1;             // on-demand: refit versions version .. version + repeat - 1 (benchmarks)
  std::string secret_file;
};

// The transports a push can send its checkpoint over: the checkpoint is
// mapped into host memory, so those whose trainer side takes host weights
// (validate_rank_settings), into host or GPU engines alike.
std::vector<std::string> push_transports(const RankOptions& o) {
  std::vector<std::string> names;
  for (const std::string& name : transport_names()) {
    RankOptions trial = o;
    trial.transport = name;
    trial.trainer_ranks = trial.engine_ranks;  // the rank counts are another check's
    trial.mode = "staged";                     // and so is the mode
    if (validate_rank_settings(trial, /*engine=*/false).ok()) names.push_back(name);
  }
  return names;
}

// A transport that cannot send from host memory (nccl sends only from the
// sender's GPU memory) is a usage error naming what push can use: push has
// no --device of its own; the engines' --device decides where the weights
// land.
void check_transport(const RankOptions& o) {
  const std::vector<std::string> usable = push_transports(o);
  if (std::find(usable.begin(), usable.end(), o.transport) != usable.end()) return;
  throw CLI::ValidationError("--transport", o.transport + " sends only from GPU memory, and refit push sends the "
                                            "checkpoint from host memory; refit push sends over " +
                                            join_names(usable) +
                                            " (into host or GPU engines: the engines' --device decides)");
}

// The number of ranks this process runs; a usage error (exit 2) when they do
// not fit inside the job's trainer ranks, or when the transport cannot send
// a checkpoint. Defaults --trainer-ranks to the engine ranks.
void check_ranks(PushOptions& o) {
  if (o.rank.trainer_ranks < o.rank.engine_ranks) o.rank.trainer_ranks = o.rank.engine_ranks;
  const int count = o.ranks < 0 ? o.rank.trainer_ranks - o.first_rank : o.ranks;
  if (count < 1 || o.first_rank < 0 || o.first_rank + count > o.rank.trainer_ranks) {
    throw CLI::ValidationError("--first-rank/--ranks", "ranks " + std::to_string(o.first_rank) + ".." +
                                                           std::to_string(o.first_rank + count - 1) +
                                                           " are not inside 0.." +
                                                           std::to_string(o.rank.trainer_ranks - 1) +
                                                           " (--trainer-ranks " +
                                                           std::to_string(o.rank.trainer_ranks) + ")");
  }
  o.ranks = count;
  check_transport(o.rank);
  // Versions version .. version + repeat - 1 must all be versions: no wrap
  // past the largest to 0.
  const std::uint64_t more = static_cast<std::uint64_t>(std::max(o.repeat, 1) - 1);
  if (o.version > UINT64_MAX - more) {
    throw CLI::ValidationError("--version/--repeat", "--version " + std::to_string(o.version) + " with --repeat " +
                                                         std::to_string(o.repeat) +
                                                         " would push versions past the largest, " +
                                                         std::to_string(UINT64_MAX) + " (lower either)");
  }
}

// One trainer rank's whole part in the job; its committed version in `version`.
Status push_one_rank(const PushOptions& options, RankOptions o, std::uint64_t& version) {
  auto source = make_rank_source(o);
  if (!source.ok()) return source.status().WithContext("trainer rank " + std::to_string(o.rank));
  ASSIGN_OR_RETURN(auto rank, TrainerRank::Join(o, std::move(*source)));
  if (!rank->on_demand()) {
    RETURN_IF_ERROR(rank->serve());
    version = rank->committed_version();
    return Status::Ok();
  }
  for (int k = 0; k < std::max(options.repeat, 1); ++k) {
    Status refit = rank->refit(options.version + static_cast<std::uint64_t>(k));
    if (!refit.ok()) {
      // The job recovered (the engines keep their last version): end it
      // cleanly, then report the failure.
      if (rank->recovered()) (void)rank->finish();
      return refit;
    }
  }
  version = rank->committed_version();
  return rank->finish();
}

// The cause among the ranks' failures: the first that is not an abort (a
// rank aborted because another failed), else the first. The others are
// printed as notes before it.
Status first_cause(const std::vector<Status>& results) {
  const Status* cause = nullptr;
  for (const Status& s : results) {
    if (!s.ok() && (cause == nullptr || (cause->code() == StatusCode::kAborted && s.code() != StatusCode::kAborted))) {
      cause = &s;
    }
  }
  if (cause == nullptr) return Status::Ok();
  for (const Status& s : results) {
    if (!s.ok() && &s != cause) std::fprintf(stderr, "refit push: another rank failed: %s\n", s.ToString().c_str());
  }
  return *cause;
}

Status run_push(PushOptions& options) {
  ASSIGN_OR_RETURN(Secret secret, resolve_secret(options.secret_file));
  options.rank.secret = secret.bytes();
  const auto started = std::chrono::steady_clock::now();
  const auto count = static_cast<std::size_t>(options.ranks);
  std::vector<Status> results(count);
  std::vector<std::uint64_t> versions(count, 0);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      RankOptions o = options.rank;
      o.rank = options.first_rank + static_cast<int>(i);
      results[i] = push_one_rank(options, o, versions[i]);  // each thread writes its own slot
    });
  }
  for (auto& t : threads) t.join();
  RETURN_IF_ERROR(first_cause(results));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::fprintf(stderr, "refit push: %s committed as version %llu by %zu trainer rank(s) in %.2f s\n",
               options.rank.model.c_str(), static_cast<unsigned long long>(versions[0]), count, seconds);
  return Status::Ok();
}

void add_push_flags(CLI::App& cmd, PushOptions& p) {
  RankOptions& o = p.rank;
  cmd.add_option("path", o.model, "Checkpoint: a .safetensors file, or a directory with an index")->required();
  cmd.add_option("--coordinator", o.coordinator, "Coordinator address host:port")->required();
  add_rank_count_flags(cmd, o.trainer_ranks, "Trainer ranks of the job (default: as many as engine ranks)",
                       o.engine_ranks, "Engine ranks (TP size)");
  cmd.get_option("--trainer-ranks")->default_str("");  // its default is the engine ranks (check_ranks)
  cmd.add_option("--first-rank", p.first_rank, "First trainer rank this process runs")
      ->check(WholeInt(0, "a rank", "ranks"))
      ->capture_default_str();
  cmd.add_option("--ranks", p.ranks, "Trainer ranks this process runs (default: the rest)")
      ->check(WholeInt(1, "a count of ranks", "counts"));
  cmd.add_option("--version", p.version, "Weight version to commit (on-demand coordinators)")
      ->check(WholeNumber(1, UINT64_MAX, "a version", "versions"))
      ->capture_default_str();
  cmd.add_option("--repeat", p.repeat, "On-demand: push the file this many times, as consecutive versions")
      ->check(WholeInt(1, "a repeat count", "counts"))
      ->capture_default_str();
  cmd.add_option("--rule", o.shard_rules,
                 "A TP shard rule GLOB=RULE ahead of the default rules (repeatable; default: none)");
  add_bucket_size_flag(cmd, o.bucket_size);
  add_transport_flag(cmd, o.transport);
  add_mode_flag(cmd, o.mode);
  cmd.add_option("--gpu", o.gpu, "Local CUDA device for the copies into device engines")
      ->check(WholeInt(0, "a device index", "device indices"))
      ->capture_default_str();
  add_timeout_flags(cmd, o.setup_timeout_s, o.refit_timeout_s);
  add_bucket_timeout_flag(cmd, o.bucket_timeout_s);
  add_secret_file_flag(cmd, p.secret_file);
  cmd.add_option("--register-host-weights", o.register_host_weights,
                 "GPU engines: register the mapped checkpoint with the GPU so its copy engines read it "
                 "directly (false: pack through pinned buffers)")
      ->capture_default_str();
}

}  // namespace

void add_push_command(CLI::App& app, CommandTable& table) {
  auto p = std::make_shared<PushOptions>();
  CLI::App* cmd =
      app.add_subcommand("push", "Refit running engine ranks from a safetensors checkpoint (the trainer side)");
  add_push_flags(*cmd, *p);
  cmd->callback([p] { check_ranks(*p); });
  table.push_back({cmd, [p] { return run_push(*p); }});
}

}  // namespace refit::cli
