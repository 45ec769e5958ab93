// Tests of the control plane's mutual challenge-response authentication
// (control/auth.h) over real loopback sockets. Each test names the broken
// implementation it catches ("Catches: ...").
#include "control/auth.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "control/control_message.h"
#include "refit/log.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

using namespace std::chrono_literals;

const Secret kSecret("0123456789abcdef-the-shared-secret");
const Secret kOther("fedcba9876543210-another-secret!!");

struct Pair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Link> client, server;
};

Pair Connected() {
  Pair p;
  auto l = Listener::Listen("127.0.0.1", 0);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  p.listener = std::move(*l);
  auto c = Link::Connect(p.listener->address(), "the coordinator", Deadline::After(5s));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  p.client = std::move(*c);
  auto s = p.listener->accept(Deadline::After(5s));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  p.server = std::move(*s);
  return p;
}

struct Outcome {
  Status server, client;
};

// Runs both sides of one handshake, the server on a thread.
Outcome Handshake(const Secret& server_secret, const Secret& client_secret,
                  std::string_view server_context = kControlAuthContext,
                  std::string_view client_context = kControlAuthContext) {
  Pair p = Connected();
  auto server = std::async(std::launch::async, [&] {
    return authenticate_as_server(*p.server, server_secret, server_context, Deadline::After(5s));
  });
  Outcome o;
  o.client = authenticate_as_client(*p.client, client_secret, client_context, Deadline::After(5s));
  o.server = server.get();
  return o;
}

// Catches: either side failing a correct handshake (a MAC computed over
// different bytes on the two sides, a proof sent in the wrong field).
TEST(Auth, SameSecretAuthenticatesBothWays) {
  Outcome o = Handshake(kSecret, kSecret);
  EXPECT_TRUE(o.server.ok()) << o.server.ToString();
  EXPECT_TRUE(o.client.ok()) << o.client.ToString();
}

// Catches: a server that does not compare the client's MAC (or compares a
// prefix), and refusals without a reason on either side.
TEST(Auth, WrongSecretIsRefusedAndBothSidesSayWhy) {
  Outcome o = Handshake(kSecret, kOther);
  EXPECT_EQ(o.server.code(), StatusCode::kFailedPrecondition) << o.server.ToString();
  EXPECT_HAS(o.server.message(), "wrong secret");
  EXPECT_HAS(o.server.message(), "127.0.0.1:");  // names the peer
  EXPECT_EQ(o.client.code(), StatusCode::kFailedPrecondition) << o.client.ToString();
  EXPECT_HAS(o.client.message(), "the coordinator");
  EXPECT_HAS(o.client.message(), "refused");
  EXPECT_HAS(o.client.message(), "wrong secret");
}

