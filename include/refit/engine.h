// Engine: the contract between refit and an inference server.
//
// Per refit, in this order:
//   begin(version)               once (begin_partial for a partial refit)
//   apply(aligned batch)         once per aligned batch; the engine makes one
//                                post per dtype group (DESIGN.md rule 5);
//                                payload[r] goes to TP rank r (rule 8)
//   commit(version)              once, after the last batch, only when every
//                                rank of every engine succeeded; bumps the
//                                weight version (rule 6) and flushes the KV
//                                cache once (rule 9)
//   abort(version, why)          instead of commit when the refit failed: the
//                                version stays at the last committed one and
//                                the weights are reported incomplete
//
// A partial refit (refit/partial.h) moves only the tensors its scope
// selects: the batches carry those, and the others keep the bytes of the
// refit that last included them; commit(version) still bumps the version of
// the whole engine. begin_partial(version, scope) comes instead of begin():
// an engine whose weights are served while others land (shadow weights)
// must first make the tensors outside the scope whole where the refit
// lands. By default it refuses (kFailedPrecondition): an engine does not
// take partial refits unless it says so (takes_partial_refits).
//
// Between refits, in jobs that release refit's memory (CoordinatorOptions::
// release_between_refits): release_idle() after a commit, acquire_idle()
// before the next begin().
//
// Thread safety: one thread drives an engine.
#pragma once

#include <cstdint>
#include <string>

#include "refit/batch.h"
#include "refit/partial.h"
#include "refit/status.h"

namespace refit {

class Engine {
 public:
  virtual ~Engine() = default;
  virtual Status begin(std::uint64_t version) = 0;
  virtual Status begin_partial(std::uint64_t version, const RefitScope& scope) {
    (void)scope;
    return FailedPrecondition("this engine does not take partial refits (refit " + std::to_string(version) + ")");
  }
  // Whether begin_partial is implemented: the engine rank says so in its
  // join, and the coordinator refuses partial refits in a job with an engine
  // that does not (at setup, or the trainers' ask), naming it.
  virtual bool takes_partial_refits() const { return false; }
  virtual Status apply(const AlignedBatch& batch) = 0;
  virtual Status commit(std::uint64_t version) = 0;
  virtual void abort(std::uint64_t version, const Status& why) = 0;
  // The last committed weight version (0 before the first refit).
  virtual std::uint64_t weight_version() const = 0;
  // False after an aborted refit until the next commit.
  virtual bool weights_complete() const = 0;
  // Colocated jobs: frees memory the engine needs only during a refit (a
  // shadow arena not served) and returns its bytes; the served weights stay.
  // Default: nothing to free.
  virtual StatusOr<std::uint64_t> release_idle() { return std::uint64_t{0}; }
  // Takes what release_idle() freed again, before the next begin().
  virtual Status acquire_idle() { return Status::Ok(); }
};

}  // namespace refit
