// Link and Listener over TCP sockets.
//
// Every blocking step is "try the syscall with MSG_DONTWAIT (or on a
// non-blocking socket); on EAGAIN poll() until the deadline". This never
// depends on the fd's blocking mode, handles partial reads/writes and EINTR,
// and never raises SIGPIPE (MSG_NOSIGNAL).
#include "net/link.h"

#include "net/poll_wait.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kHeaderBytes = 48;

long long elapsed_ms(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// Waits until `fd` is ready for `events`. Returns 1 when ready (or in an
// error/hangup state the next syscall will report), 0 when the deadline
// passed, -errno on a poll failure.
int wait_fd(int fd, short events, Deadline d) {
  pollfd p{fd, events, 0};
  int rc = poll_until({&p, 1}, d);
  return rc > 0 ? 1 : rc;
}

struct Io {
  enum Kind { kDone, kEof, kTimeout, kError };
  Kind kind = kDone;
  std::size_t done = 0;
  int err = 0;
};

Io read_exact(int fd, std::byte* p, std::size_t n, Deadline d) {
  Io r;
  while (r.done < n) {
    ssize_t k = ::recv(fd, p + r.done, n - r.done, MSG_DONTWAIT);
    if (k > 0) {
      r.done += static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) {
      r.kind = Io::kEof;
      return r;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int w = wait_fd(fd, POLLIN, d);
      if (w == 0) {
        r.kind = Io::kTimeout;
        return r;
      }
      if (w < 0) {
        r.kind = Io::kError;
        r.err = -w;
        return r;
      }
      continue;
    }
    r.kind = Io::kError;
    r.err = errno;
    return r;
  }
  return r;
}

// Writes every byte of the iovecs (modified in place).
Io write_all(int fd, iovec* iov, int iovcnt, Deadline d) {
  Io r;
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --iovcnt;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(std::min(iovcnt, IOV_MAX));
    ssize_t k = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k >= 0) {
      auto left = static_cast<std::size_t>(k);
      r.done += left;
      while (iovcnt > 0 && left >= iov->iov_len) {
        left -= iov->iov_len;
        ++iov;
        --iovcnt;
      }
      if (iovcnt > 0) {
        iov->iov_base = static_cast<char*>(iov->iov_base) + left;
        iov->iov_len -= left;
      }
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int w = wait_fd(fd, POLLOUT, d);
      if (w == 0) {
        r.kind = Io::kTimeout;
        return r;
      }
      if (w < 0) {
        r.kind = Io::kError;
        r.err = -w;
        return r;
      }
      continue;
    }
    r.kind = Io::kError;
    r.err = errno;
    return r;
  }
  return r;
}

void put_u16(std::byte* p, std::uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put_u32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put_u64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint64_t get_le(const std::byte* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}

// Wire layout, little-endian: magic u32 @0, type u16 @4, flags u16 @6,
// a @8, b @16, c @24, d @32, payload_bytes @40 (u64 each); 48 bytes.
void encode_header(const FrameHeader& h, std::byte* out) {
  put_u32(out + 0, kFrameMagic);
  put_u16(out + 4, static_cast<std::uint16_t>(h.type));
  put_u16(out + 6, h.flags);
  put_u64(out + 8, h.a);
  put_u64(out + 16, h.b);
  put_u64(out + 24, h.c);
  put_u64(out + 32, h.d);
  put_u64(out + 40, h.payload_bytes);
}

bool known_type(std::uint16_t t) {
  return t >= static_cast<std::uint16_t>(FrameType::kHello) &&
         t <= static_cast<std::uint16_t>(FrameType::kBye);
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

void set_cloexec(int fd) {
  int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

// "1.2.3.4:80" or "[::1]:80".
std::string sockaddr_name(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "unknown address";
}

std::string join_host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

bool retryable_connect_error(int err) {
  return err == ECONNREFUSED || err == ECONNRESET || err == ECONNABORTED;
}

// A connect to a local port with no listener can, rarely, connect the socket
// to itself (TCP simultaneous open). Treat that as refused.
bool self_connected(int fd) {
  sockaddr_storage a{}, b{};
  socklen_t la = sizeof a, lb = sizeof b;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &la) != 0) return false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&b), &lb) != 0) return false;
  return la == lb && std::memcmp(&a, &b, la) == 0;
}

}  // namespace

