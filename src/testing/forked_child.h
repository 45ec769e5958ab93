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

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

namespace refit::testing {

// Whole reads and writes on a pipe end: false when the other end is gone.
inline bool WriteAll(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}
inline bool ReadAll(int fd, void* data, std::size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}
// A string with its length in front; ReceiveString returns "" when the
// other end is gone or the length is absurd (over 1 MiB).
inline bool SendString(int fd, const std::string& s) {
  const std::uint64_t n = s.size();
  return WriteAll(fd, &n, sizeof n) && WriteAll(fd, s.data(), s.size());
}
inline std::string ReceiveString(int fd) {
  std::uint64_t n = 0;
  if (!ReadAll(fd, &n, sizeof n) || n > (1u << 20)) return {};
  std::string s(n, '\0');
  return ReadAll(fd, s.data(), n) ? s : std::string();
}

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
