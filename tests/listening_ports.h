// The TCP ports a process of a test listens on, read from /proc: how a test
// finds an engine rank's data port (it listens before it joins) to connect
// to it as a stranger would.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "process_harness.h"

namespace refit::testing {

// TCP ports `pid` listens on (its sockets in LISTEN state).
inline std::vector<int> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* dir = ::opendir(fd_dir.c_str())) {
    while (dirent* e = ::readdir(dir)) {
      char target[256];
      const ssize_t n = ::readlink((fd_dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      const std::string t = target;
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    ::closedir(dir);
  }
  std::vector<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
      ports.push_back(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
    }
  }
  return ports;
}

// Engine rank `name`'s data port, polling /proc until it appears (an
// engine listens for data before it joins); 0 when it did not within 10 s.
inline int data_port(const ProcessGroup& group, const std::string& name) {
  for (int i = 0; i < 1000; ++i) {
    std::vector<int> ports = listening_ports(group.proc(name).pid);
    if (ports.size() == 1) return ports[0];
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

}  // namespace refit::testing
