// Handing one open file descriptor to processes of the same user over an
// abstract Unix socket (Linux), so that a shared segment never needs a name.
//
// Why: a named /dev/shm segment outlives a process killed before it removed
// the name (kill -9 during setup left /dev/shm/refit-<pid>-0 behind). An
// abstract socket has no file-system entry and vanishes with the last
// descriptor of its process, and the segment it hands out is an unnamed
// tmpfs file, freed with its last descriptor or mapping: a kill at any
// moment leaves nothing behind.
//
// Access: the server hands the descriptor only to a peer whose user id
// (SO_PEERCRED) is its own, as a 0600 segment would; other peers are
// disconnected without it. Abstract names are per network namespace, so
// both sides must share one (as they share a host for shm).
//
// Thread safety: FdServer serves on its own thread; stop() and the
// destructor may be called from any one thread.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "refit/deadline.h"
#include "refit/status.h"

namespace refit {

class FdServer {
 public:
  // Listens on the abstract socket "\0<name>" and serves `fd` (owned from
  // now on) to every same-user peer that connects, until stop(). A name in
  // use gives a null server and leaves `fd` open (the caller picks another
  // name); other errors close `fd`.
  static StatusOr<std::unique_ptr<FdServer>> Start(const std::string& name, int fd);
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  // Stops serving and closes the socket and the served descriptor (mappings
  // made from it stay valid). Later connects are refused. Idempotent.
  void stop();

 private:
  FdServer(std::string name, int listen_fd, int served_fd, int wake_read, int wake_write);
  void serve();

  std::string name_;
  int listen_fd_, served_fd_, wake_read_, wake_write_;
  std::thread thread_;
};

// Connects to the abstract socket "\0<name>" and returns the descriptor it
// serves (close-on-exec). Nobody listening is kNotFound; a server that
// closes without sending one (another user's) is kFailedPrecondition; no
// answer by `deadline` is kDeadlineExceeded.
StatusOr<int> receive_fd(const std::string& name, Deadline deadline);

}  // namespace refit
