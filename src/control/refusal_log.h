// RefusalLog: lines about refused connections (the coordinator's join gate,
// an engine rank's data port), at most one per cause per second.
//
// A flood of hostile connections (idle ones, a slowloris loop reopening
// them) would otherwise write a line per connection: 10,900 lines in 30 s
// were seen. A cause is the refusal's reason with the peer's address left
// out and every digit masked ("timed out after 5004ms waiting for a frame
// from A" and "... 5003ms ..." are one cause; a wrong secret and a
// malformed join are two). The first refusal of a cause is logged at once;
// the next ones within a second are counted, and the count is logged with
// the last one's reason when the second is over (at the next refusal of
// that cause or the next flush(), whichever comes first):
//   "refused a connection from A: <why>"
//   "refused 412 more connections in the last 1.0 s for the same reason; the last from A: <why>"
// ("a data connection", "data connections" where `what` says so).
// Reasons can quote a peer's bytes, so at most kMaxRefusalCauses causes are
// told apart per period; the others share one count.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace refit {

inline constexpr std::size_t kMaxRefusalCauses = 64;

class RefusalLog {
 public:
  // `source` is who speaks in refit::log ("refit coordinator", "engine
  // rank 0"); `what` is what was refused ("connection", "data connection").
  explicit RefusalLog(std::string source, std::chrono::milliseconds period = std::chrono::seconds(1),
                      std::string what = "connection")
      : source_(std::move(source)), period_(period), what_(std::move(what)) {}
  ~RefusalLog() { flush(/*all=*/true); }
  RefusalLog(const RefusalLog&) = delete;
  RefusalLog& operator=(const RefusalLog&) = delete;

  // One refused connection: from `peer` (its address), and why.
  void refused(const std::string& peer, const std::string& why);
  // Logs the counts of causes whose second is over (all: every count), and
  // forgets causes that were quiet for a whole period.
  void flush(bool all = false);

 private:
  struct PerCause {
    std::chrono::steady_clock::time_point last_logged{};
    std::uint64_t unlogged = 0;  // refused since then, not logged
    std::string last;            // the latest of those: "A: <why>"
  };
  void log_count(PerCause& c, std::chrono::steady_clock::time_point now);

  const std::string source_;
  const std::chrono::milliseconds period_;
  const std::string what_;
  std::mutex mu_;
  std::unordered_map<std::string, PerCause> causes_;
};

// The cause of a refusal: `why` without `peer`, digits masked as '#'.
std::string refusal_cause(const std::string& peer, const std::string& why);

}  // namespace refit
