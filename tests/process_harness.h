// Test harness for multi-process tests: runs the real `refit` binary
// (REFIT_BINARY, set by CMake) as separate processes, captures their output
// into files, waits with deadlines, and kills what is left at the end.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace refit::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Names in /dev/shm that start with `prefix`.
inline std::set<std::string> shm_entries(const std::string& prefix) {
  std::set<std::string> out;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(dir)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.insert(e->d_name);
    }
    ::closedir(dir);
  }
  return out;
}

class ProcessGroup {
 public:
  struct Proc {
    std::string name;
    pid_t pid = -1;
    int exit_code = -1;  // -1 while running; 128+N when killed by signal N
    std::string out_path, err_path;
  };

  ProcessGroup() : shm_before_(shm_entries("refit-")) {
    char dir[] = "/tmp/refit-test-XXXXXX";
    dir_ = ::mkdtemp(dir);
  }
  ~ProcessGroup() {
    for (auto& [name, p] : procs_) {
      if (p.exit_code < 0) {
        ::kill(p.pid, SIGKILL);
        ::waitpid(p.pid, nullptr, 0);
      }
      std::remove(p.out_path.c_str());
      std::remove(p.err_path.c_str());
      // A process killed before it sealed its pool leaves the pool's name;
      // removed here so that it cannot be blamed on a later process that
      // gets the same pid.
      for (const auto& entry : shm_left_by(p.pid)) ::unlink(("/dev/shm/" + entry).c_str());
    }
    std::remove((dir_ + "/port").c_str());
    ::rmdir(dir_.c_str());
  }

  const std::string& dir() const { return dir_; }

  // /dev/shm entries "refit-<pid>-*" of the process with this pid. refit's
  // shm pools have no name any more (an unnamed tmpfs file handed over a
  // Unix socket), so any such entry is a regression. Entries that existed before this group was
  // made are not counted: they belong to an earlier process that had the
  // same pid (one killed before it could remove its pool; pids wrap).
  std::vector<std::string> shm_left_by(pid_t pid) const {
    std::vector<std::string> out;
    for (const auto& entry : shm_entries("refit-" + std::to_string(pid) + "-")) {
      if (!shm_before_.contains(entry)) out.push_back(entry);
    }
    return out;
  }

  // The `refit` binary: REFIT_BINARY from the environment (the GPU machine
  // runs a copy of the build from another folder), else the build's path.
  static std::string refit_binary() {
    const char* binary = std::getenv("REFIT_BINARY");
    return binary != nullptr && *binary ? binary : REFIT_BINARY;
  }

  // Starts `refit <args...>` as process `name`.
  pid_t spawn(const std::string& name, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {refit_binary()};
    argv.insert(argv.end(), args.begin(), args.end());
    return spawn_command(name, argv);
  }

