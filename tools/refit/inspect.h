// `refit inspect PATH`: what a checkpoint holds and how refit would move it.
//
// Prints every tensor (name, dtype, shape, bytes, TP shard rule), the totals
// (per dtype and overall), and for each engine rank of an engine with
// --engine-ranks TP ranks the bucket plan of its stream (make_plan on
// engine_stream(model, rank, ranks) at --bucket-size): buckets, bytes,
// chunked tensors, digest, and with --buckets every bucket. --json prints
// the same as one JSON object.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "refit/status.h"

namespace refit {

struct InspectOptions {
  std::string path;                      // a .safetensors file, a checkpoint directory, or its index
  int engine_ranks = 1;
  std::uint64_t bucket_size = 4ull << 20;
  std::vector<std::string> shard_rules;  // "GLOB=RULE" rows placed before the default table
  bool json = false;
  bool buckets = false;                  // text: list every bucket of every rank
};

// The report (see README for the fields); an error names the file, tensor
// and broken rule, or the plan setting.
StatusOr<nlohmann::json> inspect_report(const InspectOptions& options);

// Prints the report (text or JSON) on stdout; returns the exit status:
// 0, or 1 with the error on stderr.
int run_inspect(const InspectOptions& options);

}  // namespace refit
