// The processes `refit demo` starts, and how they end with it.
//
// Every child is tied to the demo: it asks the kernel for SIGKILL when the
// demo dies (PR_SET_PDEATHSIG, set right after fork; a demo that died
// between fork and prctl is caught by checking getppid against the demo's
// pid), so kill -9 of the demo ends them all. SIGTERM, SIGINT or SIGHUP of
// the demo are caught: the demo forwards SIGTERM to every child that still
// runs, reaps them (SIGKILL after a grace period) and exits with 128 + the
// signal. Nothing of a demo is named in /tmp or /dev/shm (the coordinator's
// port and report come back over pipes; shm pools are unnamed), so no kill
// at any moment leaves anything behind.
//
// REQUIRES: only the demo's main thread forks (PR_SET_PDEATHSIG fires when
// the thread that forked exits, not the process).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace refit::cli {

struct Child {
  std::string name;
  pid_t pid = -1;
  int exit_code = -1;  // -1 while running
  bool killed_by_demo = false;
};

// Starts `args` (args[0]: the binary) as a child tied to this process; in
// the child, each (from, to) of `fds` is dup2'ed to `to` first. `env`: the
// child's whole environment ("NAME=value" entries); empty: this process's.
pid_t spawn_child(const std::vector<std::string>& args, const std::vector<std::pair<int, int>>& fds = {},
                  const std::vector<std::string>& env = {});

// This process's environment with `name` set to `value` (replacing any
// value it had), for spawn_child.
std::vector<std::string> environment_with(const std::string& name, const std::string& value);

// Catches SIGTERM, SIGINT and SIGHUP from now on (they set a flag only).
void catch_stop_signals();
// The signal that asked the demo to stop, or 0.
int stop_signal();

// If a stop signal arrived: forwards SIGTERM to every running child, waits
// up to 2 s for them (then SIGKILL), says so on stderr and exits the process
// with 128 + the signal. Returns otherwise.
void stop_if_signalled(std::vector<Child>& children);

// The exit code a wait status stands for: the code, or 128 + the signal.
int exit_code_of(int wait_status);

}  // namespace refit::cli