  // Starts any command as process `name`: argv[0] is looked up on PATH
  // unless it holds a '/'; `env` is added to the inherited environment.
  // stdout and stderr go to files (out(name), err(name)); stdin is
  // /dev/null. Exit code 127: the command could not be run.
  pid_t spawn_command(const std::string& name, const std::vector<std::string>& argv_s,
                      const std::vector<std::pair<std::string, std::string>>& env = {}) {
    Proc p;
    p.name = name;
    p.out_path = dir_ + "/" + sanitize(name) + ".out";
    p.err_path = dir_ + "/" + sanitize(name) + ".err";
    std::vector<std::string> args = argv_s;  // the child's copy: exec needs char*
    p.pid = ::fork();
    if (p.pid == 0) {
      int out = ::open(p.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(p.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(err, 2);
      int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, 0);
      for (const auto& [key, value] : env) ::setenv(key.c_str(), value.c_str(), 1);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      ::_exit(127);
    }
    procs_[name] = p;
    return p.pid;
  }

  // Starts a coordinator and returns its address ("127.0.0.1:PORT"), or "" if
  // it did not listen within 10 s.
  std::string spawn_coordinator(std::vector<std::string> args) {
    std::vector<std::string> full = {"coordinator", "--listen", "127.0.0.1:0", "--port-file", dir_ + "/port",
                                     "--report", dir_ + "/report.json"};
    full.insert(full.end(), args.begin(), args.end());
    spawn("coordinator", full);
    for (int i = 0; i < 1000; ++i) {
      std::ifstream in(dir_ + "/port");
      std::string port;
      if (in >> port) return "127.0.0.1:" + port;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return "";
  }

  std::string report() const { return read_file(dir_ + "/report.json"); }

  // Waits until every process exited or `seconds` passed; true if all exited.
  bool wait_all(double seconds) {
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      bool all = true;
      for (auto& [name, p] : procs_) {
        if (p.exit_code >= 0) continue;
        int st = 0;
        if (::waitpid(p.pid, &st, WNOHANG) == p.pid) {
          p.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        } else {
          all = false;
        }
      }
      if (all) return true;
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  bool wait_one(const std::string& name, double seconds) {
    Proc& p = procs_.at(name);
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (p.exit_code < 0) {
      int st = 0;
      if (::waitpid(p.pid, &st, WNOHANG) == p.pid) {
        p.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  void kill(const std::string& name, int sig) { ::kill(procs_.at(name).pid, sig); }

  // Continues a process that stops itself (a `stop` fault hook): waits until
  // it is really stopped, then sends SIGCONT. The hook logs its line before it
  // raises SIGSTOP, so a SIGCONT sent on seeing the line can arrive first and
  // be lost, leaving the process stopped for good (CI, under asan, 2026-12-01).
  // Sends at once if the process has exited or `seconds` pass.
  void resume(const std::string& name, double seconds = 30) {
    const Proc& p = procs_.at(name);
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (char st = state_of(p.pid); st != 'T' && st != 'Z' && st != '?'; st = state_of(p.pid)) {
      if (p.exit_code >= 0 || std::chrono::steady_clock::now() > until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ::kill(p.pid, SIGCONT);
  }
  const Proc& proc(const std::string& name) const { return procs_.at(name); }
  int exit_code(const std::string& name) const { return procs_.at(name).exit_code; }
  std::string err(const std::string& name) const { return read_file(procs_.at(name).err_path); }
  std::string out(const std::string& name) const { return read_file(procs_.at(name).out_path); }
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (auto& [k, v] : procs_) n.push_back(k);
    return n;
  }
  std::string all_stderr() const {
    std::string s;
    for (auto& [k, v] : procs_) s += "--- " + k + " (exit " + std::to_string(v.exit_code) + ")\n" + read_file(v.err_path);
    return s;
  }

 private:
  // The process's state letter in /proc (T stopped, Z exited); '?' if gone.
  static char state_of(pid_t pid) {
    std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    auto close = stat.rfind(')');  // the name in parentheses may hold spaces
    if (close == std::string::npos || close + 2 >= stat.size()) return '?';
    return stat[close + 2];
  }
  static std::string sanitize(std::string s) {
    for (char& c : s) {
      if (c == ' ') c = '_';
    }
    return s;
  }
  std::set<std::string> shm_before_;  // "refit-*" names in /dev/shm when the group was made
  std::string dir_;
  std::map<std::string, Proc> procs_;
};

// Runs a command (spawn_command's rules) to completion, at most `seconds`.
struct RunResult {
  int exit_code = -1;
  std::string out, err;
};
inline RunResult run_command(const std::vector<std::string>& argv, double seconds = 300) {
  ProcessGroup g;
  g.spawn_command("command", argv);
  RunResult r;
  if (!g.wait_all(seconds)) {
    r.err = "timed out";
    return r;
  }
  r.exit_code = g.exit_code("command");
  r.out = g.out("command");
  r.err = g.err("command");
  return r;
}

// Runs `refit <args>` to completion (at most `seconds`).
inline RunResult run_refit(const std::vector<std::string>& args, double seconds = 300) {
  std::vector<std::string> argv = {ProcessGroup::refit_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, seconds);
}

}  // namespace refit::testing
