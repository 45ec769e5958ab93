// Link: one framed, bidirectional byte stream between two processes (a TCP
// connection). The control plane and the data plane both speak over links.
//
// A frame is a fixed 48-byte header (FrameHeader, little-endian on the wire)
// followed by `payload_bytes` bytes. Every receive validates the header before
// anything is used: magic, known type, payload bound.
//
// Thread safety: one thread may send while another receives; two concurrent
// senders (or two receivers) on one Link need external locking.
// Every blocking call takes a Deadline and fails with kDeadlineExceeded
// (naming the peer) when it runs out; EOF from the peer is kUnavailable
// "connection to <peer> closed".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "refit/deadline.h"
#include "refit/status.h"

namespace refit {

inline constexpr std::uint32_t kFrameMagic = 0x54494652;  // "RFIT"
// Largest payload a frame may announce (a bucket, or a control message).
inline constexpr std::uint64_t kMaxFramePayload = 1ull << 40;

enum class FrameType : std::uint16_t {
  kHello = 1,    // a:  sender rank, b: receiver rank, c: plan digest
  kCredit = 2,   // a:  version, b: bucket index, c: slot
  kData = 3,     // a:  version, b: slot, c: offset in slot; payload follows (two-sided transports)
  kLanded = 4,   // a:  version, b: bucket index, c: slot, d: bytes
  kControl = 5,  // payload: one JSON control message (coordinator protocol)
  kBye = 6,      // orderly close
};

struct FrameHeader {
  std::uint32_t magic = kFrameMagic;
  FrameType type = FrameType::kHello;
  std::uint16_t flags = 0;
  std::uint64_t a = 0, b = 0, c = 0, d = 0;
  std::uint64_t payload_bytes = 0;
};

class Link {
 public:
  // Takes ownership of a connected socket. `peer` names the other side in
  // errors ("engine rank 1 at 127.0.0.1:4000").
  Link(int fd, std::string peer);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Connects to host:port, retrying refused connections (short sleeps) until
  // the deadline; then fails with kUnavailable naming the address and the
  // last error. Errors name the peer as "<peer> at <host:port>".
  static StatusOr<std::unique_ptr<Link>> Connect(const std::string& host_port, std::string peer,
                                                  Deadline deadline);

  // Sends one frame; the magic on the wire is always kFrameMagic.
  // REQUIRES: payload.size() == header.payload_bytes, or payload is empty and
  // the caller streams exactly header.payload_bytes with send_bytes next.
  Status send(const FrameHeader& header, std::span<const std::byte> payload, Deadline deadline);
  // Receives the next header; the caller must then read exactly
  // header.payload_bytes with recv_payload (or skip_payload).
  // `max_payload` bounds what this receiver accepts for this frame.
  // A bad frame (wrong magic, unknown type, payload over the bound) leaves the
  // stream out of sync: the link must be dropped after that error.
  StatusOr<FrameHeader> recv_header(Deadline deadline, std::uint64_t max_payload = kMaxFramePayload);
  Status recv_payload(std::span<std::byte> out, Deadline deadline);
  // Reads and discards `bytes` payload bytes.
  Status skip_payload(std::uint64_t bytes, Deadline deadline);

  // Raw helpers for transports that stream payload themselves.
  Status send_bytes(std::span<const std::byte> bytes, Deadline deadline);

  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  // Wakes any blocked call on this link with an error; idempotent.
  void shutdown();
  // Takes over `fresh`'s connection and peer name, closing this link's own;
  // `fresh` is left closed. Recovery after a failed refit reconnects this way,
  // keeping the Link object that transports hold a pointer to.
  // REQUIRES: no call is in progress on either link.
  void adopt(Link& fresh);

 private:
  int fd_;
  std::string peer_;
};

// A listening TCP socket.
class Listener {
 public:
  // host may be "127.0.0.1", "0.0.0.0", "::1"; port 0 picks a free port.
  static StatusOr<std::unique_ptr<Listener>> Listen(const std::string& host, int port);
  ~Listener();
  StatusOr<std::unique_ptr<Link>> accept(Deadline deadline);
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  std::string address() const;  // "host:port"
  int fd() const { return fd_; }

 private:
  Listener(int fd, std::string host, int port) : fd_(fd), host_(std::move(host)), port_(port) {}
  int fd_;
  std::string host_;
  int port_;
};

// Splits "host:port" (also "[::1]:port"); port 0..65535. Anything else
// (no port, unbracketed IPv6, junk) is kInvalidArgument naming the input.
Status split_host_port(const std::string& host_port, std::string* host, int* port);

}  // namespace refit
