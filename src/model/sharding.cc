// Tensor-parallel sharding of a full weight into engine ranks' shards.
//
// Every shard is a set of equally sized runs at a fixed stride inside the full
// tensor's C-order bytes (see RunLayout): replicated and dim-0 shards are one
// run; a dim-1 shard is one run per index of dim 0. An empty shard (more
// ranks than rows) has no runs: for_each_shard_run never reports 0-byte runs.
//
// A rule whose split dimension the tensor lacks (kRow on a 1-D tensor, any
// split of a scalar) is a programming error in the preset: it asserts in
// debug builds and, in release builds, the tensor is treated as replicated.
#include <algorithm>
#include <cassert>
#include <cstring>

#include "refit/model.h"

namespace refit {
namespace {

int split_dim(ShardRule rule) {
  switch (rule) {
    case ShardRule::kReplicated: return -1;
    case ShardRule::kColumn:
    case ShardRule::kVocab:
    case ShardRule::kExpert: return 0;
    case ShardRule::kRow: return 1;
  }
  return -1;
}

using RunLayout = ShardRunLayout;

// Product of shape[from, to).
std::uint64_t product(const std::vector<std::int64_t>& shape, std::size_t from, std::size_t to) {
  std::uint64_t p = 1;
  for (std::size_t d = from; d < to; ++d) p *= static_cast<std::uint64_t>(shape[d]);
  return p;
}

}  // namespace

int expert_owner(int expert, int experts, int ranks) {
  assert(expert >= 0 && expert < experts && ranks >= 1);
  const int base = experts / ranks;
  const int extra = experts % ranks;
  // Ranks 0..extra-1 hold base + 1 experts each, the rest base.
  if (expert < extra * (base + 1)) return expert / (base + 1);
  return extra + (expert - extra * (base + 1)) / base;
}

ShardRunLayout shard_run_layout(const Weight& weight, int rank, int ranks) {
  const ShardSlice s = shard_slice(weight, rank, ranks);
  const std::vector<std::int64_t>& shape = weight.spec.shape;
  RunLayout l;
  if (s.dim < 0) {
    l.run = weight.spec.nbytes();
    l.stride = l.run;
    l.count = 1;
  } else {
    const auto d = static_cast<std::size_t>(s.dim);
    // Bytes of one index of the split dimension.
    const std::uint64_t inner = product(shape, d + 1, shape.size()) * dtype_size(weight.spec.dtype);
    l.base = static_cast<std::uint64_t>(s.begin) * inner;
    l.run = static_cast<std::uint64_t>(s.end - s.begin) * inner;
    l.stride = static_cast<std::uint64_t>(shape[d]) * inner;
    l.count = product(shape, 0, d);
  }
  if (l.run == 0) l.count = 0;
  return l;
}

namespace {
RunLayout run_layout(const Weight& weight, int rank, int ranks) { return shard_run_layout(weight, rank, ranks); }
}  // namespace

ShardSlice shard_slice(const Weight& weight, int rank, int ranks) {
  assert(ranks >= 1 && rank >= 0 && rank < ranks);
  const int dim = split_dim(weight.rule);
  const std::vector<std::int64_t>& shape = weight.spec.shape;
  if (dim < 0) return ShardSlice{};
  if (static_cast<std::size_t>(dim) >= shape.size()) {
    assert(false && "shard rule splits a dimension the tensor does not have");
    return ShardSlice{};
  }
  if (weight.rule == ShardRule::kExpert && weight.expert >= 0) {
    // A per-expert tensor: whole on its owner, nothing (0 rows) elsewhere.
    if (expert_owner(weight.expert, weight.experts, ranks) == rank) return ShardSlice{};
    return ShardSlice{0, 0, 0};
  }
  const std::int64_t size = shape[static_cast<std::size_t>(dim)];
  const std::int64_t n = ranks;
  const std::int64_t base = size / n;
  const std::int64_t extra = size % n;
  ShardSlice s;
  s.dim = dim;
  s.begin = rank * base + std::min<std::int64_t>(rank, extra);
  s.end = s.begin + base + (rank < extra ? 1 : 0);
  return s;
}

TensorSpec shard_spec(const Weight& weight, int rank, int ranks) {
  TensorSpec spec = weight.spec;
  const ShardSlice s = shard_slice(weight, rank, ranks);
  if (s.dim >= 0) spec.shape[static_cast<std::size_t>(s.dim)] = s.end - s.begin;
  return spec;
}

std::vector<TensorSpec> engine_stream(const Model& model, int rank, int ranks) {
  std::vector<TensorSpec> out;
  out.reserve(model.weights.size());
  for (const Weight& w : model.weights) out.push_back(shard_spec(w, rank, ranks));
  return out;
}

void for_each_shard_run(const Weight& weight, int rank, int ranks,
                        const std::function<void(std::uint64_t full_offset, std::uint64_t shard_offset,
                                                 std::uint64_t bytes)>& fn) {
  const RunLayout l = run_layout(weight, rank, ranks);
  for (std::uint64_t i = 0; i < l.count; ++i) fn(l.base + i * l.stride, i * l.run, l.run);
}

void copy_shard_range(const Weight& weight, int rank, int ranks, const std::byte* full,
                      std::uint64_t shard_begin, std::span<std::byte> out) {
  if (out.empty()) return;
  const RunLayout l = run_layout(weight, rank, ranks);
  const std::uint64_t shard_end = shard_begin + out.size();
  assert(shard_end <= l.run * l.count && "copy_shard_range past the end of the shard");
  if (l.count == 0) return;  // release build, bad range: nothing to copy from
  // Runs overlapping [shard_begin, shard_end): first..last, clipped at both ends.
  for (std::uint64_t i = shard_begin / l.run; i < l.count && i * l.run < shard_end; ++i) {
    const std::uint64_t lo = std::max(shard_begin, i * l.run);
    const std::uint64_t hi = std::min(shard_end, (i + 1) * l.run);
    std::memcpy(out.data() + (lo - shard_begin), full + l.base + i * l.stride + (lo - i * l.run), hi - lo);
  }
}

}  // namespace refit
