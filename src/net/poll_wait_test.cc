// Tests of poll_wait / poll_until over pipes. Each test says which broken
// implementation it catches ("Catches: ...").
#include "net/poll_wait.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "testing/status_matchers.h"

namespace refit {
namespace {

using namespace std::chrono_literals;

// Both ends of one pipe, closed at the end of the test.
struct Pipe {
  Pipe() { EXPECT_EQ(::pipe(fds), 0); }
  ~Pipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int read_end() const { return fds[0]; }
  void write_byte() const { ASSERT_EQ(::write(fds[1], "x", 1), 1); }
  int fds[2] = {-1, -1};
};

// Catches: polling only the first fd of the set (the receiver's and the join
// gate's second fd would never wake them), or reporting readiness on the
// wrong entry.
TEST(PollWait, TheSecondOfTwoFdsWakesTheWait) {
  Pipe first, second;
  second.write_byte();
  pollfd fds[2] = {{first.read_end(), POLLIN, 0}, {second.read_end(), POLLIN, 0}};
  ASSERT_OK_AND_ASSIGN(int ready, poll_wait(fds, Deadline::After(5s), "two pipes"));
  EXPECT_EQ(ready, 1);
  EXPECT_EQ(fds[0].revents, 0);
  EXPECT_NE(fds[1].revents & POLLIN, 0);
}

// Catches: a timeout that returns before the deadline (a timeout rounded
// down, or a first poll of 0 ms taken for the deadline), or a timeout
// reported as success or without naming what was waited for.
TEST(PollWait, ADeadlineEndsTheWaitNamingWhatWasWaitedFor) {
  Pipe idle;
  pollfd fd{idle.read_end(), POLLIN, 0};
  const Deadline deadline = Deadline::After(30ms);
  StatusOr<int> ready = poll_wait({&fd, 1}, deadline, "the idle pipe");
  EXPECT_TRUE(deadline.expired());
  ASSERT_FALSE(ready.ok());
  EXPECT_EQ(ready.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(ready.status().message().find("the idle pipe"), std::string::npos) << ready.status().ToString();
  EXPECT_EQ(fd.revents, 0);
}

// Catches: an expired deadline that skips the poll instead of checking
// readiness once (nccl's link check polls with an expired deadline).
TEST(PollWait, AnExpiredDeadlineStillLooksOnce) {
  Pipe ready_pipe;
  ready_pipe.write_byte();
  pollfd fd{ready_pipe.read_end(), POLLIN, 0};
  EXPECT_EQ(poll_until({&fd, 1}, Deadline::After(0ms)), 1);
  EXPECT_NE(fd.revents & POLLIN, 0);
}

std::atomic<int> g_signals{0};

// Catches: EINTR from poll(2) returned as an error (a signal to a thread
// that waits would fail its link or stop the receiver's I/O thread).
TEST(PollWait, SignalsFromAnotherThreadDoNotEndTheWait) {
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_signals.fetch_add(1); };
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: poll returns EINTR
  struct sigaction old {};
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);
  g_signals = 0;
  Pipe wake;
  pollfd fd{wake.read_end(), POLLIN, 0};
  StatusOr<int> ready = Internal("not run");
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    ready = poll_wait({&fd, 1}, Deadline::After(10s), "the wake pipe");
    returned = true;
  });
  // Each signal is handled on the waiter before the next is sent; the
  // waiter does nothing but wait, so the later ones interrupt its poll. A
  // wait that ended early (the bug) stops the signals.
  for (int sent = 1; sent <= 20 && !returned.load(); ++sent) {
    ::pthread_kill(waiter.native_handle(), SIGUSR1);
    while (g_signals.load() < sent && !returned.load()) std::this_thread::yield();
  }
  wake.write_byte();
  waiter.join();
  ::sigaction(SIGUSR1, &old, nullptr);
  ASSERT_OK(ready);
  EXPECT_EQ(*ready, 1);
  EXPECT_NE(fd.revents & POLLIN, 0);
}

}  // namespace
}  // namespace refit
