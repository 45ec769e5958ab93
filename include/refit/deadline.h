// Deadlines: every wait in refit takes one (DESIGN.md: "deadlines on every
// wait"). A Deadline is a point on the steady clock; Deadline::Never() exists
// for tests and for waits that are bounded by something else.
#pragma once

#include <chrono>
#include <cstdint>

namespace refit {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  static Deadline After(std::chrono::milliseconds d) { return Deadline(Clock::now() + d); }
  static Deadline AfterSeconds(double s) {
    return Deadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)));
  }
  static Deadline Never() { return Deadline(Clock::time_point::max()); }

  bool expired() const { return Clock::now() >= at_; }
  bool is_never() const { return at_ == Clock::time_point::max(); }
  Clock::time_point at() const { return at_; }
  // Milliseconds left, clamped to [0, INT32_MAX]; for poll(2).
  int remaining_ms() const;
  // The earlier of two deadlines.
  Deadline min(Deadline other) const { return at_ < other.at_ ? *this : other; }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

inline int Deadline::remaining_ms() const {
  if (is_never()) return INT32_MAX;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
  if (left <= 0) return 0;
  if (left > INT32_MAX) return INT32_MAX;
  return static_cast<int>(left);
}

}  // namespace refit