// ---------------------------------------------------------------- Link

Link::Link(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {
  set_cloexec(fd_);
  int one = 1;
  // Fails harmlessly on non-TCP sockets (socketpair in tests).
  (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Link::~Link() {
  if (fd_ >= 0) ::close(fd_);
}

void Link::shutdown() { (void)::shutdown(fd_, SHUT_RDWR); }

void Link::adopt(Link& fresh) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fresh.fd_;
  fresh.fd_ = -1;
  peer_ = fresh.peer_;
}

StatusOr<std::unique_ptr<Link>> Link::Connect(const std::string& host_port, std::string peer,
                                              Deadline deadline) {
  const auto start = Clock::now();
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(split_host_port(host_port, &host, &port));
  if (port == 0) return InvalidArgument("cannot connect to \"" + host_port + "\": port 0");
  std::string name = peer.empty()                                   ? host_port
                     : peer.find(host_port) == std::string::npos ? peer + " at " + host_port
                                                                    : peer;
  int last_err = 0;
  int attempts = 0;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    std::string port_str = std::to_string(port);
    int gai = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
    if (gai != 0 && gai != EAI_AGAIN) {
      return InvalidArgument("cannot resolve host \"" + host + "\" of " + name + ": " + ::gai_strerror(gai));
    }
    ++attempts;
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        int err = errno;
        ::freeaddrinfo(res);
        return ErrnoStatus("creating a socket to connect to " + name, err);
      }
      int err = 0;
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
          int w = wait_fd(fd, POLLOUT, deadline);
          if (w == 0) {
            ::close(fd);
            ::freeaddrinfo(res);
            return DeadlineExceeded("timed out after " + std::to_string(elapsed_ms(start)) +
                                    "ms connecting to " + name);
          }
          err = w < 0 ? -w : 0;
          if (err == 0) {
            socklen_t len = sizeof err;
            if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          }
        }
      }
      if (err == 0 && self_connected(fd)) err = ECONNREFUSED;
      if (err == 0) {
        ::freeaddrinfo(res);
        return std::make_unique<Link>(fd, std::move(name));
      }
      ::close(fd);
      if (!retryable_connect_error(err)) {
        ::freeaddrinfo(res);
        return ErrnoStatus("connecting to " + name, err);
      }
      last_err = err;
    }
    if (res != nullptr) ::freeaddrinfo(res);
    if (gai == EAI_AGAIN) last_err = EAGAIN;
    if (deadline.expired()) {
      return Unavailable("cannot connect to " + name + ": " +
                         (gai == EAI_AGAIN ? std::string("name resolution failed temporarily")
                                           : std::string(std::strerror(last_err))) +
                         " (" + std::to_string(attempts) + " attempts in " +
                         std::to_string(elapsed_ms(start)) + "ms)");
    }
    auto nap = std::min<Clock::duration>(std::chrono::milliseconds(20), deadline.at() - Clock::now());
    if (nap > Clock::duration::zero()) std::this_thread::sleep_for(nap);
  }
}

Status Link::send(const FrameHeader& header, std::span<const std::byte> payload, Deadline deadline) {
  if (!payload.empty() && payload.size() != header.payload_bytes) {
    return InvalidArgument("sending a frame to " + peer_ + ": header announces " +
                           std::to_string(header.payload_bytes) + " payload bytes but " +
                           std::to_string(payload.size()) + " were given");
  }
  const auto start = Clock::now();
  std::byte wire[kHeaderBytes];
  encode_header(header, wire);
  iovec iov[2] = {{wire, kHeaderBytes},
                  {const_cast<std::byte*>(payload.data()), payload.size()}};
  const std::size_t total = kHeaderBytes + payload.size();
  Io r = write_all(fd_, iov, 2, deadline);
  auto progress = [&] { return " (wrote " + std::to_string(r.done) + " of " + std::to_string(total) + " bytes)"; };
  switch (r.kind) {
    case Io::kDone: return Status::Ok();
    case Io::kTimeout:
      return DeadlineExceeded("timed out after " + std::to_string(elapsed_ms(start)) +
                              "ms sending a frame to " + peer_ + progress());
    default:
      return ErrnoStatus("sending a frame to " + peer_ + progress(), r.err);
  }
}

