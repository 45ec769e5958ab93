// Where two ranks' views of one engine rank's stream part ways: the words a
// plan digest mismatch (DESIGN.md rule 1) is explained in. A digest says
// only that the two plans differ; the specs say which tensor, and how.
//
// Thread safety: a pure function.
#pragma once

#include <string>
#include <vector>

#include "refit/model.h"
#include "refit/tensor.h"

namespace refit {

// One side of the comparison: a rank's name ("trainer rank 1"), the stream
// of tensor specs it holds, in stream order, and the shard rule that cut
// each of them (Join::rules): null, empty or of another count than specs
// when the rank sent none.
struct NamedSpecs {
  std::string rank;
  const std::vector<TensorSpec>* specs = nullptr;
  const std::vector<ShardRule>* rules = nullptr;
};

// The first difference between the two streams, e.g.
//   "tensor 3 differs in dtype: trainer rank 1 has 'w' float32[4, 4],
//    engine rank 1 has 'w' bfloat16[4, 4]"
//   "trainer rank 1 has 2 tensors, engine rank 1 has 3: the first one more
//    is tensor 2 'layers.1.w' bfloat16[8] of engine rank 1"
// naming the index, every field that differs (name, dtype, shape) and the
// tensor on each side. When both sides sent rules, each tensor is shown
// with its rule and the rule is compared too:
//   "tensor 2 differs in rule: trainer rank 1 has 'w' bfloat16[4, 4] (rule
//    row), engine rank 1 has 'w' bfloat16[4, 4] (rule column)"
// "" when the streams (and the rules, when both sent them) are equal.
// REQUIRES: a.specs and b.specs are not null.
std::string first_spec_difference(const NamedSpecs& a, const NamedSpecs& b);

}  // namespace refit
