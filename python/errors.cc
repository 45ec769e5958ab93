// Status codes as Python exception classes: see errors.h.
#include "errors.h"

#include <array>
#include <string>

namespace py = pybind11;

namespace refit::python {
namespace {

struct ErrorClass {
  StatusCode code;
  const char* name;
  PyObject* extra_base;  // a builtin it also derives from, or nullptr
  const char* doc;
};

// Indexed by the StatusCode value (kOk has the base class).
constexpr int kCodes = static_cast<int>(StatusCode::kInternal) + 1;
std::array<PyObject*, kCodes> g_classes{};
PyObject* g_base = nullptr;

}  // namespace

void register_errors(py::module_& module) {
  g_base = PyErr_NewExceptionWithDoc("refit.Error",
                                     "Base class of every refit failure. `code` names the kind "
                                     "(status.h: invalid_argument, failed_precondition, aborted, ...).",
                                     PyExc_Exception, nullptr);
  if (g_base == nullptr) throw py::error_already_set();
  PyObject_SetAttrString(g_base, "code", py::str("unknown").ptr());
  module.add_object("Error", py::handle(g_base));
  g_classes.fill(g_base);

  const ErrorClass classes[] = {
      {StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError,
       "The caller passed bad input: a tensor, a spec, a setting (also a ValueError)."},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError", nullptr,
       "The job's configuration cannot work; an operator must fix something."},
      {StatusCode::kNotFound, "NotFoundError", nullptr, "Something named does not exist."},
      {StatusCode::kUnavailable, "UnavailableError", nullptr, "A peer is not reachable (retry the call)."},
      {StatusCode::kAborted, "AbortedError", nullptr, "A refit failed somewhere in the job (retry the refit)."},
      {StatusCode::kDeadlineExceeded, "DeadlineExceededError", nullptr, "A wait ran past its deadline."},
      {StatusCode::kDataLoss, "DataLossError", nullptr, "Bytes arrived wrong (verification)."},
      {StatusCode::kResourceExhausted, "ResourceExhaustedError", nullptr,
       "Memory, shared memory or descriptors ran out."},
      {StatusCode::kInternal, "InternalError", nullptr, "A bug in refit."},
  };
  for (const ErrorClass& c : classes) {
    const std::string qualified = std::string("refit.") + c.name;
    py::object bases = c.extra_base ? py::object(py::make_tuple(py::handle(g_base), py::handle(c.extra_base)))
                                    : py::object(py::reinterpret_borrow<py::object>(g_base));
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), c.doc, bases.ptr(), nullptr);
    if (cls == nullptr) throw py::error_already_set();
    PyObject_SetAttrString(cls, "code", py::str(std::string(status_code_name(c.code))).ptr());
    module.add_object(c.name, py::handle(cls));
    g_classes[static_cast<std::size_t>(c.code)] = cls;  // one reference kept for the process's lifetime
  }
}

py::handle exception_class(StatusCode code) {
  const auto i = static_cast<std::size_t>(code);
  return i < g_classes.size() && g_classes[i] != nullptr ? py::handle(g_classes[i]) : py::handle(g_base);
}

void throw_status(const Status& status, py::object cause) {
  py::handle cls = exception_class(status.code());
  py::object error = cls(status.message());
  if (!cause.is_none()) error.attr("__cause__") = cause;
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw py::error_already_set();
}

Status status_from_python(const py::error_already_set& error, StatusCode code, const std::string& context) {
  const std::string type = py::str(error.type().attr("__name__"));
  const std::string text = py::str(error.value());
  return Status(code, context + " " + type + (text.empty() ? "" : ": " + text));
}

}  // namespace refit::python