Status Link::send_bytes(std::span<const std::byte> bytes, Deadline deadline) {
  const auto start = Clock::now();
  iovec iov[1] = {{const_cast<std::byte*>(bytes.data()), bytes.size()}};
  Io r = write_all(fd_, iov, 1, deadline);
  auto progress = [&] {
    return " (wrote " + std::to_string(r.done) + " of " + std::to_string(bytes.size()) + " bytes)";
  };
  switch (r.kind) {
    case Io::kDone: return Status::Ok();
    case Io::kTimeout:
      return DeadlineExceeded("timed out after " + std::to_string(elapsed_ms(start)) +
                              "ms sending bytes to " + peer_ + progress());
    default:
      return ErrnoStatus("sending bytes to " + peer_ + progress(), r.err);
  }
}

StatusOr<FrameHeader> Link::recv_header(Deadline deadline, std::uint64_t max_payload) {
  const auto start = Clock::now();
  std::byte wire[kHeaderBytes];
  Io r = read_exact(fd_, wire, kHeaderBytes, deadline);
  std::string got = r.done == 0 ? std::string()
                                : " (got " + std::to_string(r.done) + " of 48 header bytes)";
  switch (r.kind) {
    case Io::kDone: break;
    case Io::kEof:
      return Unavailable("connection to " + peer_ + " closed" + (r.done ? " mid-frame" + got : std::string()));
    case Io::kTimeout:
      return DeadlineExceeded("timed out after " + std::to_string(elapsed_ms(start)) +
                              "ms waiting for a frame from " + peer_ + got);
    case Io::kError:
      return ErrnoStatus("connection to " + peer_ + " failed while waiting for a frame" + got, r.err);
  }
  auto magic = static_cast<std::uint32_t>(get_le(wire + 0, 4));
  if (magic != kFrameMagic) {
    return DataLoss("bad frame from " + peer_ + ": magic " + hex32(magic) + " (expected " +
                    hex32(kFrameMagic) + ")");
  }
  auto type = static_cast<std::uint16_t>(get_le(wire + 4, 2));
  if (!known_type(type)) {
    return DataLoss("bad frame from " + peer_ + ": unknown frame type " + std::to_string(type));
  }
  FrameHeader h;
  h.magic = magic;
  h.type = static_cast<FrameType>(type);
  h.flags = static_cast<std::uint16_t>(get_le(wire + 6, 2));
  h.a = get_le(wire + 8, 8);
  h.b = get_le(wire + 16, 8);
  h.c = get_le(wire + 24, 8);
  h.d = get_le(wire + 32, 8);
  h.payload_bytes = get_le(wire + 40, 8);
  if (h.payload_bytes > max_payload) {
    return InvalidArgument("bad frame from " + peer_ + ": type " + std::to_string(type) + " announces " +
                           std::to_string(h.payload_bytes) + " payload bytes, more than the " +
                           std::to_string(max_payload) + " accepted here");
  }
  return h;
}

Status Link::recv_payload(std::span<std::byte> out, Deadline deadline) {
  const auto start = Clock::now();
  Io r = read_exact(fd_, out.data(), out.size(), deadline);
  std::string got = " (got " + std::to_string(r.done) + " of " + std::to_string(out.size()) + ")";
  switch (r.kind) {
    case Io::kDone: return Status::Ok();
    case Io::kEof: return Unavailable("connection to " + peer_ + " closed mid-payload" + got);
    case Io::kTimeout:
      return DeadlineExceeded("timed out after " + std::to_string(elapsed_ms(start)) + "ms waiting for " +
                              std::to_string(out.size()) + " payload bytes from " + peer_ + got);
    case Io::kError:
      return ErrnoStatus("connection to " + peer_ + " failed while reading a payload" + got, r.err);
  }
  return Internal("unreachable");
}

