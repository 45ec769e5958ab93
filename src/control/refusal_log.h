// RefusalLog: the coordinator's lines about refused connections, at most one
// per cause per second.
//
// A flood of hostile connections (idle ones, a slowloris loop reopening
// them) would otherwise write a line per connection: 10,900 lines in 30 s
// were seen. The first refusal of a cause is logged at once; the next ones
// within a second are counted, and the count is logged with the last one's
// line when the second is over (at the next refusal of that cause or the
// next flush(), whichever comes first):
//   "refused a connection from A: <why>"
//   "refused 412 more connections in the last 1.0 s (handshake timed out); the last from A: <why>"
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace refit {

enum class RefusalCause {
  kEvicted,         // an unauthenticated connection dropped to make room for a newer one
  kTimedOut,        // no authentication, or no join, within the handshake deadline
  kAuthentication,  // a wrong or missing secret, a malformed handshake, a peer that left
  kJoin,            // authenticated, but its first message is not a valid join
};
inline constexpr int kRefusalCauses = 4;

// "evicted to make room", "handshake timed out", ... (used in the counts).
std::string_view refusal_cause_name(RefusalCause cause);

class RefusalLog {
 public:
  // `source` is who speaks in refit::log ("refit coordinator").
  explicit RefusalLog(std::string source, std::chrono::milliseconds period = std::chrono::seconds(1))
      : source_(std::move(source)), period_(period) {}
  ~RefusalLog() { flush(/*all=*/true); }
  RefusalLog(const RefusalLog&) = delete;
  RefusalLog& operator=(const RefusalLog&) = delete;

  // One refused connection: from `peer` (its address), and why.
  void refused(RefusalCause cause, const std::string& peer, const std::string& why);
  // Logs the counts of causes whose second is over (all: every count).
  void flush(bool all = false);

 private:
  struct PerCause {
    bool ever_logged = false;
    std::chrono::steady_clock::time_point last_logged{};
    std::uint64_t unlogged = 0;  // refused since then, not logged
    std::string last;            // the latest of those: "A: <why>"
  };
  void log_count(RefusalCause cause, PerCause& c, std::chrono::steady_clock::time_point now);

  const std::string source_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::array<PerCause, kRefusalCauses> causes_{};
};

}  // namespace refit
