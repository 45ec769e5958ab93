#include "control/auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "control/control_message.h"
#include "core/regular_file.h"
#include "control/protocol.h"
#include "refit/log.h"

namespace refit {
namespace {

constexpr std::uint64_t kProtocol = 1;
constexpr const char* kMethod = "hmac-sha256";
constexpr const char* kNone = "none";
constexpr const char* kSecretHelp = "give both sides the same secret with --secret-file or REFIT_SECRET";

// Tells the peer why it is refused (best effort: it may be gone) and returns
// `why` for the caller to log.
Status refuse(Link& link, const Status& why, Deadline deadline) {
  (void)send_message(link, AuthMessage(Refusal{why}), deadline.min(Deadline::After(std::chrono::milliseconds(1000))));
  return Status(why.code(), "refused " + link.peer() + ": " + why.message());
}

}  // namespace

std::string refusal_reason(const Status& refused, const std::string& peer) {
  const std::string prefix = "refused " + peer + ": ";
  const std::string& why = refused.message();
  return why.rfind(prefix, 0) == 0 ? why.substr(prefix.size()) : why;
}

namespace {

StatusOr<Json> recv_auth(Link& link, Deadline deadline, const char* step) {
  auto message = recv_control(link, deadline, kMaxAuthMessageBytes);
  if (!message.ok()) return message.status().WithContext(std::string("authentication (") + step + ")");
  return message;
}

// The peer's next message, decoded; a malformed one is kInvalidArgument
// naming the peer.
StatusOr<AuthMessage> recv_auth_decoded(Link& link, Deadline deadline, const char* step) {
  ASSIGN_OR_RETURN(Json json, recv_auth(link, deadline, step));
  auto message = decode_auth_message(json);
  if (!message.ok()) return InvalidArgument("malformed control message from " + link.peer() + ": " + message.status().message());
  return message;
}

}  // namespace

// ---------------------------------------------------------------- Secret

namespace {

// A secret file that group or others may read is a secret shared with them:
// accepted (the job runs), but said once per file and process (a demo or a
// process that resolves its secret twice says it once).
void warn_if_others_may_read(const std::string& path, mode_t mode) {
  if ((mode & (S_IRWXG | S_IRWXO)) == 0) return;
  static std::mutex mu;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.insert(path).second) return;
  }
  char octal[8];
  std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode & 07777));
  log(LogLevel::kWarning, "refit",
      "warning: the secret file " + path + " has mode " + octal +
          ": users other than its owner may read it; chmod 600 " + path);
}

}  // namespace

Secret& Secret::operator=(const Secret& other) {
  if (this != &other) {
    if (!bytes_.empty()) OPENSSL_cleanse(bytes_.data(), bytes_.size());
    bytes_ = other.bytes_;
  }
  return *this;
}

Secret::~Secret() {
  if (!bytes_.empty()) OPENSSL_cleanse(bytes_.data(), bytes_.size());
}

StatusOr<Secret> Secret::FromBytes(std::string bytes, const std::string& source) {
  if (bytes.size() < kMinSecretBytes || bytes.size() > kMaxSecretBytes) {
    std::size_t n = bytes.size();
    OPENSSL_cleanse(bytes.data(), bytes.size());
    return InvalidArgument("the secret from " + source + " is " + std::to_string(n) + " bytes long; it must be " +
                           std::to_string(kMinSecretBytes) + " to " + std::to_string(kMaxSecretBytes) +
                           " bytes (e.g. head -c 32 /dev/urandom | base64)");
  }
  return Secret(std::move(bytes));
}

StatusOr<Secret> Secret::FromFile(const std::string& path) {
  // A FIFO or a device is refused before it is read, without blocking.
  ASSIGN_OR_RETURN(RegularFile file, open_regular_file(path, "the secret file " + path));
  warn_if_others_may_read(path, file.st.st_mode);
  const int fd = file.fd.get();
  std::string bytes(kMaxSecretBytes + 2, '\0');  // + "\r\n"
  std::size_t got = 0;
  while (got < bytes.size()) {
    ssize_t k = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int err = errno;
      OPENSSL_cleanse(bytes.data(), bytes.size());
      return ErrnoStatus("reading the secret file " + path, err);
    }
    if (k == 0) break;
    got += static_cast<std::size_t>(k);
  }
  std::size_t n = got;
  if (n > 0 && bytes[n - 1] == '\n') --n;
  if (n > 0 && bytes[n - 1] == '\r') --n;
  std::string secret(bytes.data(), n);
  OPENSSL_cleanse(bytes.data(), bytes.size());
  if (got == bytes.size()) {
    OPENSSL_cleanse(secret.data(), secret.size());
    return InvalidArgument("the secret file " + path + " is larger than " + std::to_string(kMaxSecretBytes) + " bytes");
  }
  return FromBytes(std::move(secret), "file " + path);
}

StatusOr<Secret> Secret::Resolve(const std::string& file, const char* env_value) {
  if (!file.empty()) return FromFile(file);
  if (env_value != nullptr && *env_value != '\0') return FromBytes(env_value, "REFIT_SECRET");
  return Secret();
}

