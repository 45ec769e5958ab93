// BucketFeed: see bucket_feed.h.
#include "reshard/bucket_feed.h"

#include <algorithm>
#include <cassert>
#include <string>
#include <utility>

namespace refit {
namespace {

// One trainer rank's runs of one tensor into the engine rank: a slice of
// pair(trainer, e).runs, ordered by dst offset.
struct RunRange {
  int trainer = 0;
  const TransferRun* begin = nullptr;
  const TransferRun* end = nullptr;
};

// Per tensor, the trainer ranks that send the engine rank any of it,
// ascending, each with its runs: built once, so that an entry looks only at
// the runs of its own tensor.
using RunIndex = std::vector<std::vector<RunRange>>;

// The part of the engine rank's local shard of one tensor that one bucket
// entry holds: [lo, hi), at bucket_offset in the bucket.
struct Window {
  std::uint32_t tensor = 0;
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  std::uint64_t bucket_offset = 0;
};

std::string tensor_name(const TransferPlan& transfer, std::uint32_t tensor) {
  return "'" + transfer.engine_tensors[tensor].spec.name + "'";
}

Status check_engine_rank(const TransferPlan& transfer, int engine_rank) {
  if (engine_rank < 0 || engine_rank >= transfer.engine_ranks) {
    return InvalidArgument("engine rank " + std::to_string(engine_rank) + " is outside the transfer plan's " +
                           std::to_string(transfer.engine_ranks) + " engine ranks");
  }
  const auto pairs = static_cast<std::size_t>(transfer.trainer_ranks) * static_cast<std::size_t>(transfer.engine_ranks);
  if (transfer.trainer_ranks < 1 || transfer.pairs.size() != pairs) {
    return InvalidArgument("the transfer plan has " + std::to_string(transfer.pairs.size()) + " pairs for " +
                           std::to_string(transfer.trainer_ranks) + " trainer ranks x " +
                           std::to_string(transfer.engine_ranks) + " engine ranks");
  }
  return Status::Ok();
}

// The bucket plan's specs must be, in order, engine rank e's local specs of
// the transfer plan's engine tensors: the feed indexes both by the same
// tensor.
Status check_stream(const TransferPlan& transfer, int e, const Plan& plan) {
  const std::vector<SideTensor>& tensors = transfer.engine_tensors;
  const std::size_t common = std::min(plan.specs.size(), tensors.size());
  for (std::size_t i = 0; i < common; ++i) {
    ASSIGN_OR_RETURN(const TensorSpec local, local_spec(tensors[i].spec, tensors[i].layout, e));
    if (plan.specs[i] == local) continue;
    return InvalidArgument("stream position " + std::to_string(i) + " of the bucket plan is '" +
                           plan.specs[i].ToString() + "', but engine rank " + std::to_string(e) +
                           "'s local shard of tensor '" + tensors[i].spec.name + "' is '" + local.ToString() + "'");
  }
  if (plan.specs.size() == tensors.size()) return Status::Ok();
  const std::string first_odd = plan.specs.size() > common ? "'" + plan.specs[common].name + "' is extra"
                                                           : "'" + tensors[common].spec.name + "' is missing";
  return InvalidArgument("the bucket plan's stream has " + std::to_string(plan.specs.size()) +
                         " tensors, the transfer plan " + std::to_string(tensors.size()) + " (tensor " + first_odd +
                         ")");
}

// A run the clipping arithmetic can rely on: tensors of the plan, pieces
// of bytes > 0 that do not overlap (dst_stride >= bytes when count > 1).
Status check_run(const TransferPlan& transfer, int t, const TransferRun& run) {
  if (run.tensor >= transfer.engine_tensors.size()) {
    return InvalidArgument("trainer rank " + std::to_string(t) + " has a run of tensor " + std::to_string(run.tensor) +
                           ", the transfer plan has " + std::to_string(transfer.engine_tensors.size()) + " tensors");
  }
  if (run.src_tensor >= transfer.trainer_tensors.size()) {
    return InvalidArgument("trainer rank " + std::to_string(t) + " has a run of tensor " +
                           tensor_name(transfer, run.tensor) + " from trainer tensor " +
                           std::to_string(run.src_tensor) + ", the transfer plan has " +
                           std::to_string(transfer.trainer_tensors.size()) + " trainer tensors");
  }
  if (run.bytes > 0 && run.count >= 1 && (run.count == 1 || run.dst_stride >= run.bytes)) return Status::Ok();
  return InvalidArgument("trainer rank " + std::to_string(t) + "'s run of tensor " + tensor_name(transfer, run.tensor) +
                         " at dst offset " + std::to_string(run.dst_offset) + " has " + std::to_string(run.count) +
                         " pieces of " + std::to_string(run.bytes) + " bytes, dst stride " +
                         std::to_string(run.dst_stride) + ": pieces must hold bytes and not overlap");
}

// Groups each trainer rank's runs into engine rank e by tensor. A pair's
// runs are ordered by tensor, so each (trainer, tensor) is one slice.
StatusOr<RunIndex> index_runs(const TransferPlan& transfer, int e) {
  RunIndex index(transfer.engine_tensors.size());
  for (int t = 0; t < transfer.trainer_ranks; ++t) {
    const std::vector<TransferRun>& runs = transfer.pair(t, e).runs;
    for (const TransferRun* run = runs.data(); run != runs.data() + runs.size(); ++run) {
      RETURN_IF_ERROR(check_run(transfer, t, *run));
      std::vector<RunRange>& ranges = index[run->tensor];
      if (!ranges.empty() && ranges.back().trainer == t && ranges.back().end == run) {
        ranges.back().end = run + 1;
        continue;
      }
      if (!ranges.empty() && ranges.back().trainer == t) {
        return InvalidArgument("trainer rank " + std::to_string(t) + "'s runs of tensor " +
                               tensor_name(transfer, run->tensor) + " into engine rank " + std::to_string(e) +
                               " are not ordered by tensor");
      }
      ranges.push_back(RunRange{t, run, run + 1});
    }
  }
  return index;
}

// End of the destination bytes of run's last piece.
std::uint64_t dst_end(const TransferRun& run) { return run.dst_offset + (run.count - 1) * run.dst_stride + run.bytes; }

// Piece i of `run`, cut to [max(lo, piece start), min(hi, piece end)): a
// count-1 run of the covered bytes.
FeedRun cut_piece(const TransferRun& run, std::uint64_t i, const Window& w) {
  const std::uint64_t dst = run.dst_offset + i * run.dst_stride;
  const std::uint64_t begin = std::max(w.lo, dst);
  const std::uint64_t end = std::min(w.hi, dst + run.bytes);
  return FeedRun{w.tensor, run.src_offset + i * run.src_stride + (begin - dst), begin, w.bucket_offset + (begin - w.lo),
                 end - begin, 1, 0, 0, run.src_tensor};
}

// Pieces [i, i + n) of `run`, each wholly inside the window, as one run.
FeedRun whole_pieces(const TransferRun& run, std::uint64_t i, std::uint64_t n, const Window& w) {
  const std::uint64_t dst = run.dst_offset + i * run.dst_stride;
  FeedRun out{w.tensor, run.src_offset + i * run.src_stride, dst, w.bucket_offset + (dst - w.lo), run.bytes, n, 0, 0,
              run.src_tensor};
  if (n > 1) {
    out.src_stride = run.src_stride;
    out.dst_stride = run.dst_stride;
  }
  return out;
}

// Appends the part of `run` whose destination lies in the window: a cut
// first piece, the whole pieces as one strided run, a cut last piece (each
// only where it holds bytes). The first and last pieces that overlap are
// found by arithmetic; a run of thousands of pieces is never expanded.
void clip_run(const TransferRun& run, const Window& w, std::vector<FeedRun>& out) {
  if (w.lo >= w.hi || dst_end(run) <= w.lo || run.dst_offset >= w.hi) return;
  std::uint64_t first = 0;  // the first piece that ends after lo
  std::uint64_t last = 0;   // the last piece that starts before hi
  if (run.count > 1) {
    const std::uint64_t step = run.dst_stride;
    first = w.lo < run.dst_offset + run.bytes ? 0 : (w.lo - run.dst_offset - run.bytes) / step + 1;
    last = std::min(run.count - 1, (w.hi - 1 - run.dst_offset) / step);
  }
  if (first > last) return;  // the window lies between two pieces
  std::uint64_t begin = first;
  std::uint64_t end = last + 1;  // pieces [begin, end) are left to emit
  if (run.dst_offset + first * run.dst_stride < w.lo) out.push_back(cut_piece(run, begin++, w));
  const bool cut_last = end > begin && run.dst_offset + last * run.dst_stride + run.bytes > w.hi;
  if (cut_last) --end;
  if (end > begin) out.push_back(whole_pieces(run, begin, end - begin, w));
  if (cut_last) out.push_back(cut_piece(run, end, w));
}

// Appends trainer rank range.trainer's runs that land in the window to
// `out`; returns their bytes. The runs are ordered by dst offset and their
// pieces do not interleave, so the first one that reaches the window is
// found by bisection and the scan stops at the first one past it.
std::uint64_t clip_range(const RunRange& range, const Window& w, std::vector<FeedRun>& out) {
  const std::size_t before = out.size();
  const TransferRun* run =
      std::partition_point(range.begin, range.end, [&](const TransferRun& r) { return dst_end(r) <= w.lo; });
  for (; run != range.end && run->dst_offset < w.hi; ++run) clip_run(*run, w, out);
  std::uint64_t bytes = 0;
  for (std::size_t k = before; k < out.size(); ++k) bytes += out[k].total_bytes();
  return bytes;
}

// The shares of one bucket as they are filled: a slot per trainer rank, so
// that finding a trainer's share costs nothing whatever M is.
class ShareBuilder {
 public:
  explicit ShareBuilder(int trainer_ranks) : slot_(static_cast<std::size_t>(trainer_ranks), kNone) {}

