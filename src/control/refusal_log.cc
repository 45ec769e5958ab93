#include "control/refusal_log.h"

#include <cstdio>

#include "refit/log.h"

namespace refit {

std::string_view refusal_cause_name(RefusalCause cause) {
  switch (cause) {
    case RefusalCause::kEvicted: return "unauthenticated, evicted to make room for newer connections";
    case RefusalCause::kTimedOut: return "handshake timed out";
    case RefusalCause::kAuthentication: return "authentication failed";
    case RefusalCause::kJoin: return "invalid join";
  }
  return "unknown";
}

void RefusalLog::refused(RefusalCause cause, const std::string& peer, const std::string& why) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  PerCause& c = causes_[static_cast<int>(cause)];
  if (c.ever_logged && now - c.last_logged < period_) {
    ++c.unlogged;
    c.last = peer + ": " + why;
    return;
  }
  if (c.unlogged > 0) log_count(cause, c, now);
  c.ever_logged = true;
  c.last_logged = now;
  log(LogLevel::kWarning, source_, "refused a connection from " + peer + ": " + why);
}

void RefusalLog::flush(bool all) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < kRefusalCauses; ++i) {
    PerCause& c = causes_[i];
    if (c.unlogged > 0 && (all || now - c.last_logged >= period_)) log_count(static_cast<RefusalCause>(i), c, now);
  }
}

void RefusalLog::log_count(RefusalCause cause, PerCause& c, std::chrono::steady_clock::time_point now) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f",
                std::chrono::duration<double>(now - c.last_logged).count());
  log(LogLevel::kWarning, source_,
      "refused " + std::to_string(c.unlogged) + " more connection" + (c.unlogged == 1 ? "" : "s") + " in the last " +
          seconds + " s (" + std::string(refusal_cause_name(cause)) + "); the last from " + c.last);
  c.unlogged = 0;
  c.last.clear();
  c.last_logged = now;
}

}  // namespace refit
