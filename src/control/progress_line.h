// The coordinator's progress line on a terminal (CoordinatorOptions::
// progress), redrawn in place through refit::log (LogLevel::kProgress):
// setup longer than a second ("setup: 3 of 4 ranks joined, 2.1 s", then
// "every rank joined, linking data paths"), and each refit's bar
// ("refit 2/3 [#####     ] 50% 8.03 GiB 312.45 GB/s").
//
// Thread safety: none; the coordinator's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "control/refit_phases.h"

namespace refit {

class ProgressLine {
 public:
  // `enabled`: draw at all; `refits`: the job's count (0: on demand).
  ProgressLine(bool enabled, int refits) : enabled_(enabled), refits_(refits) {}

  // Setup, once it has taken a second: where it is, every 200 ms.
  void setup(const std::string& where);
  // Setup is over: "setup: done in 2.3 s" if anything was drawn.
  void setup_done();
  // Refit `go` went out: the bar's clock starts.
  void go() { go_time_ = Clock::now(); }
  // A refit's bar, at most every 100 ms (the final one always).
  void refit(const ShowProgress& progress, std::uint64_t bytes_per_refit);
  // Before any other line: ends a setup line drawn in place.
  void break_line();

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  int refits_;
  bool drawn_ = false;  // a setup line is on screen, without its newline
  Clock::time_point started_ = Clock::now(), go_time_{}, last_draw_{};
};

}  // namespace refit
