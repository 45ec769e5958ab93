// Fuzz target: the authentication handshake (src/control/auth.cc) against a
// hostile peer, on both sides: the coordinator's (authenticate_as_server)
// reading a would-be rank's response, and a rank's (authenticate_as_client)
// reading a would-be coordinator's challenge and verdict.
//
// Input: byte 0: bit 0 picks the side (1: client), bit 1 gives this side a
// secret; the rest is the peer's byte stream (kControl frames). A peer
// without the secret must never be accepted when this side has one: the
// target traps if it is (the fuzzer cannot forge an HMAC, so acceptance
// would mean a check was skipped).
#include <chrono>

#include "control/auth.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > refit::fuzz::kMaxFedBytes) return 0;
  static const refit::Secret kSecret("fuzz-secret-0123456789abcdef");
  const bool client = (data[0] & 1) != 0;
  const refit::Secret secret = (data[0] & 2) ? kSecret : refit::Secret();
  refit::fuzz::FedLink fed(refit::fuzz::as_text(data + 1, size - 1));
  const auto deadline = refit::Deadline::After(std::chrono::seconds(5));
  refit::Status s = client ? refit::authenticate_as_client(fed.link(), secret, refit::kControlAuthContext, deadline)
                           : refit::authenticate_as_server(fed.link(), secret, refit::kControlAuthContext, deadline);
  if (s.ok() && !secret.empty()) __builtin_trap();  // authenticated without knowing the secret
  return 0;
}
