// _refit.Coordinator: run_coordinator (refit/coordinator.h) on a
// background thread of the calling process.
//
// The constructor takes a CoordinatorOptions (every field, heartbeats
// included, as the package set it) and the secret's bytes, and returns once
// the socket listens (port known) or raises the setup error. wait() blocks,
// without the GIL, until the job ends and returns its JSON report as a dict
// (with "error" when it failed); it waits in slices of 200 ms and checks
// for Python signals between them, so Ctrl-C interrupts it. The thread
// never touches Python. Destroying the object waits for the job to end (it
// ends when every rank left, at the setup deadline when ranks never came,
// or once a rank is lost: heartbeat_timeout_s).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "bindings.h"
#include "refit/secret.h"
#include "refit/coordinator.h"
#include "refit/format.h"
#include "errors.h"

namespace py = pybind11;

namespace refit::python {
namespace {

class PyCoordinator {
 public:
  // `options`: as the package filled them in; `secret`: its bytes ("" for none).
  PyCoordinator(CoordinatorOptions options, const std::string& secret) : state_(std::make_shared<State>()) {
    if (!secret.empty()) options.secret = value_or_throw(Secret::FromBytes(secret, "Coordinator(secret=...)"));
    host_ = options.listen.substr(0, options.listen.rfind(':'));

    thread_ = std::thread([state = state_, options] {
      JobReport report = run_coordinator(options, [&state](int port) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->port = port;
        state->cv.notify_all();
      });
      std::lock_guard<std::mutex> lock(state->mu);
      state->report = std::move(report);
      state->done = true;
      state->cv.notify_all();
    });
    {
      // Untimed, and safe: run_coordinator calls on_listening right after
      // it bound its socket, or returns at once with the setup error.
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(state_->mu);
      state_->cv.wait(lock, [&] { return state_->port >= 0 || state_->done; });
    }
    if (state_->port < 0) {  // ended before listening: a setup error
      join();
      Status why = state_->report.status;
      check(why.ok() ? Aborted("the coordinator ended before listening") : why);
    }
  }

  ~PyCoordinator() { join(); }

  int port() const { return state_->port; }
  std::string address() const { return host_ + ":" + std::to_string(state_->port); }

  bool done() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done;
  }

  // The report once the job ended; DeadlineExceededError after `timeout_s`
  // (< 0: no limit: the job's own deadlines and heartbeats end it). Waits in
  // slices, checking for Python signals (KeyboardInterrupt) between them.
  py::object wait(double timeout_s) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point until =
        timeout_s < 0 ? Clock::time_point::max()
                      : Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    bool ended = false;
    for (;;) {
      {
        py::gil_scoped_release release;
        std::unique_lock<std::mutex> lock(state_->mu);
        const Clock::time_point slice = std::min(until, Clock::now() + std::chrono::milliseconds(200));
        ended = state_->cv.wait_until(lock, slice, [&] { return state_->done; });
      }
      if (ended || Clock::now() >= until) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    if (!ended) {
      throw_status(DeadlineExceeded("the coordinator at " + address() + " is still running after " +
                                    format_seconds(timeout_s)));
    }
    join();
    return py::module_::import("json").attr("loads")(state_->report.json);
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    int port = -1;
    bool done = false;
    JobReport report;
  };

  void join() {
    if (!thread_.joinable()) return;
    py::gil_scoped_release release;
    thread_.join();
  }

  std::shared_ptr<State> state_;
  std::string host_;
  std::thread thread_;
};

}  // namespace

void bind_coordinator(py::module_& m) {
  py::class_<PyCoordinator>(m, "Coordinator")
      .def(py::init<CoordinatorOptions, const std::string&>(), py::arg("options"), py::arg("secret"))
      .def_property_readonly("port", &PyCoordinator::port)
      .def_property_readonly("address", &PyCoordinator::address)
      .def_property_readonly("done", &PyCoordinator::done)
      .def("wait", &PyCoordinator::wait, py::arg("timeout_s") = -1.0);
}

}  // namespace refit::python
