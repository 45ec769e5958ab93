// poll_wait: the one loop around poll(2) that every wait on file descriptors
// in refit goes through (links, the join gate's listener, the receiver's I/O
// thread, the ucx worker's event fd, the nccl link check).
//
// The loop waits until at least one fd is ready or the deadline passes. It
// retries EINTR with the time that is left, and rounds the timeout up so
// that it never returns before the deadline (no busy loop near the end). A
// ready fd is one whose `revents` is non-zero after the call: that includes
// error and hangup states (POLLERR, POLLHUP, POLLNVAL), which the next
// syscall on the fd reports. On a timeout every `revents` is zero.
//
// Thread safety: none needed; the functions keep no state.
#pragma once

#include <poll.h>

#include <span>
#include <string_view>

#include "refit/deadline.h"
#include "refit/status.h"

namespace refit {

// Timeout for one poll(2) call: -1 for Deadline::Never(), else the time left
// rounded up to whole milliseconds (0 once the deadline passed).
int poll_timeout_ms(Deadline deadline);

// Polls `fds` until one is ready or `deadline` passes. Returns the number of
// ready fds (> 0), 0 when the deadline passed first, or -errno when poll
// fails (never -EINTR). An expired deadline still polls once, without
// waiting: a check of readiness "now".
int poll_until(std::span<pollfd> fds, Deadline deadline);

// poll_until with a Status: the number of ready fds; kDeadlineExceeded
// "timed out waiting for <what>" when the deadline passed first; the errno
// status of "poll on <what>" when poll fails. `what` names what was waited
// for ("a connection on 127.0.0.1:5000", "the trainer links").
StatusOr<int> poll_wait(std::span<pollfd> fds, Deadline deadline, std::string_view what);

}  // namespace refit