// ---------------------------------------------------------------- listening

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

Status check_listen_without_secret(const std::string& host, const Secret& secret, const std::string& who,
                                   const std::string& listen) {
  if (!secret.empty() || is_loopback_host(host)) return Status::Ok();
  return FailedPrecondition("refusing to listen on " + listen + " for " + who +
                            " without a secret: any host that reaches it could feed it weights; give the "
                            "coordinator and every rank --secret-file (or REFIT_SECRET), or listen on a loopback "
                            "address");
}

// ---------------------------------------------------------------- primitives

AuthMac auth_mac(const Secret& secret, AuthDirection direction, std::string_view context, const AuthNonce& server_nonce,
                 const AuthNonce& client_nonce) {
  std::string data = "refit-auth-v1";
  data.push_back('\0');
  data += direction == AuthDirection::kClientProof ? "client" : "server";
  data.push_back('\0');
  for (int i = 0; i < 8; ++i) data.push_back(static_cast<char>(static_cast<std::uint64_t>(context.size()) >> (8 * i)));
  data.append(context);
  data.append(reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
  data.append(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  AuthMac mac{};
  unsigned int len = 0;
  unsigned char* ok = HMAC(EVP_sha256(), secret.bytes().data(), static_cast<int>(secret.bytes().size()),
                           reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac.data(), &len);
  // HMAC-SHA256 with an in-memory key cannot fail short of memory
  // exhaustion; an all-zero MAC then simply never matches.
  if (ok == nullptr || len != mac.size()) mac.fill(0);
  return mac;
}

std::string data_auth_context(int engine_rank) {
  return std::string(kDataAuthContext) + " -> engine rank " + std::to_string(engine_rank);
}

StatusOr<AuthNonce> random_nonce() {
  AuthNonce nonce{};
  std::size_t got = 0;
  while (got < nonce.size()) {
    ssize_t k = ::getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return ErrnoStatus("getrandom for an authentication nonce", errno);
    got += static_cast<std::size_t>(k);
  }
  return nonce;
}

std::string auth_hex(std::span<const unsigned char> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

// ---------------------------------------------------------------- server

Status authenticate_as_server(Link& link, const Secret& secret, std::string_view context, Deadline deadline) {
  const bool have = !secret.empty();
  AuthChallenge challenge{kProtocol, have ? kMethod : kNone, std::string()};
  AuthNonce server_nonce{};
  if (have) {
    ASSIGN_OR_RETURN(server_nonce, random_nonce());
    challenge.nonce = auth_hex(server_nonce);
  }
  RETURN_IF_ERROR(send_message(link, AuthMessage(challenge), deadline).WithContext("authentication (challenge)"));
  ASSIGN_OR_RETURN(Json json, recv_auth(link, deadline, "waiting for the response"));
  auto reply = decode_auth_message(json);
  if (reply.ok()) {
    if (const auto* refusal = std::get_if<Refusal>(&*reply)) {
      // The client refused us (it has a secret and we have none, ...).
      return FailedPrecondition(link.peer() + " refused to authenticate: " + refusal->error.message());
    }
  }
  const AuthResponse* response = reply.ok() ? std::get_if<AuthResponse>(&*reply) : nullptr;
  if (response == nullptr) {
    const std::string got = reply.ok() ? "got '" + message_name(*reply) + "'" : reply.status().message();
    return refuse(link,
                  InvalidArgument("authentication required first: expected 'auth_response', " + got +
                                  " (a client that does not speak refit's authentication protocol " +
                                  std::to_string(kProtocol) + "?)"),
                  deadline);
  }
  const std::string& method = response->auth;
  if (!have) {
    if (method != kNone) {
      return refuse(link, InvalidArgument("protocol error: answered '" + method + "' to a challenge without auth"),
                    deadline);
    }
    RETURN_IF_ERROR(send_message(link, AuthMessage(AuthOk{}), deadline).WithContext("authentication (ok)"));
    return Status::Ok();
  }
  if (method == kNone) {
    return refuse(link, FailedPrecondition(std::string("authentication required, but the peer has no secret (") +
                                           kSecretHelp + ")"),
                  deadline);
  }
  if (method != kMethod) {
    return refuse(link, InvalidArgument("unknown authentication method '" + method + "' (expected " + kMethod + ")"),
                  deadline);
  }
  AuthNonce client_nonce{};
  AuthMac client_mac{};
  if (!parse_auth_hex(response->nonce, &client_nonce) || !parse_auth_hex(response->mac, &client_mac)) {
    return refuse(link,
                  InvalidArgument("malformed auth_response: 'nonce' and 'mac' must each be " +
                                  std::to_string(2 * kAuthNonceBytes) + " lowercase hex digits"),
                  deadline);
  }
  if (CRYPTO_memcmp(client_nonce.data(), server_nonce.data(), client_nonce.size()) == 0) {
    return refuse(link, InvalidArgument("the response reuses the challenge's nonce"), deadline);
  }
  const AuthMac expected = auth_mac(secret, AuthDirection::kClientProof, context, server_nonce, client_nonce);
  if (CRYPTO_memcmp(expected.data(), client_mac.data(), expected.size()) != 0) {
    return refuse(link,
                  FailedPrecondition(std::string("wrong secret: the response's MAC does not match (") + kSecretHelp +
                                     ")"),
                  deadline);
  }
  const AuthMac proof = auth_mac(secret, AuthDirection::kServerProof, context, server_nonce, client_nonce);
  RETURN_IF_ERROR(
      send_message(link, AuthMessage(AuthOk{auth_hex(proof)}), deadline).WithContext("authentication (ok)"));
  return Status::Ok();
}

// ---------------------------------------------------------------- client

Status authenticate_as_client(Link& link, const Secret& secret, std::string_view context, Deadline deadline) {
  const bool have = !secret.empty();
  ASSIGN_OR_RETURN(AuthMessage first, recv_auth_decoded(link, deadline, "waiting for the challenge"));
  if (const auto* refusal = std::get_if<Refusal>(&first)) {
    return Status(refusal->error.code(), link.peer() + " refused the connection: " + refusal->error.message());
  }
  const auto* challenge = std::get_if<AuthChallenge>(&first);
  if (challenge == nullptr) {
    return InvalidArgument("protocol error: " + link.peer() + " sent '" + message_name(first) +
                           "' instead of an authentication challenge (not a refit server of protocol " +
                           std::to_string(kProtocol) + "?)");
  }
  if (challenge->protocol != kProtocol) {
    return FailedPrecondition(link.peer() + " speaks authentication protocol " + std::to_string(challenge->protocol) +
                              ", this side " + std::to_string(kProtocol));
  }
  const std::string& method = challenge->auth;
  auto finish = [&](const AuthResponse& response, const AuthNonce* server_nonce, const AuthNonce* client_nonce) -> Status {
    RETURN_IF_ERROR(send_message(link, AuthMessage(response), deadline).WithContext("authentication (response)"));
    ASSIGN_OR_RETURN(AuthMessage reply, recv_auth_decoded(link, deadline, "waiting for the verdict"));
    if (const auto* refusal = std::get_if<Refusal>(&reply)) {
      return FailedPrecondition(link.peer() + " refused this side's authentication: " + refusal->error.message());
    }
    const auto* ok = std::get_if<AuthOk>(&reply);
    if (ok == nullptr) {
      return InvalidArgument("protocol error: " + link.peer() + " answered the authentication with '" +
                             message_name(reply) + "'");
    }
    if (server_nonce == nullptr) return Status::Ok();
    AuthMac got{};
    if (!parse_auth_hex(ok->mac, &got)) {
      return FailedPrecondition(link.peer() + " did not prove it knows the secret (no valid 'mac' in auth_ok)");
    }
    const AuthMac expected = auth_mac(secret, AuthDirection::kServerProof, context, *server_nonce, *client_nonce);
    if (CRYPTO_memcmp(expected.data(), got.data(), expected.size()) != 0) {
      return FailedPrecondition(link.peer() +
                                " failed to prove it knows the secret (wrong MAC): not the expected server, or its "
                                "secret differs");
    }
    return Status::Ok();
  };

  if (method == kNone) {
    if (have) {
      Status why = FailedPrecondition(
          "this side has a secret, so it only trusts a server that proves it knows it; the server has none");
      (void)send_message(link, AuthMessage(Refusal{why}), deadline);
      return FailedPrecondition(link.peer() + " does not authenticate (it has no secret) but this side has one: " +
                                "refusing a server that cannot prove it knows the secret (" + kSecretHelp + ")");
    }
    return finish(AuthResponse{kNone, "", ""}, nullptr, nullptr);
  }
  if (method != kMethod) {
    return FailedPrecondition(link.peer() + " asks for authentication method '" + method + "', this side knows " +
                              kMethod);
  }
  AuthNonce server_nonce{};
  if (!parse_auth_hex(challenge->nonce, &server_nonce)) {
    return InvalidArgument("malformed authentication challenge from " + link.peer() + ": 'nonce' must be " +
                           std::to_string(2 * kAuthNonceBytes) + " lowercase hex digits");
  }
  if (!have) {
    // Tell the server (it logs the refusal), then say what to do.
    Status s = finish(AuthResponse{kNone, "", ""}, nullptr, nullptr);
    if (s.ok()) return s;
    return FailedPrecondition(link.peer() + " requires authentication, but this side has no secret (" + kSecretHelp +
                              ")");
  }
  ASSIGN_OR_RETURN(AuthNonce client_nonce, random_nonce());
  const AuthMac mac = auth_mac(secret, AuthDirection::kClientProof, context, server_nonce, client_nonce);
  return finish(AuthResponse{kMethod, auth_hex(client_nonce), auth_hex(mac)}, &server_nonce, &client_nonce);
}

}  // namespace refit