  BucketShare& of(int trainer) {
    std::size_t& slot = slot_[static_cast<std::size_t>(trainer)];
    if (slot == kNone) {
      slot = shares_.size();
      shares_.push_back(BucketShare{trainer, 0, {}});
    }
    return shares_[slot];
  }

  // The shares with bytes, ascending trainer rank; resets the builder.
  std::vector<BucketShare> take() {
    for (const BucketShare& s : shares_) slot_[static_cast<std::size_t>(s.trainer_rank)] = kNone;
    std::erase_if(shares_, [](const BucketShare& s) { return s.bytes == 0; });
    std::sort(shares_.begin(), shares_.end(),
              [](const BucketShare& a, const BucketShare& b) { return a.trainer_rank < b.trainer_rank; });
    return std::exchange(shares_, {});
  }

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> slot_;
  std::vector<BucketShare> shares_;
};

// Adds every trainer rank's part of one entry to `shares`. Errors when the
// runs do not cover the entry's bytes exactly (a transfer plan whose runs
// are not the engine rank's shard).
Status feed_entry(const TransferPlan& transfer, const RunIndex& index, int e, std::uint64_t j, const PlanEntry& entry,
                  ShareBuilder& shares) {
  if (entry.tensor >= index.size()) {
    return InvalidArgument("bucket " + std::to_string(j) + " has an entry of tensor " + std::to_string(entry.tensor) +
                           ", the stream has " + std::to_string(index.size()) + " tensors");
  }
  const Window w{entry.tensor, entry.tensor_offset, entry.tensor_offset + entry.bytes, entry.bucket_offset};
  std::uint64_t covered = 0;
  for (const RunRange& range : index[entry.tensor]) {
    BucketShare& share = shares.of(range.trainer);
    const std::uint64_t bytes = clip_range(range, w, share.runs);
    share.bytes += bytes;
    covered += bytes;
  }
  if (covered == entry.bytes) return Status::Ok();
  return InvalidArgument("the transfer plan's runs of tensor " + tensor_name(transfer, entry.tensor) +
                         " into engine rank " + std::to_string(e) + " cover " + std::to_string(covered) + " of the " +
                         std::to_string(entry.bytes) + " bytes [" + std::to_string(w.lo) + ", " +
                         std::to_string(w.hi) + ") of its local shard that bucket " + std::to_string(j) + " holds");
}

}  // namespace

std::vector<int> BucketFeed::trainer_ranks() const {
  std::vector<int> out;
  for (const std::vector<BucketShare>& bucket : shares) {
    for (const BucketShare& s : bucket) out.push_back(s.trainer_rank);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

const BucketShare* BucketFeed::share(std::uint64_t j, int trainer_rank) const {
  if (j >= shares.size()) return nullptr;
  for (const BucketShare& s : shares[j]) {
    if (s.trainer_rank == trainer_rank) return &s;
  }
  return nullptr;
}

StatusOr<BucketFeed> make_bucket_feed(const TransferPlan& transfer, int engine_rank, const Plan& plan) {
  RETURN_IF_ERROR(check_engine_rank(transfer, engine_rank));
  RETURN_IF_ERROR(check_stream(transfer, engine_rank, plan));
  ASSIGN_OR_RETURN(const RunIndex index, index_runs(transfer, engine_rank));
  BucketFeed feed{engine_rank, {}};
  feed.shares.reserve(plan.buckets.size());
  ShareBuilder builder(transfer.trainer_ranks);
  for (std::uint64_t j = 0; j < plan.buckets.size(); ++j) {
    for (const PlanEntry& entry : plan.buckets[j].entries) {
      RETURN_IF_ERROR(feed_entry(transfer, index, engine_rank, j, entry, builder));
    }
    feed.shares.push_back(builder.take());
  }
  return feed;
}

BucketFeed deal_whole_buckets(BucketFeed feed, const std::vector<int>& feeders) {
  assert(!feeders.empty());
  for (std::size_t j = 0; j < feed.shares.size(); ++j) {
    assert(feed.shares[j].size() <= 1);
    for (BucketShare& s : feed.shares[j]) s.trainer_rank = feeders[j % feeders.size()];
  }
  return feed;
}

}  // namespace refit
