// Engine: the contract between refit and an inference server.
//
// Per refit, in this order:
//   begin(version)               once
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
// Thread safety: one thread drives an engine.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "refit/aligner.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

class Engine {
 public:
  virtual ~Engine() = default;
  virtual Status begin(std::uint64_t version) = 0;
  virtual Status apply(const AlignedBatch& batch) = 0;
  virtual Status commit(std::uint64_t version) = 0;
  virtual void abort(std::uint64_t version, const Status& why) = 0;
  // The last committed weight version (0 before the first refit).
  virtual std::uint64_t weight_version() const = 0;
  // False after an aborted refit until the next commit.
  virtual bool weights_complete() const = 0;
};

struct ReferenceEngineStats {
  std::uint64_t begins = 0;
  std::uint64_t posts = 0;           // one per dtype group per apply
  std::uint64_t cache_flushes = 0;   // one per commit
  std::uint64_t tensors_applied = 0; // per local rank, summed
  std::uint64_t bytes_applied = 0;
};

// An embedded engine that behaves like a server: it allocates its weights once
// (one buffer per tensor per local rank) and copies each applied batch into
// them. It can host every rank of an engine (one process per engine) or a
// subset (one process per engine rank): payloads of ranks it does not host are
// skipped and must have data == nullptr.
//
// Checks on every apply, each failing with kFailedPrecondition naming the
// tensor and rank: a post holds one dtype; payload[r]'s name equals the
// name at that position; its shape equals rank r's own parameter shape; a
// hosted rank's payload has bytes.
class ReferenceEngine : public Engine {
 public:
  // streams[r] = rank r's specs (all ranks of the engine, in TP order);
  // `hosted` = the ranks whose weights live in this process.
  ReferenceEngine(std::vector<std::vector<TensorSpec>> streams, std::vector<int> hosted);

  Status begin(std::uint64_t version) override;
  Status apply(const AlignedBatch& batch) override;
  Status commit(std::uint64_t version) override;
  void abort(std::uint64_t version, const Status& why) override;
  std::uint64_t weight_version() const override { return version_; }
  bool weights_complete() const override { return complete_; }

  // The bytes of `name` on hosted rank `rank`, or nullptr.
  const std::byte* weight(int rank, const std::string& name) const;
  std::byte* mutable_weight(int rank, const std::string& name);
  const std::vector<TensorSpec>& stream(int rank) const { return streams_.at(rank); }
  const std::vector<int>& hosted() const { return hosted_; }
  const ReferenceEngineStats& stats() const { return stats_; }

 private:
  std::vector<std::vector<TensorSpec>> streams_;
  std::vector<int> hosted_;
  // weights_[r][name] for hosted ranks.
  std::vector<std::map<std::string, std::vector<std::byte>>> weights_;
  std::vector<std::map<std::string, const TensorSpec*>> shapes_;
  std::uint64_t version_ = 0;
  std::uint64_t pending_version_ = 0;
  bool in_refit_ = false;
  bool complete_ = true;
  ReferenceEngineStats stats_;
};

}  // namespace refit