// Catches: a server with a secret that lets a client without one in.
TEST(Auth, ClientWithoutSecretIsRefused) {
  Outcome o = Handshake(kSecret, Secret());
  EXPECT_FALSE(o.server.ok());
  EXPECT_HAS(o.server.message(), "the peer has no secret");
  EXPECT_EQ(o.client.code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(o.client.message(), "requires authentication, but this side has no secret");
  EXPECT_HAS(o.client.message(), "REFIT_SECRET");
}

// A fake coordinator has no secret, so it offers no authentication.
// Catches: a client with a secret that accepts an unauthenticated server.
TEST(Auth, ClientWithSecretRefusesServerWithoutOne) {
  Outcome o = Handshake(Secret(), kSecret);
  EXPECT_EQ(o.client.code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(o.client.message(), "does not authenticate");
  EXPECT_FALSE(o.server.ok());  // and the server learns why
  EXPECT_HAS(o.server.message(), "refused to authenticate");
}

// Catches: a handshake that fails when neither side has a secret (the
// documented loopback-only mode).
TEST(Auth, NoSecretOnEitherSideConnects) {
  Outcome o = Handshake(Secret(), Secret());
  EXPECT_TRUE(o.server.ok()) << o.server.ToString();
  EXPECT_TRUE(o.client.ok()) << o.client.ToString();
}

// Catches: a MAC that does not cover the context (a data-plane handshake
// would then be valid on the control plane).
TEST(Auth, DifferentContextsDoNotAuthenticate) {
  Outcome o = Handshake(kSecret, kSecret, "refit control v1", "refit data trainer 0 -> engine 0");
  EXPECT_FALSE(o.server.ok());
  EXPECT_FALSE(o.client.ok());
}

// A fake server (no secret) that plays the protocol: it challenges, then
// answers auth_ok with `proof(client_response)` as its MAC.
Status ClientAgainstFakeServer(const std::function<std::string(const Json& response)>& proof) {
  Pair p = Connected();
  auto fake = std::async(std::launch::async, [&] {
    auto nonce = random_nonce();
    Json challenge{{"type", "auth_challenge"}, {"protocol", 1}, {"auth", "hmac-sha256"}, {"nonce", auth_hex(*nonce)}};
    if (!send_control(*p.server, challenge, Deadline::After(5s)).ok()) return;
    auto response = recv_control(*p.server, Deadline::After(5s));
    if (!response.ok()) return;
    (void)send_control(*p.server, Json{{"type", "auth_ok"}, {"mac", proof(*response)}}, Deadline::After(5s));
  });
  Status s = authenticate_as_client(*p.client, kSecret, kControlAuthContext, Deadline::After(5s));
  fake.wait();
  return s;
}

// Catches: a client that does not check the server's proof, and a MAC that
// does not include the direction (then the client's own MAC, reflected back,
// would pass as the server's proof).
TEST(Auth, FakeServerCannotProveItKnowsTheSecret) {
  Status reflected = ClientAgainstFakeServer([](const Json& r) { return r.value("mac", std::string()); });
  EXPECT_EQ(reflected.code(), StatusCode::kFailedPrecondition) << reflected.ToString();
  EXPECT_HAS(reflected.message(), "failed to prove it knows the secret");
  Status garbage = ClientAgainstFakeServer([](const Json&) { return std::string(64, 'a'); });
  EXPECT_HAS(garbage.message(), "failed to prove it knows the secret");
  Status missing = ClientAgainstFakeServer([](const Json&) { return std::string("zz"); });
  EXPECT_HAS(missing.message(), "did not prove it knows the secret");
}

// Catches: a server that sends its proof before checking the client's (an
// oracle for anyone who connects), and one that reuses its nonce (a recorded
// response could then be replayed).
TEST(Auth, ServerProvesNothingToAWrongClientAndNoncesAreFresh) {
  Pair a = Connected();
  auto server_a = std::async(std::launch::async, [&] {
    return authenticate_as_server(*a.server, kSecret, kControlAuthContext, Deadline::After(5s));
  });
  auto challenge_a = recv_control(*a.client, Deadline::After(5s));
  ASSERT_TRUE(challenge_a.ok()) << challenge_a.status().ToString();
  AuthNonce server_nonce{}, client_nonce{};
  ASSERT_TRUE(parse_auth_hex((*challenge_a)["nonce"].get<std::string>(), &server_nonce));
  client_nonce.fill(7);
  // A correct response for connection a, recorded...
  Json recorded{{"type", "auth_response"},
                {"auth", "hmac-sha256"},
                {"nonce", auth_hex(client_nonce)},
                {"mac", auth_hex(auth_mac(kSecret, AuthDirection::kClientProof, kControlAuthContext, server_nonce,
                                          client_nonce))}};
  // ...but first a wrong one on connection a: refused, and no MAC comes back.
  Json wrong = recorded;
  wrong["mac"] = std::string(64, '0');
  ASSERT_TRUE(send_control(*a.client, wrong, Deadline::After(5s)).ok());
  auto verdict = recv_control(*a.client, Deadline::After(5s));
  ASSERT_TRUE(verdict.ok()) << verdict.status().ToString();
  EXPECT_EQ((*verdict)["type"], "error");
  EXPECT_FALSE(verdict->contains("mac"));
  EXPECT_FALSE(server_a.get().ok());

  // Replaying the recorded response on a new connection fails: new nonce.
  Pair b = Connected();
  auto server_b = std::async(std::launch::async, [&] {
    return authenticate_as_server(*b.server, kSecret, kControlAuthContext, Deadline::After(5s));
  });
  auto challenge_b = recv_control(*b.client, Deadline::After(5s));
  ASSERT_TRUE(challenge_b.ok());
  EXPECT_NE((*challenge_b)["nonce"], (*challenge_a)["nonce"]);
  ASSERT_TRUE(send_control(*b.client, recorded, Deadline::After(5s)).ok());
  Status replayed = server_b.get();
  EXPECT_EQ(replayed.code(), StatusCode::kFailedPrecondition) << replayed.ToString();
  EXPECT_HAS(replayed.message(), "wrong secret");
}

// Catches: reading an unauthenticated peer's frame with the control plane's
// 64 MiB bound (memory for anyone who connects) instead of the auth bound.
TEST(Auth, OversizedFrameFromAnUnauthenticatedPeerIsRefusedUnread) {
  Pair p = Connected();
  auto server = std::async(std::launch::async, [&] {
    return authenticate_as_server(*p.server, kSecret, kControlAuthContext, Deadline::After(5s));
  });
  ASSERT_TRUE(recv_control(*p.client, Deadline::After(5s)).ok());  // the challenge
  FrameHeader h;
  h.type = FrameType::kControl;
  h.payload_bytes = 1 << 20;
  ASSERT_TRUE(p.client->send(h, {}, Deadline::After(5s)).ok());  // header only: the payload never comes
  auto start = std::chrono::steady_clock::now();
  Status s = server.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);  // did not wait for the payload
  EXPECT_HAS(s.message(), "more than the 4096 accepted");
}

// Catches: a handshake without a deadline (a silent peer would hold the
// coordinator's handshake forever).
TEST(Auth, SilentPeerFailsAtTheDeadline) {
  Pair p = Connected();
  auto start = std::chrono::steady_clock::now();
  Status s = authenticate_as_server(*p.server, kSecret, kControlAuthContext, Deadline::After(300ms));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 3s);
}

