// Partial refits (issue 22 item 4): a refit of a named subset of an engine
// rank's stream, and the plan it moves by. Not wired into a refit yet: the
// protocol, the ranks and the verification are designed in
// docs/notes/partial_refits.md; this is its first step, the selection and
// the plan, which trainer and engine ranks compute apart from the same
// full plan and the same globs (so their digests agree).
#pragma once

#include <string>
#include <vector>

#include "refit/plan.h"
#include "refit/status.h"

namespace refit {

// What one refit moves: whole-name globs ('*' only; refit/checkpoint.h
// glob_match), sorted, without duplicates; empty: every tensor.
struct RefitScope {
  std::vector<std::string> only;
  bool full() const { return only.empty(); }
};

// `globs` sorted, duplicates removed. kInvalidArgument for an empty glob.
StatusOr<RefitScope> canonical_scope(std::vector<std::string> globs);

// Which tensors of `specs` the scope selects (all for a full scope).
// kInvalidArgument naming a glob that selects nothing: a misspelt subset
// must not refit nothing and call it done.
StatusOr<std::vector<bool>> select_tensors(const RefitScope& scope, const std::vector<TensorSpec>& specs);

// The plan of a partial refit: `full`'s specs unchanged (every
// PlanEntry::tensor still indexes the full stream, so sources, arena
// offsets and the engine's names keep working), buckets over the selected
// tensors only, laid out by make_plan's rules (chunks of full.bucket_size)
// but closed at pool_slot_bytes(full), so that every bucket fits the
// engine's receive slots. total_bytes and largest_chunked_tensor count the
// selected tensors; the digest covers the layout. Every tensor selected:
// `full` itself. kInvalidArgument when `selected` has another size or
// selects nothing.
StatusOr<Plan> make_subset_plan(const Plan& full, const std::vector<bool>& selected);

}  // namespace refit
