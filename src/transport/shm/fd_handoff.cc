#include "transport/shm/fd_handoff.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "net/poll_wait.h"
#include "refit/log.h"

namespace refit {
namespace {

// The abstract address "\0<name>" and its length.
socklen_t abstract_address(const std::string& name, sockaddr_un* addr) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  const std::size_t n = std::min(name.size(), sizeof(addr->sun_path) - 1);
  std::memcpy(addr->sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// Sends `fd` with one byte of data on the connected socket `conn`.
bool send_fd(int conn, int fd) {
  char byte = 'F';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return ::sendmsg(conn, &msg, MSG_NOSIGNAL) == 1;
}

}  // namespace

StatusOr<std::unique_ptr<FdServer>> FdServer::Start(const std::string& name, int fd) {
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("creating the socket that hands out " + name, err);
  }
  sockaddr_un addr;
  const socklen_t len = abstract_address(name, &addr);
  if (::bind(s, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(s, 64) != 0) {
    const int err = errno;
    ::close(s);
    if (err == EADDRINUSE) return std::unique_ptr<FdServer>();
    ::close(fd);
    return ErrnoStatus("listening on the abstract socket @" + name, err);
  }
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(s);
    ::close(fd);
    return ErrnoStatus("creating the stop pipe of @" + name, err);
  }
  return std::unique_ptr<FdServer>(new FdServer(name, s, fd, wake[0], wake[1]));
}

FdServer::FdServer(std::string name, int listen_fd, int served_fd, int wake_read, int wake_write)
    : name_(std::move(name)),
      listen_fd_(listen_fd),
      served_fd_(served_fd),
      wake_read_(wake_read),
      wake_write_(wake_write),
      thread_([this] { serve(); }) {}

FdServer::~FdServer() { stop(); }

void FdServer::stop() {
  if (!thread_.joinable()) return;
  (void)!::write(wake_write_, "x", 1);
  thread_.join();
  for (int fd : {listen_fd_, served_fd_, wake_read_, wake_write_}) ::close(fd);
}

void FdServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    // Woken by a peer or by stop() (the wake pipe); the second bound only
    // keeps every wait finite.
    const int ready = poll_until(fds, Deadline::After(std::chrono::seconds(1)));
    if (ready < 0) {
      log(LogLevel::kError, "shm", "poll on @" + name_ + " failed: " + std::strerror(-ready));
      return;
    }
    if (ready == 0) continue;
    if (fds[1].revents != 0) return;
    const int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;  // the peer gave up already (EAGAIN, ECONNABORTED)
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::geteuid()) {
      (void)send_fd(conn, served_fd_);
    } else {
      log(LogLevel::kWarning, "shm",
          "refused to hand the segment @" + name_ + " to pid " + std::to_string(cred.pid) + " of another user (uid " +
              std::to_string(cred.uid) + ")");
    }
    ::close(conn);
  }
}

StatusOr<int> receive_fd(const std::string& name, Deadline deadline) {
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return ErrnoStatus("creating a socket to reach @" + name, errno);
  sockaddr_un addr;
  const socklen_t len = abstract_address(name, &addr);
  if (::connect(s, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int err = errno;
    ::close(s);
    if (err == ECONNREFUSED || err == ENOENT) {
      return NotFound("nobody serves @" + name + " (" + std::strerror(err) + ")");
    }
    return ErrnoStatus("connecting to @" + name, err);
  }
  pollfd p{s, POLLIN, 0};
  const int ready = poll_until(std::span<pollfd>(&p, 1), deadline);
  if (ready <= 0) {
    ::close(s);
    return DeadlineExceeded("no answer from @" + name + " before the deadline");
  }
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
  const int err = errno;
  ::close(s);
  if (n < 0) return ErrnoStatus("receiving the descriptor from @" + name, err);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (n != 1 || c == nullptr || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int))) {
    return FailedPrecondition("@" + name + " closed without handing over its descriptor (it serves its own user only)");
  }
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

}  // namespace refit
