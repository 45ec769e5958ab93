// Helpers shared by the fuzz targets (fuzz/*_fuzz.cc; fuzz/run.sh runs them).
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "net/link.h"

namespace refit::fuzz {

// Largest input a socket-fed target takes (it must fit the socket buffers,
// so the whole input is written before the code under test reads).
inline constexpr std::size_t kMaxFedBytes = 128 * 1024;

// A Link whose peer already sent `bytes` and closed its sending side: every
// receive sees the fuzz input, then EOF (never a wait). What the Link sends
// lands in the peer's receive buffer and is dropped.
class FedLink {
 public:
  explicit FedLink(std::string_view bytes) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
    const int big = 1 << 20;
    (void)::setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    (void)::setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    (void)::setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    (void)::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    std::size_t done = 0;
    while (done < bytes.size()) {
      ssize_t k = ::write(sv[1], bytes.data() + done, bytes.size() - done);
      if (k <= 0) std::abort();  // the buffers are larger than kMaxFedBytes
      done += static_cast<std::size_t>(k);
    }
    ::shutdown(sv[1], SHUT_WR);
    peer_ = sv[1];
    link_ = std::make_unique<Link>(sv[0], "the fuzz peer");
  }
  ~FedLink() {
    link_.reset();
    ::close(peer_);
  }
  Link& link() { return *link_; }
  // Hands the Link over (for code that takes ownership); the peer's end
  // stays open until this object is destroyed.
  std::unique_ptr<Link> release() { return std::move(link_); }

 private:
  int peer_ = -1;
  std::unique_ptr<Link> link_;
};

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace refit::fuzz
