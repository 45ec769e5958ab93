// Aligner: across the ranks of one engine, cuts the per-rank batches into
// aligned batches in which every rank holds the same names, in the same order,
// with the same dtypes (shapes may differ: they are shards).
//
// Ranks' streams may be cut at different boundaries (uneven shards give
// different bucket layouts); the aligner yields the common prefix of what
// every rank has received. It pulls a new batch from a rank only when that
// rank's queue is empty (DESIGN.md rule 3), so the consumer holds at most one
// batch per rank while the transport fills the other slot.
//
// Loud errors (DESIGN.md rule 4), all kFailedPrecondition, naming ranks,
// positions and tensors: different names at the same position, different
// dtypes for one name, streams that end at different points. No path spins:
// every step either yields at least one tensor, ends, or fails.
//
// Lifetime: the views of an aligned batch are valid until the next call of
// next() (they come from batches the sources still hold).
// Thread safety: one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "batch/batch_source.h"
#include "refit/batch.h"
#include "refit/status.h"

namespace refit {

class Aligner {
 public:
  // `ranks[r]` feeds engine TP rank r; sources must outlive the aligner and
  // ranks[r]->rank() must equal r (checked: kInvalidArgument otherwise).
  static StatusOr<Aligner> Create(std::vector<BatchSource*> ranks);

  // The next aligned batch, std::nullopt when every stream ended together.
  StatusOr<std::optional<AlignedBatch>> next(Deadline deadline);

  // Pulls issued so far per rank (for tests of the "only advances an empty
  // rank" rule).
  const std::vector<std::uint64_t>& pulls() const { return pulls_; }

 private:
  explicit Aligner(std::vector<BatchSource*> ranks);
  // next()'s steps, in order.
  // Pulls one batch from each rank whose queue is empty and has not ended
  // (DESIGN.md rule 3), appending its views to the rank's queue.
  Status pull(Deadline deadline);
  // True when every rank has ended (queue empty after pull); an error when
  // some ended while others still hold tensors.
  StatusOr<bool> ended_together() const;
  // The length of the prefix every queue holds, after checking each of its
  // tensors has rank 0's name and dtype on every rank.
  StatusOr<std::size_t> agreed_prefix() const;
  // Moves the first n views of every queue into the next aligned batch.
  AlignedBatch take(std::size_t n);
  std::vector<BatchSource*> ranks_;
  std::vector<std::deque<TensorView>> queues_;
  std::vector<bool> ended_;
  std::vector<std::uint64_t> pulls_;
  std::vector<std::uint64_t> yielded_;  // tensors yielded so far (position in stream)
  std::uint64_t sequence_ = 0;
};

// Runs the aligner over PlanReplay sources of `plans` (plans[r] = rank r) and
// returns the number of tensors of each aligned batch; fails with the same
// errors the runtime aligner would give. Used at setup.
StatusOr<std::vector<std::size_t>> aligned_schedule(const std::vector<const Plan*>& plans);

}  // namespace refit
