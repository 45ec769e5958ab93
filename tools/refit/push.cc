#include "refit/push.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "refit/trainer_rank.h"

namespace refit {

int run_push(const PushOptions& options) {
  const int count = options.ranks < 0 ? options.rank.trainer_ranks - options.first_rank : options.ranks;
  if (count < 1 || options.first_rank < 0 || options.first_rank + count > options.rank.trainer_ranks) {
    std::fprintf(stderr, "refit push: error: ranks %d..%d are not inside 0..%d (--trainer-ranks %d)\n",
                 options.first_rank, options.first_rank + count - 1, options.rank.trainer_ranks - 1,
                 options.rank.trainer_ranks);
    return 2;
  }
  const auto started = std::chrono::steady_clock::now();
  std::mutex mu;
  std::vector<Status> results(static_cast<std::size_t>(count));
  std::vector<std::uint64_t> versions(static_cast<std::size_t>(count), 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      RankOptions o = options.rank;
      o.rank = options.first_rank + i;
      Status status = [&]() -> Status {
        auto source = make_rank_source(o);
        if (!source.ok()) return source.status().WithContext("trainer rank " + std::to_string(o.rank));
        ASSIGN_OR_RETURN(auto rank, TrainerRank::Join(o, std::move(*source)));
        if (rank->on_demand()) {
          for (int k = 0; k < std::max(options.repeat, 1); ++k) {
            Status refit = rank->refit(options.version + static_cast<std::uint64_t>(k));
            if (!refit.ok()) {
              // The job recovered (the engines keep their last version):
              // end it cleanly, then report the failure.
              if (rank->recovered()) (void)rank->finish();
              return refit;
            }
          }
          versions[static_cast<std::size_t>(i)] = rank->committed_version();
          return rank->finish();
        }
        RETURN_IF_ERROR(rank->serve());
        versions[static_cast<std::size_t>(i)] = rank->committed_version();
        return Status::Ok();
      }();
      std::lock_guard<std::mutex> lock(mu);
      results[static_cast<std::size_t>(i)] = status;
    });
  }
  for (auto& t : threads) t.join();
  int failed = 0;
  for (const Status& s : results) {
    if (!s.ok()) {
      std::fprintf(stderr, "refit push: error: %s\n", s.ToString().c_str());
      ++failed;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (failed > 0) return 1;
  std::fprintf(stderr, "refit push: %s committed as version %llu by %d trainer rank(s) in %.2f s\n",
               options.rank.model.c_str(), static_cast<unsigned long long>(versions[0]), count, seconds);
  return 0;
}

}  // namespace refit
