// Status and StatusOr<T>: the one error convention of refit.
//
// Every fallible function returns a Status (or a StatusOr<T>). A Status is
// cheap on success (no allocation) and carries a canonical code plus a message
// that says what was being done, to which rank/tensor/peer, and what was
// expected. The codes map to retry policy:
//   kUnavailable        retry the call (a peer is not reachable yet)
//   kAborted            retry the whole refit (a peer failed mid-refit)
//   kFailedPrecondition an operator must fix something (configuration)
//   kInvalidArgument    the caller passed bad input (flags, specs, messages)
//   kDeadlineExceeded   a wait ran past its deadline
//   kDataLoss           bytes arrived wrong (verification, checksum)
//   kResourceExhausted  memory, shared memory or descriptors ran out
//   kInternal           a bug in refit
//
// Thread safety: Status and StatusOr are values; distinct objects may be used
// from distinct threads freely.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace refit {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kFailedPrecondition,
  kNotFound,
  kUnavailable,
  kAborted,
  kDeadlineExceeded,
  kDataLoss,
  kResourceExhausted,
  kInternal,
};

// Stable lowercase name of a code ("invalid_argument", ...).
std::string_view status_code_name(StatusCode code);

class Status;
// The Status whose ToString() is `text` ("invalid_argument: <message>";
// "ok" is OK), as a report or another process wrote it; a text without a
// known code name is kAborted with the whole text as its message.
Status status_from_text(std::string_view text);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "invalid_argument: <message>", or "ok".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>"; OK stays OK.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Status from errno: "<what>: <strerror(err)>", code chosen from errno.
Status ErrnoStatus(std::string_view what, int err);

// Either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : value_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(value_).ok() && "StatusOr built from an OK status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(value_); }
  Status status() const { return ok() ? Status() : std::get<Status>(value_); }

  // REQUIRES: ok().
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> value_;
};

}  // namespace refit

#define REFIT_CONCAT_INNER_(a, b) a##b
#define REFIT_CONCAT_(a, b) REFIT_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    ::refit::Status refit_status_ = (expr);   \
    if (!refit_status_.ok()) return refit_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, StatusOrExpr)`: declares/assigns lhs from the value
// or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(REFIT_CONCAT_(refit_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
