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

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "demo_errors.h"

namespace refit::cli {

struct Child {
  std::string name;
  pid_t pid = -1;
  int exit_code = -1;  // -1 while running
  bool killed_by_demo = false;
  // The read end of the child's stderr (-1: not captured, or at its end),
  // what came of it that is not yet a whole line, and the error line
  // (demo_errors.h) held back from the demo's stderr.
  int stderr_read = -1;
  std::string stderr_pending;
  bool at_line_start = true;
  std::optional<ErrorLine> error;
};

// Starts `args` as spawn_child does, with the child's stderr on a pipe that
// pump_stderr reads.
Child start_child(std::string name, const std::vector<std::string>& args,
                  std::vector<std::pair<int, int>> fds = {}, const std::vector<std::string>& env = {});

// Passes what `child` wrote to its stderr since the last call on to this
// process's stderr, line by line as it comes, except its error line, which
// it keeps in child.error. Never blocks; at the end of the pipe it closes it.
// Call it often: a child whose pipe is full waits.
void pump_stderr(Child& child);
void pump_stderr(std::vector<Child>& children);

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
// up to 2 s for them (then SIGKILL) passing on what they write to stderr,
// says so on stderr and exits the process
// with 128 + the signal. Returns otherwise.
void stop_if_signalled(std::vector<Child>& children);

// The exit code a wait status stands for: the code, or 128 + the signal.
int exit_code_of(int wait_status);

}  // namespace refit::cli
