#include "control/progress_line.h"

#include <algorithm>
#include <cstdio>

#include "refit/format.h"
#include "refit/log.h"
#include "refit/plan.h"

namespace refit {
namespace {
constexpr const char* kSource = "refit coordinator";
}  // namespace

void ProgressLine::setup(const std::string& where) {
  const auto now = Clock::now();
  if (!enabled_ || now - started_ < std::chrono::seconds(1) || now - last_draw_ < std::chrono::milliseconds(200)) {
    return;
  }
  last_draw_ = now;
  drawn_ = true;
  log(LogLevel::kProgress, kSource,
      "\rsetup: " + where + ", " + format_seconds(std::chrono::duration<double>(now - started_).count()) + "        ");
}

void ProgressLine::setup_done() {
  if (!drawn_) return;
  drawn_ = false;
  log(LogLevel::kProgress, kSource,
      "\rsetup: done in " + format_seconds(std::chrono::duration<double>(Clock::now() - started_).count()) +
          "                                        \n");
}

void ProgressLine::break_line() {
  if (!drawn_) return;
  drawn_ = false;
  log(LogLevel::kProgress, kSource, "\n");
}

void ProgressLine::refit(const ShowProgress& progress, std::uint64_t total) {
  if (!enabled_) return;
  const auto now = Clock::now();
  if (!progress.final && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const std::uint64_t sent = progress.final ? total : progress.bytes;
  const double frac = total ? std::min(1.0, static_cast<double>(sent) / static_cast<double>(total)) : 1.0;
  const double secs = std::chrono::duration<double>(now - go_time_).count();
  const int width = 30, filled = static_cast<int>(frac * width);
  char line[256];
  std::snprintf(line, sizeof line, "\rrefit %llu%s [%s%s] %3d%% %s %.2f GB/s%s",
                static_cast<unsigned long long>(progress.version),
                refits_ > 0 ? ("/" + std::to_string(refits_)).c_str() : "",
                std::string(static_cast<std::size_t>(filled), '#').c_str(),
                std::string(static_cast<std::size_t>(width - filled), ' ').c_str(), static_cast<int>(frac * 100),
                format_bytes(sent).c_str(), secs > 0 ? static_cast<double>(sent) / secs / 1e9 : 0.0,
                progress.final ? "\n" : "");
  log(LogLevel::kProgress, kSource, line);
}

}  // namespace refit