// Catches: a peer that does not speak the protocol (an old rank sending its
// join first) being taken for authenticated, or refused without a reason.
TEST(Auth, PeerThatSkipsAuthenticationIsRefusedWithAReason) {
  Pair p = Connected();
  auto server = std::async(std::launch::async, [&] {
    return authenticate_as_server(*p.server, kSecret, kControlAuthContext, Deadline::After(5s));
  });
  ASSERT_TRUE(recv_control(*p.client, Deadline::After(5s)).ok());
  ASSERT_TRUE(send_control(*p.client, Json{{"type", "join"}, {"role", "engine"}, {"rank", 0}}, Deadline::After(5s)).ok());
  auto verdict = recv_control(*p.client, Deadline::After(5s));
  ASSERT_TRUE(verdict.ok());
  EXPECT_EQ((*verdict)["type"], "error");
  EXPECT_HAS((*verdict)["error"]["message"].get<std::string>(), "expected 'auth_response', got 'join'");
  EXPECT_FALSE(server.get().ok());
}

// The MAC is the documented HMAC over the documented layout, computed here
// independently with OpenSSL. Catches: a layout change (which would break
// compatibility between versions) and a MAC that ignores any of its inputs.
TEST(AuthMac, MatchesTheDocumentedLayoutAndCoversEveryInput) {
  AuthNonce s{}, c{};
  for (std::size_t i = 0; i < s.size(); ++i) {
    s[i] = static_cast<unsigned char>(i);
    c[i] = static_cast<unsigned char>(255 - i);
  }
  std::string data = std::string("refit-auth-v1") + '\0' + "client" + '\0';
  std::string ctx = "ctx";
  data += std::string("\x03\0\0\0\0\0\0\0", 8) + ctx;
  data.append(reinterpret_cast<const char*>(s.data()), s.size());
  data.append(reinterpret_cast<const char*>(c.data()), c.size());
  unsigned char expected[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), kSecret.bytes().data(), static_cast<int>(kSecret.bytes().size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), expected, &len);
  AuthMac mac = auth_mac(kSecret, AuthDirection::kClientProof, ctx, s, c);
  EXPECT_EQ(auth_hex(mac), auth_hex(std::span<const unsigned char>(expected, 32)));

  AuthNonce s2 = s, c2 = c;
  s2[5] ^= 1;
  c2[31] ^= 1;
  EXPECT_NE(auth_mac(kSecret, AuthDirection::kServerProof, ctx, s, c), mac);
  EXPECT_NE(auth_mac(kOther, AuthDirection::kClientProof, ctx, s, c), mac);
  EXPECT_NE(auth_mac(kSecret, AuthDirection::kClientProof, "ctx2", s, c), mac);
  EXPECT_NE(auth_mac(kSecret, AuthDirection::kClientProof, ctx, s2, c), mac);
  EXPECT_NE(auth_mac(kSecret, AuthDirection::kClientProof, ctx, s, c2), mac);
  // Swapping the nonces' roles changes the MAC too.
  EXPECT_NE(auth_mac(kSecret, AuthDirection::kClientProof, ctx, c, s), mac);
}

