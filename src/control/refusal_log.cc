#include "control/refusal_log.h"

#include <cstdio>

#include "refit/log.h"

namespace refit {

std::string refusal_cause(const std::string& peer, const std::string& why) {
  std::string cause = why;
  if (!peer.empty()) {
    for (std::size_t at = cause.find(peer); at != std::string::npos; at = cause.find(peer, at + 1)) {
      cause.replace(at, peer.size(), "A");
    }
  }
  for (char& c : cause) {
    if (c >= '0' && c <= '9') c = '#';
  }
  return cause;
}

void RefusalLog::refused(const std::string& peer, const std::string& why) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  std::string key = refusal_cause(peer, why);
  if (causes_.size() >= kMaxRefusalCauses && !causes_.contains(key)) key = "(too many different reasons)";
  auto [it, fresh] = causes_.try_emplace(std::move(key));
  PerCause& c = it->second;
  if (!fresh && now - c.last_logged < period_) {
    ++c.unlogged;
    c.last = peer + ": " + why;
    return;
  }
  if (c.unlogged > 0) log_count(c, now);
  c.last_logged = now;
  log(LogLevel::kWarning, source_, "refused a " + what_ + " from " + peer + ": " + why);
}

void RefusalLog::flush(bool all) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = causes_.begin(); it != causes_.end();) {
    PerCause& c = it->second;
    const bool over = now - c.last_logged >= period_;
    if (c.unlogged > 0 && (all || over)) {
      log_count(c, now);
    } else if (over) {
      it = causes_.erase(it);  // quiet for a period: its next refusal is logged at once
      continue;
    }
    ++it;
  }
}

void RefusalLog::log_count(PerCause& c, std::chrono::steady_clock::time_point now) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", std::chrono::duration<double>(now - c.last_logged).count());
  log(LogLevel::kWarning, source_,
      "refused " + std::to_string(c.unlogged) + " more " + what_ + (c.unlogged == 1 ? "" : "s") + " in the last " +
          seconds + " s for the same reason; the last from " + c.last);
  c.unlogged = 0;
  c.last.clear();
  c.last_logged = now;
}

}  // namespace refit
