// EventPool: completion events of one device kept for reuse, so that a
// submit creates an event only when no completed one is free (creating one
// costs a driver call; a refit submits thousands of writes).
//
// Not thread-safe: one thread at a time, like the RemoteTarget that owns it.
#pragma once

#include <utility>
#include <vector>

#include "cuda/device.h"
#include "refit/status.h"

namespace refit {

class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}

  // A free event, or a new one of the pool's device.
  StatusOr<CudaEvent> take() {
    if (free_.empty()) return CudaEvent::Create(device_);
    CudaEvent event = std::move(free_.back());
    free_.pop_back();
    return event;
  }
  // REQUIRES: the work `event` captured has finished (or it was never
  // recorded): the next take() may record it again.
  void give_back(CudaEvent event) { free_.push_back(std::move(event)); }
  void clear() { free_.clear(); }

 private:
  int device_;
  std::vector<CudaEvent> free_;
};

}  // namespace refit
