// For tests that must act while another thread of the process is blocked (in
// poll, a condition variable wait, a sleep between retries): wait for that
// observable event, as /proc/self/task/TID/syscall shows it, never a fixed
// sleep.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

namespace refit::testing {

// The calling thread's kernel id (for WaitUntilBlockedIn from another thread).
inline pid_t ThisThreadId() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// Syscalls a thread waits on a file descriptor in.
inline std::vector<long> PollSyscalls() {
  return {
#ifdef SYS_poll
      SYS_poll,
#endif
      SYS_ppoll};
}

// The syscalls of a sleep (std::this_thread::sleep_for).
inline std::vector<long> SleepSyscalls() {
  return {
#ifdef SYS_nanosleep
      SYS_nanosleep,
#endif
      SYS_clock_nanosleep};
}

// The syscall of a condition variable or mutex wait.
inline std::vector<long> FutexSyscalls() { return {SYS_futex}; }

// Waits (at most `limit`) until thread `tid` of this process is blocked in
// one of `syscalls`; true once it is, false when the limit passed first.
inline bool WaitUntilBlockedIn(pid_t tid, const std::vector<long>& syscalls,
                               std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const std::string path = "/proc/self/task/" + std::to_string(tid) + "/syscall";
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    long number = -1;
    // "running" while the thread runs (the read fails), else its syscall number first.
    if (in >> number && std::find(syscalls.begin(), syscalls.end(), number) != syscalls.end()) return true;
    std::this_thread::yield();
  }
  return false;
}

}  // namespace refit::testing
