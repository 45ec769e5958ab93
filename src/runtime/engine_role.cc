// The engine role as `refit engine` runs it: the device, the model and a
// ReferenceEngine holding this rank's weights (with --shadow two arenas,
// with --readers reader threads beside it), then an EngineRank serving the
// job (roles.h: run_engine). The rank itself: engine_rank.cc.
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/refit_tally.h"
#include "cuda/device.h"
#include "refit/device_memory.h"
#include "refit/engine_rank.h"
#include "refit/log.h"
#include "refit/partial.h"
#include "refit/model.h"
#include "refit/reference_engine.h"
#include "refit/roles.h"
#include "refit/safetensors.h"
#include "runtime/committed_reader.h"
#include "runtime/model_choice.h"
#include "runtime/setup_failure.h"
#include "runtime/weight_readers.h"
#include "runtime/weight_verify.h"

namespace refit {
namespace {

// Writes `rank`'s weights (its shards, as the engine holds them) to `path`.
Status save_shards(const Model& model, const ReferenceEngine& engine, int rank, int ranks, bool on_device,
                   std::uint64_t version, const std::string& path) {
  std::vector<SafetensorsWriteTensor> tensors;
  std::vector<std::vector<std::byte>> host_copies;
  host_copies.reserve(model.weights.size());
  for (const Weight& w : model.weights) {
    const TensorSpec spec = shard_spec(w, rank, ranks);
    const std::byte* held = engine.weight(rank, spec.name);
    if (held == nullptr) {
      return Internal("engine rank " + std::to_string(rank) + " holds no weight '" + spec.name + "'");
    }
    if (on_device) {
      host_copies.emplace_back(spec.nbytes());
      RETURN_IF_ERROR(copy_device_to_host(host_copies.back(), held));
      held = host_copies.back().data();
    }
    tensors.push_back({spec, std::span<const std::byte>(held, spec.nbytes())});
  }
  std::map<std::string, std::string> metadata{{"refit_version", std::to_string(version)},
                                              {"refit_engine_rank", std::to_string(rank)},
                                              {"refit_engine_ranks", std::to_string(ranks)},
                                              {"refit_model", model.preset}};
  return write_safetensors(path, tensors, metadata)
      .WithContext("engine rank " + std::to_string(rank) + " saving refit " + std::to_string(version));
}

// What `refit engine` builds before it joins: the device, the model and
// the reference engine holding this rank's weights.
struct LocalEngine {
  bool on_device = false;
  int device = -1;  // local CUDA index
  ModelChoice choice;
  std::vector<std::vector<TensorSpec>> streams;  // every engine rank's, sharded alike
  std::unique_ptr<ReferenceEngine> engine;
  std::unique_ptr<WeightReaders> readers;  // --readers; stopped before the engine goes
  // Partial refits: the version of the last committed refit that moved each
  // model weight (empty before the first commit), kept apart from the
  // engine's own bookkeeping, for the verification.
  std::vector<std::uint64_t> versions;
};

// Refit `version` committed, a partial one of `only` (empty: every tensor):
// the weights it moved hold it now. Returns the bytes it moved into
// `stream` (this rank's).
std::uint64_t commit_versions(LocalEngine& local, std::uint64_t version, const std::vector<TensorSpec>& stream,
                              const std::vector<std::string>& only) {
  std::vector<bool> moved(stream.size(), true);
  if (!only.empty()) {  // as the rank selected them (it refused the refit otherwise)
    StatusOr<std::vector<bool>> selected = select_tensors(RefitScope{only}, stream);
    if (selected.ok()) moved = std::move(selected).value();
  }
  local.versions.resize(stream.size(), 0);
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < stream.size(); ++i) {
    if (!moved[i]) continue;
    local.versions[i] = version;
    bytes += stream[i].nbytes();
  }
  return bytes;
}

// --shadow and --readers fit the model: the second arena within
// --memory-limit; readers of a synthetic model's content (a checkpoint's
// bytes are the same in every version). Errors name the settings.
Status check_shadow_and_readers(const EngineOptions& options, const LocalEngine& local) {
  if (options.shadow && options.memory_limit != 0) {
    std::uint64_t arena = 0;
    (void)weight_arena_offsets(local.streams[static_cast<std::size_t>(options.rank)], &arena);
    if (arena >= options.memory_limit) {
      return FailedPrecondition("--shadow needs a second weight arena of " + format_bytes(arena) +
                                ", which does not fit --memory-limit " + format_bytes(options.memory_limit) +
                                " (the limit holds it and the receive pool)");
    }
  }
  if (options.readers > 0 && local.choice.checkpoint) {
    return FailedPrecondition("--readers checks the served weights against a version's synthetic content; a "
                              "checkpoint --model's bytes are the same in every version (not built yet)");
  }
  return Status::Ok();
}

// What this rank calls itself before the setup says the job's engine count:
// "engine rank 0", or for an engine other than 0 "engine 2 rank 0".
std::string rank_label(const EngineOptions& options) {
  if (options.engine == 0) return "engine rank " + std::to_string(options.rank);
  return "engine " + std::to_string(options.engine) + " rank " + std::to_string(options.rank);
}

Status make_local_engine(const EngineOptions& options, LocalEngine& local) {
  const std::string name = rank_label(options);
  RETURN_IF_ERROR(validate_rank_settings(options, /*engine=*/true).WithContext(name));
  local.on_device = options.device == "cuda";
  if (local.on_device) {
    // DESIGN.md rule 7: a local index inside CUDA_VISIBLE_DEVICES.
    auto visible = cuda_device_count();
    if (!visible.ok()) return visible.status().WithContext(name);
    auto device = engine_local_device(options.base_gpu_id, options.rank, *visible, options.engine_gpus);
    if (!device.ok()) return device.status().WithContext(name);
    local.device = *device;
  }
  if (options.rank < 0 || options.rank >= options.engine_ranks) {
    return InvalidArgument(name + ": --rank " + std::to_string(options.rank) + " is outside 0.." +
                           std::to_string(options.engine_ranks - 1) + " (--engine-ranks " +
                           std::to_string(options.engine_ranks) + ")");
  }
  auto choice = open_engine_model(options);
  if (!choice.ok()) return choice.status().WithContext(name);
  local.choice = std::move(*choice);
  // The weights, allocated once: every rank's stream is this rank's model
  // sharded the same way (checked against the coordinator's at setup).
  for (int r = 0; r < options.engine_ranks; ++r) {
    local.streams.push_back(engine_stream(local.choice.model, r, options.engine_ranks));
  }
  RETURN_IF_ERROR(check_shadow_and_readers(options, local).WithContext(name));
  ReferenceEngineOptions engine_options;
  engine_options.memory = local.on_device ? MemoryKind::kCuda : MemoryKind::kHost;
  engine_options.device = local.device;
  engine_options.shadow = options.shadow;
  engine_options.releasable_shadow = options.shadow && options.mode == "staged";
  auto engine = ReferenceEngine::Create(local.streams, std::vector<int>{options.rank}, engine_options);
  if (!engine.ok()) return engine.status().WithContext(name);
  local.engine = std::move(*engine);
  return Status::Ok();
}

// The job's synthetic content as this engine rank checks it: the
// coordinator's seed and --change-fraction (validated at setup).
ContentSeed content_seed(const EngineOptions& options, std::uint64_t seed) {
  const StatusOr<std::uint64_t> change = change_parts(options.change_fraction);
  return ContentSeed(seed, change.ok() ? *change : kEveryElement);
}

EngineBinding bind_local_engine(const EngineOptions& options, LocalEngine& local) {
  EngineBinding binding;
  binding.stream = local.streams[static_cast<std::size_t>(options.rank)];
  for (const Weight& w : local.choice.model.weights) binding.rules.push_back(w.rule);  // stream order
  binding.expected_streams = local.streams;
  binding.engine = local.engine.get();
  binding.arena = local.engine->arena(options.rank);
  binding.arena_bytes = local.engine->arena_bytes(options.rank);
  binding.memory = local.on_device ? MemoryKind::kCuda : MemoryKind::kHost;
  binding.device = local.device;
  binding.quantized_tensors = local.choice.quantized.quantized_tensors;
  binding.shadow = options.shadow;
  binding.weight_memory_bytes = local.engine->weight_memory_bytes();
  // The weights can be read back: delta refits decode over host weights, and a relay parent sends them to an
  // engine joining the job.
  binding.read_committed = make_committed_reader(local.engine.get(), options.rank,
                                                 &local.streams[static_cast<std::size_t>(options.rank)],
                                                 local.on_device ? local.device : -1);
  if (options.readers > 0) {
    binding.read_counts = [&local] { return local.readers ? local.readers->counts() : ReadCounts{}; };
  }
  if (options.verify) {
    binding.verify = [&options, &local](std::uint64_t version, std::uint64_t seed, const std::vector<bool>& moved) {
      WeightVersions versions{version, {}};
      if (!moved.empty()) {
        for (std::size_t i = 0; i < moved.size(); ++i) {
          versions.each.push_back(moved[i] || i >= local.versions.size() ? version : local.versions[i]);
        }
      }
      return verify_engine_weights(local.choice, *local.engine, options.rank, options.engine_ranks, local.on_device,
                                   versions, content_seed(options, seed));
    };
  }
  return binding;
}

// After a failed refit, a shadow engine says what it still serves: the
// last committed version, whole (its bytes checked again where the content
// is synthetic), never the failed refit's.
void say_what_is_served(const EngineOptions& options, const LocalEngine& local, std::uint64_t seed) {
  const std::string name = rank_label(options);
  const std::uint64_t version = local.engine->weight_version();
  if (version == 0) return log(LogLevel::kInfo, name, "shadow weights: no refit was committed, nothing is served");
  const std::string serving = "shadow weights: still serving refit " + std::to_string(version);
  if (local.choice.checkpoint || !local.choice.quantized.sources.empty() || !options.verify) {
    return log(LogLevel::kInfo, name, serving + ", complete (not checked again)");
  }
  const Status served = verify_served_synthetic(local.choice.model, *local.engine, options.rank, options.engine_ranks,
                                                local.on_device, WeightVersions{version, local.versions},
                                                content_seed(options, seed));
  log(LogLevel::kInfo, name,
      served.ok() ? serving + ", complete and verified again (the failed refit was never served)"
                  : serving + ", but its check failed: " + served.message());
}

}  // namespace