Status Link::skip_payload(std::uint64_t bytes, Deadline deadline) {
  std::byte scratch[64 * 1024];
  std::uint64_t left = bytes;
  while (left > 0) {
    auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left, sizeof scratch));
    Status s = recv_payload(std::span<std::byte>(scratch, n), deadline);
    if (!s.ok()) return s.WithContext("skipping " + std::to_string(bytes) + " payload bytes");
    left -= n;
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- Listener

StatusOr<std::unique_ptr<Listener>> Listener::Listen(const std::string& host_in, int port) {
  std::string host = host_in;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string where = join_host_port(host, port);
  if (port < 0 || port > 65535) return InvalidArgument("cannot listen on " + where + ": port out of range");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  int gai = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
  if (gai != 0) return InvalidArgument("cannot listen on " + where + ": " + ::gai_strerror(gai));
  Status last = Internal("cannot listen on " + where + ": no address");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = ErrnoStatus("cannot listen on " + where + ": socket", errno);
      continue;
    }
    int one = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      last = ErrnoStatus("cannot listen on " + where + ": bind", errno);
      ::close(fd);
      continue;
    }
    if (::listen(fd, SOMAXCONN) != 0) {
      last = ErrnoStatus("cannot listen on " + where + ": listen", errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      last = ErrnoStatus("cannot listen on " + where + ": getsockname", errno);
      ::close(fd);
      continue;
    }
    int real_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    ::freeaddrinfo(res);
    return std::unique_ptr<Listener>(new Listener(fd, host, real_port));
  }
  ::freeaddrinfo(res);
  return last;
}

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Listener::address() const { return join_host_port(host_, port_); }

StatusOr<std::unique_ptr<Link>> Listener::accept(Deadline deadline) {
  const auto start = Clock::now();
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd >= 0) return std::make_unique<Link>(fd, sockaddr_name(reinterpret_cast<sockaddr*>(&addr)));
    int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      int w = wait_fd(fd_, POLLIN, deadline);
      if (w == 0) {
        return DeadlineExceeded("timed out after " + std::to_string(elapsed_ms(start)) +
                                "ms waiting for a connection on " + address());
      }
      if (w < 0) return ErrnoStatus("waiting for a connection on " + address(), -w);
      continue;
    }
    return ErrnoStatus("accepting a connection on " + address(), err);
  }
}

// ---------------------------------------------------------------- addresses

Status split_host_port(const std::string& hp, std::string* host, int* port) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("bad address \"" + hp + "\": " + why + " (expected host:port or [ipv6]:port)");
  };
  std::string h, p;
  if (!hp.empty() && hp.front() == '[') {
    auto close = hp.find(']');
    if (close == std::string::npos) return bad("missing ']'");
    h = hp.substr(1, close - 1);
    if (close + 1 >= hp.size() || hp[close + 1] != ':') return bad("missing :port after ']'");
    p = hp.substr(close + 2);
  } else {
    auto colon = hp.rfind(':');
    if (colon == std::string::npos) return bad("missing :port");
    h = hp.substr(0, colon);
    p = hp.substr(colon + 1);
    if (h.find(':') != std::string::npos) return bad("an IPv6 address needs brackets");
  }
  if (h.empty()) return bad("empty host");
  for (char ch : h) {
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '-' || ch == '_' || ch == ':' || ch == '%';
    if (!ok) return bad("invalid character in host");
  }
  if (p.empty() || p.size() > 5 || !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad("port must be a number 0..65535");
  }
  int value = std::stoi(p);
  if (value > 65535) return bad("port must be a number 0..65535");
  *host = std::move(h);
  *port = value;
  return Status::Ok();
}

}  // namespace refit
