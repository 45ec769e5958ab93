#include "demo_children.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace refit::cli {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int sig) {
  if (g_stop_signal == 0) g_stop_signal = sig;
}

}  // namespace

int exit_code_of(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

std::vector<std::string> environment_with(const std::string& name, const std::string& value) {
  std::vector<std::string> env;
  const std::string prefix = name + "=";
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) != 0) env.emplace_back(*e);
  }
  env.push_back(prefix + value);
  return env;
}

pid_t spawn_child(const std::vector<std::string>& args, const std::vector<std::pair<int, int>>& fds,
                  const std::vector<std::string>& env) {
  std::vector<char*> envp;  // built before the fork: the child only execs
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t demo = ::getpid();
  std::fflush(nullptr);  // nothing buffered is written twice
  pid_t pid = ::fork();
  if (pid == 0) {
    // Die with the demo; a demo already gone before the prctl took effect
    // left this child to init: end now.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != demo) ::_exit(128 + SIGKILL);
    for (const auto& [from, to] : fds) {
      if (::dup2(from, to) < 0) ::_exit(127);
    }
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (env.empty()) {
      ::execv(argv[0], argv.data());
    } else {
      ::execve(argv[0], argv.data(), envp.data());
    }
    std::perror("refit demo: exec");
    ::_exit(127);
  }
  return pid;
}

Child start_child(std::string name, const std::vector<std::string>& args, std::vector<std::pair<int, int>> fds,
                  const std::vector<std::string>& env) {
  Child child;
  child.name = std::move(name);
  int err[2];
  if (::pipe2(err, O_CLOEXEC) != 0) {  // the child writes to the demo's stderr itself
    child.pid = spawn_child(args, fds, env);
    return child;
  }
  fds.emplace_back(err[1], 2);
  child.pid = spawn_child(args, fds, env);
  ::close(err[1]);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  child.stderr_read = err[0];
  return child;
}

namespace {

// Passes the whole lines of child.stderr_pending on (all of it at the end of
// the pipe), keeping the error line; a line that may still become an error
// line waits for its end.
void pass_lines(Child& child, bool at_end) {
  std::string& pending = child.stderr_pending;
  std::size_t done = 0;
  while (done < pending.size()) {
    std::size_t end = pending.find('\n', done);
    const bool whole = end != std::string::npos;
    if (!whole && !at_end && child.at_line_start &&
        may_become_error_line(std::string_view(pending).substr(done))) {
      break;
    }
    end = whole ? end + 1 : pending.size();
    std::string_view line = std::string_view(pending).substr(done, end - done);
    auto error = child.at_line_start ? parse_error_line(line.substr(0, line.size() - (whole ? 1 : 0))) : std::nullopt;
    if (error) {
      child.error = std::move(error);
    } else {
      std::fwrite(line.data(), 1, line.size(), stderr);
    }
    child.at_line_start = whole;
    done = end;
  }
  pending.erase(0, done);
}

}  // namespace

void pump_stderr(Child& child) {
  if (child.stderr_read < 0) return;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(child.stderr_read, buf, sizeof buf)) > 0) child.stderr_pending.append(buf, static_cast<std::size_t>(n));
  const bool at_end = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  pass_lines(child, at_end);
  if (at_end) {
    ::close(child.stderr_read);
    child.stderr_read = -1;
  }
}

void pump_stderr(std::vector<Child>& children) {
  for (Child& c : children) pump_stderr(c);
}

void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  ::sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking call returns EINTR and the loop looks
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

int stop_signal() { return g_stop_signal; }

void stop_if_signalled(std::vector<Child>& children) {
  const int sig = g_stop_signal;
  if (sig == 0) return;
  int running = 0;
  for (Child& c : children) {
    if (c.exit_code < 0) {
      ::kill(c.pid, SIGTERM);
      ++running;
    }
  }
  const auto grace_until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (running > 0) {
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, WNOHANG);
    for (Child& c : children) {
      if (pid > 0 && c.pid == pid && c.exit_code < 0) {
        c.exit_code = exit_code_of(st);
        --running;
      }
    }
    pump_stderr(children);
    if (pid > 0) continue;
    if (pid < 0 && errno == ECHILD) break;
    if (std::chrono::steady_clock::now() > grace_until) {
      for (Child& c : children) {
        if (c.exit_code < 0) ::kill(c.pid, SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::fprintf(stderr, "refit demo: stopped by %s; ended the coordinator and every rank\n", ::strsignal(sig));
  std::fflush(nullptr);
  std::_Exit(128 + sig);
}

}  // namespace refit::cli