// Catches: a hex parser that accepts uppercase, odd lengths or junk (two
// spellings of one MAC), or an encoder that is not the parser's inverse.
TEST(AuthHex, StrictLowercaseRoundTrip) {
  AuthNonce n{};
  for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<unsigned char>(i * 37);
  std::string hex = auth_hex(n);
  AuthNonce back{};
  ASSERT_TRUE(parse_auth_hex(hex, &back));
  EXPECT_EQ(back, n);
  std::string upper = hex;
  upper[1] = 'A';
  EXPECT_FALSE(parse_auth_hex("0" + hex.substr(1, 62), &back));  // 63 digits
  EXPECT_FALSE(parse_auth_hex(hex + "00", &back));
  EXPECT_FALSE(parse_auth_hex(std::string(64, 'g'), &back));
  hex[1] = 'A';
  EXPECT_FALSE(parse_auth_hex(hex, &back));
}

// Catches: two nonces in a row being equal (no randomness).
TEST(AuthNonceTest, RandomNoncesDiffer) {
  auto a = random_nonce(), b = random_nonce();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
}

class SecretFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/refit-secret-XXXXXX";
    int fd = ::mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    ::close(fd);
    path_ = tmpl;
  }
  void TearDown() override { std::remove(path_.c_str()); }
  void Write(const std::string& text) { std::ofstream(path_, std::ios::binary) << text; }
  std::string path_;
};

// Catches: a secret that keeps the file's trailing newline (then
// `echo secret > file` on one side and REFIT_SECRET=secret on the other
// would never match), or that strips more than one line ending.
TEST_F(SecretFile, TrailingNewlineIsNotPartOfTheSecret) {
  Write("0123456789abcdef-the-shared-secret\n");
  auto s = Secret::FromFile(path_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->bytes(), kSecret.bytes());
  Write("0123456789abcdef-the-shared-secret\r\n");
  EXPECT_EQ(Secret::FromFile(path_)->bytes(), kSecret.bytes());
  Write("0123456789abcdef-the-shared-secret\n\n");
  EXPECT_EQ(Secret::FromFile(path_)->bytes(), kSecret.bytes() + "\n");
}

// Catches: accepting a short (guessable) or empty secret, and errors that do
// not name the source and the length.
TEST_F(SecretFile, ShortOrMissingSecretsAreRefusedNamingTheSource) {
  Write("short\n");
  auto s = Secret::FromFile(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_HAS(s.status().message(), path_);
  EXPECT_HAS(s.status().message(), "is 5 bytes long");
  Write("");
  EXPECT_FALSE(Secret::FromFile(path_).ok());
  auto missing = Secret::FromFile(path_ + "-missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_HAS(missing.status().message(), path_ + "-missing");
  auto env = Secret::Resolve("", "tiny");
  ASSERT_FALSE(env.ok());
  EXPECT_HAS(env.status().message(), "REFIT_SECRET");
}

// Catches: the environment overriding an explicit --secret-file, and an
// unset or empty variable meaning anything but "no secret".
TEST_F(SecretFile, FileWinsOverTheEnvironmentWhichWinsOverNone) {
  Write("0123456789abcdef-the-shared-secret");
  auto from_file = Secret::Resolve(path_, "fedcba9876543210-another-secret!!");
  ASSERT_TRUE(from_file.ok());
  EXPECT_EQ(from_file->bytes(), kSecret.bytes());
  auto from_env = Secret::Resolve("", "fedcba9876543210-another-secret!!");
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(from_env->bytes(), kOther.bytes());
  EXPECT_TRUE(Secret::Resolve("", nullptr)->empty());
  EXPECT_TRUE(Secret::Resolve("", "")->empty());
}

// Catches: a secret file that others may read accepted without a word, a
// warning that names neither the file nor its mode, one said again each time
// the same process reads the file, and one for a private (0600) file.
// Mutations tried: the mode check removed from Secret::FromFile (no
// warning: fails), and the once-per-file set left out (two warnings: fails).
TEST_F(SecretFile, AFileOthersMayReadIsWarnedAboutOnce) {
  Write("0123456789abcdef-the-shared-secret\n");
  std::vector<std::string> warnings;
  set_log_sink([&](LogLevel level, std::string_view, std::string_view message) {
    if (level == LogLevel::kWarning) warnings.emplace_back(message);
  });
  ASSERT_EQ(::chmod(path_.c_str(), 0600), 0);
  ASSERT_TRUE(Secret::FromFile(path_).ok());
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  ASSERT_EQ(::chmod(path_.c_str(), 0644), 0);
  ASSERT_TRUE(Secret::FromFile(path_).ok());
  ASSERT_TRUE(Secret::Resolve(path_, nullptr).ok());
  set_log_sink({});
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_HAS(warnings[0], "the secret file " + path_ + " has mode 0644");
  EXPECT_HAS(warnings[0], "chmod 600 " + path_);
}

}  // namespace
}  // namespace refit
