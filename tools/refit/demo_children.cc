#include "demo_children.h"

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
