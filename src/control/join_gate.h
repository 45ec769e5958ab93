// JoinGate: admits connections to the coordinator off its main thread.
//
// A thread accepts connections on the coordinator's listener. Each one is
// authenticated (control/auth.h) and its first message (the join) read on a
// handshake thread of its own, within a deadline, so a slow, silent or
// hostile peer never blocks the coordinator's loop (and so a running refit)
// nor the other peers. At most `max_handshakes` handshakes run at once; a
// connection beyond that is closed at once and logged. A peer that fails
// authentication, or whose first message is malformed, is told why (best
// effort), logged and dropped. Candidates that passed both are queued for the
// coordinator, which decides on its own thread (role, rank range,
// duplicates): it take()s them when fd() polls readable.
//
// Thread safety: fd() and take() are for one thread (the coordinator's);
// Options::log is called from the gate's threads, one call at a time.
// The destructor stops accepting, wakes every handshake in flight and joins
// every thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "control/auth.h"
#include "control/control_message.h"
#include "net/link.h"
#include "refit/status.h"

namespace refit {

class JoinGate {
 public:
  struct Options {
    Secret secret;                                        // empty: no authentication
    std::chrono::milliseconds auth_timeout{5000};         // connect -> authenticated
    std::chrono::milliseconds join_timeout{30000};        // authenticated -> join received
    int max_handshakes = 32;                              // in flight at once
    std::function<void(const std::string&)> log;          // one line per refused connection
  };
  struct Candidate {
    std::unique_ptr<Link> link;  // peer(): the address it connected from
    Json join;                   // its first message, validated (control_message.h)
  };

  // Starts accepting on `listener`.
  static StatusOr<std::unique_ptr<JoinGate>> Start(std::unique_ptr<Listener> listener, Options options);
  ~JoinGate();
  JoinGate(const JoinGate&) = delete;
  JoinGate& operator=(const JoinGate&) = delete;

  // Polls readable (POLLIN) while a candidate waits.
  int fd() const { return ready_fd_; }
  // The next candidate, if any (never blocks).
  std::optional<Candidate> take();

  const Listener& listener() const { return *listener_; }
  // Connections refused so far (authentication, malformed join, overload).
  int refused() const { return refused_.load(); }

 private:
  // One connection being authenticated. Its thread owns the Link; `link`
  // lets the destructor wake it (shutdown) and is cleared, under mu_, before
  // the thread gives the Link away or drops it.
  struct Handshake {
    std::thread thread;
    Link* link = nullptr;
    bool done = false;
  };

  JoinGate(std::unique_ptr<Listener> listener, Options options, int ready_fd, int stop_fd);
  void accept_loop();
  void handshake(Handshake* h, std::unique_ptr<Link> link);
  void reap(bool all);
  void log(const std::string& line);

  std::unique_ptr<Listener> listener_;
  Options options_;
  int ready_fd_;  // eventfd: candidates waiting
  int stop_fd_;   // eventfd: stop the accept loop
  std::atomic<int> refused_{0};
  std::mutex log_mu_;

  std::mutex mu_;  // guards everything below
  std::deque<Candidate> queue_;
  std::list<Handshake> handshakes_;
  bool stopping_ = false;

  std::thread acceptor_;  // last: started after everything above exists
};

}  // namespace refit
