// The reader threads of --readers: see weight_readers.h.
#include "runtime/weight_readers.h"

#include <mutex>

namespace refit {

WeightReaders::WeightReaders(const ReferenceEngine& engine, int readers, std::size_t tensors, Check check)
    : engine_(engine), tensors_(tensors), check_(std::move(check)) {
  if (tensors_ == 0) return;
  for (int k = 0; k < readers; ++k) threads_.emplace_back([this, k] { run(k); });
}

WeightReaders::~WeightReaders() {
  stop_ = true;
  for (std::thread& t : threads_) t.join();
}

void WeightReaders::run(int reader) {
  std::size_t index = static_cast<std::size_t>(reader) * 7919 % tensors_;
  while (!stop_.load(std::memory_order_relaxed)) {
    Status failed;
    engine_.read_active([&](std::uint64_t version) {
      passes_.fetch_add(1, std::memory_order_relaxed);
      if (version == 0) return;  // nothing served yet
      StatusOr<bool> whole = check_(index, version);
      if (!whole.ok()) {
        failed = whole.status();
        return;
      }
      reads_.fetch_add(1, std::memory_order_relaxed);
      if (!*whole) torn_.fetch_add(1, std::memory_order_relaxed);
    });
    if (!failed.ok()) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (error_.ok()) error_ = failed;
      return;
    }
    index = (index + 1) % tensors_;
    // Between passes, as a server between forward passes: let the refit's
    // flip (and, with live weights, its batches) in.
    std::this_thread::yield();
  }
}

ReadCounts WeightReaders::counts() const {
  return ReadCounts{reads_.load(std::memory_order_relaxed), torn_.load(std::memory_order_relaxed)};
}

Status WeightReaders::error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return error_;
}

}  // namespace refit
