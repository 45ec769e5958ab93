// Test helper: a forked child process that runs a function of the test
// binary (no exec), for tests whose two sides must live in different
// processes (a one-sided write really crossing a process boundary, a peer
// that dies). Multi-process tests of the `refit` binary use
// tests/process_harness.h instead.
//
// The child runs body(to_parent, from_parent) and exits with its return
// value (_exit: no atexit handlers, no gtest output of the parent's state).
// `to_parent` / `from_parent` are pipe ends for short messages. A child the
// test did not Wait for is killed (SIGKILL) and reaped when the ForkedChild
// goes, so a failed assertion never leaves a process behind.
//
// Fork only before the test starts threads of its own, and never after CUDA
// was initialized in this process (CUDA does not survive fork).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>

namespace refit::testing {

class ForkedChild {
 public:
  explicit ForkedChild(const std::function<int(int to_parent, int from_parent)>& body) {
    int up[2], down[2];
    if (::pipe(up) != 0 || ::pipe(down) != 0) std::abort();
    std::fflush(nullptr);  // nothing buffered is written twice
    pid_ = ::fork();
    if (pid_ < 0) std::abort();
    if (pid_ == 0) {
      ::close(up[0]);
      ::close(down[1]);
      ::_exit(body(up[1], down[0]));
    }
    ::close(up[1]);
    ::close(down[0]);
    from_child_ = up[0];
    to_child_ = down[1];
  }
  ~ForkedChild() {
    if (pid_ > 0) Kill();
    ::close(from_child_);
    ::close(to_child_);
  }
  ForkedChild(const ForkedChild&) = delete;
  ForkedChild& operator=(const ForkedChild&) = delete;

  // SIGKILL, then reap.
  void Kill() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Waits for the child: its exit code, -N when signal N ended it, -1000
  // when there was nothing to wait for.
  int Wait() {
    int status = 0;
    if (pid_ <= 0 || ::waitpid(pid_, &status, 0) != pid_) return -1000;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  pid_t pid() const { return pid_; }
  int from_child() const { return from_child_; }
  int to_child() const { return to_child_; }

 private:
  pid_t pid_ = -1;
  int from_child_ = -1, to_child_ = -1;
};

}  // namespace refit::testing
