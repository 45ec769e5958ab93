// An eventfd used to wake a thread blocked in poll_until (net/poll_wait.h):
// signal_event_fd adds one to its counter, drain_event_fd reads the counter
// back to zero. Both retry EINTR; any other error is ignored (an eventfd's
// counter cannot overflow at these rates, and a read of a non-blocking
// eventfd at zero is EAGAIN, which means already drained).
//
// Thread safety: any thread may signal; the thread that polls drains.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace refit {

inline void signal_event_fd(int fd) {
  const std::uint64_t one = 1;
  ssize_t rc;
  do {
    rc = ::write(fd, &one, sizeof one);
  } while (rc < 0 && errno == EINTR);
}

inline void drain_event_fd(int fd) {
  std::uint64_t value = 0;
  ssize_t rc;
  do {
    rc = ::read(fd, &value, sizeof value);
  } while (rc < 0 && errno == EINTR);
}

}  // namespace refit
