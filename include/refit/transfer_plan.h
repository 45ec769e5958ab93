// The transfer plan: which bytes move from each trainer rank's shards into
// each engine rank's shards, when both sides hold tensors split by layouts.
//
// make_transfer_plan is a pure function of (tensors with their full specs and
// both sides' layouts, trainer ranks M, engine ranks N, options): both sides
// hold the same tensors. make_mapped_transfer_plan (mapped_transfer_plan.h)
// plans between two different tensor lists joined by correspondences (a
// Megatron trainer into a Hugging Face or vLLM engine). Both sides compute
// the plan at setup and compare digests, like the bucket plan's (plan.h).
//
// Rules it keeps:
//   * Every byte an engine rank's box holds comes from exactly one trainer
//     rank whose box holds it; nothing reaches an engine rank twice; a trainer
//     rank reads only its own local shard (it never materialises a tensor it
//     does not hold).
//   * Where several trainer ranks hold the same bytes (replicated levels), the
//     piece an engine rank needs from them is cut along its first dimension of
//     extent > 1 into up to one part per holder (parts of at least
//     min_split_bytes), and each part goes to the holder that has sent the
//     fewest bytes so far (lowest rank on a tie), in the order tensor, engine
//     rank, trainer box. Deterministic.
//   * M and N are independent (M < N, M = N, M > N).
//
// Offsets are into local shards: a rank's shard of a tensor is the C-order
// bytes of its box (layout.h). A box is flattened into strided runs of
// contiguous pieces, each piece maximal: no two pieces in a row continue each
// other on both the source and the destination side (they would be one).
//
// Thread safety: a TransferPlan is immutable once made.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "refit/correspondence.h"
#include "refit/layout.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

// One tensor of the model: its full spec and how each side splits it.
struct TensorLayouts {
  TensorSpec spec;  // full, unsharded
  Layout trainer;   // over the M trainer ranks
  Layout engine;    // over the N engine ranks
};

// One side's tensor: its full spec and how that side's ranks split it.
struct SideTensor {
  TensorSpec spec;  // full, unsharded
  Layout layout;    // over that side's ranks
  friend bool operator==(const SideTensor&, const SideTensor&) = default;
};

struct TransferPlanOptions {
  // A piece held by several trainer ranks is cut into parts of at least this
  // many bytes before the parts are dealt to the holders. 0 or 1: cut into
  // one part per holder whenever the piece has enough rows.
  // Default: 1 MiB.
  std::uint64_t min_split_bytes = 1ull << 20;
};

// A strided run: for i in 0..count-1, bytes [src_offset + i * src_stride,
// + bytes) of the trainer rank's local shard of trainer tensor `src_tensor`
// land at [dst_offset + i * dst_stride, + bytes) of the engine rank's local
// shard of engine tensor `tensor`.
// count == 1 is one contiguous run (both strides 0). A 2-D box is one
// strided run (one contiguous piece per row); a row-by-row list would be
// millions of entries for a MoE model's row-split experts.
struct TransferRun {
  std::uint32_t tensor = 0;  // index into TransferPlan::engine_tensors
  std::uint64_t src_offset = 0;
  std::uint64_t dst_offset = 0;
  std::uint64_t bytes = 0;   // of one contiguous piece, > 0
  std::uint64_t count = 1;   // contiguous pieces, >= 1
  std::uint64_t src_stride = 0;
  std::uint64_t dst_stride = 0;
  // Index into TransferPlan::trainer_tensors; equal to `tensor` in a plan of
  // make_transfer_plan. Last: an initializer of the fields above reads as
  // before, and leaves it 0.
  std::uint32_t src_tensor = 0;

  std::uint64_t total_bytes() const { return bytes * count; }
  friend bool operator==(const TransferRun&, const TransferRun&) = default;
};

// The contiguous pieces of `run` in order, each as a run of count 1.
std::vector<TransferRun> contiguous_pieces(const TransferRun& run);

// Everything one trainer rank sends one engine rank, ordered by (engine)
// tensor, then by dst_offset; expanded into contiguous pieces, the dst
// offsets increase.
struct TransferPair {
  int trainer_rank = 0;
  int engine_rank = 0;
  std::vector<TransferRun> runs;
  std::uint64_t bytes = 0;  // sum of runs' total_bytes()
};

struct TransferPlan {
  // The trainer's tensors (TransferRun::src_tensor indexes them) and the
  // engine's (TransferRun::tensor; an engine rank's stream holds its shards
  // of them in this order). make_transfer_plan: the same specs on both sides.
  std::vector<SideTensor> trainer_tensors;
  std::vector<SideTensor> engine_tensors;
  // make_mapped_transfer_plan's, in plan order (engine tensor, then the
  // engine box's position); empty in a plan of make_transfer_plan.
  std::vector<Correspondence> correspondences;
  int trainer_ranks = 0;  // M
  int engine_ranks = 0;   // N
  TransferPlanOptions options;
  std::vector<TransferPair> pairs;  // all M * N pairs, pair (t, e) at t * N + e
  std::uint64_t total_bytes = 0;    // bytes every engine rank receives, summed
  std::uint64_t digest = 0;         // xxh64 of a canonical encoding of all of the above

  // REQUIRES: 0 <= t < M, 0 <= e < N.
  const TransferPair& pair(int t, int e) const { return pairs[static_cast<std::size_t>(t * engine_ranks + e)]; }
  // Bytes each trainer rank sends, indexed by trainer rank.
  std::vector<std::uint64_t> bytes_per_trainer_rank() const;
  // Hex form of the digest, 16 digits.
  std::string digest_hex() const;
};

// Builds the plan. Errors (kInvalidArgument, naming the tensor and the value):
// no tensors, M or N below 1, an invalid spec, a duplicate name, a layout
// whose rank count is not M (trainer) or N (engine), a layout the tensor does
// not fit (layout_box's errors: they name the rank and the level).
StatusOr<TransferPlan> make_transfer_plan(std::vector<TensorLayouts> tensors, int trainer_ranks, int engine_ranks,
                                          TransferPlanOptions options = {});

// One tensor's bytes in a pair stream: `spec` (the tensor's name and dtype,
// shape {elements moved}) is the entry a bucket plan cuts; its bytes are the
// source bytes of the runs' contiguous pieces concatenated in order, and
// each piece lands at its destination offset.
struct PairStreamEntry {
  TensorSpec spec;
  std::vector<TransferRun> runs;
};

// What one trainer rank sends one engine rank, as a stream for make_plan.
struct PairStream {
  int trainer_rank = 0;
  int engine_rank = 0;
  std::vector<PairStreamEntry> entries;  // in tensor order, one per tensor that moves

  // The entries' specs in order: the input of make_plan (plan.h).
  std::vector<TensorSpec> specs() const;
};

// The non-empty pairs of `plan` as streams, ordered by (trainer, engine).
std::vector<PairStream> pair_streams(const TransferPlan& plan);

}  // namespace refit
