// Runs fn(i) for i in [0, n) over at most `max_threads` host threads (the
// calling thread among them, and never more than the machine's cores or
// n), each thread taking every threads-th index; a thread stops at its
// first error, and the first error by thread order is returned once all
// joined. For the CPU quantization passes (runtime/quantized_source.cc,
// runtime/quantized_shards.cc), whose items are independent tensors.
//
// Thread safety: fn must be safe to call concurrently for distinct i.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "refit/status.h"

namespace refit {

inline Status parallel_for(std::size_t n, unsigned max_threads, const std::function<Status(std::size_t)>& fn) {
  const unsigned cores = std::max(std::thread::hardware_concurrency(), 2u);
  const auto threads = static_cast<unsigned>(std::min<std::size_t>({max_threads, cores, n}));
  std::vector<Status> results(std::max(threads, 1u));
  auto work = [&](unsigned t) {
    for (std::size_t i = t; i < n && results[t].ok(); i += threads) results[t] = fn(i);
  };
  std::vector<std::thread> workers;
  for (unsigned t = 1; t < threads; ++t) workers.emplace_back(work, t);
  if (threads > 0) work(0);
  for (auto& w : workers) w.join();
  for (const Status& s : results) RETURN_IF_ERROR(s);
  return Status::Ok();
}

}  // namespace refit
