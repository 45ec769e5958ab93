// Secret: the job's shared secret. Every rank proves it knows it to the
// coordinator, the coordinator proves it to every rank, and trainer ranks
// prove it to the engine ranks they feed (HMAC-SHA256 challenge-response;
// docs/DESIGN.md "Authentication"). An empty secret means no
// authentication, which a coordinator or an engine accepts only on a
// loopback address.
//
// Thread safety: a Secret is an immutable value.
#pragma once

#include <cstddef>
#include <string>

#include "refit/status.h"

namespace refit {

// Shortest secret accepted: 16 bytes (128 bits if random).
inline constexpr std::size_t kMinSecretBytes = 16;
inline constexpr std::size_t kMaxSecretBytes = 64 * 1024;

// The shared secret, or none (empty: no authentication). The bytes are
// overwritten when the object is destroyed.
class Secret {
 public:
  Secret() = default;
  // REQUIRES: bytes is empty or between kMinSecretBytes and kMaxSecretBytes
  // long (FromBytes checks it).
  explicit Secret(std::string bytes) : bytes_(std::move(bytes)) {}
  Secret(const Secret& other) = default;
  Secret& operator=(const Secret& other);
  ~Secret();

  // `bytes` as a secret, checking its length; `source` names it in errors.
  static StatusOr<Secret> FromBytes(std::string bytes, const std::string& source);
  // The file's contents without one trailing newline ("\n" or "\r\n"). A
  // file that group or others may access (mode & 077) is read, with a
  // warning through refit::log naming the file and its mode, once per file
  // and process.
  static StatusOr<Secret> FromFile(const std::string& path);
  // What the CLI takes: --secret-file `file` when not empty, else the value
  // of REFIT_SECRET (`env_value`, read by the caller; nullptr or "" when
  // unset), else none.
  static StatusOr<Secret> Resolve(const std::string& file, const char* env_value);

  bool empty() const { return bytes_.empty(); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

}  // namespace refit
