// Batches: what a receiver yields and what an engine applies.
//
// A Batch is the list of complete tensors a receiver yields after a bucket
// lands, in stream order: views into a staging slot or a reassembly buffer,
// valid as the source's lifetime contract says.
//
// An AlignedBatch is what the Engine contract (engine.h) receives: the
// per-rank batches of one engine cut so that every rank holds the same
// names, in the same order, with the same dtypes (shapes may differ: they
// are shards). Its views are valid until the engine returns from apply().
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "refit/dtype.h"
#include "refit/tensor.h"

namespace refit {

struct Batch {
  std::uint64_t sequence = 0;        // 0, 1, 2 ... within one refit
  std::uint64_t bucket = 0;          // index of the bucket that completed it
  std::vector<TensorView> tensors;   // stream order
};

struct AlignedBatch {
  std::uint64_t sequence = 0;
  // One entry per tensor name, stream order.
  std::vector<const TensorSpec*> specs;  // rank 0's specs (names/dtypes are common; shapes are rank 0's)
  // payload[r][i]: rank r's view of tensor i. payload.size() == number of ranks,
  // index r == engine TP rank r (DESIGN.md rule 8).
  std::vector<std::vector<TensorView>> payload;

  struct DTypeGroup {
    DType dtype;
    std::vector<std::size_t> indices;  // into specs, stream order
  };
  // Tensors grouped by dtype, groups in order of first appearance: one engine
  // post per group (DESIGN.md rule 5).
  std::vector<DTypeGroup> groups() const;
  std::size_t size() const { return specs.size(); }
};

}  // namespace refit
