// ReferenceEngine: an embedded engine that owns real weight memory and checks
// every post the way a server would (engine.h).
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "refit/reference_engine.h"
#include "cuda/batched_copy.h"
#include "cuda/device.h"
#include "model/shard_copy.h"

namespace refit {
namespace {

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// The payload list of TP rank `rank` (DESIGN.md rule 8: payload index i is
// engine TP rank i, whatever subset of ranks this process hosts).
const std::vector<TensorView>& rank_payload(const AlignedBatch& batch, int rank) { return batch.payload[rank]; }

}  // namespace

std::vector<std::uint64_t> weight_arena_offsets(const std::vector<TensorSpec>& stream, std::uint64_t* total) {
  std::vector<std::uint64_t> offsets;
  offsets.reserve(stream.size());
  std::uint64_t at = 0;
  for (const TensorSpec& spec : stream) {
    offsets.push_back(at);
    at += (spec.nbytes() + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment;
  }
  if (total != nullptr) *total = at;
  return offsets;
}

std::uint64_t shadow_arena_stride(const std::vector<TensorSpec>& stream) {
  std::uint64_t total = 0;
  (void)weight_arena_offsets(stream, &total);
  return total;
}

// One hosted rank's weights: a host vector or a device buffer, allocated once.
// Arena 0 owns its rank's memory, in shadow mode both arenas' (arena 1 is
// a view into it at `bytes`, so direct mode exposes one region).
struct ReferenceEngine::Arena {
  std::vector<std::byte> host;
  DeviceBuffer device;
  std::byte* view = nullptr;  // arena 1 in shadow mode
  std::uint64_t bytes = 0;    // of this arena
  std::byte* data() { return view != nullptr ? view : device.data() != nullptr ? device.data() : host.data(); }
};

StatusOr<std::unique_ptr<ReferenceEngine>> ReferenceEngine::Create(std::vector<std::vector<TensorSpec>> streams,
                                                                   std::vector<int> hosted,
                                                                   ReferenceEngineOptions options) {
  std::unique_ptr<ReferenceEngine> engine(new ReferenceEngine(std::move(streams), std::move(hosted), options, 0));
  RETURN_IF_ERROR(engine->allocate());
  return engine;
}

ReferenceEngine::ReferenceEngine(std::vector<std::vector<TensorSpec>> streams, std::vector<int> hosted)
    : ReferenceEngine(std::move(streams), std::move(hosted), ReferenceEngineOptions{}, 0) {
  Status st = allocate();  // host memory: only std::bad_alloc can fail, and it throws
  (void)st;
}

ReferenceEngine::ReferenceEngine(std::vector<std::vector<TensorSpec>> streams, std::vector<int> hosted,
                                 ReferenceEngineOptions options, int /*tag*/)
    : streams_(std::move(streams)), hosted_(std::move(hosted)), options_(options) {
  const int ranks = static_cast<int>(streams_.size());
  shapes_.resize(streams_.size());
  for (int r = 0; r < ranks; ++r) {
    for (const TensorSpec& spec : streams_[r]) shapes_[r][spec.name] = &spec;
  }
}

struct ReferenceEngine::PreparedApply {
  // What identifies the batch: batch.specs, then for every rank r and tensor
  // i payload[r][i]'s spec, data and memory kind.
  std::vector<const void*> key;
  std::vector<PreparedCopy> posts;  // one per dtype group
  std::uint64_t tensors = 0;        // for the stats
  std::uint64_t bytes = 0;
};

namespace {

std::vector<const void*> batch_key(const AlignedBatch& batch) {
  std::size_t n = batch.specs.size();
  for (const std::vector<TensorView>& views : batch.payload) n += 3 * views.size();
  std::vector<const void*> key;
  key.reserve(n);
  key.assign(batch.specs.begin(), batch.specs.end());
  for (const std::vector<TensorView>& views : batch.payload) {
    for (const TensorView& v : views) {
      key.push_back(v.spec);
      key.push_back(v.data);
      key.push_back(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(v.memory)));
    }
  }
  return key;
}

using RankShapes = std::vector<std::unordered_map<std::string, const TensorSpec*>>;

// The batch holds one payload list per TP rank of the engine, each as long
// as the batch's list of specs.
Status check_payload_counts(const std::string& where, const AlignedBatch& batch, std::size_t ranks) {
  if (batch.payload.size() != ranks) {
    return FailedPrecondition(where + " has payloads for " + std::to_string(batch.payload.size()) +
                              " ranks; the engine has " + std::to_string(ranks) + " TP ranks");
  }
  for (std::size_t r = 0; r < ranks; ++r) {
    if (batch.payload[r].size() != batch.specs.size()) {
      return FailedPrecondition(where + ": payload for rank " + std::to_string(r) + " holds " +
                                std::to_string(batch.payload[r].size()) + " tensors, the batch names " +
                                std::to_string(batch.specs.size()));
    }
  }
  return Status::Ok();
}

// Every post holds tensors of its dtype, and payload[r][i] is rank r's
// parameter of the batch's tensor i, in its shape (DESIGN.md rules 5, 8).
Status check_posts(const std::string& where, const AlignedBatch& batch,
                   const std::vector<AlignedBatch::DTypeGroup>& groups, const RankShapes& shapes) {
  const std::size_t ranks = shapes.size();
  for (const AlignedBatch::DTypeGroup& group : groups) {
    for (std::size_t i : group.indices) {
      const TensorSpec* spec = batch.specs[i];
      if (spec == nullptr) return FailedPrecondition(where + ": tensor " + std::to_string(i) + " has no spec");
      if (spec->dtype != group.dtype) {
        return FailedPrecondition(where + ": the " + std::string(dtype_name(group.dtype)) + " post holds tensor '" +
                                  spec->name + "' of dtype " + std::string(dtype_name(spec->dtype)) +
                                  " (one post per dtype; dtypes are never promoted)");
      }
      for (std::size_t r = 0; r < ranks; ++r) {
        const TensorView& view = batch.payload[r][i];
        // Built only for an error: this loop runs once per tensor and rank.
        const auto who = [&] { return "tensor '" + spec->name + "' on rank " + std::to_string(r); };
        if (view.spec == nullptr) return FailedPrecondition(where + ": " + who() + " has no spec");
        if (view.spec->name != spec->name) {
          return FailedPrecondition(where + ": " + who() + ": payload[" + std::to_string(r) + "][" +
                                    std::to_string(i) + "] is '" + view.spec->name + "'");
        }
        if (view.spec->dtype != group.dtype) {
          return FailedPrecondition(where + ": " + who() + " has dtype " + std::string(dtype_name(view.spec->dtype)) +
                                    ", the post is " + std::string(dtype_name(group.dtype)));
        }
        auto own = shapes[r].find(spec->name);
        if (own == shapes[r].end()) {
          return FailedPrecondition(where + ": " + who() + ": rank " + std::to_string(r) + " has no such parameter");
        }
        if (view.spec->shape != own->second->shape || view.spec->dtype != own->second->dtype) {
          return FailedPrecondition(where + ": " + who() + ": payload shape " + shape_string(view.spec->shape) +
                                    " differs from rank " + std::to_string(r) + "'s parameter shape " +
                                    shape_string(own->second->shape) +
                                    " (payload index i must be engine TP rank i)");
        }
      }
    }
  }
  return Status::Ok();
}

// Every tensor of a rank this process hosts has its bytes, as many as its
// parameter, in memory this engine can copy from.
Status check_hosted(const std::string& where, const AlignedBatch& batch,
                    const std::vector<AlignedBatch::DTypeGroup>& groups, const std::vector<int>& hosted,
                    const RankShapes& shapes, MemoryKind memory) {
  for (int r : hosted) {
    const std::vector<TensorView>& mine = rank_payload(batch, r);
    for (const AlignedBatch::DTypeGroup& group : groups) {
      for (std::size_t i : group.indices) {
        const TensorView& view = mine[i];
        if (view.data == nullptr && view.spec->nbytes() > 0) {
          return FailedPrecondition(where + ": tensor '" + view.spec->name + "' on hosted rank " +
                                    std::to_string(r) + " has no bytes (data == nullptr)");
        }
        auto own = shapes[r].find(view.spec->name);
        if (own == shapes[r].end() || own->second->nbytes() != view.spec->nbytes()) {
          return FailedPrecondition(where + ": tensor '" + view.spec->name + "' on hosted rank " +
                                    std::to_string(r) + " has " + std::to_string(view.spec->nbytes()) +
                                    " bytes; rank " + std::to_string(r) + "'s parameter has " +
                                    (own == shapes[r].end() ? std::string("none")
                                                            : std::to_string(own->second->nbytes())));
        }
        if (view.memory == MemoryKind::kCuda && memory != MemoryKind::kCuda) {
          return FailedPrecondition(where + ": tensor '" + view.spec->name + "' on hosted rank " +
                                    std::to_string(r) + " is in device memory; this engine's weights are in host memory");
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace

ReferenceEngine::~ReferenceEngine() = default;

Status ReferenceEngine::allocate_arena(Arena& arena) const {
  if (options_.memory == MemoryKind::kCuda) {
    ASSIGN_OR_RETURN(arena.device, DeviceBuffer::Allocate(options_.device, std::max<std::uint64_t>(arena.bytes, 1)));
  } else {
    arena.host.assign(arena.bytes, std::byte{0});
  }
  return Status::Ok();
}

StatusOr<std::uint64_t> ReferenceEngine::release_idle() {
  if (!options_.shadow || !options_.releasable_shadow || idle_released_) return std::uint64_t{0};
  if (in_refit_) return FailedPrecondition("reference engine: release_idle() while refit " +
                                           std::to_string(pending_version_) + " is open");
  std::uint64_t freed = 0;
  for (auto& arena : arenas_[landing()]) {
    if (!arena) continue;
    arena->device = DeviceBuffer();
    std::vector<std::byte>().swap(arena->host);
    freed += arena->bytes;
  }
  prepared_.clear();  // their copies wrote into the freed arena
  for (int r : hosted_) versions_[static_cast<std::size_t>(r)].forget(landing());
  idle_released_ = true;
  return freed;
}

std::byte* ReferenceEngine::arena_data(int k, std::size_t rank) { return arenas_[k][rank]->data(); }

Status ReferenceEngine::acquire_idle() {
  if (!idle_released_) return Status::Ok();
  for (auto& arena : arenas_[landing()]) {
    if (arena) RETURN_IF_ERROR(allocate_arena(*arena));
  }
  idle_released_ = false;
  return Status::Ok();
}

// Weights are allocated once, here; apply() only copies into them. Hosted
// ranks outside [0, ranks) are reported by begin().
Status ReferenceEngine::allocate() {
  const int ranks = static_cast<int>(streams_.size());
  offsets_.resize(streams_.size());
  for (const std::vector<TensorSpec>& stream : streams_) versions_.emplace_back(stream.size());
  for (int k = 0; k < (options_.shadow ? 2 : 1); ++k) arenas_[k].resize(streams_.size());
  for (int r : hosted_) {
    if (r < 0 || r >= ranks) continue;
    std::uint64_t bytes = 0;
    std::vector<std::uint64_t> offsets = weight_arena_offsets(streams_[r], &bytes);
    for (std::size_t i = 0; i < streams_[r].size(); ++i) offsets_[r][streams_[r][i].name] = offsets[i];
    // Shadow weights in one region (arena 1 a view into it), unless each must be freed on its own.
    const bool one_region = options_.shadow && !options_.releasable_shadow;
    auto arena = std::make_unique<Arena>();
    arena->bytes = (one_region ? 2 : 1) * bytes;
    RETURN_IF_ERROR(allocate_arena(*arena));
    arena->bytes = bytes;
    if (options_.shadow) {
      arenas_[1][r] = std::make_unique<Arena>();
      arenas_[1][r]->bytes = bytes;
      if (one_region) {
        arenas_[1][r]->view = arena->data() + bytes;
      } else {
        RETURN_IF_ERROR(allocate_arena(*arenas_[1][r]));
      }
    }
    arenas_[0][r] = std::move(arena);
    if (options_.memory == MemoryKind::kCuda && !copier_) {
      ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(options_.device));
      copier_ = std::make_unique<BatchedCopier>(std::move(copier));
      ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(options_.device));
      stream_ = std::make_unique<CudaStream>(std::move(stream));
    }
  }
  return Status::Ok();
}

Status ReferenceEngine::begin(std::uint64_t version) {
  for (int r : hosted_) {
    if (r < 0 || r >= static_cast<int>(streams_.size())) {
      return FailedPrecondition("reference engine: hosted rank " + std::to_string(r) + " is outside the engine's " +
                                std::to_string(streams_.size()) + " TP ranks");
    }
  }
  if (idle_released_) {
    return FailedPrecondition("reference engine: begin(" + std::to_string(version) +
                              ") while the shadow arena is released (acquire_idle() first)");
  }
  if (in_refit_) {
    return FailedPrecondition("reference engine: begin(" + std::to_string(version) + ") while refit " +
                              std::to_string(pending_version_) + " is still open (commit or abort it first)");
  }
  if (version <= version_) {
    return FailedPrecondition("reference engine: begin(" + std::to_string(version) +
                              ") does not advance the committed weight version " + std::to_string(version_));
  }
  in_refit_ = true;
  pending_version_ = version;
  for (int r : hosted_) versions_[static_cast<std::size_t>(r)].open({});  // every tensor (unless begin_partial)
  ++stats_.begins;
  return Status::Ok();
}

const ReferenceEngine::PreparedApply* ReferenceEngine::find_prepared(std::uint64_t sequence,
                                                                     const std::vector<const void*>& key) const {
  if (sequence >= prepared_.size()) return nullptr;
  for (const auto& p : prepared_[sequence]) {
    if (p->key == key) return p.get();
  }
  return nullptr;
}

Status ReferenceEngine::apply_prepared(const PreparedApply& prepared, const std::string& where) {
  for (const PreparedCopy& post : prepared.posts) {
    ++stats_.posts;
    RETURN_IF_ERROR(copier_->launch(post, stream_->handle()).WithContext(where));
  }
  stats_.tensors_applied += prepared.tensors;
  stats_.bytes_applied += prepared.bytes;
  return stream_->synchronize().WithContext(where);
}

Status ReferenceEngine::apply(const AlignedBatch& batch) {
  const std::string where = "reference engine: aligned batch " + std::to_string(batch.sequence);
  if (!in_refit_) {
    return FailedPrecondition(where + " applied outside begin()..commit(): no refit is open");
  }
  RETURN_IF_ERROR(check_payload_counts(where, batch, streams_.size()));
  std::vector<const void*> key;  // device engines: what identifies this batch (built once)
  // Without shadow weights readers wait while a batch is copied into the
  // weights they read (and read a mixture of versions between batches).
  std::unique_lock<std::shared_mutex> no_readers;
  if (!options_.shadow) no_readers = exclude_readers();
  if (options_.memory == MemoryKind::kCuda) {
    key = batch_key(batch);
    // The same batch into the other arena is another set of copies.
    key.push_back(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(landing())));
    if (const PreparedApply* prepared = find_prepared(batch.sequence, key)) return apply_prepared(*prepared, where);
  }
  const std::vector<AlignedBatch::DTypeGroup> groups = batch.groups();

  // Validate every post before copying anything, so a failed apply leaves the
  // weights as they were.
  RETURN_IF_ERROR(check_posts(where, batch, groups, shapes_));
  RETURN_IF_ERROR(check_hosted(where, batch, groups, hosted_, shapes_, options_.memory));

  // One post per dtype group (DESIGN.md rule 5); payload[r] goes to rank r
  // (rule 8). Payloads of ranks hosted elsewhere are ignored.
  // On a device each post is one batched copy launch, prepared here and kept
  // (by sequence, replacing the oldest) for the same batch next refit;
  // apply() returns once they finished (the staging slots may then be
  // recycled). Every post is prepared before any is launched.
  auto prepared = std::make_unique<PreparedApply>();
  std::vector<CopyRun> runs;
  for (const AlignedBatch::DTypeGroup& group : groups) {
    runs.clear();
    for (int r : hosted_) {
      const std::vector<TensorView>& mine = rank_payload(batch, r);
      std::byte* arena = arenas_[landing()][r]->data();
      for (std::size_t i : group.indices) {
        const TensorView& view = mine[i];
        const std::uint64_t n = view.spec->nbytes();
        // Validated above: every hosted rank has this parameter.
        if (n > 0) runs.push_back(copy_run_1d(view.data, arena + offsets_[r].at(view.spec->name), n));
        ++prepared->tensors;
        prepared->bytes += n;
      }
    }
    if (options_.memory == MemoryKind::kCuda) {
      auto post = copier_->prepare(runs);
      if (!post.ok()) return post.status().WithContext(where);
      prepared->posts.push_back(std::move(post).value());
    } else {
      ++stats_.posts;
      copy_runs_on_host(runs);
    }
  }
  if (options_.memory != MemoryKind::kCuda) {
    stats_.tensors_applied += prepared->tensors;
    stats_.bytes_applied += prepared->bytes;
    return Status::Ok();
  }
  prepared->key = std::move(key);
  if (prepared_.size() <= batch.sequence) prepared_.resize(batch.sequence + 1);
  std::vector<std::unique_ptr<PreparedApply>>& kept = prepared_[batch.sequence];
  // Shadow weights alternate two arenas: twice the batches to keep.
  if (kept.size() >= (options_.shadow ? 2 : 1) * kPreparedPerSequence) kept.erase(kept.begin());
  kept.push_back(std::move(prepared));
  return apply_prepared(*kept.back(), where);
}

Status ReferenceEngine::commit(std::uint64_t version) {
  if (!in_refit_) {
    return FailedPrecondition("reference engine: commit(" + std::to_string(version) +
                              ") without begin(): no refit is open");
  }
  if (version != pending_version_) {
    return FailedPrecondition("reference engine: commit(" + std::to_string(version) + ") but the open refit is " +
                              std::to_string(pending_version_));
  }
  in_refit_ = false;
  std::unique_lock<std::shared_mutex> no_readers = exclude_readers();
  note_landed(version);  // readers read the served arena's versions (served_version): held out meanwhile
  if (options_.shadow) active_ = 1 - active_;  // the flip: the landed arena is served from now on
  version_ = version;  // DESIGN.md rule 6: once per refit, only here
  complete_ = true;
  ++stats_.cache_flushes;  // rule 9: one KV-cache flush per refit
  if (options_.on_flip) options_.on_flip(version);
  return Status::Ok();
}

void ReferenceEngine::abort(std::uint64_t /*version*/, const Status& /*why*/) {
  if (in_refit_) {
    std::unique_lock<std::shared_mutex> no_readers = exclude_readers();
    note_landed(0);
  }
  in_refit_ = false;
  // The version stays at the last committed one. Shadow weights: the failed
  // refit wrote only the inactive arena, which the next refit overwrites;
  // else the weights may be a mix of two versions until the next commit.
  if (!options_.shadow) complete_ = false;
}

std::unique_lock<std::shared_mutex> ReferenceEngine::exclude_readers() const {
  std::lock_guard<std::mutex> gate(flip_gate_);
  return std::unique_lock<std::shared_mutex>(flip_mu_);
}

void ReferenceEngine::read_active(const std::function<void(std::uint64_t version)>& pass) const {
  { std::lock_guard<std::mutex> gate(flip_gate_); }  // behind a waiting writer
  std::shared_lock<std::shared_mutex> reading(flip_mu_);
  pass(version_);
}

const std::byte* ReferenceEngine::weight_in(int arena, int rank, const std::string& name) const {
  const auto& arenas = arenas_[arena];
  if (rank < 0 || rank >= static_cast<int>(arenas.size()) || !arenas[rank]) return nullptr;
  auto it = offsets_[rank].find(name);
  std::byte* data = arenas[rank]->data();  // null while released (release_idle)
  return it == offsets_[rank].end() || data == nullptr ? nullptr : data + it->second;
}

const std::byte* ReferenceEngine::landed_weight(int rank, const std::string& name) const {
  return weight_in(landing(), rank, name);
}

const std::byte* ReferenceEngine::weight(int rank, const std::string& name) const {
  return weight_in(active_, rank, name);
}

std::byte* ReferenceEngine::mutable_weight(int rank, const std::string& name) {
  return const_cast<std::byte*>(static_cast<const ReferenceEngine*>(this)->weight(rank, name));
}

std::byte* ReferenceEngine::arena(int rank) {
  if (rank < 0 || rank >= static_cast<int>(arenas_[0].size()) || !arenas_[0][rank]) return nullptr;
  return arenas_[0][rank]->data();
}

std::uint64_t ReferenceEngine::arena_bytes(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(arenas_[0].size()) || !arenas_[0][rank]) return 0;
  return (options_.shadow && !options_.releasable_shadow ? 2 : 1) * arenas_[0][rank]->bytes;
}

std::uint64_t ReferenceEngine::weight_memory_bytes() const {
  std::uint64_t bytes = 0;
  for (const auto& arenas : arenas_) {
    for (const auto& arena : arenas) bytes += arena ? arena->bytes : 0;
  }
  return bytes;
}

}  // namespace refit
