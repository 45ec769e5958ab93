// WeightReaders: threads that stand in for a server's forward passes while
// refits arrive (`--readers N`, issue 21), to prove that they never read a
// mixture of versions. Each reader, over and over, enters the engine's
// read_active() (one "forward pass": no flip can happen inside it), takes
// the committed version v and checks one tensor of the served weights
// (round robin, each reader from its own start) against v's content: a read
// whose tensor is not v's is torn. Passes before the first commit (nothing
// served yet) are not counted.
//
// With shadow weights every read is whole; with live weights a pass between
// two batches of a staged refit sees tensors of the next version under the
// committed one's number and counts as torn.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "refit/engine_rank.h"
#include "refit/reference_engine.h"
#include "refit/status.h"

namespace refit {

class WeightReaders {
 public:
  // Whether tensor `index` as served holds `version`'s bytes (called inside
  // read_active); an error stops that reader and is kept for error().
  using Check = std::function<StatusOr<bool>(std::size_t index, std::uint64_t version)>;

  // Starts `readers` threads over `engine`'s `tensors` tensors. `engine`
  // must outlive this object.
  WeightReaders(const ReferenceEngine& engine, int readers, std::size_t tensors, Check check);
  // Stops and joins every reader.
  ~WeightReaders();
  WeightReaders(const WeightReaders&) = delete;
  WeightReaders& operator=(const WeightReaders&) = delete;

  // The counts so far. Thread-safe.
  ReadCounts counts() const;
  // Every pass so far, counted as a read or not (before the first commit).
  std::uint64_t passes() const { return passes_.load(std::memory_order_relaxed); }
  // The first error a reader met (it then stopped), or OK.
  Status error() const;

 private:
  void run(int reader);

  const ReferenceEngine& engine_;
  const std::size_t tensors_;
  const Check check_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> passes_{0}, reads_{0}, torn_{0};
  mutable std::mutex error_mu_;
  Status error_;
  std::vector<std::thread> threads_;
};

}  // namespace refit