Status run_engine(const EngineOptions& options) {
  LocalEngine local;
  if (Status made = make_local_engine(options, local); !made.ok()) {
    // The coordinator and the other ranks hear why now, not at the setup deadline.
    report_setup_failure(options, Role::kEngine, made, options.engine);
    return made;
  }
  // With --shadow the second arena is taken out of --memory-limit first
  // (check_shadow_and_readers); the receive pool gets the rest.
  EngineOptions rank_options = options;
  if (options.shadow && options.memory_limit != 0) {
    rank_options.memory_limit -= local.engine->weight_memory_bytes() / 2;
  }
  ASSIGN_OR_RETURN(auto rank, EngineRank::Join(rank_options, bind_local_engine(options, local)));
  if (options.readers > 0) {  // from setup on: the content's seed is the job's
    local.readers = std::make_unique<WeightReaders>(
        *local.engine, options.readers, local.choice.model.weights.size(),
        [&options, &local, seed = content_seed(options, rank->seed())](std::size_t index,
                                                                       std::uint64_t version) -> StatusOr<bool> {
          const ModelChoice& c = local.choice;
          if (c.quantized.sources.empty()) {
            // A partial refit leaves tensors outside its scope at the version that last moved them.
            const std::uint64_t holds = local.engine->served_version(options.rank, index);
            return served_weight_is_version(c.model, index, *local.engine, options.rank, options.engine_ranks,
                                            local.on_device, holds, seed);
          }
          return served_quantized_weight_is_version(c.unquantized, c.quantized, index, *local.engine, options.rank,
                                                    options.engine_ranks, local.on_device, version, seed);
        });
  }
  RefitTally tally;
  for (;;) {
    auto next = rank->next();
    if (!next.ok() && rank->recovered()) continue;  // reported and recovered: serve the next refit
    if (!next.ok()) {
      if (options.shadow) say_what_is_served(options, local, rank->seed());
      return next.status();
    }
    const std::optional<std::uint64_t> version = *next;
    if (!version) {
      log(LogLevel::kInfo, rank_label(options),
          tally.summary("received", options.verify ? "committed and verified" : "committed (not verified)"));
      return Status::Ok();
    }
    if (local.readers) {
      RETURN_IF_ERROR(
          local.readers->error().WithContext(rank_label(options) + ": a --readers thread"));
    }
    tally.add(*version, commit_versions(local, *version, local.streams[static_cast<std::size_t>(options.rank)],
                                        rank->last_only()));
    if (!options.save_path.empty()) {
      RETURN_IF_ERROR(save_shards(local.choice.model, *local.engine, options.rank, options.engine_ranks,
                                  local.on_device, *version, options.save_path));
    }
  }
}

}  // namespace refit
