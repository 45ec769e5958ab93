// Mutual challenge-response authentication over a connected Link, with a
// shared secret that never crosses the wire.
//
// Each side sends a fresh 32-byte random nonce (getrandom) and the other
// answers with HMAC-SHA256(secret, label || direction || context ||
// server_nonce || client_nonce) (auth_mac). The server (the side that
// accepted the connection) checks the client's MAC first, in constant time
// (CRYPTO_memcmp), and only then proves itself, so a peer without the secret
// never obtains a MAC it did not already know. The client refuses a server
// that cannot prove it knows the secret (a fake coordinator), and, when it
// has a secret, a server that does not authenticate at all.
//
// Wire: kControl frames of at most kMaxAuthMessageBytes each (control
// messages, validated by control_message.h before use):
//   server -> client  {"type":"auth_challenge","protocol":1,"auth":"hmac-sha256","nonce":<64 hex>}
//                     ("auth":"none" and no nonce: the server has no secret)
//   client -> server  {"type":"auth_response","auth":"hmac-sha256","nonce":<64 hex>,"mac":<64 hex>}
//                     ("auth":"none": the client has no secret)
//   server -> client  {"type":"auth_ok","mac":<64 hex>}   (no mac when neither side has a secret)
//                     or {"type":"error","error":{"code":..,"message":..}}: refused, and why
// A client that refuses the server sends {"type":"error",...} instead of a
// response, so the server can log why.
//
// What this gives: only holders of the secret get past the handshake, in
// both directions, and a recorded handshake cannot be replayed (fresh nonces
// on both sides). What it does not give: confidentiality or integrity of the
// messages that follow; an attacker who can rewrite TCP traffic between two
// honest peers can relay a handshake and hijack the connection. Run refit
// on a trusted network (or inside a tunnel) when that matters
// (docs/RELIABILITY.md).
//
// The same two calls authenticate any Link: the control plane uses
// kControlAuthContext, the data plane data_auth_context(engine rank), so a
// handshake of one kind of link is never valid for another, nor a data
// handshake for another engine rank.
//
// Thread safety: Secret is an immutable value. The two calls use the Link
// like any other send/receive (one thread at a time on that link).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "refit/deadline.h"
#include "net/link.h"
#include "refit/secret.h"
#include "refit/status.h"

namespace refit {

inline constexpr std::string_view kControlAuthContext = "refit control v1";
// Data plane (trainer rank -> engine rank): "refit data v1 -> engine rank N".
inline constexpr std::string_view kDataAuthContext = "refit data v1";
// How long an engine rank gives one data connection to authenticate (and,
// without a secret, to send its hello) after its accept, bounded by the
// setup deadline; handshakes run concurrently (runtime/data_links.h), so a
// silent stranger delays no trainer rank.
inline constexpr std::chrono::milliseconds kDataAuthTimeout{5000};
inline constexpr std::uint64_t kMaxAuthMessageBytes = 4096;
inline constexpr std::size_t kAuthNonceBytes = 32;
inline constexpr std::size_t kAuthMacBytes = 32;  // SHA-256
using AuthNonce = std::array<unsigned char, kAuthNonceBytes>;
using AuthMac = std::array<unsigned char, kAuthMacBytes>;

enum class AuthDirection { kClientProof, kServerProof };

// HMAC-SHA256(secret, "refit-auth-v1" 0x00 <direction> 0x00 <len(context) as
// 8 bytes LE> <context> <server_nonce> <client_nonce>), where direction is
// "client" or "server". REQUIRES: !secret.empty().
AuthMac auth_mac(const Secret& secret, AuthDirection direction, std::string_view context, const AuthNonce& server_nonce,
                 const AuthNonce& client_nonce);

// 127.0.0.0/8, ::1 or "localhost": only this host's processes can connect.
bool is_loopback_host(const std::string& host);

// Whether a process may listen on `host` with `secret`: a job without a
// secret listens on loopback addresses only, where only this host's
// processes reach it. kFailedPrecondition otherwise, naming `who` ("engine
// rank 0's data port") and `listen` (what it was asked to listen on).
Status check_listen_without_secret(const std::string& host, const Secret& secret, const std::string& who,
                                   const std::string& listen);

// The context of the data link into engine rank `engine_rank`:
// kDataAuthContext + " -> engine rank " + engine_rank.
std::string data_auth_context(int engine_rank);

// 32 random bytes from getrandom(2).
StatusOr<AuthNonce> random_nonce();

// Lowercase hex; parse_auth_hex accepts exactly 2*N lowercase hex digits.
std::string auth_hex(std::span<const unsigned char> bytes);
template <std::size_t N>
bool parse_auth_hex(std::string_view text, std::array<unsigned char, N>* out);

// Server side: challenges the peer of `link` and proves itself.
// OK: the peer proved it knows `secret` (or neither side has one).
// Otherwise the peer was told why (best effort), and the status says why,
// naming link.peer(); kFailedPrecondition for a refusal (wrong secret, a
// peer without a secret when this side has one, or the reverse),
// kInvalidArgument for a malformed message, kUnavailable/kDeadlineExceeded
// when the peer left or stalled.
Status authenticate_as_server(Link& link, const Secret& secret, std::string_view context, Deadline deadline);

// The reason of authenticate_as_server's failure without its leading
// "refused <peer>: ", for a caller that names the peer itself (so that
// the log reads "refused a connection from X: wrong secret ...", not
// "refused a connection from X: refused X: wrong secret ...").
std::string refusal_reason(const Status& refused, const std::string& peer);

// Client side: answers the server's challenge and checks its proof.
// OK: the server proved it knows `secret` (or neither side has one).
// kFailedPrecondition when the server refused us (its reason is quoted), did
// not prove it knows the secret, or does not authenticate while we have a
// secret. Errors name link.peer().
Status authenticate_as_client(Link& link, const Secret& secret, std::string_view context, Deadline deadline);

// ---- implementation of the template

template <std::size_t N>
bool parse_auth_hex(std::string_view text, std::array<unsigned char, N>* out) {
  if (text.size() != 2 * N) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < N; ++i) {
    int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

}  // namespace refit
