#include "refit/status.h"

#include <cerrno>
#include <cstring>

namespace refit {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kFailedPrecondition: return "failed_precondition";
    case StatusCode::kNotFound: return "not_found";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kAborted: return "aborted";
    case StatusCode::kDeadlineExceeded: return "deadline_exceeded";
    case StatusCode::kDataLoss: return "data_loss";
    case StatusCode::kResourceExhausted: return "resource_exhausted";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

Status status_from_text(std::string_view text) {
  if (text == "ok") return Status::Ok();
  for (int c = static_cast<int>(StatusCode::kInvalidArgument); c <= static_cast<int>(StatusCode::kInternal); ++c) {
    const auto code = static_cast<StatusCode>(c);
    const std::string prefix = std::string(status_code_name(code)) + ": ";
    if (text.substr(0, prefix.size()) == prefix) return Status(code, std::string(text.substr(prefix.size())));
  }
  return Status(StatusCode::kAborted, std::string(text));
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string out(status_code_name(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

Status ErrnoStatus(std::string_view what, int err) {
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE: code = StatusCode::kResourceExhausted; break;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH: code = StatusCode::kUnavailable; break;
    case ETIMEDOUT: code = StatusCode::kDeadlineExceeded; break;
    case ENOENT: code = StatusCode::kNotFound; break;
    case EINVAL:
    // A path that names no file refit can open (a symbolic link loop, a
    // file used as a directory, a name too long, a socket): the caller's
    // argument, named in `what`, never an internal error.
    case ELOOP:
    case ENOTDIR:
    case ENAMETOOLONG:
    case EISDIR:
    case ENXIO:
    case ENODEV:
    case EOVERFLOW: code = StatusCode::kInvalidArgument; break;
    case EEXIST:
    case EADDRINUSE:
    case EACCES:
    case EPERM: code = StatusCode::kFailedPrecondition; break;
    default: break;
  }
  std::string m(what);
  m += ": ";
  m += std::strerror(err);
  return Status(code, std::move(m));
}

}  // namespace refit
