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
#include "demo_errors.h"
#include "flags.h"
#include "refit/format.h"
#include "refit/plan.h"
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

// Those of transport_names() whose side `engine` (or the trainer's) takes
// settings `o` with `device` (validate_rank_settings is the judge).
std::vector<std::string> transports_taking(const RankOptions& o, bool engine, const std::string& device) {
  std::vector<std::string> names;
  for (const std::string& name : transport_names()) {
    RankOptions trial = o;
    trial.transport = name;
    trial.device = device;
    trial.trainer_ranks = trial.engine_ranks;  // the rank counts are another check's
    trial.mode = "staged";                     // and so is the mode
    if (validate_rank_settings(trial, engine).ok()) names.push_back(name);
  }
  return names;
}

// Those of `names` that are also in `of`.
std::vector<std::string> only(const std::vector<std::string>& names, const std::vector<std::string>& of) {
  std::vector<std::string> out;
  for (const std::string& n : names) {
    if (std::find(of.begin(), of.end(), n) != of.end()) out.push_back(n);
  }
  return out;
}

// A transport that cannot send from host memory (nccl sends only from the
// sender's GPU memory) is a usage error naming what push can use, per kind
// of engine: push has no --device of its own; the engines' --device decides
// where the weights land, and each kind of engine takes only some of push's
// transports (GPU engines those that reach device memory: not shm or tcp).
void check_transport(const RankOptions& o) {
  // The checkpoint is mapped into host memory: the trainer side takes host weights.
  const std::vector<std::string> usable = transports_taking(o, /*engine=*/false, "cpu");
  if (std::find(usable.begin(), usable.end(), o.transport) != usable.end()) return;
  const std::vector<std::string> host = only(usable, transports_taking(o, /*engine=*/true, "cpu"));
  // GPU engines can be asked only where this process sees a CUDA device:
  // with none, every cuda engine refuses before its transport is looked at.
  const std::vector<std::string> gpu = only(usable, transports_taking(o, /*engine=*/true, "cuda"));
  throw CLI::ValidationError(
      "--transport", o.transport + " sends only from GPU memory, and refit push sends the checkpoint from host "
                                   "memory; refit push sends over " +
                         join_names(usable) + ", as the engines' --device allows: into host engines (cpu) over " +
                         (host.empty() ? std::string("none of them") : join_names(host)) +
                         "; into GPU engines (cuda) over " +
                         (gpu.empty() ? std::string("those of them that reach device memory (no CUDA device here to "
                                                    "ask which)")
                                      : join_names(gpu)));
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

// What one trainer rank of the push did: its committed version, and the
// bytes it sent in its last committed refit.
struct RankOutcome {
  std::uint64_t version = 0;
  std::uint64_t bytes = 0;
};

std::string trainer_rank_name(int rank) { return "trainer rank " + std::to_string(rank); }

// One trainer rank's whole part in the job; what it did in `outcome`.
Status push_one_rank(const PushOptions& options, RankOptions o, RankOutcome& outcome) {
  auto source = make_rank_source(o);
  if (!source.ok()) {
    // The coordinator and the engines hear why now, not at the setup deadline.
    report_rank_setup_failure(o, /*engine=*/false, source.status());
    return source.status().WithContext(trainer_rank_name(o.rank));
  }
  ASSIGN_OR_RETURN(auto rank, TrainerRank::Join(o, std::move(*source)));
  auto done = [&] {
    outcome.version = rank->committed_version();
    if (auto last = rank->last_refit()) outcome.bytes = last->bytes;
  };
  if (!rank->on_demand()) {
    RETURN_IF_ERROR(rank->serve());
    done();
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
  done();
  return rank->finish();
}

// The cause among the ranks' failures (results[i]: trainer rank first_rank
// + i): the first that is not an abort (a rank aborted because another
// failed), else the first. The others are printed as notes before it,
// except those that repeat it (demo_errors.h: repeats_cause, the demo's
// rule), as every rank's failure to open the same checkpoint would.
Status first_cause(const std::vector<Status>& results, int first_rank) {
  std::size_t cause = results.size();
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Status& s = results[i];
    if (!s.ok() && (cause == results.size() ||
                    (results[cause].code() == StatusCode::kAborted && s.code() != StatusCode::kAborted))) {
      cause = i;
    }
  }
  if (cause == results.size()) return Status::Ok();
  auto name = [&](std::size_t i) { return trainer_rank_name(first_rank + static_cast<int>(i)); };
  const Cause said{results[cause].ToString(), name(cause)};
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok() || i == cause || repeats_cause(results[i].ToString(), name(i), said)) continue;
    std::fprintf(stderr, "refit push: another rank failed: %s\n", results[i].ToString().c_str());
  }
  return results[cause];
}

Status run_push(PushOptions& options) {
  ASSIGN_OR_RETURN(Secret secret, resolve_secret(options.secret_file));
  options.rank.secret = secret.bytes();
  const auto started = std::chrono::steady_clock::now();
  const auto count = static_cast<std::size_t>(options.ranks);
  std::vector<Status> results(count);
  std::vector<RankOutcome> outcomes(count);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      RankOptions o = options.rank;
      o.rank = options.first_rank + static_cast<int>(i);
      results[i] = push_one_rank(options, o, outcomes[i]);  // each thread writes its own slot
    });
  }
  for (auto& t : threads) t.join();
  RETURN_IF_ERROR(first_cause(results, options.first_rank));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::uint64_t bytes = 0;
  for (const RankOutcome& r : outcomes) bytes += r.bytes;
  // "refit push: ckpt committed as version 1 by 2 trainer ranks (53.77 MiB sent per refit) in 0.41 s"
  std::fprintf(stderr, "refit push: %s committed as version %llu by %s (%s sent per refit) in %s\n",
               options.rank.model.c_str(), static_cast<unsigned long long>(outcomes[0].version),
               format_count(count, "trainer rank").c_str(), format_bytes(bytes).c_str(),
               format_seconds(seconds).c_str());
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
