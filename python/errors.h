// refit's exceptions in Python: Status codes (status.h) become exception
// classes, messages kept word for word.
//
//   refit.Error                       base of every refit failure (.code: "aborted", ...)
//     InvalidArgumentError            also a ValueError: the caller passed bad input
//     FailedPreconditionError         an operator must fix something (configuration)
//     NotFoundError, UnavailableError, AbortedError, DeadlineExceededError,
//     DataLossError, ResourceExhaustedError, InternalError
//
// Thread safety: throw_status and friends need the GIL (they set the Python
// error indicator).
#pragma once

#include <pybind11/pybind11.h>

#include <utility>

#include "refit/status.h"

namespace refit::python {

// Creates the exception classes as attributes of `module`. Called once.
void register_errors(pybind11::module_& module);

// The class for `code` (refit.Error for a code without its own class).
pybind11::handle exception_class(StatusCode code);

// Raises the exception of status.code() carrying status.message(), with
// `cause` (when not None) as its __cause__. REQUIRES: !status.ok().
[[noreturn]] void throw_status(const Status& status, pybind11::object cause = pybind11::none());

inline void check(const Status& status) {
  if (!status.ok()) throw_status(status);
}

template <typename T>
T value_or_throw(StatusOr<T> result) {
  if (!result.ok()) throw_status(result.status());
  return std::move(result).value();
}

// The Status of a Python exception caught as error_already_set: code `code`,
// message "<context> <Type>: <text>" (e.g. "load_fn raised ValueError: bad
// shape"). REQUIRES: the GIL.
Status status_from_python(const pybind11::error_already_set& error, StatusCode code, const std::string& context);

}  // namespace refit::python
