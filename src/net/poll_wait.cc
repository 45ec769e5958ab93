#include "net/poll_wait.h"

#include <cerrno>
#include <chrono>
#include <climits>
#include <string>

namespace refit {

int poll_timeout_ms(Deadline deadline) {
  if (deadline.is_never()) return -1;
  auto left = deadline.at() - Deadline::Clock::now();
  if (left <= Deadline::Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

int poll_until(std::span<pollfd> fds, Deadline deadline) {
  for (;;) {
    int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(deadline));
    if (rc > 0) return rc;
    if (rc == 0) {
      // A timeout clamped to INT_MAX ms ends before a far deadline: go on.
      if (deadline.expired()) return 0;
      continue;
    }
    if (errno == EINTR) continue;
    return -errno;
  }
}

StatusOr<int> poll_wait(std::span<pollfd> fds, Deadline deadline, std::string_view what) {
  int rc = poll_until(fds, deadline);
  if (rc > 0) return rc;
  if (rc == 0) return DeadlineExceeded("timed out waiting for " + std::string(what));
  return ErrnoStatus("poll on " + std::string(what), -rc);
}

}  // namespace refit
